"""HTTP fallback transports and device registration over HTTP (long-poll
`GET /v1/me/sync`, Server-Sent Events `GET /v1/me/events`,
`PUT /v1/me/devices/{id}`; docs/PROTOCOL.md sections 7-8).

These tests are marked `fallback`; scripts/test runs them (it sets
HERALD_E2E_FALLBACK=1). By hand: `python3 -m pytest Tests/e2e --run-fallback`.
"""

import json
import queue
import signal
import threading
import time

import pytest
from herald_helpers import (FRAME_WAIT, check_error, check_notification, changes_in, mint_token, parse_time, uid,
                            wait_until)

pytestmark = pytest.mark.fallback


def _sync(gw, tok, **params):
    r = gw.me("GET", "/sync", tok, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _check_reset(body):
    assert body.get("reset") is True, body
    assert set(body) >= {"notifications", "next", "cursor", "epoch"}, body
    for n in body["notifications"]:
        check_notification(n)
    return body


def _check_changes(body):
    assert "reset" not in body or body["reset"] is False, body
    assert set(body) >= {"changes", "cursor", "epoch", "hasMore"}, body
    assert isinstance(body["hasMore"], bool)
    changes_in([{"type": "changes", "changes": body["changes"]}])
    return body


# ---------------------------------------------------------------- long-poll sync

def test_sync_reset_then_changes(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user, "a")
    body = _check_reset(_sync(gateway, tok))
    assert [n["appNotificationId"] for n in body["notifications"]] == ["a"]
    assert body["cursor"] == a["seq"] and body["next"] is None
    epoch = body["epoch"]
    b = gateway.publish(user, "b")
    body = _check_changes(_sync(gateway, tok, cursor=a["seq"], epoch=epoch))
    assert [c["seq"] for c in body["changes"]] == [b["seq"]]
    assert body["cursor"] == b["seq"] and body["epoch"] == epoch and body["hasMore"] is False
    # without epoch: the current one
    body = _check_changes(_sync(gateway, tok, cursor=a["seq"]))
    assert [c["seq"] for c in body["changes"]] == [b["seq"]]
    # another epoch, or a cursor ahead: reset
    _check_reset(_sync(gateway, tok, cursor=a["seq"], epoch="other"))
    _check_reset(_sync(gateway, tok, cursor=b["seq"] + 1000, epoch=epoch))


def test_sync_limit_and_has_more(gateway, user):
    tok = mint_token(user)
    first = gateway.publish(user)
    seqs = [gateway.publish(user)["seq"] for _ in range(5)]
    body = _check_changes(_sync(gateway, tok, cursor=first["seq"], limit=2))
    assert [c["seq"] for c in body["changes"]] == seqs[:2] and body["hasMore"] is True
    assert body["cursor"] == seqs[1]
    body = _check_changes(_sync(gateway, tok, cursor=body["cursor"], limit=500))
    assert [c["seq"] for c in body["changes"]] == seqs[2:] and body["hasMore"] is False


def test_sync_reset_pages_through_history(gateway, user):
    tok = mint_token(user)
    for i in range(5):
        gateway.publish(user, f"n{i}")
    body = _check_reset(_sync(gateway, tok, limit=2))
    got = [n["appNotificationId"] for n in body["notifications"]]
    assert got == ["n4", "n3"] and body["next"]
    r = gateway.me("GET", "/notifications", tok, params={"before": body["next"], "limit": 50})
    got += [n["appNotificationId"] for n in r.json()["notifications"]]
    assert got == ["n4", "n3", "n2", "n1", "n0"]


HELD = 'herald_connections{transport="poll"}'


def _wait_held(gw, before: float, out: dict) -> None:
    """Waits until the gateway holds one more poll than `before` (or the poll
    was answered, which the caller then reports)."""
    wait_until(lambda: gw.metric(HELD) > before or out, "the poll to be held")


def test_sync_long_poll_wakes_on_change(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user)
    out = {}
    before = gateway.metric(HELD)

    def poll():
        body = _sync(gateway, tok, cursor=a["seq"], wait=10)
        out["answered"] = time.time()
        out["body"] = body

    t = threading.Thread(target=poll)
    t.start()
    # Held: the gateway says so and it has not answered. (A fixed sleep
    # before publishing raced the poll reaching the gateway.)
    _wait_held(gateway, before, out)
    assert not out, f"answered before any change: {out}"
    published = time.time()
    b = gateway.publish(user)
    t.join(30)
    assert [c["seq"] for c in out["body"]["changes"]] == [b["seq"]]
    # Woken by the change, not by its 10 s deadline (the bound as before:
    # 3 s after the start of the poll, which was 0.7 s before the publish).
    assert out["answered"] - published < 2.3, out["answered"] - published


def test_sync_long_poll_empty_at_deadline(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user)
    t0 = time.time()
    body = _check_changes(_sync(gateway, tok, cursor=a["seq"], wait=1))
    assert body["changes"] == [] and body["cursor"] == a["seq"]
    assert 0.9 <= time.time() - t0 < 3


@pytest.mark.parametrize("params", [{"wait": 61}, {"wait": -1}, {"wait": "x"}, {"limit": 0}, {"limit": 501},
                                    {"cursor": "abc"}])
def test_sync_bad_params_400(gateway, user, params):
    check_error(gateway.me("GET", "/sync", mint_token(user), params=params), 400)


def test_token_in_query_only_on_sync_and_events(gateway, user):
    tok = mint_token(user)
    r = gateway.request("GET", "/v1/me/sync", params={"token": tok})
    assert r.status_code == 200, r.text
    check_error(gateway.request("GET", "/v1/me/counts", params={"token": tok}), 401)
    check_error(gateway.request("GET", "/v1/me/notifications", params={"token": tok}), 401)


def test_bearer_header_wins_over_token_in_query_but_another_scheme_does_not(gateway, user):
    """Found by the API fuzz (openapi.yaml had both "the Authorization header
    wins" and "an Authorization: Bearer header wins"): a browser sends a
    password-protected site's Basic credentials on its own, EventSource
    included, and its ?token= must still count."""
    tok = mint_token(user)
    for auth in ("Basic dXNlcjpwYXNz", "Digest x", ""):
        r = gateway.request("GET", "/v1/me/sync", params={"token": tok}, headers={"Authorization": auth})
        assert r.status_code == 200, (auth, r.text)
    r = gateway.request("GET", "/v1/me/sync", params={"token": tok}, headers={"Authorization": "Bearer not-a-token"})
    check_error(r, 401)
    r = gateway.request("GET", "/v1/me/sync", params={"token": "not-a-token"}, headers={"Authorization": f"Bearer {tok}"})
    assert r.status_code == 200, r.text


def test_sync_respects_visibility(gateway, user):
    tok = mint_token(user)
    gateway.publish(user, "web", targetPlatforms=["web"])
    gateway.publish(user, "all")
    w, _, _ = gateway.connect(user, "phone", platform="ios")
    w.close()
    body = _check_reset(gw_sync := _sync(gateway, tok, deviceId="phone"))
    assert [n["appNotificationId"] for n in body["notifications"]] == ["all"]
    c = gw_sync["cursor"]
    gateway.publish(user, "web2", targetPlatforms=["web"])
    body = _check_changes(_sync(gateway, tok, cursor=c, deviceId="phone"))
    assert body["changes"] == [] and body["cursor"] > c


def test_poll_transport_in_device_listing(gateway, user):
    tok = mint_token(user)
    _sync(gateway, tok, deviceId="poller")
    d = gateway.devices(user)["poller"]
    assert d["transport"] == "poll" and d["connected"] is True


# ---------------------------------------------------------------- SSE

class Sse:
    """A Server-Sent Events reader on http.client, whose socket can be shut
    down at once (requests would wait for the next keep-alive comment)."""

    def __init__(self, gw, tok, headers=None, **params):
        import http.client
        import urllib.parse
        params = {"token": tok, **params}
        self.conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        self.conn.request("GET", "/v1/me/events?" + urllib.parse.urlencode(params),
                          headers={"Accept": "text/event-stream", **(headers or {})})
        self.resp = self.conn.getresponse()
        self.status_code = self.resp.status
        self.headers = {k.lower(): v for k, v in self.resp.getheaders()}
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        ev = {}
        try:
            while True:
                raw = self.resp.readline()
                if not raw:
                    break
                line = raw.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if ev:
                        self.q.put(ev)
                    ev = {}
                elif line.startswith(":"):
                    continue
                else:
                    k, _, v = line.partition(":")
                    v = v[1:] if v.startswith(" ") else v
                    ev[k] = ev[k] + "\n" + v if k in ev else v
        except Exception:
            pass
        self.q.put(None)

    def next(self, timeout=FRAME_WAIT):
        ev = self.q.get(timeout=timeout)
        assert ev is not None, "stream ended"
        return ev

    def close(self):
        import socket
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except Exception:
            pass
        self.conn.close()


def test_sse_reset_then_changes(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user, "a")
    s = Sse(gateway, tok)
    try:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        ev = s.next()
        assert ev["event"] == "reset"
        body = _check_reset(json.loads(ev["data"]))
        assert int(ev["id"]) == body["cursor"] == a["seq"]
        b = gateway.publish(user, "b")
        ev = s.next()
        assert ev["event"] == "change" and int(ev["id"]) == b["seq"]
        assert json.loads(ev["data"]) == {"seq": b["seq"], "op": "upsert", "notification": b["notification"]}
    finally:
        s.close()


def test_sse_resume_with_cursor_and_last_event_id(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user, "a")
    b = gateway.publish(user, "b")
    c = gateway.publish(user, "c")
    s = Sse(gateway, tok, cursor=a["seq"])
    try:
        assert [int(s.next()["id"]) for _ in range(2)] == [b["seq"], c["seq"]]
    finally:
        s.close()
    s = Sse(gateway, tok, headers={"Last-Event-ID": str(b["seq"])}, cursor=a["seq"])
    try:
        ev = s.next()
        assert ev["event"] == "change" and int(ev["id"]) == c["seq"]
    finally:
        s.close()


def test_sse_transport_in_listing(gateway, user):
    s = Sse(gateway, mint_token(user), deviceId="browser")
    try:
        s.next()
        d = gateway.devices(user)["browser"]
        assert d["transport"] == "sse" and d["connected"] is True
    finally:
        s.close()


# ---------------------------------------------------------------- PUT /v1/me/devices

def test_put_device(gateway, user):
    tok = mint_token(user)
    r = gateway.me("PUT", "/devices/tab-1", tok, json={})
    assert r.status_code == 200, r.text
    d = r.json()["device"]
    assert d["deviceId"] == "tab-1" and d["platform"] == "other"
    assert set(d["tags"]) == {f"user:{user}", "platform:other", "device:tab-1"}
    parse_time(d["lastSeenAt"])
    r = gateway.me("PUT", "/devices/tab-1", tok, json={"platform": "web", "tags": ["lang:it"]})
    d = r.json()["device"]
    assert d["platform"] == "web" and set(d["tags"]) == {"lang:it", f"user:{user}", "platform:web", "device:tab-1"}
    r = gateway.me("PUT", "/devices/tab-1", tok, json={"tags": []})
    d = r.json()["device"]
    assert d["platform"] == "web" and set(d["tags"]) == {f"user:{user}", "platform:web", "device:tab-1"}
    assert gateway.devices(user)["tab-1"]["platform"] == "web"


@pytest.mark.parametrize("body", [{"platform": "toaster"}, {"tags": "a"}, {"tags": ["user:x"]},
                                  {"tags": ["bad tag"]}, {"tags": [f"t{i}" for i in range(61)]}, [], {"platform": 1}])
def test_put_device_bad_request(gateway, user, body):
    check_error(gateway.me("PUT", "/devices/tab-1", mint_token(user), json=body), 400)
    assert gateway.devices(user) == {}


def test_put_device_bound_token(gateway, user):
    tok = mint_token(user, dev="a")
    check_error(gateway.me("PUT", "/devices/b", tok, json={}), 403)
    assert gateway.me("PUT", "/devices/a", tok, json={}).status_code == 200


def test_put_device_tags_target(gateway, user):
    tok = mint_token(user)
    gateway.me("PUT", "/devices/tab-1", tok, json={"platform": "web", "tags": ["vip"]})
    gateway.publish(user, "vip", targetTags="vip")
    gateway.publish(user, "not", targetTags="!vip")
    got = {n["appNotificationId"] for n in gateway.me("GET", "/notifications", tok, device="tab-1").json()["notifications"]}
    assert got == {"vip"}


def test_sigterm_answers_held_polls(fresh_gateway):
    gw = fresh_gateway
    user = uid("held")
    tok = mint_token(user)
    a = gw.publish(user)
    out = {}

    def poll():
        r = gw.me("GET", "/sync", tok, params={"cursor": a["seq"], "wait": 30})
        out["status"], out["body"] = r.status_code, r.json()

    t = threading.Thread(target=poll)
    t.start()
    # SIGTERM once the poll is held: earlier, the request could meet a
    # gateway that stopped accepting (a sleep of 0.5 s guessed).
    _wait_held(gw, 0, out)
    assert not out, f"answered before SIGTERM: {out}"
    gw.proc.send_signal(signal.SIGTERM)
    gw.stopped_by_test = True
    t.join(10)
    assert out.get("status") == 200 and out["body"]["changes"] == [], out
    assert gw.proc.wait(10) == 0


def test_sigterm_ends_sse_streams(fresh_gateway):
    gw = fresh_gateway
    user = uid("sse")
    s = Sse(gw, mint_token(user))
    try:
        assert s.next()["event"] == "reset"
        gw.proc.send_signal(signal.SIGTERM)
        gw.stopped_by_test = True
        deadline = time.time() + 10
        ended = False
        while time.time() < deadline:
            try:
                if s.q.get(timeout=max(0.1, deadline - time.time())) is None:
                    ended = True
                    break
            except queue.Empty:
                break
        assert ended, "the SSE stream did not end after SIGTERM"
        assert gw.proc.wait(10) == 0
    finally:
        s.close()
