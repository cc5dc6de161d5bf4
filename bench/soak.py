#!/usr/bin/env python3
"""Hostile-traffic soak: attackers beside normal clients, on one gateway.

Starts `herald serve` (memory store), then for --seconds runs, in parallel:
  normal:   one publisher (HTTP, --rate/s) to a user with two WebSocket devices
            that must receive every change, in order; latency is measured;
  hostile:  malformed JSON, binary frames, oversized frames, invalid UTF-8,
            forged/none/expired tokens, unknown message types, deep nesting,
            slow-loris HTTP headers, half-sent bodies, a reader that never
            reads (slow consumer), chunked bodies, garbage bytes;
and samples the gateway's RSS each second. Prints a summary and exits
non-zero if a normal client lost anything or RSS grew past --max-growth-mb.
Loopback only; every loop is bounded by --seconds.
"""
from __future__ import annotations

import argparse, base64, hashlib, hmac, json, os, random, socket, subprocess, sys, tempfile, threading, time
from pathlib import Path

import requests
from websockets.sync.client import connect as _connect


def connect(*a, **kw):
    return _connect(*a, legacy=True, **kw) if 'legacy' in _connect.__code__.co_varnames else _connect(*a, **kw)

APP, KEY, SECRET = "soak", "soak-key", "soak-secret"


