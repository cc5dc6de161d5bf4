"""Web Push in headless Chromium: herald.js's enablePush/disablePush and the
service worker web-demo/herald-sw.js, against the real gateway pushing
through the Web Push stand-in (Tests/e2e/push_standins.py).

Chromium cannot reach its own push service here, so `pushManager.subscribe`
never settles: the tests give enablePush a registration whose pushManager
hands out a subscription of the stand-in (endpoint and keys the stand-in
made, as a browser's push service would), and check that enablePush asked
for it with `userVisibleOnly: true` and the gateway's VAPID key. What the
gateway then sends the stand-in, decrypted there, is delivered to the real
service worker with the DevTools protocol (`ServiceWorker.deliverPushMessage`),
and the tray is read back with `registration.getNotifications()`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
import urllib.request
import uuid

import pytest
from conftest import REPO_ROOT, SERVER_KEY, Gateway, _stop_checked, pushing_gateway

sys.path.insert(0, str(REPO_ROOT / "Tests" / "e2e"))
from push_standins import WebPushStandIn, pem_private  # noqa: E402

WAIT = 20.0


@pytest.fixture(scope="module")
def web_push(browser_paths, tmp_path_factory):
    with WebPushStandIn(tmp_path_factory.mktemp("webpush")) as web:
        yield web


@pytest.fixture(scope="module")
def gw(web_push, tmp_path_factory):
    """A demo gateway whose `demo` app (the config file's) pushes through the stand-in."""
    from cryptography.hazmat.primitives.asymmetric import ec
    folder = tmp_path_factory.mktemp("herald")
    vapid = folder / "vapid.pem"
    vapid.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))
    g = pushing_gateway(folder, {"webpush": {"vapidPrivateKeyFile": str(vapid), "subject": "mailto:ops@example.com",
                                             "allowedHosts": [f"127.0.0.1:{web_push.server.port}"], "caFile": web_push.ca_file}})
    yield g
    _stop_checked(g)


def call(gw: Gateway, method: str, path: str, body: dict | None = None, token: str | None = None,
         device: str | None = None) -> dict | None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token or SERVER_KEY}"}
    if device:
        headers["Herald-Device"] = device
    req = urllib.request.Request(gw.url + path, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read()
        return json.loads(text) if text else None


def device_token(gw: Gateway, user: str, device: str) -> str:
    return call(gw, "POST", "/v1/demo/token", {"userId": user, "deviceId": device})["token"]


def expired_token(gw: Gateway, user: str, device: str) -> str:
    """A device token signed as the gateway signs them, expired a minute ago."""
    import jwt
    now = int(time.time())
    return jwt.encode({"app": "demo", "sub": user, "dev": device, "iat": now - 600, "exp": now - 60},
                      gw.token_secret, algorithm="HS256")


# Posts args[0] to the worker, as herald.js does, and waits for its answer.
TELL_WORKER_JS = """
const reg = await navigator.serviceWorker.ready;
return await new Promise((resolve) => {
  const channel = new MessageChannel();
  channel.port1.onmessage = (ev) => resolve(ev.data);
  reg.active.postMessage(args[0], [channel.port2]);
});
"""


def push_key(gw: Gateway, user: str, device: str) -> str:
    return call(gw, "GET", "/v1/me/push", token=device_token(gw, user, device))["webPushPublicKey"]


def publish(gw: Gateway, user: str, title: str, body: str = "") -> dict:
    return call(gw, "POST", f"/v1/apps/demo/users/{user}/notifications",
                {"appNotificationId": uuid.uuid4().hex[:12], "payload": {"title": title, "body": body}})["notification"]


def devices(gw: Gateway, user: str) -> dict:
    return {x["deviceId"]: x for x in call(gw, "GET", f"/v1/apps/demo/users/{user}/devices")["devices"]}


def wait_until(what: str, probe, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = probe()
        if ok:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class DevTools:
    """The DevTools protocol of one target (page or service worker), for what
    Selenium's execute_cdp_cmd cannot do: read events, talk to the worker."""

    def __init__(self, driver, kind: str):
        from websockets.sync.client import connect
        addr = driver.capabilities["goog:chromeOptions"]["debuggerAddress"]
        targets = json.loads(urllib.request.urlopen(f"http://{addr}/json/list", timeout=10).read())
        [target] = [t for t in targets if t["type"] == kind][:1]
        self.ws = connect(target["webSocketDebuggerUrl"], max_size=None)
        self.events: list[dict] = []
        self.next_id = 0

    def __enter__(self) -> "DevTools":
        self.ws.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.ws.__exit__(*exc)

    def call(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params or {}}))
        while True:
            m = json.loads(self.ws.recv(timeout=WAIT))
            if m.get("id") == self.next_id:
                assert "error" not in m, (method, m["error"])
                return m["result"]
            self.events.append(m)

    def event(self, method: str, count: int = 1, where=lambda params: True) -> dict:
        """The `count`th event `method` received whose params hold `where`, waiting for it if need be."""
        deadline = time.monotonic() + WAIT
        while len(got := [e for e in self.events if e.get("method") == method and where(e["params"])]) < count:
            assert time.monotonic() < deadline, f"fewer than {count} {method} events"
            self.events.append(json.loads(self.ws.recv(timeout=WAIT)))
        return got[count - 1]

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")


