"""SPEC 5: the WebSocket protocol — hello/welcome, catch-up (changes and reset),
live changes, update, delete, sync, refresh, ping, counts, token expiry and
close codes."""

import json
import time

import pytest

from herald_helpers import (CLOSE_WAIT, RawWebSocket, check_raw_error, mint_token, raw_http, FRAME_WAIT, assert_strictly_increasing, changes_in, check_error,
                            check_notification, epoch_seconds, mint_token, reset_notifications, sign_jwt, uid)


# ---------------------------------------------------------------- hello, welcome, catch-up

def test_hello_without_cursor_resets_then_welcome(gateway, user):
    a = gateway.publish(user, "a")
    b = gateway.publish(user, "b")
    gateway.me("PATCH", f"/notifications/{a['notification']['id']}", mint_token(user), json={"readState": "read"})
    ws, frames, welcome = gateway.connect(user, "d1")
    with ws:
        notes = reset_notifications(frames)
        assert {n["appNotificationId"] for n in notes} == {"a", "b"}
        assert frames[-1]["cursor"] == welcome["cursor"] >= b["seq"]
        assert frames[-1]["epoch"] == welcome["epoch"]
        assert welcome["unread"] == 1
        ws.assert_silent()


def test_hello_new_user_gets_one_empty_final_reset(gateway, user):
    ws, frames, welcome = gateway.connect(user, "d1")
    with ws:
        assert len(frames) == 1
        f = frames[0]
        assert f["type"] == "reset" and f["notifications"] == [] and f["final"] is True
        assert f["cursor"] == welcome["cursor"]
        assert welcome["unread"] == 0


def test_welcome_connection_ids_differ(gateway, user):
    w1, _, a = gateway.connect(user, "d1")
    w2, _, b = gateway.connect(user, "d2")
    assert a["connectionId"] != b["connectionId"]
    assert a["epoch"] == b["epoch"]
    w1.close(); w2.close()


def test_catchup_with_cursor_sends_exactly_the_changes_after_it(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user, "a")
    c = gateway.publish(user, "c")
    ws, _, welcome = gateway.connect(user, "d1")
    ws.close()
    cursor, epoch = welcome["cursor"], welcome["epoch"]
    b = gateway.publish(user, "b")
    pa = gateway.me("PATCH", f"/notifications/{a['notification']['id']}", tok, json={"readState": "read"}).json()
    assert gateway.me("DELETE", f"/notifications/{c['notification']['id']}", tok).status_code == 204
    ws, frames, welcome2 = gateway.connect(user, "d1", cursor=cursor, epoch=epoch)
    with ws:
        assert frames and all(f["type"] == "changes" for f in frames), frames
        changes = changes_in(frames)
        assert [ch["seq"] for ch in changes][:2] == [b["seq"], pa["seq"]]
        assert len(changes) == 3
        assert changes[0]["op"] == "upsert" and changes[0]["notification"] == b["notification"]
        assert changes[1]["op"] == "upsert" and changes[1]["notification"]["readState"] == "read"
        d = changes[2]
        assert d == {"seq": d["seq"], "op": "delete", "id": c["notification"]["id"],
                     "appNotificationId": "c", "reason": "deleted"}
        assert all(ch["seq"] > cursor for ch in changes)
        assert_strictly_increasing([ch["seq"] for ch in changes])
        assert frames[-1]["cursor"] == welcome2["cursor"] == d["seq"]
        assert welcome2["epoch"] == epoch
        assert welcome2["unread"] == 1
        ws.assert_silent()


def test_catchup_up_to_date_sends_nothing(gateway, user):
    out = gateway.publish(user)
    ws, frames, welcome = gateway.connect(user, cursor=out["seq"])
    with ws:
        assert frames == []
        assert welcome["cursor"] == out["seq"]


