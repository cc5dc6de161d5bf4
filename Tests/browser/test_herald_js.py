"""web-demo/herald.js in a real browser against a real gateway: the parts the
demo page does not reach with one notification at a time.

Each test imports herald.js into a page of the gateway's origin, runs
HeraldClient instances on forced transports and reads their state back:
resets larger than one page (WebSocket reset frames, SSE/sync resets paged
through history with `before=next`), catch-up of more than one batch of
changes with every seq applied once and in order, a new epoch after a
gateway restart, the 'auto' fallback ladder, and action errors.
"""

from __future__ import annotations

import json
import time

CLIENTS_JS = """
const [specs, done] = [arguments[0], arguments[arguments.length - 1]];
import('/herald.js').then(({ HeraldClient }) => {
  window.hc = window.hc || { clients: {}, logs: {}, seqs: {} };
  for (const s of specs) {
    const user = s.user;
    const opts = {
      getToken: async () => {
        const r = await fetch('/v1/demo/token', { method: 'POST', body: JSON.stringify({ userId: user }) });
        return (await r.json()).token;
      },
      deviceId: s.deviceId, transport: s.transport, storagePrefix: s.prefix || 'jstest',
      backoffMinMs: 100, backoffMaxMs: 1000,
    };
    if (s.brokenWebSocket) opts.WebSocket = function (u) { return new WebSocket(u.replace('/v1/ws', '/v1/nope')); };
    if (s.brokenEventSource) opts.EventSource = function (u) { return new EventSource(u.replace('/v1/me/events', '/v1/me/nope')); };
    const c = new HeraldClient(opts);
    const log = hc.logs[s.name] = [];
    const seqs = hc.seqs[s.name] = [];
    c.on('status', (st, t) => log.push(`${st}:${t}`));
    c.on('reset', (l) => log.push(`reset:${l.length}`));
    c.on('error', (e) => log.push(`error:${e.code}`));
    c.on('change', (ch) => seqs.push(ch.seq));
    hc.clients[s.name] = c;
    c.start();
  }
  done('ok');
}).catch((e) => done(String(e)));
"""

STATE_JS = """
return Object.fromEntries(Object.entries(hc.clients).map(([k, c]) => [k, {
  status: c.status, transport: c.transport, cursor: c.cursor, epoch: c.epoch, unread: c.unread,
  count: c.notifications.length,
  titles: c.notifications.slice(0, 3).map((n) => n.payload.title),
  log: hc.logs[k].join(' '),
}]));
"""


def open_lib(d, base: str) -> None:
    # Any page of the gateway's origin will do; herald.js itself is one.
    d.get(base + "/herald.js")
    d.execute_script("localStorage.clear()")


def start_clients(d, specs: list[dict]) -> None:
    assert d.execute_async_script(CLIENTS_JS, specs) == "ok"


def clients(d) -> dict:
    return d.execute_script(STATE_JS)


