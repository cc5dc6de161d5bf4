"""Two or three gateway processes on one PostgreSQL and one Redis bus
(issue 11, SPEC 9): a change committed on one node reaches WebSockets, event
streams and held polls on the others; a cursor from one node resumes on
another; presence is listed across nodes and a dead node's devices drop out
within its lease; PostgreSQL stopped for 5 s is 503 meanwhile and recovers;
Redis killed mid-burst and 20 rounds of kill -9 of a node mid-burst lose,
repeat or reorder nothing. The servers are the throwaway ones scripts/test
starts (scripts/test-servers: HERALD_TEST_POSTGRES_URL, HERALD_TEST_REDIS_URL,
and for the failure tests HERALD_TEST_POSTGRES_CTL and HERALD_TEST_REDIS_CTL);
without them these tests skip."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

from herald_helpers import CONFIG, Gateway, changes_in, check_notification, mint_token, uid, uid_in, wait_until
from test_fallback import Sse
from test_postgres import PsqlSession, store_url  # noqa: F401  (the fixture: a schema per test)

REDIS = os.environ.get("HERALD_TEST_REDIS_URL")
REDIS_CTL = os.environ.get("HERALD_TEST_REDIS_CTL")
POSTGRES_CTL = os.environ.get("HERALD_TEST_POSTGRES_CTL")
HELD = 'herald_connections{transport="poll"}'
# Each node's partitions: two, one database session each, on any machine.
PARTITIONS = 2
pytestmark = pytest.mark.skipif(not (REDIS and os.environ.get("HERALD_TEST_POSTGRES_URL")),
                                reason="no test PostgreSQL and Redis (scripts/test-servers starts them)")


class Cluster:
    """Gateway processes on one store and one bus: started, killed -9 and
    started again (with a new node id, as after a crash) by the test. Each
    runs `PARTITIONS` partitions, whatever the machine's cores."""

    def __init__(self, herald_bin, tmp_path, store_url):
        # A database number of its own scopes this test's channels.
        self.args = dict(store=store_url, extra_args=["--bus", f"{REDIS}/{random.randrange(1, 1 << 30)}",
                                                      "--partitions", str(PARTITIONS)])
        self.herald_bin, self.tmp_path = herald_bin, tmp_path
        self.nodes: list[Gateway] = []
        self.killed: list[Gateway] = []
        self.starts = 0

    def start(self, n: int) -> list[Gateway]:
        for _ in range(n):
            self.nodes.append(self._started())
        for g in self.nodes:
            self.wait_subscribed(g)
        return self.nodes

    def _started(self) -> Gateway:
        self.starts += 1
        return Gateway(self.herald_bin, self.tmp_path / f"n{self.starts}", CONFIG, **self.args).start()

    @staticmethod
    def wait_subscribed(g: Gateway) -> None:
        wait_until(lambda: g.metric("herald_bus_connected") == 1, "the bus subscribed")

    def kill(self, i: int) -> None:
        """kill -9 of node i: no clean shutdown, its presence left behind."""
        self.nodes[i].kill()
        self.killed.append(self.nodes[i])

    def restart(self, i: int) -> Gateway:
        self.nodes[i] = self._started()
        self.wait_subscribed(self.nodes[i])
        return self.nodes[i]

    def stop(self) -> None:
        for g in self.nodes:
            if g not in self.killed:
                assert g.terminate(10) == 0, g.stderr_tail()


@pytest.fixture
def cluster(herald_bin, tmp_path, store_url):  # noqa: F811
    c = Cluster(herald_bin, tmp_path, store_url)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def nodes(cluster):
    return cluster.start(2)


