"""The PostgreSQL store end to end (issue 11, SPEC 9): the real gateway on
`--store postgres://...`, publishing to a connected WebSocket, and a restart
after which a device resumes by cursor under the same epoch. The server is
the throwaway one scripts/test starts (scripts/test-servers), named by
HERALD_TEST_POSTGRES_URL; without it these tests skip. Each test gets a
schema of its own in that database."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import uuid
from typing import Callable

import pytest

from cryptography.hazmat.primitives.asymmetric import ec

from herald_helpers import CONFIG, Gateway, assert_ids_of_no_form_are_unknown, uid, uid_in, wait_until
from push_standins import APNsStandIn, FCMStandIn, Outcome, WebPushStandIn, pem_private
from test_push import apns_handle, apns_token, push_config, register

URL = os.environ.get("HERALD_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="no test PostgreSQL: set HERALD_TEST_POSTGRES_URL "
                                                "(scripts/test-servers starts one; scripts/test always does)")


def psql(sql: str) -> None:
    subprocess.run(["psql", URL, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True, capture_output=True)


@pytest.fixture
def store_url():
    schema = "e2e_" + uuid.uuid4().hex
    psql(f"CREATE SCHEMA {schema}")
    yield f"{URL}{'&' if '?' in URL else '?'}options=-csearch_path%3D{schema}"
    psql(f"DROP SCHEMA {schema} CASCADE")


def test_publish_reaches_a_websocket_and_a_restart_keeps_epoch_and_cursor(herald_bin, tmp_path, store_url):
    user = uid("user")
    gw = Gateway(herald_bin, tmp_path / "a", CONFIG, store=store_url).start()
    try:
        ws, _, welcome = gw.connect(user, "phone", cursor=0)
        with ws:
            epoch = welcome["epoch"]
            seq = gw.publish(user, "live")["seq"]
            changes, _ = ws.expect_changes(1)
            assert [c["seq"] for c in changes] == [seq]
            assert changes[0]["notification"]["appNotificationId"] == "live"
        cursor = seq
        missed = [gw.publish(user, f"m{i}")["seq"] for i in range(5)]
    finally:
        assert gw.terminate(10) == 0, gw.stderr_tail()

    gw = Gateway(herald_bin, tmp_path / "b", CONFIG, store=store_url).start()
    try:
        ws, frames, welcome = gw.connect(user, "phone", cursor=cursor, epoch=epoch)
        with ws:
            assert welcome["epoch"] == epoch, "the epoch lives in the database, not in the process"
            got = [c["seq"] for f in frames if f["type"] == "changes" for c in f["changes"]]
            assert got == missed
            assert welcome["cursor"] == missed[-1]
        assert gw.publish(user, "after")["seq"] > missed[-1], "seq continues after a restart"
    finally:
        assert gw.terminate(10) == 0, gw.stderr_tail()


def test_ids_of_no_form_are_unknown_and_fail_no_batch(herald_bin, tmp_path, store_url):
    """A NUL in a notification id used to fail its whole batch with 503."""
    gw = Gateway(herald_bin, tmp_path, CONFIG, store=store_url).start()
    try:
        assert_ids_of_no_form_are_unknown(gw, uid("user"))
    finally:
        assert gw.terminate(10) == 0, gw.stderr_tail()


def test_unreachable_server_at_start_exits_1_with_one_line(herald_bin):
    # Port 1 on loopback: nothing listens there.
    r = subprocess.run([str(herald_bin), "serve", "--port", "0", "--store", "postgres://herald:secret@127.0.0.1:1/herald",
                        "--app", "x.y", "--server-key", "k", "--token-secret", "s"],
                       capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0], lines
    assert "secret" not in lines[0], "the password is never printed"


class PsqlSession:
    """One interactive psql connection, to hold locks while the gateway works."""

    def __init__(self, url: str):
        self.proc = subprocess.Popen(["psql", url, "-q", "-X", "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def run(self, sql: str, timeout: float = 30) -> None:
        """Runs `sql` and waits until it is done."""
        marker = uid("done")
        self.proc.stdin.write(f"{sql}\n\\echo {marker}\n")
        self.proc.stdin.flush()
        while (line := self.lines.get(timeout=timeout).strip()) != marker:
            assert not line.startswith(("ERROR", "psql:")), line

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def gateway_waiting() -> bool:
    """True while one of the gateway's sessions waits for a lock."""
    r = subprocess.run(["psql", URL, "-tAX", "-c", "SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = 'herald' AND wait_event_type = 'Lock'"],
                       check=True, capture_output=True, text=True)
    return r.stdout.strip() == "1"