# Runs the async function body `arguments[0]` in the page with the rest as `args`: {ok, value} or {ok: false, code, error}.
RUN_JS = """
const [body, args, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
(async () => (new Function('args', `return (async () => { ${body} })()`))(args))().then(
  (value) => done({ ok: true, value: value ?? null }),
  (e) => done({ ok: false, code: e?.code ?? e?.name ?? null, error: String(e?.message ?? e) }));
"""


def run(d, body: str, *args) -> dict:
    return d.execute_async_script(RUN_JS, body, list(args))


def ok(d, body: str, *args):
    r = run(d, body, *args)
    assert r["ok"], r
    return r["value"]


# A HeraldClient for the user's device (not started: enablePush needs none),
# and a registration of herald-sw.js whose pushManager is the stand-in's.
SETUP_JS = """
const [user, deviceId, sub] = args;
const { HeraldClient } = await import('/herald.js');
const real = await navigator.serviceWorker.register('/herald-sw.js');
await navigator.serviceWorker.ready;
window.client = new HeraldClient({
  deviceId, platform: 'web', storage: null,
  getToken: async () => (await (await fetch('/v1/demo/token', {
    method: 'POST', body: JSON.stringify({ userId: user, deviceId }) })).json()).token,
});
window.subscribeCalls = [];
window.unsubscribed = 0;
const subscription = sub && {
  options: { applicationServerKey: null },
  toJSON: () => sub,
  unsubscribe: async () => { window.unsubscribed++; return true; },
};
let current = null;
window.reg = {
  active: real.active,
  pushManager: {
    getSubscription: async () => current,
    subscribe: async (options) => {
      subscribeCalls.push({ userVisibleOnly: options.userVisibleOnly,
                            key: btoa(String.fromCharCode(...new Uint8Array(options.applicationServerKey))) });
      subscription.options.applicationServerKey = options.applicationServerKey;
      current = subscription;
      return subscription;
    },
  },
};
"""

TRAY_JS = """
const reg = await navigator.serviceWorker.ready;
return (await reg.getNotifications()).map((n) => ({ tag: n.tag, title: n.title, body: n.body, timestamp: n.timestamp }));
"""


def b64(s: str) -> str:
    """base64url as the page's btoa gives it."""
    return base64.b64encode(base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))).decode()