def test_cursor_without_epoch_is_current_epoch(gateway, user):
    a = gateway.publish(user, "a")
    b = gateway.publish(user, "b")
    ws, frames, welcome = gateway.connect(user, cursor=a["seq"])
    with ws:
        assert [f["type"] for f in frames] == ["changes"]
        assert [c["seq"] for c in changes_in(frames)] == [b["seq"]]


def test_cursor_ahead_of_feed_is_reset(gateway, user):
    out = gateway.publish(user, "a")
    ws, frames, welcome = gateway.connect(user, cursor=out["seq"] + 1000)
    with ws:
        notes = reset_notifications(frames)
        assert [n["appNotificationId"] for n in notes] == ["a"]
        assert welcome["cursor"] == out["seq"]


def test_other_epoch_is_reset(gateway, user):
    a = gateway.publish(user, "a")
    gateway.publish(user, "b")
    ws, frames, welcome = gateway.connect(user, cursor=a["seq"], epoch="not-the-epoch")
    with ws:
        notes = reset_notifications(frames)
        assert {n["appNotificationId"] for n in notes} == {"a", "b"}
        assert welcome["epoch"] != "not-the-epoch"


def test_catchup_batches_of_at_most_500(gateway, user):
    first = gateway.publish(user, "first")
    for i in range(504):
        gateway.publish(user, f"bulk-{i}", payload={})
    ws, frames, welcome = gateway.connect(user, cursor=first["seq"])
    with ws:
        assert len(frames) >= 2
        for f in frames:
            assert f["type"] == "changes" and 1 <= len(f["changes"]) <= 500, (f["type"], len(f.get("changes", [])))
        changes = changes_in(frames)
        assert len(changes) == 504
        assert_strictly_increasing([c["seq"] for c in changes])
        for f in frames:
            assert f["cursor"] == f["changes"][-1]["seq"]
        assert welcome["cursor"] == changes[-1]["seq"]
    ws, frames, welcome = gateway.connect(user)
    with ws:
        notes = reset_notifications(frames)
        assert len(frames) >= 2
        assert len(notes) == 505 and len({n["id"] for n in notes}) == 505
        assert welcome["unread"] == 505


# ---------------------------------------------------------------- live changes and counts

def test_live_change_and_counts(gateway, user):
    ws, _, welcome = gateway.connect(user, "d1")
    with ws:
        out = gateway.publish(user, "live", payload={"t": 1})
        f, _ = ws.recv_until(lambda f: f["type"] in ("change", "changes"))
        c = changes_in([f])[0]
        assert c == {"seq": out["seq"], "op": "upsert", "notification": out["notification"]}
        frames = ws.expect_counts(1, [f]) + ws.drain()
        counts = [x for x in frames if x["type"] == "counts"]
        assert counts and counts[-1]["unread"] == 1, frames
        # read via HTTP: unread drops, counts follows
        r = gateway.me("PATCH", f"/notifications/{out['notification']['id']}", mint_token(user), json={"readState": "read"})
        frames = ws.expect_counts(0, ws.collect_until(changes_in, what="the read change")) + ws.drain()
        assert [c["seq"] for c in changes_in(frames)] == [r.json()["seq"]]
        assert [x["unread"] for x in frames if x["type"] == "counts"][-1:] == [0], frames


def test_seq_increases_across_catchup_and_live(gateway, user):
    a = gateway.publish(user)
    gateway.publish(user)
    ws, frames, welcome = gateway.connect(user, cursor=a["seq"])
    with ws:
        for _ in range(5):
            gateway.publish(user)
        live, _ = ws.expect_changes(5)
        seqs = [c["seq"] for c in changes_in(frames) + live]
        assert_strictly_increasing(seqs)
        assert seqs[0] > a["seq"] and len(seqs) == 6


# ---------------------------------------------------------------- update / delete

