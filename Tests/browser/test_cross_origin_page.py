"""web-demo/herald.js on pages of other origins than the gateway's (CORS,
docs/PROTOCOL.md 7.1), in headless Chromium.

Two static servers on their own ports serve web-demo/ (so `herald.js`) as
two more origins. The gateway has an app that lists the first one
(`--allowed-origins`): there herald.js syncs over SSE and long-poll,
registers its device and dismisses over HTTP (preflighted PATCH with
`If-Match`), and reads error answers. The second origin is refused by the
browser: its preflighted requests are never sent, its event stream and
poll fail, and nothing changes on the gateway.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
import urllib.request

import pytest
from conftest import REPO_ROOT, Gateway, _stop_checked

APP, KEY, SECRET = "cors.app", "sk-cors", "ts-cors"

START_JS = """
const [base, specs, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
import('/herald.js').then(({ HeraldClient }) => {
  window.hc = { clients: {}, logs: {} };
  for (const s of specs) {
    const c = new HeraldClient({ baseUrl: base, token: s.token, deviceId: s.deviceId, transport: s.transport,
                                 platform: 'web', tags: ['lang:it'], storage: null, backoffMinMs: 100, backoffMaxMs: 1000 });
    const log = hc.logs[s.transport] = [];
    c.on('status', (st, t) => log.push(`${st}:${t}`));
    c.on('error', (e) => log.push(`error:${e.code}`));
    hc.clients[s.transport] = c;
    c.start();
  }
  done('ok');
}).catch((e) => done(String(e)));
"""

STATE_JS = """
return Object.fromEntries(Object.entries(hc.clients).map(([k, c]) => [k, {
  status: c.status, log: hc.logs[k].join(' '),
  notifications: c.notifications.map((n) => [n.id, n.readState, n.userActionState, n.version]),
}]));
"""

# Runs `expr` (a promise) in the page: {ok, value} or {ok: false, error, code, status}.
RUN_JS = """
const [expr, done] = [arguments[0], arguments[arguments.length - 1]];
Promise.resolve().then(() => eval(expr)).then(
  (value) => done({ ok: true, value: value ?? null }),
  (e) => done({ ok: false, error: e?.name ?? String(e), code: e?.code ?? null, status: e?.status ?? null }));
"""


class PageServer:
    """web-demo/ over HTTP on 127.0.0.1:<free port>: an origin of its own."""

    def __init__(self):
        handler = functools.partial(Quiet, directory=str(REPO_ROOT / "web-demo"))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def origins(browser_paths):
    pages = PageServer(), PageServer()
    yield pages
    for p in pages:
        p.close()


@pytest.fixture(scope="module")
def gw(origins, tmp_path_factory):
    allowed, _ = origins
    g = Gateway(tmp_path_factory.mktemp("herald"), ["--app", APP, "--server-key", KEY, "--token-secret", SECRET,
                                                    "--allowed-origins", allowed.origin]).start()
    yield g
    _stop_checked(g)


def server(gw, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{gw.url}/v1/apps/{APP}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def publish(gw, user: str, anid: str) -> dict:
    return server(gw, "POST", f"/users/{user}/notifications",
                  {"appNotificationId": anid, "payload": {"title": anid}})["notification"]


def token(gw, user: str) -> str:
    return server(gw, "POST", "/tokens", {"userId": user})["token"]


def run(d, expr: str) -> dict:
    return d.execute_async_script(RUN_JS, expr)


def wait_clients(d, what: str, cond, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = d.execute_script(STATE_JS)
        if cond(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; clients:\n{json.dumps(last, indent=1)}")


def test_herald_js_on_an_allowed_origin_syncs_over_sse_and_poll_and_dismisses_over_http(gw, origins, driver):
    allowed, _ = origins
    d, user = driver, "cors-user"
    n = publish(gw, user, "first")
    d.get(allowed.origin + "/herald.js")
    specs = [{"transport": t, "deviceId": f"cors-{t}", "token": token(gw, user)} for t in ("sse", "poll")]
    assert d.execute_async_script(START_JS, gw.url, specs) == "ok"
    wait_clients(d, "both live with the first notification", lambda s: all(
        c["status"] == "live" and [x[0] for x in c["notifications"]] == [n["id"]] for c in s.values()))
    # registered over HTTP (a preflighted PUT with Content-Type)
    devices = {x["deviceId"]: x for x in server(gw, "GET", f"/users/{user}/devices")["devices"]}
    assert {"cors-sse", "cors-poll"} <= set(devices), devices
    assert "lang:it" in devices["cors-sse"]["tags"] and devices["cors-poll"]["platform"] == "web", devices
    # live over both transports
    second = publish(gw, user, "second")
    wait_clients(d, "the second everywhere", lambda s: all(len(c["notifications"]) == 2 for c in s.values()))
    # dismissed over HTTP: a preflighted PATCH with If-Match; the answer is read
    r = run(d, f"hc.clients.sse.dismiss('{second['id']}', {{ markRead: true, ifVersion: 1 }})")
    assert r["ok"] and r["value"]["notification"]["version"] == 2, r
    wait_clients(d, "dismissed on both", lambda s: all(
        [second["id"], "read", "dismissed", 2] in c["notifications"] for c in s.values()))
    got = server(gw, "GET", f"/users/{user}/notifications/{second['id']}")["notification"]
    assert (got["readState"], got["userActionState"]) == ("read", "dismissed"), got
    # error answers are readable too: a code, not a network error
    r = run(d, "hc.clients.poll.markRead('n_does_not_exist')")
    assert r == {"ok": False, "error": "HeraldError", "code": "not_found", "status": 404}, r
    r = run(d, f"hc.clients.poll.activate('{second['id']}', {{ ifVersion: 1 }})")
    assert r["code"] == "precondition_failed" and r["status"] == 412, r
    d.execute_script("for (const c of Object.values(hc.clients)) c.stop();")


def test_a_page_of_an_origin_the_app_does_not_list_is_refused(gw, origins, driver):
    _, refused = origins
    d, user = driver, "refused-user"
    n = publish(gw, user, "untouched")
    tok = token(gw, user)
    d.get(refused.origin + "/herald.js")
    base = json.dumps(gw.url)
    # A preflighted PATCH (herald.js over HTTP): the preflight fails, the PATCH is never sent.
    r = run(d, f"import('/herald.js').then(({{ HeraldClient }}) => new HeraldClient({{ baseUrl: {base}, "
               f"token: '{tok}', deviceId: 'evil-http', storage: null }}).dismiss('{n['id']}', {{ markRead: true }}))")
    assert r["ok"] is False and r["code"] == "network", r
    # Requests without preflight (long-poll and event stream with ?token=) are refused by the gateway
    # (403, the app lists origins) and their answers by the browser.
    r = run(d, f"fetch({base} + '/v1/me/sync?deviceId=evil-poll&token={tok}')")
    assert r["ok"] is False and r["error"] == "TypeError", r
    r = run(d, f"""new Promise((resolve, reject) => {{
      const es = new EventSource({base} + '/v1/me/events?deviceId=evil-sse&token={tok}');
      es.onopen = () => {{ es.close(); resolve('opened'); }};
      es.onerror = () => {{ const state = es.readyState; es.close(); reject({{ name: 'error', code: state }}); }};
    }})""")
    assert r == {"ok": False, "error": "error", "code": 2, "status": None}, r   # 2: CLOSED, failed for good
    # nothing changed: the notification as published, no device registered
    got = server(gw, "GET", f"/users/{user}/notifications/{n['id']}")["notification"]
    assert (got["readState"], got["userActionState"], got["version"]) == ("unread", "noInteraction", 1), got
    assert server(gw, "GET", f"/users/{user}/devices")["devices"] == []
