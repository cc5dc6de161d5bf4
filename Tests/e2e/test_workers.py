"""`herald serve --workers N` (issue 11): a supervisor binds the one port and
runs N worker processes of the same binary on it, sharing PostgreSQL and
Redis. One `listening on` line; connections spread over the workers (seen in
/proc: which worker process holds the server end of each client's socket); a
publish reaches devices on every worker and a dismiss on one reaches the
others; a worker killed -9 is started again and takes connections while the
others' devices stay connected; SIGTERM ends everything with status 0 within
10 s; workers need a PostgreSQL store and a Redis bus (exit 2 otherwise); a
port in use is still exit 2. Servers from scripts/test-servers; without them
these tests skip."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import time

import pytest
import requests

from herald_helpers import CONFIG, Gateway, changes_in, check_notification, mint_token, uid, wait_until
from test_postgres import store_url  # noqa: F401  (the fixture: a schema per test)

REDIS = os.environ.get("HERALD_TEST_REDIS_URL")
pytestmark = pytest.mark.skipif(not (REDIS and os.environ.get("HERALD_TEST_POSTGRES_URL")),
                                reason="no test PostgreSQL and Redis (scripts/test-servers starts them)")


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's children, from /proc/*/stat (field 4 is the parent)."""
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = open(f"/proc/{name}/stat").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == supervisor and fields[0] != "Z":
                out.add(int(name))
    return out


def holders(pids: set[int], server_port: int) -> dict[int, int]:
    """Client port → the worker pid holding the server end of that TCP connection."""
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[int(link[8:-1])] = pid
    out = {}
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            local, remote, inode = parts[1], parts[2], int(parts[9])
            if int(local.split(":")[1], 16) == server_port and inode in inodes:
                out[int(remote.split(":")[1], 16)] = inodes[inode]
    return out


def port_free(port: int) -> bool:
    """Whether a listener can take the port, as herald would (SO_REUSEADDR: TIME_WAIT does not count)."""
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        return True
    except OSError:
        return False
    finally:
        s.close()


def client_port(ws) -> int:
    return ws.conn.socket.getsockname()[1]


class Workers:
    """One `herald serve --workers N` on the test's schema and its own bus channels."""

    def __init__(self, herald_bin, tmp_path, store, n: int):
        self.n = n
        self.gw = Gateway(herald_bin, tmp_path, CONFIG, store=store,
                          extra_args=["--bus", f"{REDIS}/{random.randrange(1, 1 << 30)}", "--workers", str(n)])

    def start(self) -> "Workers":
        self.gw.start()
        self.wait_workers()
        return self

    @property
    def pid(self) -> int:
        return self.gw.proc.pid

    def pids(self) -> set[int]:
        return worker_pids(self.pid)

    def subscribed(self) -> int:
        return len(re.findall(r" worker \d+: bus: subscribed", self.gw.stderr_tail(1 << 20)))

    def wait_workers(self, subscriptions: int | None = None) -> set[int]:
        """Until N workers run and the bus said `subscribed` `subscriptions` times (default N)."""
        want = subscriptions or self.n
        wait_until(lambda: len(self.pids()) == self.n and self.subscribed() >= want, f"{self.n} workers subscribed")
        return self.pids()

    def holder(self, ws) -> int:
        return wait_until(lambda: holders(self.pids(), self.gw.port).get(client_port(ws)), "the worker holding a connection")


@pytest.fixture
def workers(herald_bin, tmp_path, store_url):  # noqa: F811
    started: list[Workers] = []

    def make(n: int) -> Workers:
        w = Workers(herald_bin, tmp_path / f"w{len(started)}", store_url, n)
        started.append(w)
        return w.start()

    yield make
    for w in started:
        if w.gw.alive():
            assert w.gw.terminate(10) == 0, w.gw.stderr_tail()