class Browser:
    """This browser's tray as the tests see it: pushes handed to its herald-sw.js, notifications
    read back. `subscription` is the stand-in's, which the page subscribes with; DevTools
    sessions (the page's, to deliver pushes; the worker's, to see it fetch) live in `stack`."""

    def __init__(self, d, gw: Gateway, web: WebPushStandIn, stack: contextlib.ExitStack, subscription: dict):
        self.d, self.gw, self.web, self.stack, self.subscription = d, gw, web, stack, subscription
        self.page = stack.enter_context(DevTools(d, "page"))
        self.worker = None
        self.registration_id = None
        self.delivered = 0

    @classmethod
    def herald_js(cls, d, gw: Gateway, web: WebPushStandIn, stack, user: str, device: str = "browser") -> "Browser":
        """A page of the gateway's origin running SETUP_JS, notifications allowed."""
        d.get(gw.url + "/herald.js")
        d.execute_cdp_cmd("Browser.grantPermissions", {"origin": gw.url, "permissions": ["notifications"]})
        b = cls(d, gw, web, stack, web.new_subscription(application_server_key=push_key(gw, user, device)))
        ok(d, SETUP_JS, user, device, b.subscription)
        return b

    def enable(self, **options) -> dict:
        return ok(self.d, "return await client.enablePush(reg, args[0]);", options)

    def show_one(self, user: str, title: str) -> tuple[dict, dict]:
        """Push enabled, a publish of `title` to `user` pushed and shown: the notification and its push."""
        self.enable()
        n = publish(self.gw, user, title)
        [m] = self.deliver_pushes(1)
        self.wait_tray("shown", [{"tag": n["id"], "title": title, "body": ""}])
        return n, m

    def deliver_pushes(self, count: int, settled: bool = True) -> list[dict]:
        """Waits for the gateway's next `count` pushes to this browser and hands each to the worker."""
        got = wait_until(f"{count} more pushes at the stand-in",
                         lambda: (len(r := self.received()) >= self.delivered + count, r))[self.delivered:self.delivered + count]
        for m in got:
            self.deliver_raw(m["plaintext"].decode(), settled)
        self.delivered += count
        return got

    def received(self) -> list[dict]:
        """What the stand-in took for this browser's subscription, decrypted."""
        return [m for m in self.web.accepted if self.subscription["endpoint"].endswith("/" + m["subscription"])]

    def deliver_raw(self, data: str, settled: bool = True) -> None:
        """Hands `data` to the worker as a push. Settled: until the worker, having shown it, has
        asked the gateway which notifications stay (with some shown, it does). Pushes are handed
        over one at a time so: headless Chromium was seen to leave a showNotification unsettled,
        and a second notification unshown, when a push arrived while another event was at work."""
        if self.registration_id is None:  # the worker is registered by now
            self.page.call("ServiceWorker.enable")
            [reg] = self.page.event("ServiceWorker.workerRegistrationUpdated")["params"]["registrations"]
            self.registration_id = reg["registrationId"]
            self.worker = self.stack.enter_context(DevTools(self.d, "service_worker"))
            self.worker.call("Network.enable")
        asked = lambda p: "/v1/me/notifications?" in p["response"]["url"]  # noqa: E731
        self.worker.call("Runtime.evaluate", {"expression": "0"})  # takes in the events sent so far
        seen = sum(1 for e in self.worker.events if e.get("method") == "Network.responseReceived" and asked(e["params"]))
        self.page.call("ServiceWorker.deliverPushMessage", {
            "origin": self.gw.url, "registrationId": self.registration_id, "data": data})
        if settled:
            self.worker.event("Network.responseReceived", seen + 1, asked)

    def tray(self) -> list[dict]:
        return ok(self.d, TRAY_JS)

    def wait_tray(self, what: str, expected) -> None:
        """Until the tray is `expected` (tag, title and body; in any order), or `expected(tray)` holds."""
        key = lambda xs: sorted(({k: x[k] for k in ("tag", "title", "body")} for x in xs), key=lambda x: x["tag"])
        holds = expected if callable(expected) else lambda tray: key(tray) == key(expected)
        wait_until(what, lambda: (holds(t := self.tray()), t))


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def browser(gw, web_push, driver):
    """browser(user): a Browser of that user, on the test's Chromium."""
    with contextlib.ExitStack() as stack:
        yield lambda user: Browser.herald_js(driver, gw, web_push, stack, user)