def test_publish_on_node_1_reaches_a_websocket_an_event_stream_and_a_held_poll_elsewhere(cluster):
    n1, n2, n3 = cluster.start(3)
    user = uid("user")
    tok = mint_token(user)
    ws, _, welcome = n2.connect(user, "phone")
    position = {"cursor": welcome["cursor"], "epoch": welcome["epoch"]}
    sse = Sse(n3, tok, deviceId="browser", **position)
    polled: dict = {}

    def poll():
        r = n2.me("GET", "/sync", tok, params={"deviceId": "poller", "wait": 30, **position})
        polled["answer"] = r

    held = n2.metric(HELD)
    t = threading.Thread(target=poll)
    try:
        t.start()
        wait_until(lambda: n2.metric(HELD) > held or polled, "the poll held on node 2")
        assert not polled, polled["answer"].text
        out = n1.publish(user, "everywhere", payload={"title": "Hello"})
        change = {"seq": out["seq"], "op": "upsert", "notification": out["notification"]}

        changes, frames = ws.expect_changes(1)
        assert changes == [change], frames
        ev = sse.next()
        assert (ev["event"], int(ev["id"]), json.loads(ev["data"])) == ("change", out["seq"], change), ev
        t.join(10)
        assert polled["answer"].status_code == 200, polled["answer"].text
        body = polled["answer"].json()
        assert body["changes"] == [change] and body["cursor"] == out["seq"], body
    finally:
        t.join(35)
        sse.close()
        ws.close()


def test_a_cursor_and_epoch_from_node_1_resume_on_node_2_with_exactly_the_missed_changes(nodes):
    n1, n2 = nodes
    user = uid("user")
    ws, _, welcome = n1.connect(user, "phone")
    with ws:
        seen = [n1.publish(user, f"seen{i}")["seq"] for i in range(3)]
        changes, _ = ws.expect_changes(3)
        assert [c["seq"] for c in changes] == seen
    # Missed while away, published on both nodes.
    missed = [nodes[i % 2].publish(user, f"missed{i}") for i in range(5)]
    ws, frames, resumed = n2.connect(user, "phone", cursor=seen[-1], epoch=welcome["epoch"])
    with ws:
        assert resumed["epoch"] == welcome["epoch"], "one epoch for every node of one database"
        assert not any(f["type"] == "reset" for f in frames), frames
        assert changes_in(frames) == [{"seq": m["seq"], "op": "upsert", "notification": m["notification"]} for m in missed]
        assert resumed["cursor"] == missed[-1]["seq"]
        ws.assert_silent()


@pytest.mark.skipif(not POSTGRES_CTL, reason="HERALD_TEST_POSTGRES_CTL is not set")
def test_postgres_stopped_for_5_s_is_503_meanwhile_and_everything_recovers(nodes):
    n1, n2 = nodes
    user = uid("user")
    devices = [n1.connect(user, "d1")[0], n2.connect(user, "d2")[0]]
    before = n1.publish(user, "before")["seq"]
    for d in devices:
        assert [c["seq"] for c in d.expect_changes(1)[0]] == [before]

    subprocess.run([POSTGRES_CTL, "stop"], check=True)
    stopped = time.monotonic()
    try:
        refused = 0
        # Five seconds of PostgreSQL away: every write refused politely,
        # every device still connected and answered.
        while time.monotonic() - stopped < 5:
            for g in nodes:
                r = g.publish_raw(user, {"appNotificationId": uid("down"), "payload": {}})
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "unavailable" and int(r.headers["Retry-After"]) >= 1, r.headers
                refused += 1
            for d in devices:
                d.ping()
            time.sleep(0.05)  # pacing: a device may send 50 messages a second
        for g in nodes:
            assert g.http.get(g.base + "/healthz").json()["store"] == "unavailable"
    finally:
        subprocess.run([POSTGRES_CTL, "start"], check=True)
    print(f"{refused} publishes refused in 5 s")

    def published(g):
        r = g.publish_raw(user, {"appNotificationId": uid("after"), "payload": {}})
        assert r.status_code in (201, 503), r.text
        return r.status_code == 201 and r.json()["seq"]

    after = [wait_until(lambda: published(g), "a publish succeeding again", timeout=30) for g in nodes]
    recovered = time.monotonic() - stopped - 5
    print(f"publishing again {recovered:.1f} s after PostgreSQL was started")
    for d in devices:
        with d:
            frames = d.collect_until(lambda fs: len(changes_in(fs)) >= 2, what="the changes after recovery")
            assert [c["seq"] for c in changes_in(frames)] == sorted(after), "nothing refused was delivered"
            d.assert_silent(ignore=("counts",))
    for g in nodes:
        assert g.alive(), g.stderr_tail()
        wait_until(lambda: g.http.get(g.base + "/healthz").json()["store"] == "ok", "healthz store ok")


