"""The key invariant (SPEC 1, 5): a device that resumes with its cursor while
publishes keep coming gets every change after its cursor exactly once on that
connection, in strictly increasing seq order — nothing lost in the hand-over
from catch-up to live, nothing repeated."""

import random
import threading
import time

import pytest

from herald_helpers import Closed, Gateway, assert_strictly_increasing, changes_in, check_welcome, mint_token, uid

BURST_THREADS = 3
BURST_EACH = 20


def _publisher(gw: Gateway, user: str, prefix: str, count: int, start: threading.Event,
               published: list, errors: list, jitter: float) -> None:
    start.wait()
    try:
        for i in range(count):
            anid = f"{prefix}-{i}"
            r = gw.publish_raw(user, {"appNotificationId": anid, "payload": {"i": i}})
            if r.status_code != 201:
                errors.append(f"{anid}: {r.status_code} {r.text[:200]}")
                continue
            published.append((r.json()["seq"], anid))
            if jitter:
                time.sleep(random.uniform(0, jitter))
    except Exception as e:  # noqa: BLE001 - reported by the test
        errors.append(repr(e))


@pytest.mark.parametrize("round_", range(6))
def test_reconnect_during_publish_burst(gateway, round_):
    rnd = random.Random(round_)
    user = uid("race")
    device = "racer"
    token = mint_token(user, dev=device)
    # some history, then the device syncs and goes away
    for i in range(3):
        gateway.publish(user, f"old-{i}")
    ws, _, welcome = gateway.connect(user, device, token=token)
    cursor, epoch = welcome["cursor"], welcome["epoch"]
    ws.close()
    # changes while it is away
    published: list = []
    for i in range(3 + round_):
        out = gateway.publish(user, f"away-{i}")
        published.append((out["seq"], f"away-{i}"))

    start = threading.Event()
    errors: list = []
    threads = [threading.Thread(target=_publisher,
                                args=(gateway, user, f"burst{t}", BURST_EACH, start, published, errors,
                                      0.004 if round_ % 2 else 0.0))
               for t in range(BURST_THREADS)]
    for t in threads:
        t.start()
    start.set()
    time.sleep(rnd.uniform(0, 0.03))

    w = gateway.ws()
    frames = []
    try:
        w.send({"type": "hello", "token": token, "deviceId": device, "cursor": cursor, "epoch": epoch})
        marker_sent = False
        marker_seq = None
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"marker not seen; frames so far: {len(frames)}"
            if not marker_sent and not any(t.is_alive() for t in threads):
                out = gateway.publish(user, "marker")
                marker_seq = out["seq"]
                marker_sent = True
            try:
                f = w.recv(0.2)
            except TimeoutError:
                continue
            except Closed as e:
                raise AssertionError(f"connection closed {e.code} {e.reason}")
            frames.append(f)
            if marker_sent and any(c["op"] == "upsert" and c["notification"]["appNotificationId"] == "marker"
                                   for c in changes_in([f])):
                break
    finally:
        w.close()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "publishers still running"
    assert not errors, errors

    types = [f["type"] for f in frames]
    assert "welcome" in types, types
    wi = types.index("welcome")
    check_welcome(frames[wi])
    assert "reset" not in types, "a usable cursor of the current epoch must be answered with changes, not a reset"
    assert all(t in ("changes",) for t in types[:wi]), types[:wi]
    assert set(types[wi + 1:]) <= {"change", "changes", "counts"}, types

    changes = changes_in(frames)
    seqs = [c["seq"] for c in changes]
    dupes = sorted({s for s in seqs if seqs.count(s) > 1})
    assert not dupes, f"duplicate seqs on one connection: {dupes}"
    for a, b in zip(seqs, seqs[1:]):
        assert b > a, f"seq went from {a} to {b}"
    assert all(s > cursor for s in seqs), f"changes at or before the cursor {cursor}"
    assert all(c["op"] == "upsert" for c in changes)

    got = [c["notification"]["appNotificationId"] for c in changes if c["notification"]["appNotificationId"] != "marker"]
    want = {anid for _, anid in published}
    assert len(want) == len(published) == 3 + round_ + BURST_THREADS * BURST_EACH
    missing = want - set(got)
    extra = set(got) - want
    assert not missing, f"lost {len(missing)} changes: {sorted(missing)[:10]}"
    assert not extra, f"unexpected changes: {sorted(extra)[:10]}"
    assert len(got) == len(set(got)), "an appNotificationId arrived twice"
    # the seq of each change is the one its publish answered
    by_anid = {anid: seq for seq, anid in published}
    for c in changes:
        a = c["notification"]["appNotificationId"]
        if a != "marker":
            assert c["seq"] == by_anid[a], (a, c["seq"], by_anid[a])
    assert seqs[-1] == marker_seq
    # the welcome's cursor is where the catch-up ended
    catchup = changes_in(frames[:wi])
    if catchup:
        assert frames[wi]["cursor"] == catchup[-1]["seq"]
    else:
        assert frames[wi]["cursor"] >= cursor
    live = changes_in(frames[wi + 1:])
    assert all(c["seq"] > frames[wi]["cursor"] for c in live), \
        f"live changes at or before the welcome's cursor {frames[wi]['cursor']}: {[c['seq'] for c in live][:5]}"