def two_partitions(herald_bin, tmp_path, store_url) -> Gateway:
    """A gateway of two partitions: the lock tests' users are all of the
    first (`in_first`), so their writes share one engine and its batches."""
    return Gateway(herald_bin, tmp_path / "a", CONFIG, store=store_url, extra_args=["--partitions", "2"]).start()


FIRST = 0


def in_first(*prefixes: str) -> list[str]:
    return [uid_in(FIRST, 2, p) for p in prefixes]


def test_a_deadlock_with_another_transaction_is_run_again_not_answered_503(herald_bin, tmp_path, store_url):
    gw = two_partitions(herald_bin, tmp_path, store_url)
    alice, bob = in_first("alice", "bob")
    other = PsqlSession(store_url)
    try:
        for u in (alice, bob):
            gw.publish(u, "first")  # their feeds rows, the per-user locks
        # This session waits longer than the gateway's before looking for a
        # deadlock, so the gateway's transaction is the one PostgreSQL ends.
        other.run(f"SET deadlock_timeout = '60s'; BEGIN; SELECT 1 FROM feeds WHERE user_id = '{bob}' FOR UPDATE;")
        answer = {}
        # One batch that locks alice, then waits for bob.
        send = threading.Thread(target=lambda: answer.update(r=gw.server(
            "POST", "/notifications", json={"userIds": [alice, bob], "appNotificationId": "both", "payload": {}})))
        send.start()

        wait_until(gateway_waiting, "the gateway's batch waiting for bob")
        # Waits for alice: a deadlock, which the gateway's session finds after its 1 s.
        other.run(f"SELECT 1 FROM feeds WHERE user_id = '{alice}' FOR UPDATE; ROLLBACK;")
        send.join(30)
        assert answer["r"].status_code == 202, answer["r"].text
        for u in (alice, bob):
            assert "both" in {n["appNotificationId"] for n in gw.list_all(u)}
        # Twice when the run again locks alice before this session's
        # waiting lock does (row locks are taken again after a wake-up), and
        # so deadlocks a second time.
        assert gw.metric("herald_store_conflict_retries_total") in (1, 2)
    finally:
        other.close()
        assert gw.terminate(10) == 0, gw.stderr_tail()