def test_publish_and_dismiss_on_one_node_reach_a_device_on_the_other(nodes):
    n1, n2 = nodes
    user = uid("user")
    assert n2.http.get(n2.base + "/healthz").json()["bus"] == "connected"
    n1.publish(user, "earlier")  # the feed's head is past 0 when the devices follow
    phone, _, _ = n1.connect(user, "phone")
    laptop, _, _ = n2.connect(user, "laptop")
    with phone, laptop:
        out = n1.publish(user, "task-42", payload={"title": "Review"})
        changes, frames = laptop.expect_changes(1)
        assert changes == [{"seq": out["seq"], "op": "upsert", "notification": out["notification"]}], frames

        ack, _ = phone.request({"type": "update", "id": out["notification"]["id"], "userActionState": "dismissed"})
        assert ack["type"] == "ack", ack
        dismissed = check_notification(ack["notification"])
        frames = laptop.collect_until(lambda fs: any(c["seq"] == ack["seq"] for c in changes_in(fs)), what="the dismiss")
        assert changes_in(frames) == [{"seq": ack["seq"], "op": "upsert", "notification": dismissed}], frames
    # Each node started the user at its feed's head when the first device
    # followed, so no change was taken for a gap and read back from the store.
    assert [n.metric("herald_bus_catchups_total") for n in (n1, n2)] == [0, 0]


@contextlib.contextmanager
def apart_nodes(herald_bin, tmp_path, store_url):
    """Two nodes on one store, each on a bus of its own: whatever node 1
    puts on its bus never reaches node 2, as if lost."""
    apart = [Cluster(herald_bin, tmp_path / name, store_url) for name in ("a", "b")]
    try:
        (n1,), (n2,) = (c.start(1) for c in apart)
        yield n1, n2
    finally:
        for c in apart:
            c.stop()


def test_a_change_that_never_came_over_the_bus_reaches_the_other_node_s_devices(herald_bin, tmp_path, store_url):  # noqa: F811
    """A change committed on one node whose record never reaches another
    (here node 1 publishes on a bus of its own, as if the record were lost:
    a node killed between commit and publish, Redis dropping it) still
    reaches the other node's devices with no later change of the user: that
    node compares its followed feeds with the store every 5 s and catches up
    a feed still behind 10 s later (docs/ARCHITECTURE.md, "Changes across
    nodes")."""
    with apart_nodes(herald_bin, tmp_path, store_url) as (n1, n2):
        user = uid("user")
        phone, _, _ = n2.connect(user, "phone")
        with phone:
            out = n1.publish(user, "never-on-node-2-s-bus")
            frames = phone.collect_until(lambda fs: changes_in(fs), timeout=40, what="the change, from the store")
            assert changes_in(frames) == [{"seq": out["seq"], "op": "upsert", "notification": out["notification"]}], frames
            assert n2.metric("herald_bus_missed_total") == 1
            nxt = n2.publish(user, "next")
            changes, frames = phone.expect_changes(1)
            assert changes == [{"seq": nxt["seq"], "op": "upsert", "notification": nxt["notification"]}], frames
        assert n2.metric("herald_bus_catchups_total") == 0, "the next change followed on, no gap"


