"""The push benchmarks' client side (bench/push.sh): registers devices with
APNs handles through the server API, publishes one notification to each of
their users, and reads what the APNs stand-in received.

  push_load.py register BASE COUNT [PREFIX [plain]]
                                              COUNT users PREFIX0.., each one ios device with an APNs handle
                                              (plain: without, for a gateway without push)
  push_load.py burst BASE COUNT [PREFIX]       app-wide sends of 1,000 users each to all COUNT users, at once;
                                              prints the unix time of the first send
  push_load.py publish BASE COUNT RATE [PREFIX] one publish per user at RATE/s; prints one JSON line:
                                              {"acked": N, "errors": N, "seconds": S, "cpu": its own CPU seconds,
                                               "ack_times": {notification id: unix seconds}}
Every loop is bounded by COUNT and by time (10 minutes at most).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import sys
import threading
import time
from urllib.parse import urlsplit

APP, KEY = "bench", "bench-key"
DEADLINE = time.monotonic() + 600


def token_for(prefix: str, i: int) -> str:
    # A handle is unique per app: each user's own, or registering moves it.
    return hashlib.sha256(f"{prefix}{i}".encode()).hexdigest()


def connection(base: str) -> http.client.HTTPConnection:
    u = urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=30)


def request(conn, method: str, path: str, body: dict):
    conn.request(method, path, body=json.dumps(body), headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    return r.status, data


def register(base: str, count: int, prefix: str, handles: bool = True) -> None:
    def work(lo: int, hi: int):
        conn = connection(base)
        for i in range(lo, hi):
            if time.monotonic() > DEADLINE:
                raise SystemExit("registration ran out of time")
            body = {"platform": "ios"}
            if handles:
                body["push"] = {"service": "apns", "token": token_for(prefix, i)}
            status, data = request(conn, "PUT", f"/v1/apps/{APP}/users/{prefix}{i}/devices/phone", body)
            if status != 200:
                raise SystemExit(f"register {i}: {status} {data[:200]!r}")
    threads = [threading.Thread(target=work, args=(k * count // 8, (k + 1) * count // 8)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def paced(base: str, count: int, rate: float, call, workers: int = 16) -> float:
    """Runs `call(conn, i)` for i in 0..<count at `rate` per second over
    `workers` connections (each i no sooner than its turn); answers the
    seconds it took. Bounded by DEADLINE."""
    start = time.monotonic()

    def work(k: int):
        conn = connection(base)
        for i in range(k, count, workers):
            due = start + i / rate
            while (now := time.monotonic()) < due:
                time.sleep(due - now)
            if now > DEADLINE:
                return
            call(conn, i)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - start


def publish(base: str, count: int, rate: float, prefix: str) -> None:
    acked, errors, ack_times = 0, 0, {}
    lock = threading.Lock()

    def one(conn, i: int):
        nonlocal acked, errors
        status, data = request(conn, "POST", f"/v1/apps/{APP}/users/{prefix}{i}/notifications",
                               {"appNotificationId": f"b{i}", "payload": {"title": f"Bench {i}", "body": "push benchmark"}})
        with lock:
            if status in (200, 201):
                acked += 1
                ack_times[json.loads(data)["notification"]["id"]] = time.time()
            else:
                errors += 1
    seconds = paced(base, count, rate, one)
    print(json.dumps({"acked": acked, "errors": errors, "seconds": seconds,
                      "cpu": time.process_time(), "ack_times": ack_times}))


def burst(base: str, count: int, prefix: str) -> None:
    conn = connection(base)
    start = time.time()
    for lo in range(0, count, 1000):
        users = [f"{prefix}{i}" for i in range(lo, min(count, lo + 1000))]
        status, data = request(conn, "POST", f"/v1/apps/{APP}/notifications",
                               {"userIds": users, "appNotificationId": "burst", "payload": {"title": "Burst", "body": "push benchmark"}})
        if status != 202:
            raise SystemExit(f"app-wide send: {status} {data[:200]!r}")
    print(start)


if __name__ == "__main__":
    cmd, base, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if cmd == "register":
        register(base, count, sys.argv[4] if len(sys.argv) > 4 else "p", handles=sys.argv[5:6] != ["plain"])
    elif cmd == "burst":
        burst(base, count, sys.argv[4] if len(sys.argv) > 4 else "p")
    elif cmd == "publish":
        publish(base, count, float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "p")
    else:
        raise SystemExit(__doc__)
