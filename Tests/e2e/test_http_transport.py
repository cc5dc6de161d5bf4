"""The HTTP/1.1 transport itself, over raw sockets: pipelined requests,
paths exactly as sent, streams whose client goes away, and SIGTERM while a
connection still holds a request.

Each test that can wedge a gateway (it did before these were fixed) starts
its own, so one failure does not take the module's gateway down with it.
"""

import json
import os
import signal
import socket
import threading
import time

import pytest
from herald_helpers import (APPS, CONFIG, check_error, check_raw_error, mint_token, parse_response, parse_responses,
                            raw_http, read_until_eof, uid, wait_until)
from test_fallback import Sse

KEY = APPS["app.one"]["serverKey"]


def request(method: str, path: str, body: bytes = b"", **headers) -> bytes:
    """One HTTP/1.1 request; a header given as None is left out."""
    h = {"Host": "x", "Content-Length": str(len(body)), **headers}
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
            + "\r\n").encode() + body


def publish_request(user: str, anid: str, **headers) -> bytes:
    body = json.dumps({"appNotificationId": anid, "payload": {"n": anid}}).encode()
    return request("POST", f"/v1/apps/app.one/users/{user}/notifications", body,
                   Authorization=f"Bearer {KEY}", **{"Content-Type": "application/json", **headers})


def pipeline(gw, data: bytes) -> list:
    """Writes `data` (requests, the last with `Connection: close`) in one
    send and answers the responses read until the gateway closes."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(data)
        return parse_responses(read_until_eof(s))


def read_response(s, timeout: float = 10.0):
    """The first whole response read from `s`, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    data = b""
    while (parsed := parse_response(data)) is None:
        left = deadline - time.monotonic()
        assert left > 0, f"no whole response within {timeout}s; got {data[:300]!r}"
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        assert chunk, f"connection closed before a whole response; got {data[:300]!r}"
        data += chunk
    return parsed[0]


def wait_for(what: str, cond, timeout: float = 5.0):
    deadline = time.time() + timeout
    while not (v := cond()):
        assert time.time() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)
    return v


# ---------------------------------------------------------------- pipelining

def test_pipelined_publishes_are_answered_in_order_and_stored(gateway_factory):
    gw = gateway_factory()
    user = uid("pipe")
    rs = pipeline(gw, publish_request(user, "a") + publish_request(user, "b", Connection="close"))
    assert [r.status_code for r in rs] == [201, 201], [r.text[:200] for r in rs]
    assert [r.json()["notification"]["appNotificationId"] for r in rs] == ["a", "b"]
    assert rs[0].json()["seq"] < rs[1].json()["seq"]
    assert {n["appNotificationId"] for n in gw.list_all(user)} == {"a", "b"}


def test_pipelined_healthz_then_publish(gateway_factory):
    gw = gateway_factory()
    user = uid("pipe")
    rs = pipeline(gw, request("GET", "/healthz") + publish_request(user, "a", Connection="close"))
    assert [r.status_code for r in rs] == [200, 201], [r.text[:200] for r in rs]
    assert rs[0].json()["status"] == "ok"
    assert [n["appNotificationId"] for n in gw.list_all(user)] == ["a"]


def test_request_pipelined_behind_a_held_poll_waits_its_turn(gateway_factory):
    gw = gateway_factory()
    user = uid("pipe")
    tok = mint_token(user)
    rs = pipeline(gw, request("GET", "/v1/me/sync?cursor=0&wait=1", Authorization=f"Bearer {tok}")
                  + publish_request(user, "a") + request("GET", "/healthz", Connection="close"))
    assert [r.status_code for r in rs] == [200, 201, 200], [r.text[:200] for r in rs]
    first = rs[0].json()
    assert first.get("reset") or first["changes"] == [], first


# ---------------------------------------------------------------- shutdown