def test_a_device_event_that_never_came_over_the_bus_acts_on_the_other_node_within_the_device_audit(
        herald_bin, tmp_path, store_url):  # noqa: F811
    """A device deleted through one node whose event never reaches another
    (node 1 on a bus of its own, as if the event were lost: its node killed
    between commit and publish) still has its connection on that node
    closed with 4003: every 30 s each node reads the registrations of the
    devices connected to it (docs/ARCHITECTURE.md, "Devices across
    nodes"). Its connection used to stay open until it reconnected."""
    with apart_nodes(herald_bin, tmp_path, store_url) as (n1, n2):
        user = uid("user")
        phone, _, _ = n2.connect(user, "phone")
        with phone:
            assert n1.me("DELETE", "/devices/phone", mint_token(user)).status_code == 204
            code, _ = phone.expect_close(timeout=45)
            assert code == 4003


def node_id(g: Gateway) -> str:
    """A node's id, from its log line `bus: subscribed ... (node ID)`."""
    m = re.search(r"\(node ([0-9a-f]{16})\)", g.stderr_tail(100_000))
    assert m, g.stderr_tail()
    return m.group(1)


def node_sessions(g: Gateway, partition: int, where: str) -> int:
    """Whether the PostgreSQL session of `partition` of node `g` (named
    `herald/NODE-PARTITION`) matches `where` (1) or not (0)."""
    r = subprocess.run(["psql", os.environ["HERALD_TEST_POSTGRES_URL"], "-tAX", "-c",
                        f"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'herald/{node_id(g)}-{partition}' AND {where}"],
                       check=True, capture_output=True, text=True)
    return int(r.stdout.strip())


def node_activity(g: Gateway) -> str:
    """Node `g`'s sessions as pg_stat_activity shows them: for the message
    of a wait on them that timed out."""
    r = subprocess.run(["psql", os.environ["HERALD_TEST_POSTGRES_URL"], "-tAX", "-c",
                        "SELECT application_name, state, wait_event_type, wait_event, xact_start, left(query, 100) "
                        f"FROM pg_stat_activity WHERE application_name LIKE 'herald/{node_id(g)}-%'"],
                       capture_output=True, text=True)
    return r.stdout + r.stderr


def test_a_node_frozen_in_a_transaction_is_fenced_and_the_others_write_on(nodes, store_url):  # noqa: F811
    """A node frozen in the middle of a batch (SIGSTOP, a paused VM) holds
    its users' row locks, and the other nodes' writes to those users wait.
    Once such a wait has lasted PostgreSQL's lock_timeout (15 s), the waiting
    node ends the frozen node's session (lease lapsed, transaction open that
    long, silent for 10 s, waiting for its client) and runs its batch
    again; the frozen node, resumed, answers its batch 503 (nothing was
    saved: it froze before its COMMIT) and works on."""
    n1, n2 = nodes
    # Both of one partition, whose session the test watches.
    user, other = uid_in(0, PARTITIONS, "user"), uid_in(0, PARTITIONS, "other")
    n2.publish(user, "first")
    # The partition's statements prepared (preparing is a round trip of its
    # own): its batch below then waits in its first write, not before it.
    n1.publish(other, "warm-up")
    blocker = PsqlSession(store_url)
    answer: dict = {}
    frozen = threading.Thread(target=lambda: answer.update(
        r=n1.publish_raw(user, {"appNotificationId": "frozen", "payload": {}})))
    try:
        # Node 1's batch waits for the user's feeds row, then claims it and
        # reads the heads, whose answer finds the process stopped. A row
        # lock, not the table's: maintenance on the session (pruning, the
        # expiry sweep) skips locked rows, where it would wait for a locked
        # table, hold the session through a lock_timeout and leave it idle.
        blocker.run(f"BEGIN; SELECT 1 FROM feeds WHERE app = 'app.one' AND user_id = '{user}' FOR UPDATE;")
        frozen.start()
        # The batch's own statement, its first write (the INSERT that locks its feeds rows).
        wait_until(lambda: node_sessions(n1, 0, "wait_event_type = 'Lock' AND query LIKE 'INSERT INTO feeds %unnest%'") == 1,
                   "node 1's batch waiting for the user's row")
        n1.proc.send_signal(signal.SIGSTOP)
        blocker.run("COMMIT;")
        try:
            wait_until(lambda: node_sessions(n1, 0, "xact_start IS NOT NULL AND wait_event = 'ClientRead'") == 1,
                       "node 1's session holding the user's row, waiting for its stopped client")
        except AssertionError as e:
            raise AssertionError(f"{e}; node 1's sessions:\n{node_activity(n1)}") from None
        began = time.monotonic()
        out = n2.publish(user, "goes-through")
        waited = time.monotonic() - began
        assert out["seq"] == 2, out
        assert 14 < waited < 30, f"waited {waited:.1f} s: one lock_timeout, then the batch ran again"
        assert "ended the database session of node" in n2.stderr_tail(), n2.stderr_tail()
        assert n2.metric("herald_store_conflict_retries_total") == 1
    finally:
        n1.proc.send_signal(signal.SIGCONT)
        frozen.join(30)
        blocker.close()
    # The server ended the session before the COMMIT came: nothing of it was saved.
    assert answer["r"].status_code == 503, answer["r"].text
    assert "nothing was changed" in answer["r"].json()["error"]["message"], answer["r"].text
    after = n1.publish(user, "after")
    assert after["seq"] == 3, after
    assert sorted(n["appNotificationId"] for n in n2.list_all(user)) == ["after", "first", "goes-through"]