def test_update_ack_and_broadcast(gateway, user):
    n = gateway.publish(user)["notification"]
    w1, _, _ = gateway.connect(user, "d1")
    w2, _, _ = gateway.connect(user, "d2")
    with w1, w2:
        ack, before = w1.request({"type": "update", "id": n["id"], "readState": "read", "ifVersion": 1})
        assert ack["type"] == "ack", ack
        m = check_notification(ack["notification"])
        assert m["readState"] == "read" and m["version"] == 2
        seq = ack["seq"]
        # The broadcast may come before or after the ack: wait for the change
        # and the counts on each connection, then look for any extra.
        got = lambda fs: (any(c["seq"] == seq for c in changes_in(fs))
                          and any(x["type"] == "counts" and x["unread"] == 0 for x in fs))
        frames1 = w1.collect_until(got, before, what="the change and counts") + w1.drain()
        frames2 = w2.collect_until(got, what="the change and counts") + w2.drain()
        for frames in (frames1, frames2):
            ch = changes_in(frames)
            assert len(ch) == 1 and ch[0]["seq"] == seq and ch[0]["notification"] == m, frames
            assert [x["unread"] for x in frames if x["type"] == "counts"][-1:] == [0], frames
    assert gateway.get_notification(user, n["id"]) == m


def test_update_noop_acks_current_seq(gateway, user):
    n = gateway.publish(user)["notification"]
    w, _, welcome = gateway.connect(user)
    with w:
        ack, _ = w.request({"type": "update", "id": n["id"], "readState": "unread", "userActionState": "noInteraction"})
        assert ack["type"] == "ack" and ack["seq"] == welcome["cursor"]
        assert ack["notification"]["version"] == 1
        w.assert_silent()


def test_update_without_state_is_bad_request(gateway, user):
    n = gateway.publish(user)["notification"]
    w, _, _ = gateway.connect(user)
    with w:
        err, _ = w.request({"type": "update", "id": n["id"]})
        assert err["type"] == "error" and err["code"] == "bad_request" and isinstance(err["message"], str)
        err, _ = w.request({"type": "update", "id": n["id"], "readState": "bogus"})
        assert err["type"] == "error" and err["code"] == "bad_request"
        w.ping()   # the connection is kept
    assert gateway.get_notification(user, n["id"]) == n


def test_update_if_version_mismatch(gateway, user):
    n = gateway.publish(user)["notification"]
    w1, _, _ = gateway.connect(user, "d1")
    w2, _, _ = gateway.connect(user, "d2")
    with w1, w2:
        ref = w1.ref()
        err, _ = w1.request({"type": "update", "ref": ref, "id": n["id"], "userActionState": "dismissed", "ifVersion": 5})
        assert err == {"type": "error", "ref": ref, "code": "precondition_failed", "message": err["message"]}
        w1.ping()
        w2.assert_silent()
    assert gateway.get_notification(user, n["id"]) == n


def test_update_unknown_or_foreign_id_is_not_found(gateway, user):
    other = gateway.publish(uid("other"))["notification"]
    hidden = gateway.publish(user, targetPlatforms=["android"])["notification"]
    w, _, _ = gateway.connect(user, "d1", platform="web")
    with w:
        for nid in ("n_nope", other["id"], hidden["id"]):
            err, _ = w.request({"type": "update", "id": nid, "readState": "read"})
            assert err["type"] == "error" and err["code"] == "not_found", (nid, err)
            err, _ = w.request({"type": "delete", "id": nid})
            assert err["type"] == "error" and err["code"] == "not_found", (nid, err)
        w.ping()
    assert gateway.get_notification(user, hidden["id"]) == hidden


def test_delete_message(gateway, user):
    n = gateway.publish(user, "gone")["notification"]
    w1, _, _ = gateway.connect(user, "d1")
    w2, _, _ = gateway.connect(user, "d2")
    with w1, w2:
        ack, before = w1.request({"type": "delete", "id": n["id"]})
        assert ack["type"] == "ack" and isinstance(ack["seq"], int)
        got = lambda fs: any(c["seq"] == ack["seq"] for c in changes_in(fs))
        for frames in (w1.collect_until(got, before, what="the delete") + w1.drain(),
                       w2.collect_until(got, what="the delete") + w2.drain()):
            ch = changes_in(frames)
            assert ch == [{"seq": ack["seq"], "op": "delete", "id": n["id"], "appNotificationId": "gone",
                           "reason": "deleted"}], frames
        err, _ = w1.request({"type": "delete", "id": n["id"]})
        assert err["type"] == "error" and err["code"] == "not_found"
    assert gateway.get_notification(user, n["id"]) is None


