"""Catch-ups of users with many or large notifications, on every transport
(issue 10, defect 0): the device receives all of it, in seq order, once,
and a WebSocket gets `welcome` only after the whole catch-up.

Before the one Subscription, a WebSocket catch-up was queued whole: past
the 4 MiB per-connection queue the gateway closed 4008 "slow consumer", yet
still sent `welcome` at the feed's head first, so a client that kept that
cursor silently lost what was skipped."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from herald_helpers import (CONFIG, Gateway, assert_strictly_increasing, changes_in, mint_token,
                            reset_notifications, uid)
from test_fallback import Sse

CATCH_UP_WAIT = 120.0   # seconds for a whole catch-up of tens of MB on a loaded 2-core machine


def publish_many(gw, user: str, n: int, payload_bytes: int) -> list[int]:
    """Publishes `n` notifications with a `payload_bytes` body string; answers their seqs."""
    body = "x" * payload_bytes

    def one(i: int) -> int:
        r = gw.publish_raw(user, {"appNotificationId": f"n{i}", "payload": {"i": i, "body": body}})
        assert r.status_code == 201, r.text[:300]
        return r.json()["seq"]

    with ThreadPoolExecutor(8) as pool:
        return sorted(pool.map(one, range(n)))


@pytest.fixture(scope="module")
def gateway(herald_bin, tmp_path_factory):
    """On SQLite, the default store: catch-up pages are read by the reader
    thread on its own connection while the engine commits."""
    d = tmp_path_factory.mktemp("heavy")
    gw = Gateway(herald_bin, d, CONFIG, store=f"sqlite:{d}/herald.db", extra_args=["--durability", "off"]).start()
    yield gw
    assert gw.terminate(10.0) == 0, gw.stderr_tail()


@pytest.fixture(scope="module")
def users(gateway):
    """Three heavy users of one gateway, with the seqs of their notifications."""
    out = {}
    for name, n, size in [("many", 10_000, 100), ("large", 100, 60_000), ("max", 1_000, 65_500)]:
        u = uid(name)
        out[name] = (u, publish_many(gateway, u, n, size))
    return out


def ws_catch_up(gw, user: str, **hello) -> tuple[object, list[dict], dict]:
    """Says hello and reads until `welcome`, however long the catch-up is;
    answers (client, catch-up frames, welcome). Fails on a close."""
    c = gw.ws()
    frames, welcome = c.hello(mint_token(user), uid("d"), timeout=CATCH_UP_WAIT, **hello)
    return c, frames, welcome


def assert_frames_bounded(frames: list[dict]) -> None:
    """At most 500 items per frame and, past the first item, about 512 KiB."""
    for f in frames:
        items = f.get("notifications", f.get("changes", []))
        assert len(items) <= 500, f"{f['type']} frame with {len(items)} items"
        size = len(json.dumps(f, separators=(",", ":")))
        assert size <= 512 * 1024 + 70_000 + 1024, f"{f['type']} frame of {size} bytes"


@pytest.mark.parametrize("name", ["many", "large", "max"])
def test_websocket_reset_brings_everything(gateway, users, name):
    user, seqs = users[name]
    c, frames, welcome = ws_catch_up(gateway, user)
    with c:
        assert_frames_bounded(frames)
        resets = [f for f in frames if f["type"] == "reset"]
        got = reset_notifications(resets)
        assert len(got) == len(seqs) and len({n["id"] for n in got}) == len(seqs)
        assert {n["appNotificationId"] for n in got} == {f"n{i}" for i in range(len(seqs))}
        assert all(f["cursor"] == seqs[-1] for f in resets), "every reset frame carries the reset's position"
        assert welcome["cursor"] == seqs[-1] and welcome["unread"] == len(seqs)
        c.ping()   # still open: no slow-consumer close


@pytest.mark.parametrize("name", ["many", "large", "max"])
def test_websocket_resume_brings_every_change(gateway, users, name):
    user, seqs = users[name]
    c, frames, welcome = ws_catch_up(gateway, user, cursor=seqs[0])
    with c:
        assert_frames_bounded(frames)
        assert all(f["type"] == "changes" for f in frames)
        got = [ch["seq"] for ch in changes_in(frames)]
        assert got == seqs[1:], f"missing or repeated: {len(got)} of {len(seqs) - 1}"
        assert welcome["cursor"] == seqs[-1]
        c.ping()


def test_websocket_catch_up_merges_changes_made_meanwhile(gateway):
    """Publishes land while a slow client is still catching up: it gets
    every change once, in order, and welcome only after all of them."""
    user = uid("merge")
    seqs = publish_many(gateway, user, 300, 65_500)
    c = gateway.ws()
    with c:
        c.send({"type": "hello", "token": mint_token(user), "deviceId": uid("d"), "cursor": 0})
        first = c.recv(10)   # the catch-up has begun; the client reads nothing more for a while
        assert first["type"] == "changes"
        extra = [gateway.publish(user, f"late-{i}", {"k": i})["seq"] for i in range(40)]
        frames = [first]
        while True:
            f = c.recv(CATCH_UP_WAIT)
            if f["type"] == "welcome":
                welcome = f
                break
            frames.append(f)
        caught_up = [ch["seq"] for ch in changes_in(frames)]
        missing = [x for x in extra if x not in caught_up]
        live = [ch["seq"] for ch in c.expect_changes(len(missing), timeout=10)[0]] if missing else []
        everything = caught_up + live
        assert_strictly_increasing(everything)
        assert everything == seqs + extra, "every change exactly once, in order, across catch-up and live"
        assert welcome["cursor"] >= max(caught_up)


def test_a_read_all_over_large_notifications_reaches_live_devices_whole(gateway):
    """One commit of about 5 MiB for one user (a read-all over 80 unread
    notifications of 60 KB), past the 4 MiB a connection may queue: the
    user's live WebSocket and event stream each get every change, in order,
    once, and stay open. Both used to be closed as slow consumers however
    fast they read: the commit was queued whole before anything was sent."""
    user = uid("readall")
    tok = mint_token(user)
    publish_many(gateway, user, 80, 60_000)
    ws, _, welcome = ws_catch_up(gateway, user)
    sse = Sse(gateway, tok, cursor=welcome["cursor"], epoch=welcome["epoch"])
    deferred = gateway.metric("herald_deferred_bursts_total")
    try:
        r = gateway.me("POST", "/notifications/read-all", tok)
        assert r.status_code == 200, r.text
        want = list(range(welcome["cursor"] + 1, r.json()["seq"] + 1))
        assert len(want) == 80
        frames = ws.collect_until(lambda fs: [c["seq"] for c in changes_in(fs)][-1:] == want[-1:],
                                  timeout=CATCH_UP_WAIT, what="every change of the read-all")
        assert [c["seq"] for c in changes_in(frames)] == want, "in order, once"
        assert all(c["notification"]["readState"] == "read" for c in changes_in(frames))
        assert_frames_bounded(frames)
        ws.ping()  # still open
        assert [int(sse.next(CATCH_UP_WAIT)["id"]) for _ in want] == want
        assert gateway.metric("herald_deferred_bursts_total") >= deferred + 2
        assert gateway.metric('herald_dropped_connections_total{reason="slow_consumer"}') == 0
    finally:
        sse.close()
        ws.close()


@pytest.mark.fallback
def test_sse_resume_brings_every_change(gateway, users):
    user, seqs = users["many"]
    s = Sse(gateway, mint_token(user), cursor=seqs[0])
    try:
        got = [int(s.next(CATCH_UP_WAIT)["id"]) for _ in range(len(seqs) - 1)]
        assert got == seqs[1:]
    finally:
        s.close()


@pytest.mark.fallback
def test_sse_resume_large_notifications(gateway, users):
    user, seqs = users["max"]
    s = Sse(gateway, mint_token(user), cursor=0)
    try:
        events = [s.next(CATCH_UP_WAIT) for _ in range(len(seqs))]
        assert [int(e["id"]) for e in events] == seqs
        assert all(len(json.loads(e["data"])["notification"]["payload"]["body"]) == 65_500 for e in events)
    finally:
        s.close()


@pytest.mark.fallback
def test_sse_reset_then_history_brings_everything(gateway, users):
    user, seqs = users["many"]
    tok = mint_token(user)
    s = Sse(gateway, tok)
    try:
        ev = s.next(CATCH_UP_WAIT)
    finally:
        s.close()
    assert ev["event"] == "reset" and int(ev["id"]) == seqs[-1]
    body = json.loads(ev["data"])
    got = [n["id"] for n in body["notifications"]]
    assert 0 < len(got) <= 500 and body["next"]
    before = body["next"]
    while before:
        r = gateway.me("GET", "/notifications", tok, params={"limit": 500, "before": before})
        assert r.status_code == 200, r.text
        got += [n["id"] for n in r.json()["notifications"]]
        before = r.json()["next"]
    assert len(got) == len(set(got)) == len(seqs)


@pytest.mark.fallback
@pytest.mark.parametrize("name", ["many", "max"])
def test_long_poll_pages_every_change(gateway, users, name):
    user, seqs = users[name]
    tok = mint_token(user)
    got, cursor = [], seqs[0]
    for _ in range(len(seqs)):
        r = gateway.me("GET", "/sync", tok, params={"cursor": cursor}, timeout=60)
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        got += [c["seq"] for c in body["changes"]]
        cursor = body["cursor"]
        if not body["hasMore"]:
            break
    assert got == seqs[1:] and cursor == seqs[-1]


@pytest.mark.fallback
def test_long_poll_reset_then_history(gateway, users):
    user, seqs = users["large"]
    tok = mint_token(user)
    r = gateway.me("GET", "/sync", tok, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert body["reset"] is True and body["cursor"] == seqs[-1]
    got = [n["id"] for n in body["notifications"]]
    before = body["next"]
    while before:
        r = gateway.me("GET", "/notifications", tok, params={"limit": 500, "before": before}, timeout=60)
        got += [n["id"] for n in r.json()["notifications"]]
        before = r.json()["next"]
    assert len(got) == len(set(got)) == len(seqs)