def run_behind_a_held_batch(gw: Gateway, other: PsqlSession, first: str, hold: str,
                            queued: list[tuple[str, Callable[[], object]]], then: str) -> dict[str, object]:
    """The lock-order tests' choreography, with `other` as another node's
    batch that locks in the shared order: it holds `first`, and holds the
    engine in a batch of its own (a publish to `hold`) while `queued` (name,
    call) queue behind it, in that order. Then it lets `hold` go, waits until
    the gateway waits for a lock again (`first`), takes `then` and commits.
    Were the gateway holding `then`, that would be a deadlock, which the
    gateway's session finds after its 1 s and loses. The answers, by name."""
    answers: dict[str, object] = {}

    def start(name: str, call: Callable[[], object]) -> threading.Thread:
        t = threading.Thread(target=lambda: answers.update({name: call()}))
        t.start()
        return t

    other.run(f"SET deadlock_timeout = '60s'; BEGIN; SELECT 1 FROM feeds WHERE user_id = '{first}' FOR UPDATE; "
              f"SAVEPOINT s; SELECT 1 FROM feeds WHERE user_id = '{hold}' FOR UPDATE;")
    held = start(hold, lambda: gw.publish_raw(hold, {"appNotificationId": "x", "payload": {}}))
    wait_until(gateway_waiting, f"the gateway's batch waiting for {hold}")
    # What queued while the batch blocked (the answer of a maintenance read
    # out on the reader thread) counts too: each call is counted from here.
    # Counted on the held partition alone: the other one's queue drains meanwhile.
    waiting = lambda: gw.metric(f'herald_engine_queue{{partition="{FIRST}"}}')
    base = waiting()
    threads = []
    for name, call in queued:
        threads.append(start(name, call))
        wait_until(lambda: waiting() >= base + len(threads), f"{name} queued")
    other.run("ROLLBACK TO SAVEPOINT s;")
    held.join(30)
    assert answers[hold].status_code == 201, answers[hold].text
    wait_until(gateway_waiting, f"the next batch waiting for {first}")
    other.run(f"SELECT 1 FROM feeds WHERE user_id = '{then}' FOR UPDATE; COMMIT;")
    for t in threads:
        t.join(30)
    return answers


def test_a_send_by_tags_runs_in_a_batch_of_its_own_so_it_never_deadlocks(herald_bin, tmp_path, store_url):
    """An app-wide send by tags learns its users only as it runs, and claims
    them then. Queued behind a publish to zed it used to share that
    publish's batch: holding zed, it waited for alice, and another node's
    batch holding alice and then taking zed deadlocked with it (a conflict
    retry and a 1 s stall). In a batch of its own it waits for alice holding
    nothing."""
    gw = two_partitions(herald_bin, tmp_path, store_url)
    (alice, zed, hold), tag = in_first("alice", "zed", "hold"), uid("vip")
    other = PsqlSession(store_url)
    try:
        for u in (alice, zed, hold):
            gw.publish(u, "first")
        assert gw.me("PUT", "/devices/phone", gw.token(alice), json={"tags": [tag]}).status_code == 200
        answers = run_behind_a_held_batch(gw, other, first=alice, hold=hold, then=zed, queued=[
            (zed, lambda: gw.publish_raw(zed, {"appNotificationId": "x", "payload": {}})),
            ("tags", lambda: gw.server("POST", "/notifications", json={
                "tagExpression": tag, "appNotificationId": "by-tag", "payload": {}}))])
        assert answers[zed].status_code == 201, answers[zed].text
        assert answers["tags"].status_code == 202 and answers["tags"].json() == {"users": 1}, answers["tags"].text
        assert "by-tag" in {n["appNotificationId"] for n in gw.list_all(alice)}
        assert gw.metric("herald_store_conflict_retries_total") == 0
    finally:
        other.close()
        assert gw.terminate(10) == 0, gw.stderr_tail()


def test_a_batch_locks_its_users_in_one_order_so_it_never_deadlocks_with_one_that_keeps_it(herald_bin, tmp_path, store_url):
    """Another node's batch for the same users, played by a psql session
    that locks in (app, user) order: it holds alice and then takes bob. The
    gateway's batch publishes to bob, then alice. Locking on first touch it
    would hold bob and wait for alice, a deadlock (the old behaviour: one
    conflict retry and a 1 s stall); claiming both up front in order it
    waits for alice holding nothing, and both go through."""
    gw = two_partitions(herald_bin, tmp_path, store_url)
    alice, bob, zed = in_first("alice", "bob", "zed")
    other = PsqlSession(store_url)
    try:
        for u in (alice, bob, zed):
            gw.publish(u, "first")
        answers = run_behind_a_held_batch(gw, other, first=alice, hold=zed, then=bob, queued=[
            (u, lambda u=u: gw.publish_raw(u, {"appNotificationId": "x", "payload": {}})) for u in (bob, alice)])
        assert [answers[u].status_code for u in (bob, alice)] == [201, 201], [answers[u].text for u in (bob, alice)]
        assert [answers[u].json()["seq"] for u in (bob, alice)] == [2, 2]
        assert gw.metric("herald_store_conflict_retries_total") == 0
        assert gw.metric(f'herald_engine_queue{{partition="{FIRST}"}}') == 0
    finally:
        other.close()
        assert gw.terminate(10) == 0, gw.stderr_tail()