def test_three_workers_print_one_line_spread_connections_and_share_publishes_and_dismisses(workers):
    w = workers(3)
    pids = w.pids()
    users = [uid("user") for _ in range(20)]
    conns = []   # (user, device, ws, pid)
    try:
        for u in users:
            for d in ("phone", "laptop", "tablet"):
                ws, _, _ = w.gw.connect(u, d)
                conns.append((u, d, ws, w.holder(ws)))
        spread = {p: sum(1 for c in conns if c[3] == p) for p in pids}
        print(f"60 connections over 3 workers: {sorted(spread.values())}")
        assert len([p for p, n in spread.items() if n]) >= 2, f"60 connections all on one worker: {spread}"

        # A publish to every user reaches each of its devices, on whichever worker.
        published = {u: w.gw.publish(u, "hello")["seq"] for u in users}
        reached = set()
        for u, d, ws, pid in conns:
            changes, frames = ws.expect_changes(1)
            assert [c["seq"] for c in changes] == [published[u]], (u, d, frames)
            reached.add(pid)
        assert reached == {p for p, n in spread.items() if n}

        # A dismiss from a device on one worker reaches the user's devices on others.
        u = next((u for u in users if len({c[3] for c in conns if c[0] == u}) > 1), None)
        assert u is not None, f"no user with devices on two workers: {spread}"
        mine = [c for c in conns if c[0] == u]
        first = mine[0]
        others = [c for c in mine[1:] if c[3] != first[3]]
        assert others
        nid = w.gw.list_all(u)[0]["id"]
        ack, _ = first[2].request({"type": "update", "id": nid, "userActionState": "dismissed"})
        assert ack["type"] == "ack", ack
        dismissed = check_notification(ack["notification"])
        assert dismissed["userActionState"] == "dismissed"
        for _, d, ws, _ in others:
            frames = ws.collect_until(lambda fs: any(c["seq"] == ack["seq"] for c in changes_in(fs)), what="the dismiss")
            assert changes_in(frames) == [{"seq": ack["seq"], "op": "upsert", "notification": dismissed}], (d, frames)
    finally:
        for c in conns:
            c[2].close()
    assert w.gw.terminate(10) == 0, w.gw.stderr_tail()
    assert w.gw.stdout_closed.wait(5)
    assert w.gw.extra_stdout == [], "stdout must carry the one listening line only"
    assert w.gw.stderr_tail(1 << 20).count("workers ready") == 1


def metrics_folder(w: Workers) -> str:
    """The folder the workers share their metrics in (from their environment)."""
    folders = {open(f"/proc/{pid}/environ", "rb").read().split(b"HERALD_WORKER_METRICS=")[1].split(b"\0")[0].decode()
               for pid in w.pids()}
    assert len(folders) == 1 and os.path.isdir(next(iter(folders))), folders
    return folders.pop()


def test_metrics_through_the_port_answer_for_every_worker(workers):
    """A scrape through the shared port lands on one worker, which answers
    for every worker (each sample labelled with its worker), so the sums are
    the deployment's. The workers' metrics folder goes when they stop."""
    w = workers(2)

    def scrape() -> str:
        # A connection of its own each time: any worker may take it.
        return requests.get(f"{w.gw.base}/metrics", timeout=10).text

    def published(text: str) -> dict[str, float]:
        return {m[0]: float(m[1]) for m in re.findall(r'^herald_publishes_total\{worker="(\d+)"\} (\S+)$', text, re.M)}

    wait_until(lambda: published(scrape()).keys() == {"1", "2"}, "both workers' metrics written")
    for _ in range(10):
        text = scrape()
        assert published(text).keys() == {"1", "2"}, text
        assert len(re.findall(r"^# TYPE herald_publishes_total counter$", text, re.M)) == 1, text
    users = [uid("user") for _ in range(6)]
    for u in users:
        w.gw.publish(u, "hello")
    wait_until(lambda: sum(published(scrape()).values()) == len(users), "every publish counted, on whichever worker")
    folder = metrics_folder(w)
    assert w.gw.terminate(10) == 0, w.gw.stderr_tail()
    assert not os.path.exists(folder), "the metrics folder outlived the workers"


def test_a_worker_killed_9_is_started_again_and_the_others_keep_their_devices(workers):
    w = workers(2)
    before = w.pids()
    user = uid("user")
    conns = []
    try:
        # Devices on both workers (the kernel picks; keep connecting until it did).
        for i in range(40):
            ws, _, _ = w.gw.connect(user, f"d{i}")
            conns.append((ws, w.holder(ws)))
            if len({p for _, p in conns}) == 2 and i >= 5:
                break
        assert {p for _, p in conns} == before, "connections never reached both workers"
        victim = conns[0][1]
        survivors = [ws for ws, p in conns if p != victim]
        os.kill(victim, signal.SIGKILL)
        restarted = wait_until(lambda: (w.pids() - before) if len(w.pids()) == 2 else None, "the worker started again")
        w.wait_workers(subscriptions=3)
        log = w.gw.stderr_tail(1 << 20)
        assert f"(pid {victim}) was killed by signal 9" in log and "started again" in log, log

        # The other worker's devices stayed connected and still get changes.
        for ws in survivors:
            ws.ping()
        seq = w.gw.publish(user, "after-kill")["seq"]
        for ws in survivors:
            changes, frames = ws.expect_changes(1)
            assert [c["seq"] for c in changes] == [seq], frames

        # New connections work, and the new worker takes some.
        (new,) = restarted
        for i in range(60):
            ws, _, _ = w.gw.connect(uid("user"), f"n{i}")
            conns.append((ws, w.holder(ws)))
            if conns[-1][1] == new:
                break
        assert conns[-1][1] == new, "the restarted worker took no connection"
        u2 = uid("user")
        ws2, _, _ = w.gw.connect(u2, "x")
        conns.append((ws2, w.holder(ws2)))
        seq = w.gw.publish(u2, "on-new")["seq"]
        changes, frames = ws2.expect_changes(1)
        assert [c["seq"] for c in changes] == [seq], frames
    finally:
        for ws, _ in conns:
            ws.close()