def test_a_device_deleted_through_one_node_is_disconnected_on_the_other(nodes):
    """SPEC 4: a deleted device's open connections close with 4003, also
    those on another node (they used to stay open there)."""
    n1, n2 = nodes
    user = uid("user")
    phone, _, _ = n2.connect(user, "phone")
    with phone:
        assert n1.me("DELETE", "/devices/phone", mint_token(user)).status_code == 204
        code, _ = phone.expect_close()
        assert code == 4003


@pytest.mark.skipif(not REDIS_CTL, reason="HERALD_TEST_REDIS_CTL is not set")
def test_device_events_lost_with_the_bus_act_on_the_other_node_when_it_resubscribes(cluster):
    """A device re-registered and another deleted through node 1 while Redis
    is down, node 1 killed before Redis returns: their events never reach
    the bus. Node 2, resubscribing, reads the registrations of the devices
    connected to it before catching them up: the deleted one closes with
    4003, the other takes its new platform, and its catch-up brings what
    that platform may see (they used to keep their old state until they
    reconnected)."""
    n1, n2 = cluster.start(2)
    user = uid("user")
    phone, _, _ = n2.connect(user, "phone")
    tablet, _, _ = n2.connect(user, "tablet")
    token = mint_token(user)
    subprocess.run([REDIS_CTL, "kill"], check=True)
    try:
        assert n1.me("PUT", "/devices/phone", token, json={"platform": "ios"}).status_code == 200
        assert n1.me("DELETE", "/devices/tablet", token).status_code == 204
        missed = n1.publish(user, "ios-only-meanwhile", targetPlatforms=["ios"])["seq"]
        cluster.kill(0)  # the records it holds for Redis die with it
    finally:
        subprocess.run([REDIS_CTL, "start"], check=True)
    with tablet:
        code, _ = tablet.expect_close(timeout=30)
        assert code == 4003
    with phone:
        phone.collect_until(lambda fs: missed in {c["seq"] for c in changes_in(fs)}, timeout=30,
                            what="the ios-only notification published meanwhile, caught up as ios")
        seq = n2.publish(user, "ios-only", targetPlatforms=["ios"])["seq"]
        phone.collect_until(lambda fs: seq in {c["seq"] for c in changes_in(fs)}, timeout=10,
                            what="a live ios-only notification, seen as ios")