def test_sigterm_with_requests_held_on_a_connection_exits_0(gateway_factory):
    gw = gateway_factory()
    user = uid("held")
    tok = mint_token(user)
    head = gw.publish(user, "a")
    held = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    half = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    try:
        # A poll held until a change or SIGTERM, with a publish queued behind it ...
        held.sendall(request("GET", f"/v1/me/sync?cursor={head['seq']}&wait=60&deviceId=d1",
                             Authorization=f"Bearer {tok}") + publish_request(user, "b"))
        # Held, not still catching up (which SIGTERM answers 503): counted as a connection once held.
        wait_for("poll held", lambda: gw.metric('herald_connections{transport="poll"}') == 1)
        # ... and a publish whose body never comes in full.
        whole = publish_request(user, "c")
        half.sendall(whole[:-5])
        gw.proc.send_signal(signal.SIGTERM)
        gw.stopped_by_test = True
        t0 = time.time()
        assert gw.proc.wait(10) == 0, gw.stderr_tail()
        assert time.time() - t0 < 10
        rs = parse_responses(read_until_eof(held))
        assert rs and rs[0].status_code == 200 and rs[0].json()["changes"] == [], [r.text[:200] for r in rs]
        assert len(rs) == 2 or rs[0].headers.get("connection") == "close", \
            "a request left unanswered needs `Connection: close` on the answer before it"
    finally:
        held.close()
        half.close()


# ---------------------------------------------------------------- paths

BAD_IDS = ["semi;colon", "semi%3Bcolon", "a%2Fb", "a%20b", "a&b", "a,b", "a+b", "a%25b", "caf%C3%A9", "a%00b",
           "a!b", "a%3Fb"]


def server_routes(user: str):
    body = json.dumps({"appNotificationId": "x", "payload": {}}).encode()
    return [("POST", f"/v1/apps/app.one/users/{user}/notifications", body),
            ("GET", f"/v1/apps/app.one/users/{user}/notifications", b""),
            ("GET", f"/v1/apps/app.one/users/{user}/devices", b""),
            ("GET", f"/v1/apps/app.one/users/{user}/notifications/n_x", b"")]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_user_id_outside_the_allowed_set_is_400_on_every_route(gateway, bad):
    for method, path, body in server_routes(bad):
        r = raw_http(gateway, method, path, {"Authorization": f"Bearer {KEY}"}, body)
        check_raw_error(r, 400, "bad_request")


@pytest.mark.parametrize("bad", BAD_IDS)
def test_device_id_outside_the_allowed_set_is_400(gateway, bad):
    tok = mint_token(uid("dev"))
    routes = [("PUT", f"/v1/me/devices/{bad}", b"{}"), ("DELETE", f"/v1/me/devices/{bad}", b"")]
    if "&" not in bad:  # in a query `&` separates parameters
        routes.append(("GET", f"/v1/me/sync?deviceId={bad}", b""))
    for method, path, body in routes:
        r = raw_http(gateway, method, path, {"Authorization": f"Bearer {tok}"}, body)
        check_raw_error(r, 400, "bad_request")


def test_ids_are_taken_as_sent_not_as_file_paths(gateway):
    """`.` and `..` are valid ids (SPEC 1), and an allowed character may come
    percent-encoded: neither is navigation."""
    for user, sent in (("..", ".."), (".", "."), (uid("enc"), None)):
        sent = sent or "%" + format(ord(user[0]), "02X") + user[1:]
        r = raw_http(gateway, "POST", f"/v1/apps/app.one/users/{sent}/notifications",
                     {"Authorization": f"Bearer {KEY}"}, json.dumps({"appNotificationId": "x", "payload": {}}).encode())
        assert r.status_code in (200, 201), r.text[:300]
        assert r.json()["notification"]["userId"] == user
        r = raw_http(gateway, "GET", f"/v1/apps/app.one/users/{sent}/notifications", {"Authorization": f"Bearer {KEY}"})
        assert [n["userId"] for n in r.json()["notifications"]] == [user]


# ---------------------------------------------------------------- event streams

def test_event_stream_closed_by_its_client_is_released(gateway):
    user = uid("sse")
    s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        open_stream(gateway, s, user)
        d = gateway.devices(user)["d1"]
        assert d["connected"] is True and d["transport"] == "sse", d
    finally:
        s.close()
    d = wait_for("stream released", lambda: (d := gateway.devices(user)["d1"])["connected"] is False and d)
    assert d["transport"] is None, d