# ---------------------------------------------------------------- sync / refresh / ping

def test_sync_resends_changes_after_cursor(gateway, user):
    a = gateway.publish(user, "a")
    w, _, welcome = gateway.connect(user)
    with w:
        gateway.publish(user, "b")
        gateway.publish(user, "c")
        live, frames = w.expect_changes(2)
        w.expect_counts(3, frames)   # a, b and c unread: read it before the sync
        w.drain()
        ref = w.ref()
        w.send({"type": "sync", "ref": ref, "cursor": a["seq"], "epoch": welcome["epoch"]})
        ack, frames = w.expect("ack", ref=ref)
        assert all(f["type"] == "changes" for f in frames), frames
        resent = changes_in(frames)
        assert [c["seq"] for c in resent] == [c["seq"] for c in live]
        assert ack["cursor"] == live[-1]["seq"]
        # with another epoch: a reset, then the ack
        ref = w.ref()
        w.send({"type": "sync", "ref": ref, "cursor": a["seq"], "epoch": "bogus"})
        ack, frames = w.expect("ack", ref=ref)
        notes = reset_notifications(frames)
        assert {n["appNotificationId"] for n in notes} == {"a", "b", "c"}
        assert ack["cursor"] == live[-1]["seq"]


def test_refresh_token(gateway, user):
    w, _, _ = gateway.connect(user, "d1", token=mint_token(user, dev="d1"))
    with w:
        ack, _ = w.request({"type": "refresh", "token": mint_token(user, dev="d1", ttl=7200)})
        assert ack["type"] == "ack", ack
        ack, _ = w.request({"type": "refresh", "token": mint_token(user)})   # unbound, same user
        assert ack["type"] == "ack", ack
        cases = [
            ("garbage", "unauthorized"),
            (mint_token(user, secret="wrong"), "unauthorized"),
            (mint_token(user, exp=int(time.time()) - 5, iat=int(time.time()) - 100), "unauthorized"),
            (mint_token(uid("someone-else")), "forbidden"),
            (mint_token(user, app="app.two"), "forbidden"),
            (mint_token(user, dev="d2"), "forbidden"),
        ]
        for tok, code in cases:
            err, _ = w.request({"type": "refresh", "token": tok})
            assert err["type"] == "error" and err["code"] == code, (code, err)
        w.ping()
        # still delivering
        gateway.publish(user)
        w.expect_changes(1)


def test_ping_pong(gateway, user):
    w, _, _ = gateway.connect(user)
    with w:
        w.send({"type": "ping", "ref": "c5"})
        f = w.recv()
        assert f == {"type": "pong", "ref": "c5"}


# ---------------------------------------------------------------- token expiry

def test_token_expiring_then_close_4001(gateway, user):
    exp = int(time.time()) + 4
    w, _, welcome = gateway.connect(user, token=mint_token(user, exp=exp))
    # Sent at once after the welcome (less than 60 s left), before the close.
    f, _ = w.expect("tokenExpiring")
    assert f == {"type": "tokenExpiring", "expiresAt": f["expiresAt"]}
    assert abs(epoch_seconds(f["expiresAt"]) - exp) < 0.002
    code, _ = w.expect_close(timeout=max(0, exp - time.time()) + CLOSE_WAIT)
    closed = time.time()
    assert code == 4001
    assert closed >= exp - 0.5, "closed before the token's exp"
    assert closed <= exp + 3, f"closed {closed - exp:.1f} s after the token's exp"