@pytest.mark.skipif(not REDIS_CTL, reason="HERALD_TEST_REDIS_CTL is not set")
def test_redis_killed_and_restarted_in_a_burst_loses_and_repeats_nothing(nodes):
    n1, n2 = nodes
    user = uid("user")
    devices = [n2.connect(user, "d2")[0], n1.connect(user, "d1")[0]]
    resubscribed = [g.metric("herald_bus_resubscriptions_total") for g in nodes]
    published: list[int] = []
    failures: list[BaseException] = []

    def burst():
        # Both nodes publish to the user, so each device gets changes from
        # its own node and, over the bus, from the other.
        try:
            for i in range(400):
                published.append(nodes[i % 2].publish(user, f"b{i}")["seq"])
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            failures.append(e)

    t = threading.Thread(target=burst)
    t.start()
    wait_until(lambda: len(published) >= 100 or failures, "the burst under way")
    subprocess.run([REDIS_CTL, "kill"], check=True)
    wait_until(lambda: len(published) >= 200 or failures, "publishes while Redis is down")
    subprocess.run([REDIS_CTL, "start"], check=True)
    t.join(60)
    assert not failures, failures
    for g, before in zip(nodes, resubscribed):
        wait_until(lambda: g.metric("herald_bus_resubscriptions_total") > before, "the bus resubscribed")
    want = sorted(published)
    for d in devices:
        with d:
            frames = d.collect_until(lambda fs: {c["seq"] for c in changes_in(fs)} >= set(want), timeout=30,
                                     what="every change of the burst")
            got = [c["seq"] for c in changes_in(frames)]
            assert got == want, "every change, in seq order, once, on the same connection"
    for g in nodes:
        assert g.http.get(g.base + "/healthz").json()["bus"] == "connected"


# docs/PROTOCOL.md, devices listing: a node that dies has its devices shown
# disconnected by the other nodes within its presence lease.
PRESENCE_LEASE = 10.0


def test_presence_shows_devices_on_other_nodes_and_drops_a_dead_node_s_within_the_lease(cluster):
    n1, n2 = cluster.start(2)
    user = uid("user")
    ws, _, _ = n2.connect(user, "tablet")
    watch, _, _ = n2.connect(user, "watch")
    sse = Sse(n2, mint_token(user), deviceId="browser")
    r = n2.me("GET", "/sync", mint_token(user), params={"deviceId": "poller"})
    assert r.status_code == 200, r.text
    try:
        assert sse.next()["event"] == "reset"
        want = {"tablet": "websocket", "watch": "websocket", "browser": "sse", "poller": "poll"}

        def transports():
            return {d: v["transport"] for d, v in n1.devices(user).items() if v["connected"]}

        wait_until(lambda: transports() == want, "node 1 listing node 2's devices", timeout=5)
        # A connection that closes is seen at once, not at the lease's end.
        watch.close()
        del want["watch"]
        wait_until(lambda: transports() == want, "node 1 seeing the watch disconnect", timeout=3)

        cluster.kill(1)
        died = time.monotonic()
        wait_until(lambda: transports() == {}, "node 2's devices listed disconnected", timeout=PRESENCE_LEASE + 5)
        gone = time.monotonic() - died
        print(f"a dead node's devices were listed disconnected after {gone:.1f} s")
        assert gone <= PRESENCE_LEASE + 0.5, gone
        listed = n1.devices(user)
        assert all(not d["connected"] and d["transport"] is None for d in listed.values()), listed
    finally:
        sse.close()
        ws.close()