def test_an_event_stream_to_an_http_1_0_client_is_not_chunked(gateway):
    """An HTTP/1.0 client knows no chunked bodies (RFC 9112 6.1): its event
    stream comes raw, ended by closing; it used to be chunked, the chunk
    sizes read as part of the events."""
    user = uid("sse10")
    published = gateway.publish(user, "first")
    s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        s.sendall(f"GET /v1/me/events?token={mint_token(user)}&deviceId=d1&cursor=0 HTTP/1.0\r\n\r\n".encode())
        got = b""
        while b"\n\n" not in got.partition(b"\r\n\r\n")[2]:
            chunk = s.recv(65536)
            assert chunk, f"stream ended early: {got!r}"
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding" not in head.lower(), head
        assert body.startswith(f"id: {published['seq']}\nevent: change\ndata: ".encode()), body[:200]
    finally:
        s.close()


def test_expect_100_continue_is_answered_before_the_body(gateway):
    """libcurl (PHP's too) sends `Expect: 100-continue` with bodies over
    1 KiB and waits for `100 Continue` before sending them; unanswered, it
    waited a second per publish."""
    user = uid("expect")
    body = json.dumps({"appNotificationId": "big", "payload": {"blob": "x" * 4000}}).encode()
    s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    try:
        s.sendall(request("POST", f"/v1/apps/app.one/users/{user}/notifications",
                          **{"Authorization": f"Bearer {APPS['app.one']['serverKey']}", "Content-Type": "application/json",
                             "Expect": "100-continue", "Content-Length": str(len(body))}))
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            assert chunk, f"closed: {got!r}"
            got += chunk
        assert got == b"HTTP/1.1 100 Continue\r\n\r\n", got
        s.sendall(body)
        r = read_response(s)
        assert r.status_code == 201, r.text
    finally:
        s.close()


# ---------------------------------------------------------------- found by the OpenAPI review

@pytest.mark.parametrize("method,path,allowed", [
    ("DELETE", "/healthz", "GET, HEAD"),
    ("GET", "/v1/me/notifications/read-all", "POST"),
    ("POST", "/v1/apps/app.one/users/u/devices", "GET, HEAD"),
    ("PUT", "/v1/apps/app.one/users/u/notifications", "GET, HEAD, POST"),
])
def test_405_names_the_allowed_methods(gateway, method, path, allowed):
    """RFC 9110 15.5.6: a 405 carries Allow."""
    r = gateway.request(method, path)
    check_error(r, 405)
    assert r.headers.get("Allow") == allowed, r.headers


@pytest.mark.fallback
def test_last_event_id_wins_over_a_bad_cursor_query(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user, "a")
    b = gateway.publish(user, "b")
    s = Sse(gateway, tok, headers={"Last-Event-ID": str(a["seq"])}, cursor="not-a-number")
    try:
        assert s.status_code == 200
        assert int(s.next(10)["id"]) == b["seq"]
    finally:
        s.close()


@pytest.mark.fallback
def test_overlong_epoch_query_is_400(gateway, user):
    tok = mint_token(user)
    for path in ("/sync", "/events"):
        check_error(gateway.me("GET", path, tok, params={"cursor": 0, "epoch": "e" * 129}), 400)


def test_configured_app_named_demo_is_the_demo_app(gateway_factory):
    cfg = {"apps": [{"id": "demo", "serverKey": "configured-key", "tokenSecret": "configured-secret"}]}
    gw = gateway_factory(cfg, ["--demo"])
    r = gw.request("POST", "/v1/demo/token", json={"userId": "alice"})
    assert r.status_code == 200, r.text
    token = r.json()["token"]
    assert gw.me("GET", "/counts", token).status_code == 200, "the demo token verifies"
    assert gw.server("GET", "/users/alice/notifications", app="demo", key="configured-key").status_code == 200


# ---------------------------------------------------------------- hardening