@pytest.mark.parametrize("round_", range(3))
def test_reconnect_during_mixed_writes(gateway, round_):
    """Publishes, updates and deletes race a resume: the seqs received equal
    exactly the seqs the writes after the cursor answered (each notification
    changes at most once after the cursor, so no change can stand for another)."""
    user = uid("mixed")
    tok = mint_token(user)
    old = [gateway.publish(user, f"old-{i}")["notification"] for i in range(30)]
    ws, _, welcome = gateway.connect(user, "racer")
    cursor, epoch = welcome["cursor"], welcome["epoch"]
    ws.close()

    answered: list = []   # (seq, what)
    errors: list = []
    start = threading.Event()

    def publisher():
        start.wait()
        for i in range(25):
            r = gateway.publish_raw(user, {"appNotificationId": f"new-{i}", "payload": {}})
            (answered.append((r.json()["seq"], f"new-{i}")) if r.status_code == 201
             else errors.append(r.text))

    def updater():
        start.wait()
        for n in old[:15]:
            r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"})
            (answered.append((r.json()["seq"], n["appNotificationId"])) if r.status_code == 200
             else errors.append(r.text))

    def deleter():
        start.wait()
        for n in old[15:]:
            r = gateway.me("DELETE", f"/notifications/{n['id']}", tok)
            if r.status_code != 204:
                errors.append(r.text)

    threads = [threading.Thread(target=f) for f in (publisher, updater, deleter)]
    for t in threads:
        t.start()
    start.set()
    time.sleep(random.Random(round_).uniform(0, 0.02))
    w = gateway.ws()
    frames = []
    try:
        w.send({"type": "hello", "token": tok, "deviceId": "racer", "cursor": cursor, "epoch": epoch})
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "writers still running"
        assert not errors, errors
        marker = gateway.publish(user, "marker")["seq"]
        deadline = time.monotonic() + 60
        while not any(c["seq"] == marker for c in changes_in(frames)):
            assert time.monotonic() < deadline, "marker not seen"
            try:
                frames.append(w.recv(0.5))
            except TimeoutError:
                pass
    finally:
        w.close()
    changes = changes_in(frames)
    seqs = [c["seq"] for c in changes]
    assert_strictly_increasing(seqs)
    assert all(s > cursor for s in seqs)
    got_deletes = {c["appNotificationId"] for c in changes if c["op"] == "delete"}
    assert got_deletes == {n["appNotificationId"] for n in old[15:]}
    assert all(c["reason"] == "deleted" for c in changes if c["op"] == "delete")
    upserts = {c["seq"]: c["notification"]["appNotificationId"] for c in changes if c["op"] == "upsert"}
    want = dict(answered)
    want[marker] = "marker"
    assert upserts == want, (f"missing {sorted(set(want) - set(upserts))[:10]}, "
                             f"unexpected {sorted(set(upserts) - set(want))[:10]}")
    assert len(seqs) == len(want) + 15