def token(sub, exp_in=3600, alg="HS256", secret=SECRET):
    def b64(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    now = int(time.time())
    h = b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    p = b64(json.dumps({"app": APP, "sub": sub, "iat": now, "exp": now + exp_in}).encode())
    sig = b64(hmac.new(secret.encode(), f"{h}.{p}".encode(), hashlib.sha256).digest())
    return f"{h}.{p}.{sig}"


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--herald", default=str(Path(__file__).resolve().parents[1] / ".build/release/herald"))
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--attackers", type=int, default=6)
    ap.add_argument("--max-growth-mb", type=float, default=32)
    a = ap.parse_args()

    cfg = Path(tempfile.mkdtemp()) / "soak.json"
    cfg.write_text(json.dumps({"apps": [{"id": APP, "serverKey": KEY, "tokenSecret": SECRET}],
                               "limits": {"maxQueuedBytesPerConnection": 1 << 20}}))
    proc = subprocess.Popen([a.herald, "serve", "--port", "0", "--store", "memory", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline().decode()
    base = line.strip().split()[-1]
    host, port = base.removeprefix("http://").split(":")
    port = int(port)
    ws_url = f"ws://{host}:{port}/v1/ws"
    stop = time.time() + a.seconds
    stats = {"hostile": 0, "hostile_errors": 0}
    lock = threading.Lock()

    # --- normal clients
    user = "normal-user"
    devices = []
    for d in ("phone", "laptop"):
        c = connect(ws_url, max_size=None, ping_interval=None)
        c.send(json.dumps({"type": "hello", "token": token(user), "deviceId": d}))
        while json.loads(c.recv(timeout=5))["type"] != "welcome":
            pass
        devices.append(c)
    received = [dict() for _ in devices]   # anid -> latency

    def reader(i, c):
        while True:
            try:
                f = json.loads(c.recv(timeout=max(1, stop - time.time() + 5)))
            except Exception:
                return
            changes = [f["change"]] if f["type"] == "change" else f.get("changes", []) if f["type"] == "changes" else []
            for ch in changes:
                if ch["op"] == "upsert":
                    p = ch["notification"]["payload"]
                    received[i][ch["notification"]["appNotificationId"]] = time.time() - p["t"]

    readers = [threading.Thread(target=reader, args=(i, c), daemon=True) for i, c in enumerate(devices)]
    for t in readers:
        t.start()
    sent = []

    def publisher():
        s = requests.Session()
        n = 0
        while time.time() < stop:
            anid = f"m{n}"
            r = s.post(f"{base}/v1/apps/{APP}/users/{user}/notifications", headers={"Authorization": f"Bearer {KEY}"},
                       json={"appNotificationId": anid, "payload": {"t": time.time()}}, timeout=5)
            if r.status_code in (200, 201):
                sent.append(anid)
            n += 1
            time.sleep(1 / a.rate)

    # --- attackers
    def ws_attack(rng):
        kinds = ["badjson", "binary", "oversize", "badutf8", "forged", "none", "expired", "unknown", "deep", "stall"]
        k = rng.choice(kinds)
        try:
            c = connect(ws_url, max_size=None, ping_interval=None, open_timeout=3, close_timeout=1)
            if k == "badjson": c.send('{"type":"hello",')
            elif k == "binary": c.send(b"\x00\x01" * 100)
            elif k == "oversize": c.send("x" * (300 * 1024))
            elif k == "badutf8": c.send(b"\xff\xfe\xfd", text=True)
            elif k == "forged": c.send(json.dumps({"type": "hello", "token": token("victim", secret="guess"), "deviceId": "d"}))
            elif k == "none": c.send(json.dumps({"type": "hello", "token": token("victim", alg="none"), "deviceId": "d"}))
            elif k == "expired": c.send(json.dumps({"type": "hello", "token": token("victim", exp_in=-60), "deviceId": "d"}))
            elif k == "unknown": c.send(json.dumps({"type": "launch", "x": 1}))
            elif k == "deep": c.send("[" * 10000 + "]" * 10000)
            elif k == "stall":
                # A real device of the victim user that never reads: slow consumer.
                c.send(json.dumps({"type": "hello", "token": token(user), "deviceId": f"stall{rng.randrange(3)}"}))
                time.sleep(min(5, max(0, stop - time.time())))
            try:
                c.recv(timeout=2)
            except Exception:
                pass
            c.close()
        except Exception:
            with lock:
                stats["hostile_errors"] += 1

    def http_attack(rng):
        k = rng.choice(["slowloris", "halfbody", "chunked", "garbage", "hugeheader", "badpath"])
        try:
            s = socket.create_connection((host, port), timeout=3)
            if k == "slowloris":
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                for _ in range(3):
                    time.sleep(0.5); s.sendall(b"X-a: b\r\n")
            elif k == "halfbody":
                s.sendall(b"POST /v1/apps/soak/users/u/notifications HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"a\":")
                time.sleep(1)
            elif k == "chunked":
                s.sendall(b"POST /v1/apps/soak/users/u/notifications HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            elif k == "garbage":
                s.sendall(os.urandom(rng.randrange(1, 4000)))
            elif k == "hugeheader":
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * 20000 + b"\r\n\r\n")
            else:
                s.sendall(b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(1)
            try:
                s.recv(4096)
            except Exception:
                pass
            s.close()
        except Exception:
            with lock:
                stats["hostile_errors"] += 1

    def attacker(seed):
        rng = random.Random(seed)
        while time.time() < stop:
            (ws_attack if rng.random() < 0.6 else http_attack)(rng)
            with lock:
                stats["hostile"] += 1

    rss = [rss_kb(proc.pid)]
    threads = [threading.Thread(target=publisher)] + [threading.Thread(target=attacker, args=(i,)) for i in range(a.attackers)]
    for t in threads:
        t.start()
    while time.time() < stop:
        time.sleep(1)
        rss.append(rss_kb(proc.pid))
    for t in threads:
        t.join(15)
    time.sleep(2)
    rss.append(rss_kb(proc.pid))
    for c in devices:
        c.close()
    alive = proc.poll() is None
    proc.terminate()
    rc = proc.wait(15)

    lat = sorted(v for r in received for v in r.values())
    missing = [sorted(set(sent) - set(r)) for r in received]
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")
    third = max(1, len(rss) // 3)
    growth = (rss[-1] - min(rss[third:])) / 1024
    print(f"soak {a.seconds:.0f} s: {stats['hostile']} hostile connections ({stats['hostile_errors']} refused at connect), "
          f"{len(sent)} publishes to the normal user")
    print(f"normal devices: received {[len(r) for r in received]} of {len(sent)}, missing {[len(m) for m in missing]}, "
          f"latency p50 {q(0.5):.2f} ms p99 {q(0.99):.2f} ms max {q(1.0):.2f} ms")
    print(f"gateway RSS: start {rss[0]/1024:.1f} MB, max {max(rss)/1024:.1f} MB, end {rss[-1]/1024:.1f} MB, "
          f"growth after warm-up {growth:.1f} MB (by thirds: {' / '.join(f'{rss[k]/1024:.1f}' for k in (third, 2 * third, len(rss) - 1))} MB); alive through the soak: {alive}; exit status at SIGTERM {rc}")
    ok = alive and rc == 0 and not any(missing) and growth <= a.max_growth_mb
    print("RESULT", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