def test_enable_push_registers_the_subscription_and_a_publish_shows_one_notification(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    device = b.enable()
    assert device["push"] == {"service": "webpush"} and device["platform"] == "web", device
    assert devices(gw, user)["browser"]["push"] == {"service": "webpush"}
    key = push_key(gw, user, "browser")
    assert ok(driver, "return subscribeCalls;") == [{"userVisibleOnly": True, "key": b64(key)}]
    n = publish(gw, user, "Build #128 passed", "All 412 tests green")
    [m] = b.deliver_pushes(1)
    assert m["json"]["herald"]["id"] == n["id"] and m["headers"]["topic"] == n["id"]
    b.wait_tray("the notification shown", [{"tag": n["id"], "title": "Build #128 passed", "body": "All 412 tests green"}])


def test_a_dismiss_on_another_device_leaves_the_tray_when_the_worker_next_runs(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    b.enable()
    first, read_one = publish(gw, user, "first"), publish(gw, user, "second")
    b.deliver_pushes(2)
    b.wait_tray("both shown", [{"tag": first["id"], "title": "first", "body": ""},
                               {"tag": read_one["id"], "title": "second", "body": ""}])
    phone = device_token(gw, user, "phone")
    call(gw, "PATCH", f"/v1/me/notifications/{first['id']}", {"userActionState": "dismissed"}, token=phone, device="phone")
    call(gw, "PATCH", f"/v1/me/notifications/{read_one['id']}", {"readState": "read"}, token=phone, device="phone")
    # Web Push gets no taps: the next visible push runs the worker, which asks the gateway.
    third = publish(gw, user, "third")
    [m] = b.deliver_pushes(1)
    assert m["json"]["herald"]["id"] == third["id"] and len(b.received()) == 3, "the dismiss and the read sent no Web Push"
    b.wait_tray("only the third left", [{"tag": third["id"], "title": "third", "body": ""}])


def test_a_push_whose_change_says_handled_closes_that_notification(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    n, m = b.show_one(user, "to be handled")
    # A body as the gateway sends it, whose change has the notification dismissed
    # (a visible push delivered late); the worker closes it without asking.
    body = m["json"]
    body["change"]["notification"]["userActionState"] = "dismissed"
    call(gw, "PATCH", f"/v1/me/notifications/{n['id']}", {"userActionState": "dismissed"},
         token=device_token(gw, user, "phone"), device="phone")
    b.deliver_raw(json.dumps(body), settled=False)  # the tray is empty after it: the worker asks nothing
    b.wait_tray("closed", [])


def test_a_click_marks_the_notification_activated_on_the_gateway(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    n, _ = b.show_one(user, "open me")
    with DevTools(driver, "service_worker") as worker:
        click_in_worker(worker)
    server = lambda: call(gw, "GET", f"/v1/apps/demo/users/{user}/notifications/{n['id']}")["notification"]
    got = wait_until("activated on the gateway", lambda: ((s := server())["userActionState"] == "activated", s))
    assert got["readState"] == "read"
    b.wait_tray("closed by the click", [])


def test_a_malformed_push_still_shows_something_and_breaks_nothing(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    b.enable()
    n = publish(gw, user, "real")
    b.deliver_pushes(1)
    # Each shows the generic notification again (a new timestamp), and the real one stays.
    shown_at = None
    for data in ["not json", "[]", '{"herald": {"id": 7}}', ""]:
        b.deliver_raw(data)
        generic = lambda tray: [x for x in tray if x["tag"] == "herald-unknown"]  # noqa: E731
        b.wait_tray(f"a generic notification for {data!r}", lambda tray: [x["timestamp"] for x in generic(tray)] not in ([], [shown_at]))
        tray = b.tray()
        assert {(x["tag"], x["title"]) for x in tray} == {("herald-unknown", "New notification"), (n["id"], "real")}, tray
        [shown_at] = [x["timestamp"] for x in generic(tray)]


def test_disable_push_removes_the_subscription_everywhere(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    b.enable()
    ok(driver, "await client.disablePush(reg);")
    assert devices(gw, user)["browser"]["push"] is None
    assert ok(driver, "return unsubscribed;") == 1


def test_enable_push_errors_are_clear(gateway, gw, web_push, driver):
    # The plain demo gateway's app has no Web Push.
    driver.get(gateway + "/herald.js")
    ok(driver, SETUP_JS, uid("u"), "browser", None)
    r = run(driver, "return await client.enablePush(reg);")
    assert (r["ok"], r["code"]) == (False, "push_unavailable") and "webPushPublicKey" in r["error"], r
    r = run(driver, "return await client.enablePush({});")
    assert (r["ok"], r["code"]) == (False, "push_unsupported"), r
    # Notifications blocked for the site.
    driver.get(gw.url + "/herald.js")
    driver.execute_cdp_cmd("Browser.setPermission", {"origin": gw.url, "permission": {"name": "notifications"},
                                                     "setting": "denied"})
    ok(driver, SETUP_JS, uid("u"), "browser", None)
    r = run(driver, "return await client.enablePush(reg);")
    assert (r["ok"], r["code"]) == (False, "permission_denied"), r


# The browser's push service, out of reach here, replaced in the page by the stand-in's subscription.
STUB_PUSH_MANAGER_JS = """
(() => {
  const sub = %s;
  let current = null;
  const subscription = { options: { applicationServerKey: null }, toJSON: () => sub,
                         unsubscribe: async () => { current = null; return true; } };
  PushManager.prototype.getSubscription = async function () { return current; };
  PushManager.prototype.subscribe = async function (options) {
    subscription.options.applicationServerKey = options.applicationServerKey;
    return (current = subscription);
  };
})();
"""


def test_the_demo_page_enables_push_and_a_dismiss_on_the_phone_card_leaves_the_tray(gw, web_push, driver):
    from selenium.webdriver.common.by import By
    d, user = driver, uid("demo")
    d.execute_cdp_cmd("Browser.grantPermissions", {"origin": gw.url, "permissions": ["notifications"]})
    subscription = web_push.new_subscription()
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": STUB_PUSH_MANAGER_JS % json.dumps(subscription)})
    d.get(f"{gw.url}/?user={user}")
    find = lambda sel: d.find_element(By.CSS_SELECTOR, sel)  # noqa: E731
    wait_until("the push control ready", lambda: (find('[data-testid="btn-push"]').is_enabled(), None))
    find('[data-testid="btn-push"]').click()
    wait_until("push on", lambda: ("Push is on" in (t := find('[data-testid="push-status"]').text), t))
    browser_device = next(k for k, v in devices(gw, user).items() if k.startswith("browser-"))
    assert devices(gw, user)[browser_device]["push"] == {"service": "webpush"}
    with contextlib.ExitStack() as stack:
        b = Browser(d, gw, web_push, stack, subscription)
        find('[data-testid="publish-title"]').clear()
        find('[data-testid="publish-title"]').send_keys("Deploy finished")
        find('[data-testid="publish-button"]').click()
        [m] = b.deliver_pushes(1)
        nid = m["json"]["herald"]["id"]
        b.wait_tray("shown in the tray", lambda tray: [x["tag"] for x in tray] == [nid])
        dismiss = f'[data-testid="device-phone"] [data-testid="notification"][data-id="{nid}"] [data-testid="btn-dismiss"]'
        wait_until("the phone card shows it", lambda: (bool(d.find_elements(By.CSS_SELECTOR, dismiss)), None))
        find(dismiss).click()
        # No push follows a dismiss: the page tells the worker, which asks the gateway.
        b.wait_tray("gone from the tray", [])
        assert len(b.received()) == 1


# A page of the gateway's origin holding <herald-inbox push>, its tokens the demo's.
INBOX_JS = """
const [user] = args;
await import('/herald-inbox.js');
const el = document.createElement('herald-inbox');
el.setAttribute('device-id', 'web-inbox');
el.setAttribute('push', '');
el.tokenProvider = async () => (await (await fetch('/v1/demo/token', {
  method: 'POST', body: JSON.stringify({ userId: user, deviceId: 'web-inbox' }) })).json()).token;
document.body.replaceChildren(el);
"""


def test_the_inbox_component_enables_push_and_a_publish_reaches_the_tray(gw, web_push, driver):
    """<herald-inbox push>'s "Notify me on this device" (issue 42): the browser's
    push service stubbed as in the demo page's test; the component, herald.js,
    the service worker, the gateway and the stand-in real."""
    from selenium.webdriver.common.by import By
    d, user = driver, uid("inbox")
    d.execute_cdp_cmd("Browser.grantPermissions", {"origin": gw.url, "permissions": ["notifications"]})
    subscription = web_push.new_subscription()
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": STUB_PUSH_MANAGER_JS % json.dumps(subscription)})
    d.get(gw.url + "/herald.js")
    ok(d, INBOX_JS, user)
    push = lambda sel: d.find_element(By.CSS_SELECTOR, "herald-inbox").shadow_root.find_element(By.CSS_SELECTOR, sel)  # noqa: E731
    push(".bell").click()  # the offer is in the panel
    wait_until("the offer to notify", lambda: ((t := push(".push button").text) == "Notify me on this device", t))
    push(".push button").click()
    wait_until("push on", lambda: ((t := push('.push [role="status"]').text) == "This device gets push notifications", t))
    assert not push(".push button").is_displayed(), "offered no more once on"
    assert devices(gw, user)["web-inbox"]["push"] == {"service": "webpush"}
    # A connected device is sent its changes live, not pushed: the inbox leaves the page (its tab closed).
    d.execute_script("document.querySelector('herald-inbox').remove()")
    wait_until("the inbox disconnected", lambda: (not (x := devices(gw, user)["web-inbox"])["connected"], x))
    with contextlib.ExitStack() as stack:
        b = Browser(d, gw, web_push, stack, subscription)
        n = publish(gw, user, "Deploy finished", "all green")
        [m] = b.deliver_pushes(1)
        assert m["json"]["herald"]["id"] == n["id"], m["json"]
        b.wait_tray("shown in the tray", [{"tag": n["id"], "title": "Deploy finished", "body": "all green"}])


def click_in_worker(worker: DevTools) -> None:
    """No DevTools command clicks a notification: the click is dispatched in the worker, on the
    notification the browser shows, to the worker's own listener. Such an event is untrusted:
    its waitUntil throws and it grants no window focus, so focusing or opening the app is not
    checked here."""
    worker.evaluate("""self.registration.getNotifications().then(([n]) =>
        void self.dispatchEvent(new NotificationEvent('notificationclick', { notification: n })))""")


def test_a_click_with_an_expired_token_is_sent_once_a_page_hands_a_new_one(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    n, _ = b.show_one(user, "later")
    with DevTools(driver, "service_worker") as worker:
        worker.call("Runtime.enable")
        expired = {"type": "herald-push-token", "token": expired_token(gw, user, "browser")}
        assert ok(driver, TELL_WORKER_JS, expired) == {"ok": True}
        click_in_worker(worker)
        # The worker tried the gateway after the message and after the click, and could not.
        worker.event("Runtime.consoleAPICalled", 2, lambda p: p["type"] == "warning" and "no tokenUrl" in json.dumps(p["args"]))
    state = lambda: call(gw, "GET", f"/v1/apps/demo/users/{user}/notifications/{n['id']}")["notification"]
    assert state()["userActionState"] == "noInteraction"
    b.wait_tray("closed by the click all the same", [])
    b.enable()  # a visit: enablePush again hands the worker a fresh token
    wait_until("activated on the gateway", lambda: ((s := state())["userActionState"] == "activated", s))


def test_the_worker_renews_an_expired_token_from_the_token_url(gw, browser, driver):
    user = uid("u")
    b = browser(user)
    b.enable(tokenUrl="/app/herald-token")
    first = publish(gw, user, "first")
    b.deliver_pushes(1)
    b.wait_tray("shown", [{"tag": first["id"], "title": "first", "body": ""}])
    call(gw, "PATCH", f"/v1/me/notifications/{first['id']}", {"userActionState": "dismissed"},
         token=device_token(gw, user, "phone"), device="phone")
    second = publish(gw, user, "second")
    with DevTools(driver, "service_worker") as worker:
        worker.call("Runtime.enable")
        expired = {"type": "herald-push-token", "token": expired_token(gw, user, "browser")}
        assert ok(driver, TELL_WORKER_JS, expired) == {"ok": True}
        # After the message the worker tried the token URL, which the gateway's origin does not serve.
        worker.event("Runtime.consoleAPICalled", 1, lambda p: "tokenUrl answered HTTP 404" in json.dumps(p["args"]))
        b.wait_tray("the dismissed one still shown", lambda tray: len(tray) == 1)
        # From now on the app's token URL is answered through DevTools, as the app's server would.
        worker.call("Fetch.enable", {"patterns": [{"urlPattern": "*/app/herald-token*"}]})
        b.deliver_pushes(1, settled=False)  # the worker waits for its token first
        paused = worker.event("Fetch.requestPaused")["params"]
        assert paused["request"]["url"] == f"{gw.url}/app/herald-token?deviceId=browser"
        fresh = json.dumps({"token": device_token(gw, user, "browser")}).encode()
        worker.call("Fetch.fulfillRequest", {"requestId": paused["requestId"], "responseCode": 200,
                                             "responseHeaders": [{"name": "Content-Type", "value": "application/json"}],
                                             "body": base64.b64encode(fresh).decode()})
        b.wait_tray("the dismissed one closed with the new token", [{"tag": second["id"], "title": "second", "body": ""}])