def test_empty_lines_before_a_request_are_ignored(gateway):
    """RFC 9112 2.2: a server ignores at least one empty line before a request line."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(b"\r\n\n\r\n" + request("GET", "/healthz", Connection="close"))
        rs = parse_responses(read_until_eof(s))
    assert [r.status_code for r in rs] == [200], [r.text[:200] for r in rs]


def test_an_http_1_1_request_without_host_with_two_or_with_a_bad_one_is_400_and_changes_nothing(gateway, user):
    """RFC 9112 3.2. The request is well framed, so the connection goes on:
    the next request on it is answered."""
    bad_hosts = [publish_request(user, anid).replace(b"Host: x", b"Host: " + value)
                 for anid, value in (("c", b"a b"), ("d", b"x, y"), ("e", b"user@x"), ("f", b"x/y"))]
    for bad in [publish_request(user, "a", Host=None), publish_request(user, "b").replace(b"Host: x", b"Host: x\r\nHost: y")] + bad_hosts:
        answers = pipeline(gateway, bad + request("GET", "/healthz", Connection="close"))
        assert [a.status_code for a in answers] == [400, 200], answers
        body = check_raw_error(answers[0], 400, "bad_request")
        assert "Host" in body["error"]["message"], body
    assert gateway.list_all(user) == []
    # HTTP/1.0 has no Host requirement
    r = raw_http(gateway, "GET", "/healthz", headers={"Host": None}, version="HTTP/1.0")
    assert r.status_code == 200, r.content
    # An authority in its forms: name, IPv4 and IPv6 literals, with a port, and empty (RFC 9110 7.2).
    for value in ("herald.example", "127.0.0.1:8080", "[::1]:8080", ""):
        assert raw_http(gateway, "GET", "/healthz", headers={"Host": value}).status_code == 200, value


def test_a_flood_of_empty_lines_is_refused_at_once(gateway_factory):
    """A client streaming CRLFs was read for ever, every read searching all
    of them again for a request line: a few empty lines are taken, then 400."""
    gw = gateway_factory()
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)

    def flood():
        try:
            for _ in range(256):  # 1 MiB in all
                s.sendall(b"\r\n" * 2048)
        except OSError:
            pass  # the gateway closed: it answered

    sender = threading.Thread(target=flood, daemon=True)
    try:
        sender.start()
        check_raw_error(read_response(s), 400, "bad_request")
    finally:
        s.close()
        sender.join(10)
    assert gw.request("GET", "/healthz").status_code == 200


@pytest.mark.parametrize("value", [b"a\rb", b"a\r", b"a\x00b"])
def test_bare_cr_or_nul_in_a_header_value_is_400(gateway, value):
    """RFC 9112 2.2 / RFC 9110 5.5: reject (or replace with SP); it was kept."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Other: " + value + b"\r\nConnection: close\r\n\r\n")
        rs = parse_responses(read_until_eof(s))
    assert len(rs) == 1, [r.text[:200] for r in rs]
    check_raw_error(rs[0], 400, "bad_request")


@pytest.mark.parametrize("path,status", [("/healthz", 200), ("/admin", 200), ("/v1/me/notifications/read-all", 405),
                                         ("/v1/nothing-here", 404), ("/healthz?a=%zz", 400)])
