"""SPEC 6 (errors, operations) and the process lifecycle: error bodies for every
reachable code, /healthz, /metrics, SIGTERM, epochs after a memory-store restart."""
import re
import signal
import threading
import time
from pathlib import Path

from herald_helpers import (APPS, check_error, check_raw_error, mint_token, raw_http, reset_notifications, uid, wait_until)


def test_every_reachable_error_code_has_the_error_shape(gateway, user):
    tok = mint_token(user)
    n = gateway.publish(user)["notification"]
    check_error(gateway.server("POST", f"/users/{user}/notifications", data=b"{", headers={"Content-Type": "application/json"}), 400, "bad_request")
    check_error(gateway.server("GET", f"/users/{user}/notifications", key="nope"), 401, "unauthorized")
    check_error(gateway.me("GET", "/counts", mint_token(user, dev="a"), device="b"), 403, "forbidden")
    check_error(gateway.me("GET", "/notifications/n_missing", tok), 404, "not_found")
    check_error(gateway.request("GET", "/v1/nothing/here"), 404, "not_found")
    check_error(gateway.request("DELETE", "/healthz"), 405, "method_not_allowed")
    check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"},
                           headers={"If-Match": '"9"'}), 412, "precondition_failed")
    big = b'{"appNotificationId":"x","payload":{"d":"' + b"a" * (2 * 1024 * 1024) + b'"}}'
    r = raw_http(gateway, "POST", f"/v1/apps/app.one/users/{user}/notifications",
                 {"Authorization": f"Bearer {APPS['app.one']['serverKey']}", "Content-Type": "application/json"}, big)
    check_raw_error(r, 413, "too_large")
    assert gateway.get_notification(user, n["id"]) == n
    assert len(gateway.list_all(user)) == 1


def test_error_responses_are_json(gateway):
    r = gateway.request("GET", "/v1/nothing/here")
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers


def test_healthz(gateway):
    r = gateway.request("GET", "/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


def test_threads_carry_their_role_in_their_names(gateway_factory):
    """`top -H` and `perf` tell the engines from the loops by name; the memory
    store has one partition, with its engine, per loop."""
    gw = gateway_factory(extra_args=["--threads", "3"])
    names = _named(gw, {f"herald-{role}-{i}" for role in ("engine", "loop") for i in range(3)})
    assert "herald-engine-3" not in names
    two = gateway_factory(extra_args=["--threads", "3", "--partitions", "2"])
    engines = {n for n in _named(two, {"herald-engine-0", "herald-engine-1"}) if n.startswith("herald-engine")}
    assert engines == {"herald-engine-0", "herald-engine-1"}


def _named(gw, expected: set[str]) -> set[str]:
    """The thread names once every `expected` one is there: a thread names
    itself when it first runs, which may come just after `listening on`."""
    return wait_until(lambda: (n := _thread_names(gw)) >= expected and n, f"threads named {sorted(expected)}")


def _thread_names(gw) -> set[str]:
    return set(_thread_list(gw))


def _thread_list(gw) -> list[str]:
    names = []
    for t in Path(f"/proc/{gw.proc.pid}/task").iterdir():
        try:
            names.append((t / "comm").read_text().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return names


def test_sqlite_at_full_durability_syncs_on_a_thread_of_its_own(gateway_factory, tmp_path, user):
    """The log's fsync runs on `herald-sync` beside the engine, and copying the
    log into the file on `herald-checkpt` (docs/OPERATIONS.md); with two
    partitions, each file has its engine, reader, sync and checkpoint threads."""
    full = gateway_factory(store=f"sqlite:{tmp_path}/full.db", extra_args=["--partitions", "1"])
    _named(full, {"herald-engine-0", "herald-sync", "herald-reader", "herald-checkpt"})
    two = gateway_factory(store=f"sqlite:{tmp_path}/two.db", extra_args=["--partitions", "2"])
    kinds = ("herald-engine-", "herald-reader-", "herald-sync", "herald-checkpt")
    wait_until(lambda: all(sum(n.startswith(k) for n in _thread_list(two)) == 2 for k in kinds),
               "two of each SQLite thread")
    assert full.publish(user, "a1", expect=201)["seq"] == 1
    assert [n["appNotificationId"] for n in full.server("GET", f"/users/{user}/notifications").json()["notifications"]] == ["a1"]
    normal = gateway_factory(store=f"sqlite:{tmp_path}/normal.db", extra_args=["--durability", "normal"])
    assert "herald-sync" not in _thread_names(normal)


def _metric(text, name):
    total = 0.0
    for m in re.finditer(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


def test_metrics(gateway, user):
    w, _, _ = gateway.connect(user)
    with w:
        before = gateway.request("GET", "/metrics").text
        gateway.publish(user)
        w.expect_changes(1)
        r = gateway.request("GET", "/metrics")
        assert _metric(r.text, "herald_publishes_total") >= _metric(before, "herald_publishes_total") + 1
        assert _metric(r.text, "herald_deliveries_total") >= _metric(before, "herald_deliveries_total") + 1
        assert (_metric(r.text, "herald_delivery_latency_seconds_count")
                >= _metric(before, "herald_delivery_latency_seconds_count") + 1)
        assert r.status_code == 200, r.text[:300]
        text = r.text
        assert re.search(r'^herald_connections\{[^}]*transport="websocket"[^}]*\} [1-9]', text, re.M), \
            "herald_connections{transport=\"websocket\"} should count the open connection"
        for name in ("herald_publishes_total", "herald_deliveries_total"):
            assert re.search(rf"^{name}(\{{[^}}]*\}})? [0-9.e+]+$", text, re.M), name
        for name in ("herald_delivery_latency_seconds", "herald_store_latency_seconds", "herald_maintenance_seconds"):
            assert re.search(rf"^# TYPE {name} histogram", text, re.M), name
            assert re.search(rf'^{name}_bucket\{{[^}}]*le="\+Inf"[^}}]*\}} ', text, re.M), name
            assert re.search(rf"^{name}_count(\{{[^}}]*\}})? ", text, re.M), name
        assert re.search(r"^# TYPE herald_connections gauge", text, re.M)
        for reason in ("slow_consumer", "rate_limited", "idle", "protocol_error", "auth_expired"):
            assert re.search(rf'^herald_dropped_connections_total\{{[^}}]*reason="{reason}"', text, re.M), reason


def test_only_one_stdout_line(fresh_gateway):
    gw = fresh_gateway
    user = uid("u")
    gw.publish(user)
    w, _, _ = gw.connect(user)
    w.close()
    gw.request("GET", "/v1/nope")
    # Everything it ever prints: stop it and read stdout to its end (a sleep
    # of 0.3 s guessed when stray lines would have arrived).
    rc = gw.terminate()
    gw.stopped_by_test = True
    assert rc == 0, f"exit status {rc} after SIGTERM; stderr: {gw.stderr_tail()}"
    assert gw.stdout_closed.wait(10), "stdout still open after the gateway exited"
    assert gw.listen_line == f"listening on http://{gw.host}:{gw.port}"
    assert gw.extra_stdout == [], f"stdout must hold only the listening line; also got {gw.extra_stdout[:5]}"


def test_sigterm_closes_websockets_1001_and_exits_0(fresh_gateway):
    gw = fresh_gateway
    u1, u2 = uid("a"), uid("b")
    w1, _, _ = gw.connect(u1, "d1")
    w2, _, _ = gw.connect(u2, "d2")
    codes = {}

    def watch(name, w):
        try:
            codes[name] = w.expect_close(timeout=10)[0]
        except AssertionError as e:
            codes[name] = str(e)

    ts = [threading.Thread(target=watch, args=(k, w)) for k, w in (("w1", w1), ("w2", w2))]
    for t in ts:
        t.start()
    t0 = time.time()
    gw.proc.send_signal(signal.SIGTERM)
    gw.stopped_by_test = True
    try:
        rc = gw.proc.wait(10)
    except Exception:
        rc = None
    for t in ts:
        t.join(10)
    assert codes == {"w1": 1001, "w2": 1001}, codes
    assert rc == 0, f"exit status {rc} (stderr: {gw.stderr_tail()})"
    assert time.time() - t0 < 10


def test_sigterm_idle_gateway_exits_0_quickly(fresh_gateway):
    gw = fresh_gateway
    t0 = time.time()
    gw.proc.send_signal(signal.SIGTERM)
    gw.stopped_by_test = True
    assert gw.proc.wait(10) == 0
    assert time.time() - t0 < 10


def test_memory_restart_changes_epoch_and_resets(gateway_factory):
    user = uid("epoch")
    gw1 = gateway_factory()
    gw1.publish(user, "a")
    w, _, welcome1 = gw1.connect(user, "d1")
    w.close()
    assert gw1.terminate() == 0
    gw1.stopped_by_test = True
    gw2 = gateway_factory()
    gw2.publish(user, "b")
    gw2.publish(user, "c")
    w, frames, welcome2 = gw2.connect(user, "d1", cursor=welcome1["cursor"], epoch=welcome1["epoch"])
    with w:
        assert welcome2["epoch"] != welcome1["epoch"], "a restarted memory store lost history: a new epoch"
        notes = reset_notifications(frames)
        assert {n["appNotificationId"] for n in notes} == {"b", "c"}


def test_garbage_requests_do_not_crash(gateway, user):
    import socket
    for junk in (b"\x00\x01\x02\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"POST /v1/apps/app.one/users/x/notifications HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"b" * 200000 + b"\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
        try:
            s.sendall(junk)
            s.settimeout(2)
            try:
                s.recv(4096)
            except (socket.timeout, ConnectionResetError):
                pass
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            s.close()
    assert gateway.alive()
    assert gateway.request("GET", "/healthz").status_code == 200
    gateway.publish(user)


def test_sigterm_right_after_listening_exits_0(herald_bin, tmp_path):
    """SIGTERM at once after the `listening on` line, a few times over: each
    must exit 0 within 10 s (SPEC 6, 7: the line means it is up)."""
    from herald_helpers import CONFIG, Gateway
    for i in range(8):
        gw = Gateway(herald_bin, tmp_path / f"g{i}", CONFIG).start()
        t0 = time.time()
        rc = gw.terminate(10.0)
        assert rc == 0, (f"start #{i}: SIGTERM right after 'listening' -> "
                         f"{'no exit within 10 s' if rc is None else f'status {rc}'} ({time.time() - t0:.1f}s); "
                         f"stderr: {gw.stderr_tail()[-500:]}")