def test_token_expiring_comes_60s_before_exp(gateway, user):
    exp = int(time.time()) + 63
    w, _, _ = gateway.connect(user, token=mint_token(user, exp=exp))
    with w:
        # Silent until a second before the warning is due; if connecting took
        # that long already, there is no such span to watch (watching 0.1 s
        # anyway, as before, could catch the warning itself).
        quiet = exp - 61 - time.time()
        if quiet > 0:
            w.assert_silent(quiet)
        f, _ = w.expect("tokenExpiring", timeout=max(0, exp - 60 - time.time()) + FRAME_WAIT)
        arrived = time.time()
        assert abs(epoch_seconds(f["expiresAt"]) - exp) < 0.002
        assert arrived >= exp - 61
        assert arrived <= exp - 58, f"tokenExpiring came {arrived - (exp - 60):.1f} s after it was due"


def test_refresh_extends_the_connection(gateway, user):
    # Far enough ahead that connecting and refreshing end before it even on a
    # slow machine (else the old token's expiry closes first).
    exp = int(time.time()) + 5
    w, _, _ = gateway.connect(user, "d1", token=mint_token(user, exp=exp))
    with w:
        w.expect("tokenExpiring")
        ack, _ = w.request({"type": "refresh", "token": mint_token(user, ttl=3600)})
        assert ack["type"] == "ack", ack
        assert time.time() < exp, "the refresh came after the old token's exp: nothing left to test"
        # Past the old exp: nothing to wait for, the old expiry must not close it.
        time.sleep(max(0, exp - time.time()) + 1.5)
        w.ping()
        gateway.publish(user)
        w.expect_changes(1)


# ---------------------------------------------------------------- close codes

def _hello_close(gateway, hello, timeout=CLOSE_WAIT):
    w = gateway.ws()
    w.send(hello)
    return w.expect_close(timeout)


@pytest.mark.parametrize("make", [
    lambda u: "garbage",
    lambda u: mint_token(u, secret="wrong"),
    lambda u: mint_token(u, exp=int(time.time()) - 2, iat=int(time.time()) - 60),
    lambda u: mint_token(u, nbf=int(time.time()) + 120),
    lambda u: sign_jwt({"alg": "none", "typ": "JWT"},
                       {"app": "app.one", "sub": u, "iat": int(time.time()), "exp": int(time.time()) + 600}, None),
    lambda u: mint_token(u, header={"alg": "RS256", "typ": "JWT"}),
    lambda u: mint_token(u, app="no.such.app"),
], ids=["garbage", "forged", "expired", "nbf", "alg-none", "rs256", "unknown-app"])
def test_hello_bad_token_closes_4001(gateway, user, make):
    code, frames = _hello_close(gateway, {"type": "hello", "token": make(user), "deviceId": "d1"})
    assert code == 4001, frames
    assert all(f["type"] == "error" for f in frames), frames


def test_hello_without_token_closes_4001(gateway):
    code, frames = _hello_close(gateway, {"type": "hello", "deviceId": "d1"})
    assert code == 4001, frames


def test_first_frame_not_hello_closes_4001(gateway, user):
    code, _ = _hello_close(gateway, {"type": "ping", "ref": "p"})
    assert code == 4001
    code, _ = _hello_close(gateway, {"type": "update", "id": "n_x", "readState": "read"})
    assert code == 4001


@pytest.mark.slow
def test_no_hello_within_10s_closes_4001(gateway):
    t0 = time.time()   # before the gateway can start its 10 s
    w = gateway.ws()
    t1 = time.time()
    code, frames = w.expect_close(timeout=CLOSE_WAIT + 10)
    closed = time.time()
    assert code == 4001, frames
    assert closed - t0 >= 9, "closed before 10 s"
    assert closed - t1 <= 14, f"closed {closed - t1:.1f} s after connecting"


