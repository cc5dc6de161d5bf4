#!/usr/bin/env python3
"""A tiny stand-in for Herald's wire contract, used only to self-test the load
generator's Herald paths (hello/welcome, change and changes frames, dismiss,
resume with cursor and epoch) before or without the real gateway.

    python3 bench/mock_herald.py --port 18081 [--batch]

Standard library only; one asyncio thread; loopback only; not a benchmark
target (it is slow). --batch sends queued live changes as one `changes` frame.
"""
import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import struct

SECRET = b"bench-secret"
KEY = "bench-key"
APP = "bench"
EPOCH = "e1"
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class User:
    def __init__(self):
        self.seq = 0
        self.changes = []  # (seq, change dict)
        self.notifs = {}  # id -> notification
        self.conns = set()


USERS = {}
COUNTER = [0]
ARGS = None


def user(uid):
    if uid not in USERS:
        USERS[uid] = User()
    return USERS[uid]


def b64d(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def check_token(tok):
    h, p, sig = tok.split(".")
    want = hmac.new(SECRET, (h + "." + p).encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(want, b64d(sig)):
        raise ValueError("bad signature")
    claims = json.loads(b64d(p))
    if claims.get("app") != APP:
        raise ValueError("wrong app")
    return claims["sub"]


def frame(text):
    data = text.encode()
    n = len(data)
    if n < 126:
        hdr = struct.pack("!BB", 0x81, n)
    elif n < 65536:
        hdr = struct.pack("!BBH", 0x81, 126, n)
    else:
        hdr = struct.pack("!BBQ", 0x81, 127, n)
    return hdr + data


class Conn:
    def __init__(self, w):
        self.w = w
        self.queue = []
        self.scheduled = False

    def send(self, obj):
        self.w.write(frame(json.dumps(obj, separators=(",", ":"))))

    def live(self, change):
        if not ARGS.batch:
            self.send({"type": "change", "change": change})
            return
        self.queue.append(change)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self):
        self.scheduled = False
        q, self.queue = self.queue, []
        if len(q) == 1:
            self.send({"type": "change", "change": q[0]})
        elif q:
            self.send({"type": "changes", "changes": q, "cursor": q[-1]["seq"]})


def record(u, change_without_seq):
    u.seq += 1
    ch = dict(seq=u.seq, **change_without_seq)
    u.changes.append((u.seq, ch))
    for c in list(u.conns):
        c.live(ch)
    return ch


async def read_frame(r):
    b0, b1 = await r.readexactly(2)
    op = b0 & 0x0F
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await r.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await r.readexactly(8))
    mask = await r.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
    data = bytearray(await r.readexactly(n))
    for i in range(n):
        data[i] ^= mask[i & 3]
    return op, bytes(data)


async def websocket(r, w, headers):
    key = headers.get("sec-websocket-key", "").encode()
    acc = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
    w.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Accept: %s\r\n\r\n" % acc).encode())
    conn = Conn(w)
    u = None
    try:
        while True:
            op, data = await read_frame(r)
            if op == 8:
                return
            if op == 9:
                continue
            msg = json.loads(data)
            if u is None:
                if msg.get("type") != "hello":
                    return
                try:
                    uid = check_token(msg["token"])
                except Exception:
                    w.write(struct.pack("!BBH", 0x88, 2, 4001))
                    return
                u = user(uid)
                cur = msg.get("cursor")
                if cur is not None and msg.get("epoch", EPOCH) == EPOCH and cur <= u.seq:
                    pend = [ch for s, ch in u.changes if s > cur]
                    for i in range(0, len(pend), 500):
                        conn.send({"type": "changes", "changes": pend[i:i + 500], "cursor": pend[i:i + 500][-1]["seq"]})
                else:
                    conn.send({"type": "reset", "notifications": list(u.notifs.values())[:500],
                               "cursor": u.seq, "epoch": EPOCH, "final": True})
                conn.send({"type": "welcome", "cursor": u.seq, "epoch": EPOCH, "connectionId": "c%d" % id(conn),
                           "unread": 0})
                u.conns.add(conn)
            elif msg.get("type") == "update":
                n = u.notifs.get(msg.get("id"))
                if not n:
                    conn.send({"type": "error", "ref": msg.get("ref"), "code": "not_found", "message": "no"})
                    continue
                n = dict(n, readState=msg.get("readState", n["readState"]), version=n["version"] + 1)
                u.notifs[n["id"]] = n
                ch = record(u, {"op": "upsert", "notification": n})
                conn.send({"type": "ack", "ref": msg.get("ref"), "notification": n, "seq": ch["seq"]})
            elif msg.get("type") == "ping":
                conn.send({"type": "pong", "ref": msg.get("ref")})
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        if u:
            u.conns.discard(conn)


async def handle(r, w):
    try:
        while True:
            line = await r.readline()
            if not line:
                return
            method, path, _ = line.decode().split(" ", 2)
            headers = {}
            while True:
                h = (await r.readline()).decode()
                if h in ("\r\n", "\n", ""):
                    break
                k, v = h.split(":", 1)
                headers[k.strip().lower()] = v.strip()
            if path == "/v1/ws" and headers.get("upgrade", "").lower() == "websocket":
                await websocket(r, w, headers)
                return
            body = await r.readexactly(int(headers.get("content-length", "0")))
            parts = path.split("/")
            status, resp = 404, {"error": {"code": "not_found", "message": path}}
            if method == "POST" and len(parts) == 7 and parts[1:3] == ["v1", "apps"] and parts[4] == "users" \
                    and parts[6] == "notifications":
                if parts[3] != APP or headers.get("authorization") != "Bearer " + KEY:
                    status, resp = 401, {"error": {"code": "unauthorized", "message": "key"}}
                else:
                    b = json.loads(body)
                    u = user(parts[5])
                    COUNTER[0] += 1
                    nid = "n_%08d" % COUNTER[0]
                    n = {"id": nid, "appNotificationId": b["appNotificationId"], "userId": parts[5],
                         "payload": b["payload"], "priority": "normal", "readState": "unread",
                         "userActionState": "noInteraction", "version": 1}
                    u.notifs[nid] = n
                    ch = record(u, {"op": "upsert", "notification": n})
                    status, resp = 201, {"notification": n, "seq": ch["seq"]}
            out = json.dumps(resp).encode()
            w.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (status, len(out)) + out)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        w.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", ARGS.port, backlog=4096)
    print("listening on http://127.0.0.1:%d" % ARGS.port, flush=True)
    async with server:
        await asyncio.wait_for(server.serve_forever(), ARGS.max_seconds)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18081)
    ap.add_argument("--batch", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=600, help="exit after this long")
    ARGS = ap.parse_args()
    try:
        asyncio.run(main())
    except (asyncio.TimeoutError, KeyboardInterrupt):
        pass