def test_sigterm_ends_every_worker_with_status_0_within_10_s(workers):
    w = workers(3)
    pids = w.pids()
    ws, _, _ = w.gw.connect(uid("user"), "phone")
    t0 = time.monotonic()
    w.gw.proc.send_signal(signal.SIGTERM)
    assert w.gw.proc.wait(10) == 0, w.gw.stderr_tail()
    assert time.monotonic() - t0 < 10
    code, _ = ws.expect_close()
    assert code == 1001
    for p in pids:
        assert not os.path.exists(f"/proc/{p}"), f"worker {p} outlived its supervisor"


def test_sighup_reloads_every_worker_and_a_dead_supervisor_takes_its_workers_along(workers):
    w = workers(3)
    pids = w.pids()
    config = json.loads(w.gw.config_path.read_text())
    config["apps"].append({"id": "app.new", "serverKey": "sk-new", "tokenSecret": "ts-new"})
    w.gw.config_path.write_text(json.dumps(config))
    w.gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: len(set(re.findall(r" worker (\d+): config reloaded .*added app\.new", w.gw.stderr_tail(1 << 20)))) == 3,
               "every worker reloaded")
    # Fresh connections land on any worker: each knows the new app.
    for i in range(12):
        r = requests.post(f"{w.gw.base}/v1/apps/app.new/users/{uid('user')}/notifications", timeout=10,
                          headers={"Authorization": "Bearer sk-new", "Connection": "close"},
                          json={"appNotificationId": f"n{i}", "payload": {}})
        assert r.status_code in (200, 201), r.text

    # kill -9 of the supervisor: every worker gets SIGTERM and stops, and the
    # port is free; the last worker out removes the metrics folder.
    folder = metrics_folder(w)
    w.gw.kill()
    wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), "the workers gone with their supervisor", timeout=10)
    wait_until(lambda: port_free(w.gw.port), "the port free", timeout=5)
    assert len(re.findall(r" worker \d+: stopped", w.gw.stderr_tail(1 << 20))) == 3
    assert not os.path.exists(folder), os.listdir(folder)


def test_workers_need_postgres_and_redis_and_a_port_in_use_is_exit_2(workers, herald_bin, tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(herald_bin), "serve", "--host", "127.0.0.1", "--port", "0", "--app", "a",
                               "--server-key", "k", "--token-secret", "s", *args],
                              capture_output=True, text=True, timeout=30, cwd=tmp_path)

    for store in (["--store", "memory"], ["--store", f"sqlite:{tmp_path}/h.db", "--bus", REDIS],
                  ["--store", os.environ["HERALD_TEST_POSTGRES_URL"]]):
        r = run("--workers", "2", *store)
        assert r.returncode == 2, (store, r)
        assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and "--workers" in r.stderr, (store, r.stderr)

    # A worker that cannot start (no PostgreSQL there) ends the supervisor with status 1.
    r = run("--workers", "2", "--store", "postgres://herald@127.0.0.1:1/none?connect_timeout=2", "--bus", REDIS)
    assert r.returncode == 1 and r.stdout == "", r
    assert "before it was ready" in r.stderr, r.stderr

    w = workers(2)
    for extra in ([], ["--workers", "2", "--store", os.environ["HERALD_TEST_POSTGRES_URL"], "--bus", REDIS]):
        r = subprocess.run([str(herald_bin), "serve", "--host", "127.0.0.1", "--port", str(w.gw.port), "--app", "a",
                            "--server-key", "k", "--token-secret", "s", *extra],
                           capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert r.returncode == 2, (extra, r)
        assert "Address already in use" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert w.gw.request("GET", "/healthz").status_code == 200