@pytest.mark.parametrize("hello", [
    {"deviceId": None},
    {"deviceId": "bad device!"},
    {"deviceId": "x" * 129},
    {"deviceId": 5},
    {"deviceId": "d1", "platform": "toaster"},
    {"deviceId": "d1", "platform": 3},
    {"deviceId": "d1", "tags": "lang:it"},
    {"deviceId": "d1", "tags": ["bad tag!"]},
    {"deviceId": "d1", "tags": ["x" * 161]},
    {"deviceId": "d1", "tags": [f"t{i}" for i in range(61)]},
    {"deviceId": "d1", "tags": ["user:someone"]},
    {"deviceId": "d1", "tags": ["platform:web"]},
    {"deviceId": "d1", "tags": ["device:d2"]},
], ids=["no-device", "bad-device", "long-device", "int-device", "bad-platform", "int-platform", "tags-string",
        "bad-tag", "long-tag", "61-tags", "user-prefix", "platform-prefix", "device-prefix"])
def test_malformed_hello_bad_request_and_1008(gateway, user, hello):
    msg = {"type": "hello", "token": mint_token(user)}
    msg.update({k: v for k, v in hello.items() if v is not None})
    code, frames = _hello_close(gateway, msg)
    assert any(f["type"] == "error" and f.get("code") == "bad_request" for f in frames), frames
    assert code == 1008
    assert gateway.devices(user) == {}, "a refused hello registers nothing"


def test_bound_token_other_device_closes_4003(gateway, user):
    code, frames = _hello_close(gateway, {"type": "hello", "token": mint_token(user, dev="phone-1"), "deviceId": "phone-2"})
    assert code == 4003, frames
    w, _, _ = gateway.connect(user, "phone-1", token=mint_token(user, dev="phone-1"))
    w.close()


def test_binary_frame_closes_1003(gateway, user):
    w, _, _ = gateway.connect(user)
    w.send_raw(json.dumps({"type": "ping", "ref": "p"}).encode(), text=False)
    code, _ = w.expect_close()
    assert code == 1003


def test_invalid_utf8_closes_1007(gateway, user):
    w, _, _ = gateway.connect(user)
    w.send_raw(b'{"type":"ping","ref":"\xff\xfe"}', text=True)
    code, _ = w.expect_close()
    assert code == 1007


def test_a_close_reason_quoting_multibyte_input_is_cut_at_a_character(gateway, user):
    """The reason quotes the client's field name; 120 bytes of it used to end
    inside an `é`, which crashed the gateway."""
    for pad in ("", "x"):
        code, frames = _hello_close(gateway, {"type": "hello", "token": mint_token(user), "deviceId": "d1",
                                              pad + "é" * 70: 1})
        assert code == 1008, frames
        assert "unknown field" in frames[-1]["message"], frames
    assert gateway.request("GET", "/healthz").status_code == 200


def test_the_largest_frame_length_after_a_fragment_closes_1009(gateway, user):
    """2^63 - 1 bytes announced behind one byte of a fragmented message:
    refused as too big, where summing the two used to crash the gateway."""
    w, _, _ = gateway.connect(user)
    mask = bytes([1, 2, 3, 4])
    first = bytes([0x01, 0x81]) + mask + bytes([ord("{") ^ mask[0]])
    largest = bytes([0x80, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]) + mask
    w.conn.socket.sendall(first + largest)
    code, _ = w.expect_close()
    assert code == 1009
    assert gateway.request("GET", "/healthz").status_code == 200


def _code(c: int) -> bytes:
    return c.to_bytes(2, "big")