def test_answer_to_head_has_no_body_and_the_connection_goes_on(gateway, path, status):
    """RFC 9110 9.3.2: HEAD is answered wherever GET is, and an answer to
    HEAD is its head alone, Content-Length included; the next request on the
    connection is answered after it."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(request("HEAD", path) + request("GET", "/healthz", Connection="close"))
        data = read_until_eof(s)
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, data[:300]
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].split()[1] == str(status), lines
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert int(fields["content-length"]) > 0, fields
    assert "connection" not in fields, fields
    if status == 405:
        assert fields.get("allow") == "POST", fields
    assert rest.startswith(b"HTTP/1.1 200 "), f"a body followed the answer to HEAD: {rest[:200]!r}"
    rs = parse_responses(rest)
    assert [r.status_code for r in rs] == [200] and rs[0].json()["status"] == "ok", rest[:300]


def test_head_on_the_event_stream_is_its_head_and_then_the_end(fresh_gateway):
    """HEAD on `/v1/me/events` checks the token as GET does and answers the
    stream's head alone; the connection closes, and the stream it would have
    opened is gone (the gauge back to 0, the device not connected)."""
    gw, user = fresh_gateway, uid("head")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(request("HEAD", "/v1/me/events?token=forged&deviceId=d1", Connection="close"))
        data = read_until_eof(s)
    assert data.startswith(b"HTTP/1.1 401 ") and data.endswith(b"\r\n\r\n"), data[:300]
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(request("HEAD", f"/v1/me/events?token={mint_token(user)}&deviceId=d1"))
        data = read_until_eof(s)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head.lower(), head
    assert rest == b"", f"a body followed the answer to HEAD: {rest[:200]!r}"
    wait_until(lambda: gw.metric('herald_connections{transport="sse"}') == 0, "the stream's connection gone")
    [device] = gw.server("GET", f"/users/{user}/devices").json()["devices"]
    assert device["deviceId"] == "d1" and device["transport"] != "sse", device



# ---------------------------------------------------------------- timeouts

def timeouts_config(**limits) -> dict:
    return {**CONFIG, "limits": limits}


def closed_by_gateway(s) -> bool:
    """Whether the gateway closed `s` (EOF or reset), within the socket's timeout."""
    try:
        return s.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def trickle(s, pieces: list[bytes], interval: float) -> float:
    """Sends `pieces` one every `interval` s (the pace is the test's, not a
    wait for the gateway) until the gateway closes the connection; answers
    the seconds from the first piece to that close, or fails if all were sent."""
    t0 = time.monotonic()
    for piece in pieces:
        try:
            s.sendall(piece)
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - t0
        s.settimeout(interval)
        if closed_by_gateway(s):
            return time.monotonic() - t0
    raise AssertionError(f"the connection was still open after {time.monotonic() - t0:.1f}s of trickling")


SLOW_REQUESTS = {
    "head": [b"GET /healthz HTTP/1.1\r\n"] + [b"X-Slow: %d\r\n" % i for i in range(40)],
    "body": [request("POST", f"/v1/apps/app.one/users/{uid('slow')}/notifications", b"x" * 100,
                     Authorization=f"Bearer {KEY}")[:-100]] + [b"x"] * 40,
}


@pytest.mark.parametrize("what", list(SLOW_REQUESTS))
@pytest.mark.parametrize("after_an_answer", [False, True])
def test_a_request_trickling_in_is_cut_off_at_its_deadline(gateway_factory, what, after_an_answer):
    """Slow-loris: the request timeout runs from a request's first byte to
    its last. It used to restart on every read, so a byte every few seconds
    held a request head or body for ever."""
    gw = gateway_factory(timeouts_config(requestTimeoutSeconds=1))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        if after_an_answer:  # the next request on a kept-alive connection
            s.sendall(request("GET", "/healthz"))
            assert read_response(s).status_code == 200
        took = trickle(s, SLOW_REQUESTS[what], interval=0.25)
    assert took >= 0.5, took
    assert gw.request("GET", "/healthz").status_code == 200


def gateway_holds(gw, client) -> bool:
    """Whether the gateway process still has its end of `client`'s
    connection open (Linux: /proc/net/tcp and the process's descriptors)."""
    port = client.getsockname()[1]
    inodes = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(local.split(":")[1], 16) == gw.port and int(remote.split(":")[1], 16) == port and inode != "0":
                inodes.add(f"socket:[{inode}]")
    fds = set()
    for fd in os.listdir(f"/proc/{gw.proc.pid}/fd"):
        try:
            fds.add(os.readlink(f"/proc/{gw.proc.pid}/fd/{fd}"))
        except OSError:
            pass
    return bool(inodes & fds)