def test_a_push_answer_claims_its_user_with_the_batch_so_it_never_deadlocks(herald_bin, tmp_path, store_url):
    """A push service's answer is a write in the engine's next batch, and
    one calling the handle dead rewrites its user's registration. Naming no
    users, it locked its user on first touch: in a batch after a publish to
    bob it held bob and waited for alice, and another node's batch holding
    alice and then taking bob deadlocked with it (a conflict retry and a 1 s
    stall). Claimed with the batch's users, in order, it waits for alice
    holding nothing."""
    vapid = tmp_path / "vapid.pem"
    vapid.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))
    with APNsStandIn(tmp_path / "apns") as apns, FCMStandIn(tmp_path / "fcm") as fcm, WebPushStandIn(tmp_path / "web") as web:
        gw = Gateway(herald_bin, tmp_path / "a", push_config(apns, fcm, web, vapid), store=store_url,
                     extra_args=["--partitions", "2"]).start()
        alice, bob, hold = in_first("alice", "bob", "hold")
        other = PsqlSession(store_url)
        try:
            for u in (alice, bob, hold):
                gw.publish(u, "first")
            token = apns_token(9)
            register(gw, alice, "phone", apns_handle(token))
            apns.script(Outcome(410, "Unregistered"), key=token)
            apns.hold = True
            gw.publish(alice, payload={"title": "t", "body": "b"})
            apns.wait_for(1, refused=True)  # its answer held
            answers = run_behind_a_held_batch(gw, other, first=alice, hold=hold, then=bob, queued=[
                ("dead", apns.release_held),
                (bob, lambda: gw.publish_raw(bob, {"appNotificationId": "x", "payload": {}}))])
            assert answers[bob].status_code == 201, answers[bob].text
            wait_until(lambda: gw.devices(alice)["phone"]["push"] is None, "the dead handle removed")
            assert gw.metric("herald_store_conflict_retries_total") == 0
        finally:
            other.close()
            assert gw.terminate(10) == 0, gw.stderr_tail()


def test_two_partitions_on_one_database_each_write_and_expire_their_own_users(herald_bin, tmp_path, store_url):
    """A node's partitions are connections to one database. Each writes
    and follows its own users; each sweeps only its own users' expired
    notifications (`herald_partition` in SQL), so every expiry reaches its
    user's devices once, whichever partition the user is in (a sweep of
    another partition's user would never reach them: no bus here)."""
    gw = two_partitions(herald_bin, tmp_path, store_url)
    try:
        users = [uid_in(p, 2, f"p{p}") for p in (0, 1)]
        clients = [gw.connect(u, "phone")[0] for u in users]
        for u in users:
            assert gw.publish(u, "lasting")["seq"] == 1
            assert gw.publish(u, "short", ttlSeconds=1)["seq"] == 2
        for c in clients:
            with c:
                changes, _ = c.expect_changes(3, timeout=5)
                assert [(ch["seq"], ch["op"]) for ch in changes] == [(1, "upsert"), (2, "upsert"), (3, "delete")], changes
                assert changes[2]["reason"] == "expired"
        for u in users:
            # Deleted once: the feed moved by one change, and the next publish follows it.
            assert [n["appNotificationId"] for n in gw.list_all(u)] == ["lasting"]
            assert gw.publish(u, "after")["seq"] == 4
    finally:
        assert gw.terminate(10) == 0, gw.stderr_tail()