@pytest.mark.parametrize("body, answer", [
    (b"", 1000), (_code(1000), 1000), (_code(1001) + "bye, ünd 😀".encode(), 1000), (_code(1011), 1000),
    (_code(3000), 1000), (_code(4999), 1000),
    # RFC 6455 5.5.1: a body is a 2-byte code, then the reason
    (b"\x03", 1002),
    # 7.4: codes that are not sent (reserved, unassigned, undefined)
    *[(_code(c), 1002) for c in (0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535)],
    # 8.1: the reason is UTF-8
    (_code(1000) + b"\xff\xfe", 1007), (_code(1000) + b"\xed\xa0\x80", 1007), (_code(1000) + "é".encode()[:1], 1007),
])
def test_a_clients_close_frame_is_read(gateway, user, body, answer):
    """The close frame's body decides the answer: a valid one (or none) is
    answered with 1000, a 1-byte body or a code not for the wire with 1002,
    a reason that is not UTF-8 with 1007. They all used to get 1000."""
    w = RawWebSocket(gateway)
    w.hello(mint_token(user))
    w.send(w.frame(0x8, body))
    code, frames = w.expect_close(answer=False)
    assert code == answer, frames
    assert gateway.request("GET", "/healthz").status_code == 200


@pytest.mark.parametrize("opcode", [0x9, 0xA])
def test_pings_and_unsolicited_pongs_count_against_the_message_rate(gateway, user, opcode):
    """1,000 WebSocket pings used to get 1,000 pongs. Pings, and pongs that
    answer no ping of the gateway's, take from the budget of messages (50 a
    second, bursts of 100, the hello included): the 100th in a burst closes
    4008, and only the pings before it are answered, in order."""
    opened = time.monotonic()
    w = RawWebSocket(gateway)
    w.hello(mint_token(user))
    w.send(b"".join(w.frame(opcode, i.to_bytes(4, "big")) for i in range(1000)))
    code, frames = w.expect_close()
    elapsed = time.monotonic() - opened
    assert code == 4008, frames
    pongs = [int.from_bytes(p, "big") for op, p in frames if op == 0xA]
    if opcode == 0xA:
        assert pongs == [], "a pong is not answered"
        return
    assert pongs == list(range(len(pongs))), pongs
    # 99 after the hello, plus what refilled at 50 a second since the connection opened
    assert 99 <= len(pongs) <= 99 + 50 * elapsed + 1, (len(pongs), elapsed)


def _send_quietly(w, data):
    try:
        w.send_raw(data)
    except Exception:
        pass   # the gateway may close while we are still sending


def test_message_over_256k_closes_1009(gateway, user):
    w, _, _ = gateway.connect(user)
    big = json.dumps({"type": "ping", "ref": "p", "pad": "x" * (300 * 1024)})
    _send_quietly(w, big)
    code, _ = w.expect_close()
    assert code == 1009


def test_fragmented_message_over_256k_closes_1009(gateway, user):
    w, _, _ = gateway.connect(user)
    big = json.dumps({"type": "ping", "ref": "p", "pad": "x" * (300 * 1024)})
    chunks = [big[i:i + 64 * 1024] for i in range(0, len(big), 64 * 1024)]
    assert all(len(c) < 256 * 1024 for c in chunks)
    _send_quietly(w, iter(chunks))
    code, _ = w.expect_close()
    assert code == 1009


def _message_of_size(n, **fields):
    msg = {"type": "update", "ref": "big", **fields, "pad": ""}
    msg["pad"] = "x" * (n - len(json.dumps(msg, separators=(",", ":")).encode()))
    data = json.dumps(msg, separators=(",", ":"))
    assert len(data.encode()) == n
    return data


def test_message_of_exactly_256k_is_fine(gateway, user):
    n = gateway.publish(user)["notification"]
    w, _, _ = gateway.connect(user)
    with w:
        data = _message_of_size(256 * 1024, id=n["id"], readState="read")
        w.send_raw(iter([data[i:i + 50000] for i in range(0, len(data), 50000)]))
        f, _ = w.recv_until(lambda f: f.get("ref") == "big")
        assert f["type"] in ("ack", "error"), f
        w.ping()


def test_message_of_256k_plus_one_closes_1009(gateway, user):
    n = gateway.publish(user)["notification"]
    w, _, _ = gateway.connect(user)
    _send_quietly(w, _message_of_size(256 * 1024 + 1, id=n["id"], readState="read"))
    code, _ = w.expect_close()
    assert code == 1009
    assert gateway.get_notification(user, n["id"]) == n