def test_the_apps_inspection_counts_its_devices_on_each_node_whichever_node_answers(nodes):
    """The inspector's live view of a cluster (PROTOCOL 18): each node's
    devices of the app by transport, from the presence records; another
    app's are not counted. A user's inspection tells a device connected
    here from one connected to another node."""
    n1, n2 = nodes
    user = uid("user")
    phone, _, _ = n1.connect(user, "phone")
    tablet, _, _ = n2.connect(uid("user"), "tablet")
    sse = Sse(n2, mint_token(user), deviceId="browser")
    another, _, _ = n2.connect(uid("user"), "laptop", app="app.two")
    try:
        assert sse.next()["event"] == "reset"
        want = sorted([{"node": node_id(n1), "devices": {"websocket": 1, "sse": 0, "poll": 0}},
                       {"node": node_id(n2), "devices": {"websocket": 1, "sse": 1, "poll": 0}}], key=lambda n: n["node"])

        def listed(g: Gateway) -> list[dict]:
            r = g.server("GET", "/inspect")
            assert r.status_code == 200, r.text
            return sorted(r.json()["nodes"], key=lambda n: n["node"])

        for g in (n1, n2):
            wait_until(lambda g=g: listed(g) == want, "both nodes' devices in the app's inspection", timeout=5)
        r = n1.server("GET", f"/users/{user}/inspect")
        assert r.status_code == 200, r.text
        where = {d["deviceId"]: (d["here"], d["elsewhere"]) for d in r.json()["devices"]}
        assert where == {"phone": ("websocket", None), "browser": (None, "sse")}, where
    finally:
        for c in (phone, tablet, another):
            c.close()
        sse.close()


class Follower:
    """A WebSocket device and every seq it received since its welcome."""

    def __init__(self, node: Gateway, user: str, name: str):
        self.node = node
        self.ws, _, welcome = node.connect(user, name)
        self.start = welcome["cursor"]
        self.seqs: list[int] = []

    def read_to(self, seq: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while max(self.seqs, default=self.start) < seq:
            left = deadline - time.monotonic()
            assert left > 0, f"no seq {seq} within {timeout}s; got up to {max(self.seqs, default=self.start)}"
            try:
                f = self.ws.recv(left)
            except TimeoutError:
                continue
            self.seqs += [c["seq"] for c in changes_in([f])]


def test_kill_9_of_a_node_mid_burst_20_times_loses_and_repeats_nothing(cluster):
    nodes = cluster.start(3)
    user = uid("user")
    followers = [Follower(g, user, f"d{i}") for i, g in enumerate(nodes)]
    started = time.monotonic()
    for round_ in range(20):
        victim = round_ % 3
        acked: list[dict] = []
        refused: list[str] = []
        lock = threading.Lock()

        def burst(g: Gateway, n: int) -> None:
            # Until the node dies (refused connection, reset, or an answer cut off).
            for i in range(n):
                try:
                    r = g.publish_raw(user, {"appNotificationId": uid(f"r{round_}"), "payload": {"i": i}})
                except requests.RequestException:
                    return
                with lock:
                    (acked.append(r.json()) if r.status_code in (200, 201) else refused.append(r.text))

        threads = [threading.Thread(target=burst, args=(g, 25)) for g in nodes]
        for t in threads:
            t.start()
        wait_until(lambda: len(acked) >= 20, "the burst under way")
        cluster.kill(victim)
        for t in threads:
            t.join(60)
        assert not refused, refused
        # A change the victim committed but never put on the bus reaches the
        # others' devices at the user's next change, which shows the gap.
        survivor = nodes[(victim + 1) % 3]
        head = survivor.publish(user, f"sentinel{round_}")["seq"]
        followers = [f for f in followers if f.node is not nodes[victim]]
        for f in followers:
            f.read_to(head)
            assert f.seqs == list(range(f.start + 1, head + 1)), "every change once, in seq order, none missing"
        feed = {n["appNotificationId"] for n in survivor.list_all(user)}
        assert {a["notification"]["appNotificationId"] for a in acked} <= feed, "every acknowledged publish is kept"
        assert {a["seq"] for a in acked} <= set(range(1, head + 1))
        restarted = cluster.restart(victim)
        followers.append(Follower(restarted, user, f"d{round_}-{victim}"))
    print(f"20 kill -9 rounds in {time.monotonic() - started:.1f} s")
    for g in nodes:
        assert g.alive(), g.stderr_tail()