def non_reading_client(gw) -> socket.socket:
    """A socket with a small receive buffer, so that output the client does
    not read stays with the gateway."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", gw.port))
    return s


def slow_consumer_drops(gw) -> float:
    return gw.metric('herald_dropped_connections_total{reason="slow_consumer"}')


def test_a_client_that_does_not_read_its_answers_is_cut_off(gateway_factory):
    """Slow-read: answers to pipelined requests that the client never reads
    stayed queued, with the rest of the pipeline, for ever."""
    gw = gateway_factory(timeouts_config(writeTimeoutSeconds=1))
    s = non_reading_client(gw)
    try:
        s.sendall(request("GET", "/healthz"))
        assert read_response(s).status_code == 200
        assert gateway_holds(gw, s)
        # About 800 KiB of requests (the gateway reads up to 1 MiB ahead),
        # and about 40 MiB of answers, far more than the socket buffers hold.
        s.sendall(request("GET", "/metrics") * 15000)
        wait_until(lambda: not gateway_holds(gw, s), "the gateway closes the connection", timeout=20)
        assert slow_consumer_drops(gw) == 1
    finally:
        s.close()
    assert gw.request("GET", "/healthz").status_code == 200


def open_stream(gw, s, user: str):
    s.sendall(request("GET", f"/v1/me/events?token={mint_token(user)}&deviceId=d1"))
    got = b""
    while b"event: reset" not in got:
        chunk = s.recv(65536)
        assert chunk, f"stream ended early: {got!r}"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert gw.devices(user)["d1"]["transport"] == "sse"


def fill(gw, user: str, mib: int):
    """Publishes about `mib` MiB of notifications to `user`."""
    blob = "p" * 60000
    for i in range(mib * 1024 * 1024 // 60000 + 1):
        gw.publish(user, f"big{i}", payload={"blob": blob})


@pytest.mark.fallback
def test_an_event_stream_its_client_stopped_reading_is_cut_off(gateway_factory):
    """An event stream whose client stopped reading, with nothing new to
    send, was never cut off; now it is once the socket took nothing of its
    queued events for `writeTimeoutSeconds`, and its device is released."""
    gw = gateway_factory(timeouts_config(writeTimeoutSeconds=1, maxQueuedBytesPerConnection=256 << 20))
    user = uid("sse")
    s = non_reading_client(gw)
    try:
        open_stream(gw, s, user)
        assert gateway_holds(gw, s)
        fill(gw, user, 8)  # more than the socket buffers take
        wait_until(lambda: gw.devices(user)["d1"]["connected"] is False, "the stream's device is released", timeout=20)
        wait_until(lambda: not gateway_holds(gw, s), "the gateway closes the connection", timeout=20)
        assert slow_consumer_drops(gw) == 1
    finally:
        s.close()


@pytest.mark.fallback
def test_an_event_stream_ended_while_its_client_is_not_reading_is_closed(gateway_factory):
    """A stream the gateway ends (here its device is deleted; an expired
    token ends it the same way) queues its last chunk; if the socket never
    takes it, the connection used to stay open for ever."""
    gw = gateway_factory(timeouts_config(writeTimeoutSeconds=1, maxQueuedBytesPerConnection=256 << 20))
    user = uid("sse")
    s = non_reading_client(gw)
    try:
        open_stream(gw, s, user)
        assert gateway_holds(gw, s)
        fill(gw, user, 5)  # queued past the socket buffers
        assert gw.me("DELETE", "/devices/d1", mint_token(user)).status_code == 204
        wait_until(lambda: not gateway_holds(gw, s), "the gateway closes the connection", timeout=20)
        assert slow_consumer_drops(gw) == 0, "ended by the gateway, not dropped for not reading"
    finally:
        s.close()


@pytest.mark.fallback
def test_an_idle_event_stream_outlives_the_write_timeout(gateway_factory):
    """Nothing queued, nothing to time out: an idle stream stays open."""
    gw = gateway_factory(timeouts_config(writeTimeoutSeconds=1))
    user = uid("sse")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        open_stream(gw, s, user)
        s.settimeout(3)  # three write timeouts of quiet: nothing may come, the stream must not end
        assert not closed_by_gateway(s)
        gw.publish(user, "late")
        s.settimeout(10)
        got = b""
        while b"event: change" not in got:
            chunk = s.recv(65536)
            assert chunk, f"stream ended: {got!r}"
            got += chunk