def test_deleting_the_device_closes_4003(gateway, user):
    tok = mint_token(user)
    w, _, _ = gateway.connect(user, "phone-1")
    r = gateway.me("DELETE", "/devices/phone-1", tok)
    assert r.status_code == 204, r.text
    code, _ = w.expect_close()
    assert code == 4003
    assert "phone-1" not in gateway.devices(user)
    check_error(gateway.me("DELETE", "/devices/phone-1", tok), 404)


def test_gateway_survives_protocol_abuse(gateway, user):
    n = gateway.publish(user)["notification"]
    w, _, _ = gateway.connect(user)
    with w:
        for bad in ('{"type":"update","ref":"x","id":5,"readState":"read"}',
                    '{"type":"delete","ref":"y"}',
                    '{"type":"sync","ref":"z","cursor":"abc"}'):
            w.send_raw(bad)
            f, _ = w.recv_until(lambda f: f["type"] in ("error", "ack"))
            assert f["type"] == "error" and f["code"] == "bad_request", f
        w.ping()
    assert gateway.get_notification(user, n["id"]) == n
    assert gateway.request("GET", "/healthz").status_code == 200


@pytest.mark.parametrize("subprotocol", ["herald-listen", "herald-http", "chat"])
def test_upgrade_naming_a_subprotocol_gets_none(fresh_gateway, subprotocol, user):
    """Herald speaks no subprotocol: an upgrade that asks for one (under lws,
    the names of its internal protocols once bound the connection to them)
    is an ordinary Herald WebSocket, with no Sec-WebSocket-Protocol chosen."""
    from websockets.sync.client import connect
    from websockets.exceptions import InvalidHandshake
    try:
        c = connect(fresh_gateway.ws_url, subprotocols=[subprotocol], open_timeout=10)
    except InvalidHandshake:
        # Clients may refuse a server that chose none of the offered ones.
        return
    with c:
        assert c.subprotocol is None
        c.send(json.dumps({"type": "hello", "token": mint_token(user), "deviceId": "d1"}))
        assert [json.loads(c.recv(timeout=10))["type"] for _ in range(2)] == ["reset", "welcome"]


@pytest.mark.parametrize("headers, why", [
    ({"Upgrade": "websocket", "Connection": "keep-alive", "Sec-WebSocket-Version": "13",
      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, "Connection: Upgrade"),
    ({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "8",
      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, "version"),
    ({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
      "Sec-WebSocket-Key": "c2hvcnQ="}, "Sec-WebSocket-Key"),
    ({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}, "Sec-WebSocket-Key"),
])
def test_bad_handshake_is_400(gateway, headers, why):
    r = raw_http(gateway, "GET", "/v1/ws", headers=headers)
    body = check_raw_error(r, 400, "bad_request")
    assert why in body["error"]["message"]
    if why == "version":
        assert r.headers.get("sec-websocket-version") == "13"


@pytest.mark.parametrize("version, host, why", [("HTTP/1.0", "x", "HTTP/1.1"), ("HTTP/1.0", None, "HTTP/1.1"),
                                                ("HTTP/1.1", None, "Host")])
def test_an_upgrade_over_http_1_0_or_without_host_is_400(gateway, version, host, why):
    """RFC 6455 4.2.1 items 1-2: the handshake is an HTTP/1.1 GET with Host."""
    r = raw_http(gateway, "GET", "/v1/ws", version=version, headers={
        "Host": host, "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    body = check_raw_error(r, 400, "bad_request")
    assert why in body["error"]["message"], body


def test_handshake_answer_follows_rfc6455(gateway):
    """The RFC's own example key and accept value (section 1.3)."""
    r = raw_http(gateway, "GET", "/v1/ws?x=1", headers={
        "Upgrade": "WebSocket", "Connection": "keep-alive, Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert r.status_code == 101
    assert r.headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert r.headers["upgrade"].lower() == "websocket"
