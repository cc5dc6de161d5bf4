"""Two gateway processes on one PostgreSQL and one Redis bus (issue 11, SPEC
9): a change committed on one node reaches devices on the other, and a Redis
crash in the middle of a burst loses, repeats or reorders nothing, without a
device reconnecting. The servers are the throwaway ones scripts/test starts
(scripts/test-servers: HERALD_TEST_POSTGRES_URL, HERALD_TEST_REDIS_URL and
HERALD_TEST_REDIS_CTL); without them these tests skip."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time

import pytest

from herald_helpers import CONFIG, Gateway, changes_in, check_notification, mint_token, uid, wait_until
from test_fallback import Sse
from test_postgres import store_url  # noqa: F401  (the fixture: a schema per test)

REDIS = os.environ.get("HERALD_TEST_REDIS_URL")
REDIS_CTL = os.environ.get("HERALD_TEST_REDIS_CTL")
pytestmark = pytest.mark.skipif(not (REDIS and os.environ.get("HERALD_TEST_POSTGRES_URL")),
                                reason="no test PostgreSQL and Redis (scripts/test-servers starts them)")


class Cluster:
    """Gateway processes on one store and one bus: started, killed -9 and
    started again (with a new node id, as after a crash) by the test."""

    def __init__(self, herald_bin, tmp_path, store_url):
        # A database number of its own scopes this test's channels.
        self.args = dict(store=store_url, extra_args=["--bus", f"{REDIS}/{random.randrange(1, 1 << 30)}"])
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


def test_publish_and_dismiss_on_one_node_reach_a_device_on_the_other(nodes):
    n1, n2 = nodes
    user = uid("user")
    assert n2.http.get(n2.base + "/healthz").json()["bus"] == "connected"
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
