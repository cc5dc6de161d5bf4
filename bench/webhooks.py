"""Webhook benchmarks (SPEC section 13; figures in docs/BENCHMARKS.md, "Webhooks").

  python3 bench/webhooks.py [burst] [throughput] [memory]      (all by default)

burst       one user with COUNT (10,000) unread notifications marks them all
            read in one request (read-all): COUNT notification.read events.
            Reports the time from the request to the last event received.
throughput  COUNT (10,000) users with one notification each; then one state
            change each (read-all by the user's device: one
            notification.read event) at RATE (2,000/s) to a receiver on
            loopback that answers 204 at once (asyncio, keep-alive, in a
            process of its own, apart from the publisher's threads) and
            verifies one request in VERIFY_EVERY (50) with the
            standardwebhooks package. Reports: last change's 2xx to the last
            event received; change-acknowledged to event-received p50/p99
            (measured at the receiver); Herald's commit-to-2xx p99 (its
            histogram's bucket bound); Herald's CPU.
receive     a receiver alone (bench/push.sh HARM_FEATURE=webhooks); its
            endpoint takes WEBHOOK_EVENTS (comma-separated) when set.
memory      WAITING (100,000) events for a receiver that answers 503:
            Herald's RSS before, and every 5 s for 30 s after, with
            herald_webhook_pending; then the same publishes with the
            endpoint taking no event type, for what the publishes alone cost.

Herald runs on SQLite (`--durability normal`) from HERALD_BIN (default
.build/release/herald). Everything is on 127.0.0.1, bounded in count and
time; what it starts it stops, by pid.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from standardwebhooks.webhooks import Webhook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "Tests" / "e2e"))
from herald_helpers import mint_token  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from push_load import DEADLINE, paced  # noqa: E402

HERALD = os.environ.get("HERALD_BIN", str(ROOT / ".build" / "release" / "herald"))
COUNT = int(os.environ.get("COUNT", 10_000))
RATE = float(os.environ.get("RATE", 2_000))
WAITING = int(os.environ.get("WAITING", 100_000))
VERIFY_EVERY = int(os.environ.get("VERIFY_EVERY", 50))
PUBLISHERS = int(os.environ.get("PUBLISHERS", 2))
APP, KEY, TOKEN_SECRET = "bench", "bench-key", "bench-secret"
SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Receiver:
    """An endpoint answering `status` at once, on a thread of its own."""

    def __init__(self, status: int, secret: str = SECRET):
        self.status, self.got, self.bad, self.count = status, {}, 0, 0
        self.note = lambda at: None   # called with each 2xx event's arrival time
        self.hook = Webhook(secret)
        self.ready = threading.Event()
        threading.Thread(target=lambda: asyncio.run(self.serve()), daemon=True).start()
        self.ready.wait(10)

    async def serve(self):
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0, backlog=512)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hooks"
        self.ready.set()
        async with server:
            await server.serve_forever()

    async def handle(self, reader, writer):
        answer = (f"HTTP/1.1 {self.status} X\r\ncontent-length: 0\r\n"
                  + ("retry-after: 3600\r\n" if self.status == 503 else "") + "\r\n").encode()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                self.count += 1
                if self.status == 200 or self.status == 204:
                    if self.count % VERIFY_EVERY == 0:
                        try:
                            self.hook.verify(body, headers)
                        except Exception:
                            self.bad += 1
                    user, now = json.loads(body)["data"]["userId"], time.time()
                    self.got.setdefault(user, now)
                    self.note(now)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


class ReceiverProcess:
    """A `Receiver` in a process of its own, for the throughput run: its
    asyncio loop then shares no interpreter lock with the publisher's
    threads (in one process the two held each other back, on two cores
    Herald shares). `received` counts 2xx events as they come; `results()`
    ends it and takes what it saw."""

    def __init__(self, status: int):
        # Spawned, not forked: the parent may run threads (an earlier run's receiver).
        ctx = multiprocessing.get_context("spawn")
        self.received = ctx.Value("i", 0)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve_receiver, args=(status, child, self.received, SECRET), daemon=True)
        self.proc.start()
        self.url = self.conn.recv()

    def results(self) -> tuple[dict[str, float], int, int]:
        """Arrival time by user, requests, failed signature checks."""
        self.conn.send("done")
        out = self.conn.recv()
        self.proc.terminate()
        return out


def _serve_receiver(status: int, conn, received, secret: str) -> None:
    r = Receiver(status, secret)  # the parent's: a spawned child draws its own SECRET

    def note(_at: float) -> None:
        with received.get_lock():
            received.value += 1
    r.note = note
    conn.send(r.url)
    conn.recv()
    conn.send((r.got, r.count, r.bad))


def start_herald(work: Path, receiver: Receiver | ReceiverProcess, events: list[str] | None) -> tuple[subprocess.Popen, int]:
    hook = {"url": receiver.url, "secret": SECRET}
    if events:
        hook["events"] = events
    cfg = work / "herald.json"
    cfg.write_text(json.dumps({"apps": [{"id": APP, "serverKey": KEY, "tokenSecret": TOKEN_SECRET, "webhooks": [hook]}]}))
    proc = subprocess.Popen([HERALD, "serve", "--host", "127.0.0.1", "--port", "0", "--store", f"sqlite:{work}/wh.db",
                             "--durability", "normal", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=open(work / "herald.log", "wb"), cwd=work)
    for line in proc.stdout:
        m = re.match(rb"listening on http://127.0.0.1:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    raise SystemExit(f"herald did not start: {(work / 'herald.log').read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def call(conn, method: str, path: str, body: dict | None, auth: str) -> tuple[int, bytes]:
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Authorization": f"Bearer {auth}", "Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def bulk(port: int, prefix: str, count: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for lo in range(0, count, 1000):
        users = [f"{prefix}{i}" for i in range(lo, min(count, lo + 1000))]
        status, data = call(conn, "POST", f"/v1/apps/{APP}/notifications",
                            {"userIds": users, "appNotificationId": "bench", "payload": {"title": "t"}}, KEY)
        assert status == 202, (status, data[:200])


def metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    return conn.getresponse().read().decode()


def metric(port: int, series: str) -> float:
    for line in metrics(port).splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def p99_bound(port: int) -> str:
    buckets = [(l.split('le="')[1].split('"')[0], float(l.split()[-1])) for l in metrics(port).splitlines()
               if l.startswith("herald_webhook_latency_seconds_bucket")]
    total = buckets[-1][1]
    le = next(le for le, n in buckets if n >= 0.99 * total)
    return "over 2.5 s" if le == "+Inf" else f"<= {float(le) * 1000:g} ms"


def cpu_seconds(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:"))


def _mark_read(port: int, first: int, rate: float, conn) -> None:
    """One publisher process's share of `throughput`: users t{first},
    t{first + PUBLISHERS}, ... each mark theirs read, at `rate`; sends back
    when each was acknowledged, and for how long it ran."""
    acks: dict[str, float] = {}
    lock = threading.Lock()

    def one(c, i: int):
        user = f"t{first + i * PUBLISHERS}"
        status, data = call(c, "POST", "/v1/me/notifications/read-all", None,
                            mint_token(user, APP, secret=TOKEN_SECRET, dev="phone"))
        assert status == 200 and json.loads(data)["updated"] == 1, (status, data[:200])
        with lock:
            acks[user] = time.time()
    sent_for = paced(f"http://127.0.0.1:{port}", len(range(first, COUNT, PUBLISHERS)), rate, one)
    conn.send((acks, sent_for))


def throughput(work: Path) -> str:
    receiver = ReceiverProcess(204)
    proc, port = start_herald(work, receiver, ["notification.read"])
    try:
        bulk(port, "t", COUNT)
        c0 = cpu_seconds(proc.pid)
        # Publishers in processes of their own: one Python process tops out below RATE here.
        ctx = multiprocessing.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(PUBLISHERS)]
        publishers = [ctx.Process(target=_mark_read, args=(port, k, RATE / PUBLISHERS, child)) for k, (_, child) in enumerate(pipes)]
        for p in publishers:
            p.start()
        acks: dict[str, float] = {}
        sent_for = 0.0
        for (parent, _), p in zip(pipes, publishers):
            got_acks, took = parent.recv()
            acks.update(got_acks)
            sent_for = max(sent_for, took)
            p.join()
        last_ack = max(acks.values())
        while receiver.received.value < COUNT and time.monotonic() < DEADLINE and time.time() - last_ack < 120:
            time.sleep(0.01)
        c1 = cpu_seconds(proc.pid)
        got, count, bad = receiver.results()
        lat = sorted((got[u] - acks[u]) * 1000 for u in acks if u in got)
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
        delivered = int(metric(port, 'herald_webhook_sent_total{outcome="delivered"}'))
        return (f"| {len(acks):,} at {len(acks) / sent_for:,.0f}/s | {len(got):,} | "
                f"{max(got.values()) - last_ack:.2f} s | {q(0.5):.1f} / {q(0.99):.1f} ms | {p99_bound(port)} | "
                f"{delivered:,} | {count // VERIFY_EVERY} checked, {bad} bad | {c1 - c0:.1f} s |")
    finally:
        stop(proc)


def burst(work: Path) -> str:
    """One user with COUNT unread notifications marks them all read at once."""
    receiver = Receiver(204)
    proc, port = start_herald(work, receiver, ["notification.read"])
    try:
        def one(conn, i: int):
            status, data = call(conn, "POST", f"/v1/apps/{APP}/users/b/notifications",
                                {"appNotificationId": f"n{i}", "payload": {"title": "t"}}, KEY)
            assert status in (200, 201), (status, data[:200])
        paced(f"http://127.0.0.1:{port}", COUNT, 1e9, one)
        receiver.got = {}
        seen: list[float] = []
        receiver.note = seen.append
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        start = time.time()
        status, data = call(conn, "POST", "/v1/me/notifications/read-all", None, mint_token("b", APP, secret=TOKEN_SECRET, dev="phone"))
        acked = time.time()
        assert status == 200 and json.loads(data)["updated"] == COUNT, (status, data[:200])
        while len(seen) < COUNT and time.time() - acked < 120:
            time.sleep(0.01)
        return (f"| {COUNT:,} in one read-all | {acked - start:.2f} s | {len(seen):,} | {max(seen) - start:.2f} s | "
                f"{max(seen) - acked:.2f} s | {receiver.count // VERIFY_EVERY} checked, {receiver.bad} bad |")
    finally:
        stop(proc)


def memory(work: Path, events: list[str] | None) -> str:
    receiver = Receiver(503)
    proc, port = start_herald(work, receiver, events)
    try:
        rss0 = rss_kib(proc.pid)
        bulk(port, "m", WAITING)
        samples = []
        for _ in range(6):
            time.sleep(5)
            samples.append(rss_kib(proc.pid))
        pending = int(metric(port, "herald_webhook_pending"))
        retried = int(metric(port, 'herald_webhook_sent_total{outcome="retried"}'))
        return (f"| {'every event' if events is None else 'none (the same publishes)'} | {rss0:,} KiB | "
                f"{' '.join(f'{s:,}' for s in samples)} | {pending:,} | {retried:,} |")
    finally:
        stop(proc)


def receive() -> None:
    """`receive`: a 204 receiver alone, for bench/push.sh's harm scenario
    with HARM_FEATURE=webhooks: prints the app's webhooks JSON, then serves
    until killed."""
    receiver = Receiver(204)
    hook = {"url": receiver.url, "secret": SECRET}
    if os.environ.get("WEBHOOK_EVENTS"):
        hook["events"] = os.environ["WEBHOOK_EVENTS"].split(",")
    print(json.dumps([hook]), flush=True)
    threading.Event().wait(DEADLINE - time.monotonic())


def main() -> None:
    if sys.argv[1:] == ["receive"]:
        return receive()
    wanted = sys.argv[1:] or ["burst", "throughput", "memory"]
    out = [f"# Webhook benchmarks\n\n{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, herald {HERALD}\n"]
    with tempfile.TemporaryDirectory(prefix="herald-wh-bench-") as tmp:
        if "burst" in wanted:
            (Path(tmp) / "b").mkdir()
            out += [f"## Burst: {COUNT:,} state changes in one request\n",
                    "| changes | read-all answered after | events received | first byte sent to last event | read-all's 2xx to last event "
                    "| signatures |", "|---|---|---|---|---|---|", burst(Path(tmp) / "b"), ""]
        if "throughput" in wanted:
            (Path(tmp) / "t").mkdir()
            out += [f"## Throughput: {COUNT:,} state changes at {RATE:,.0f}/s\n",
                    "| changes acknowledged | events received | last change's 2xx to last event | ack to received p50 / p99 "
                    "| Herald's commit-to-2xx p99 | delivered (Herald) | signatures | Herald CPU |",
                    "|---|---|---|---|---|---|---|---|", throughput(Path(tmp) / "t"), ""]
        if "memory" in wanted:
            (Path(tmp) / "m").mkdir()
            (Path(tmp) / "m0").mkdir()
            out += [f"## Memory while {WAITING:,} events wait (the receiver answers 503)\n",
                    "| events recorded | RSS before | RSS every 5 s after the publishes (KiB) | pending | retried so far |",
                    "|---|---|---|---|---|", memory(Path(tmp) / "m", None), memory(Path(tmp) / "m0", ["push.unregistered"]), ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