def wait_clients(d, what: str, cond, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = clients(d)
        if cond(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; clients:\n{json.dumps(last, indent=1)}")


def three(user: str, tag: str) -> list[dict]:
    return [{"name": t, "transport": t, "deviceId": f"{tag}-{t}", "user": user}
            for t in ("websocket", "sse", "poll")]


def test_reset_larger_than_a_page_on_every_transport(gateway_proc, driver):
    """1203 notifications: WebSocket reset frames of at most 500 until `final`;
    SSE and sync resets bring the newest 500 and page the rest via before=next."""
    gw, d = gateway_proc, driver
    user = "reset-user"
    for i in range(1203):
        gw.publish(user, f"r{i:04d}", f"r{i:04d}")
    open_lib(d, gw.url)
    start_clients(d, three(user, "reset"))
    state = wait_clients(d, "1203 notifications on every transport", lambda s: all(
        c["status"] == "live" and c["count"] == 1203 for c in s.values()))
    for name, c in state.items():
        assert c["titles"] == ["r1202", "r1201", "r1200"], (name, c)
        assert c["unread"] == 1203, (name, c)
        assert c["cursor"] == 1203, (name, c)
        assert "reset:1203" in c["log"], (name, c)


def test_catch_up_of_many_changes_applies_each_seq_once_in_order(gateway_proc, driver):
    """Offline while 1203 notifications are published and 172 of them replaced:
    on resume each client applies every change once, in seq order, without a reset."""
    gw, d = gateway_proc, driver
    user = "catchup-user"
    gw.publish(user, "first", "first")
    open_lib(d, gw.url)
    start_clients(d, three(user, "catchup"))
    wait_clients(d, "live with one", lambda s: all(c["status"] == "live" and c["count"] == 1 for c in s.values()))
    d.execute_script("for (const c of Object.values(hc.clients)) c.stop();"
                     "for (const k of Object.keys(hc.seqs)) hc.seqs[k].length = 0;"
                     "for (const k of Object.keys(hc.logs)) hc.logs[k].length = 0;")
    last = None
    for i in range(1203):
        last = gw.publish(user, f"c{i:04d}", f"c{i:04d}")
    for i in range(0, 1203, 7):  # replacements: same appNotificationId, version 2
        last = gw.publish(user, f"c{i:04d}", f"c{i:04d} v2")
    final_seq = last["seq"]
    d.execute_script("for (const c of Object.values(hc.clients)) c.start();")
    state = wait_clients(d, "caught up", lambda s: all(
        c["status"] == "live" and c["cursor"] == final_seq and c["count"] == 1204 for c in s.values()))
    seqs = d.execute_script("return hc.seqs")
    for name, c in state.items():
        assert "reset" not in c["log"], f"{name} was reset instead of caught up: {c['log']}"
        got = seqs[name]
        assert len(got) == 1375 and got == sorted(set(got)), (name, len(got), got[:5], got[-5:])
        assert got[-1] == final_seq, (name, got[-1], final_seq)
        assert c["unread"] == 1204, (name, c)
    v2 = d.execute_script(
        "return Object.fromEntries(Object.entries(hc.clients).map(([k, c]) => "
        "[k, c.notifications.filter((n) => n.version === 2 && n.payload.title.endsWith(' v2')).length]))")
    assert v2 == {"websocket": 172, "sse": 172, "poll": 172}, v2


def test_new_epoch_after_restart_resets_every_transport(fresh_gateway, driver):
    """A memory store restarted is a new epoch: clients resuming with the old
    cursor and epoch get a reset, never changes that skip or repeat."""
    gw, d = fresh_gateway, driver
    user = "epoch-user"
    for i in range(3):
        gw.publish(user, f"old{i}", f"old{i}")
    open_lib(d, gw.url)
    start_clients(d, three(user, "epoch"))
    before = wait_clients(d, "live with the old three", lambda s: all(
        c["status"] == "live" and c["count"] == 3 for c in s.values()))
    old_epochs = {c["epoch"] for c in before.values()}
    assert len(old_epochs) == 1, before
    port = gw.port
    assert gw.stop() == 0
    wait_clients(d, "reconnecting", lambda s: all(c["status"] == "reconnecting" for c in s.values()))
    gw.start(port)
    gw.publish(user, "new0", "new0")
    after = wait_clients(d, "reset to the new feed", lambda s: all(
        c["status"] == "live" and c["titles"] == ["new0"] and c["count"] == 1 for c in s.values()))
    for name, c in after.items():
        assert c["epoch"] not in old_epochs, (name, c)
        assert c["cursor"] == 1, (name, c)


def test_auto_falls_back_to_sse_then_long_poll(gateway_proc, driver):
    """'auto' with WebSocket refused tries SSE; with SSE refused too, long-poll."""
    gw, d = gateway_proc, driver
    user = "ladder-user"
    gw.publish(user, "one", "one")
    open_lib(d, gw.url)
    start_clients(d, [
        {"name": "no-ws", "transport": "auto", "deviceId": "ladder-a", "user": user, "brokenWebSocket": True},
        {"name": "no-ws-sse", "transport": "auto", "deviceId": "ladder-b", "user": user,
         "brokenWebSocket": True, "brokenEventSource": True},
        {"name": "auto", "transport": "auto", "deviceId": "ladder-c", "user": user},
    ])
    state = wait_clients(d, "all live", lambda s: all(c["status"] == "live" and c["count"] == 1 for c in s.values()))
    assert state["auto"]["transport"] == "websocket", state
    assert state["no-ws"]["transport"] == "sse", state
    assert state["no-ws-sse"]["transport"] == "poll", state
    gw.publish(user, "two", "two")
    wait_clients(d, "live change everywhere", lambda s: all(c["titles"] == ["two", "one"] for c in s.values()))


def test_action_errors_over_websocket_and_http(gateway_proc, driver):
    gw, d = gateway_proc, driver
    user = "errors-user"
    n = gw.publish(user, "e1", "e1")["notification"]
    open_lib(d, gw.url)
    start_clients(d, [{"name": "ws", "transport": "websocket", "deviceId": "err-ws", "user": user},
                      {"name": "poll", "transport": "poll", "deviceId": "err-poll", "user": user}])
    wait_clients(d, "live", lambda s: all(c["status"] == "live" and c["count"] == 1 for c in s.values()))
    run = """
const [name, expr, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const c = hc.clients[name];
Promise.resolve().then(() => eval(expr)).then(
  (r) => done({ ok: true, version: r?.notification?.version ?? null, seq: r?.seq ?? null }),
  (e) => done({ ok: false, code: e.code, status: e.status ?? null }));
"""
    nid = n["id"]
    for name in ("ws", "poll"):
        r = d.execute_async_script(run, name, f"c.update('{nid}', {{userActionState: 'activated'}}, {{ifVersion: 99}})")
        assert r == {"ok": False, "code": "precondition_failed", "status": None if name == "ws" else 412}, (name, r)
        r = d.execute_async_script(run, name, "c.markRead('n_does_not_exist')")
        assert r["ok"] is False and r["code"] == "not_found", (name, r)
    r = d.execute_async_script(run, "ws", f"c.markRead('{nid}', {{ifVersion: 1}})")
    assert r["ok"] and r["version"] == 2, r
    r = d.execute_async_script(run, "poll", f"c.activate('{nid}', {{ifVersion: 2}})")
    assert r["ok"] and r["version"] == 3, r
    wait_clients(d, "unread 0 on both", lambda s: all(c["unread"] == 0 for c in s.values()))
    r = d.execute_async_script(run, "poll", f"c.remove('{nid}')")
    assert r["ok"], r
    r = d.execute_async_script(run, "ws", f"c.remove('{nid}')")
    assert r == {"ok": False, "code": "not_found", "status": None}, r
    wait_clients(d, "gone from both", lambda s: all(c["count"] == 0 for c in s.values()))
