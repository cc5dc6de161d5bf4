#!/usr/bin/env python3
"""Users with long histories: what a connect costs, and what a storm of them
does to everyone else (issue 10, defect 0b).

Scenarios, each on a fresh gateway (SQLite store, a fresh file):

  hello-cost      a device of a user with 8,000 live notifications and one of
                  a user with 10 say hello with their current cursor, 30 times
                  each, one at a time: hello -> welcome, median and p90, and
                  the ratio (target: within 3x).
  hello-storm     10 such users x 10 devices say hello at once (current
                  cursor); meanwhile an unrelated user receives a publish
                  every 5 ms on another connection (its own process). Reports
                  the time until all 100 are welcomed and the unrelated
                  user's publish-to-delivery p50/p99/max during the storm
                  (target: p99 under 50 ms).
  reconnect-storm 1,000 devices (10 users x 100 devices; users with 10,000
                  live notifications of ~100-byte payloads) say hello without
                  a cursor at once and read their whole reset. Samples the
                  gateway's RSS every 50 ms: peak over baseline, per device;
                  checks every device got all 10,000 notifications and
                  `welcome`, and counts closes.

Usage: python3 bench/heavy_users.py [--herald BIN ...] [--quick] [--only SCENARIO]
Several --herald binaries are measured one after the other in the same run
(e.g. the previous commit's and this one's); output is one JSON line per
scenario and binary, and a table at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import http.client
import json
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import websockets

APP, KEY, SECRET = "bench", "bench-key", "bench-secret"


def token(user: str, ttl: int = 7200) -> str:
    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    now = int(time.time())
    h = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    c = b64(json.dumps({"app": APP, "sub": user, "iat": now, "exp": now + ttl}).encode())
    sig = hmac.new(SECRET.encode(), f"{h}.{c}".encode(), hashlib.sha256).digest()
    return f"{h}.{c}.{b64(sig)}"


class Herald:
    def __init__(self, binary: str):
        self.dir = tempfile.mkdtemp(prefix="herald-heavy-")
        cfg = {"apps": [{"id": APP, "serverKey": KEY, "tokenSecret": SECRET}],
               "limits": {"maxConnectionsPerUser": 200, "publishesPerSecondPerApp": 1_000_000}}
        with open(os.path.join(self.dir, "herald.json"), "w") as f:
            json.dump(cfg, f)
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", "--config", os.path.join(self.dir, "herald.json"),
             "--store", f"sqlite:{self.dir}/herald.db"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir, "stderr.log"), "wb"), text=True)
        line = self.proc.stdout.readline()
        m = re.match(r"listening on http://[\d.]+:(\d+)", line)
        if not m:
            raise SystemExit(f"gateway did not start: {line!r}")
        self.port = int(m.group(1))

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def seed(port: int, users: list[str], per_user: int, payload_bytes: int) -> None:
    """`per_user` notifications for each user, one app-wide send per round."""
    body_text = "x" * payload_bytes
    local = threading.local()

    def send(i: int) -> None:
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"userIds": users, "appNotificationId": f"n{i}", "payload": {"i": i, "b": body_text}})
        c.request("POST", f"/v1/apps/{APP}/notifications", body, {"Authorization": f"Bearer {KEY}"})
        r = c.getresponse()
        r.read()
        assert r.status == 202, r.status

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(per_user)))


async def hello(port: int, user: str, device: str, cursor=None, epoch=None, max_size=None):
    """Connects and says hello; answers (ws, seconds to welcome, welcome, notifications and changes received)."""
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/ws", max_size=max_size, compression=None,
                                  ping_interval=None, open_timeout=60)
    msg = {"type": "hello", "token": token(user), "deviceId": device}
    if cursor is not None:
        msg.update(cursor=cursor, epoch=epoch)
    t0 = time.perf_counter()
    await ws.send(json.dumps(msg))
    items = 0
    while True:
        f = json.loads(await ws.recv())
        if f["type"] == "welcome":
            return ws, time.perf_counter() - t0, f, items
        if f["type"] == "reset":
            items += len(f["notifications"])
        elif f["type"] == "changes":
            items += len(f["changes"])
        elif f["type"] == "error":
            raise RuntimeError(f"error before welcome: {f}")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# ---------------------------------------------------------------- hello-cost

def hello_cost(binary: str, quick: bool) -> dict:
    g = Herald(binary)
    try:
        heavy, light = "heavy-0", "light-0"
        seed(g.port, [heavy], 2000 if quick else 8000, 100)
        seed(g.port, [light], 10, 100)

        async def run(user: str) -> list[float]:
            ws, _, w, _ = await hello(g.port, user, "d0")
            await ws.close()
            times = []
            for i in range(10 if quick else 30):
                ws, dt, _, _ = await hello(g.port, user, "d0", w["cursor"], w["epoch"])
                times.append(dt * 1000)
                await ws.close()
            return times

        heavy_t = asyncio.run(run(heavy))
        light_t = asyncio.run(run(light))
        return {"heavy_median_ms": round(statistics.median(heavy_t), 2), "heavy_p90_ms": round(pct(heavy_t, 90), 2),
                "light_median_ms": round(statistics.median(light_t), 2), "light_p90_ms": round(pct(light_t, 90), 2),
                "ratio": round(statistics.median(heavy_t) / statistics.median(light_t), 2)}
    finally:
        g.stop()


# ---------------------------------------------------------------- hello-storm

def probe(port: int, user: str, seconds: float, out) -> None:
    """Another process: one device of `user`, a publish every 5 ms; sends back (sent_at, latency) pairs."""
    async def main():
        ws, _, _, _ = await hello(port, user, "probe")
        lat: list[tuple[float, float]] = []
        done = asyncio.Event()

        async def reader():
            while not done.is_set():
                try:
                    f = json.loads(await asyncio.wait_for(ws.recv(), 1))
                except asyncio.TimeoutError:
                    continue
                for c in ([f["change"]] if f["type"] == "change" else f.get("changes", []) if f["type"] == "changes" else []):
                    if c["op"] == "upsert":
                        t = c["notification"]["payload"]["t"]
                        lat.append((t, time.time() - t))

        task = asyncio.create_task(reader())
        loop = asyncio.get_running_loop()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def publish(i: int) -> None:
            body = json.dumps({"appNotificationId": f"p{i}", "payload": {"t": time.time()}})
            conn.request("POST", f"/v1/apps/{APP}/users/{user}/notifications", body, {"Authorization": f"Bearer {KEY}"})
            conn.getresponse().read()

        end = time.time() + seconds
        i = 0
        while time.time() < end:
            await loop.run_in_executor(None, publish, i)
            i += 1
            await asyncio.sleep(0.005)
        await asyncio.sleep(1)
        done.set()
        await task
        out.send(lat)

    asyncio.run(main())


def hello_storm(binary: str, quick: bool) -> dict:
    g = Herald(binary)
    try:
        users = [f"heavy-{i}" for i in range(10)]
        seed(g.port, users, 2000 if quick else 8000, 100)

        async def positions():
            out = {}
            for u in users:
                ws, _, w, _ = await hello(g.port, u, "d0")
                await ws.close()
                out[u] = (w["cursor"], w["epoch"])
            return out

        pos = asyncio.run(positions())
        parent, child = mp.Pipe()
        p = mp.Process(target=probe, args=(g.port, "probe-user", 6.0, child))
        p.start()
        time.sleep(2.0)   # the probe's baseline before the storm

        async def storm():
            t0 = time.time()
            res = await asyncio.gather(*(hello(g.port, u, f"d{k}", *pos[u]) for u in users for k in range(10)))
            t1 = time.time()
            for ws, *_ in res:
                await ws.close()
            return t0, t1, [r[1] for r in res]

        t0, t1, welcome_times = asyncio.run(storm())
        lat = parent.recv()
        p.join()
        during = [l * 1000 for (t, l) in lat if t0 - 0.5 <= t <= t1 + 0.5] or [0.0]
        before = [l * 1000 for (t, l) in lat if t < t0 - 0.5] or [0.0]
        return {"storm_seconds": round(t1 - t0, 3), "welcome_p99_ms": round(pct([w * 1000 for w in welcome_times], 99), 1),
                "probe_before_p99_ms": round(pct(before, 99), 2), "probe_during_p50_ms": round(pct(during, 50), 2),
                "probe_during_p99_ms": round(pct(during, 99), 2), "probe_during_max_ms": round(max(during), 2),
                "probe_during_n": len(during)}
    finally:
        g.stop()


# ---------------------------------------------------------------- reconnect-storm

def reconnect_storm(binary: str, quick: bool) -> dict:
    g = Herald(binary)
    try:
        n_users, per_user, n_notes = (5, 20, 2000) if quick else (10, 100, 10_000)
        users = [f"storm-{i}" for i in range(n_users)]
        seed(g.port, users, n_notes, 100)
        baseline = g.rss_kib()
        peak = [baseline]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], g.rss_kib())
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()

        async def one(u: str, k: int):
            try:
                ws, dt, w, items = await hello(g.port, u, f"d{k}", max_size=2**22)
            except Exception as e:   # a close before welcome
                return ("closed", str(e)[:80])
            await ws.close()
            return ("ok", dt, items)

        async def storm():
            return await asyncio.gather(*(one(u, k) for u in users for k in range(per_user)))

        t0 = time.time()
        res = asyncio.run(storm())
        elapsed = time.time() - t0
        stop.set()
        sampler.join()
        ok = [r for r in res if r[0] == "ok"]
        complete = sum(1 for r in ok if r[2] == n_notes)
        devices = n_users * per_user
        return {"devices": devices, "notifications_each": n_notes, "seconds": round(elapsed, 1),
                "welcomed": len(ok), "complete": complete, "closed": devices - len(ok),
                "rss_baseline_mib": round(baseline / 1024, 1), "rss_peak_mib": round(peak[0] / 1024, 1),
                "peak_per_device_kib": round((peak[0] - baseline) / devices, 1)}
    finally:
        g.stop()


SCENARIOS = {"hello-cost": hello_cost, "hello-storm": hello_storm, "reconnect-storm": reconnect_storm}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--herald", action="append", help="gateway binary (repeatable)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=list(SCENARIOS))
    a = ap.parse_args()
    binaries = a.herald or [".build/release/herald"]
    rows = []
    for name, fn in SCENARIOS.items():
        if a.only and name != a.only:
            continue
        for b in binaries:
            r = fn(b, a.quick)
            line = {"scenario": name, "herald": b, **r}
            print(json.dumps(line), flush=True)
            rows.append(line)
    print()
    for r in rows:
        print(f"| {r['scenario']} | {r['herald']} | " + ", ".join(f"{k} {v}" for k, v in r.items()
                                                             if k not in ("scenario", "herald")) + " |")


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()
