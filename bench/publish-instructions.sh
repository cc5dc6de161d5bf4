#!/usr/bin/env bash
# Instructions per publish (issue 32), counted by callgrind, not timed: the
# same for the same binary and inputs whatever else the machine does, so two
# builds compare on a noisy machine. Herald runs on the memory store with one
# loop under `valgrind --tool=callgrind`; one keep-alive connection publishes
# N notifications to 100 users (small payloads); a second run publishes none.
# (total(N) - total(0)) / N is what one publish costs: request head, routing,
# body, validation, the engine's batch, the answer, and with DEVICES > 0 its
# deliveries: each user then has DEVICES WebSockets open in both runs, and
# every publish reaches them all before the run ends.
#
#   bench/publish-instructions.sh                 # the release build
#   OTHER=/path/to/herald bench/publish-instructions.sh   # and another, beside it
#   DEVICES=3 bench/publish-instructions.sh       # with three deliveries a publish
#   PAYLOAD=60000 bench/publish-instructions.sh   # payloads with a string of that many bytes
#
# N [2000], DEVICES [0], PAYLOAD [0: {"t": i, "n": i}], HERALD_BIN [.build/release/herald], SKIP_HERALD_BUILD=1.
# Writes bench/out/publish-instructions.md; callgrind files beside it.
set -euo pipefail
LOG_TAG=publish-instructions
source "$(dirname "$0")/lib.sh"

N=${N:-2000}
DEVICES=${DEVICES:-0}
PAYLOAD=${PAYLOAD:-0}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
PORT=${PORT:-18195}
command -v valgrind >/dev/null || { log "valgrind is needed (Debian: valgrind)"; exit 1; }
build_herald

# total instructions of a run of BIN with COUNT publishes
count() { # bin count tag
    local HERALD_BIN=$1 pid   # herald_spawn starts $HERALD_BIN (dynamic scope)
    HERALD_PIN="valgrind --tool=callgrind --callgrind-out-file=$OUT/publish-instructions-$3.out" \
        herald_spawn publish-instructions "$WORK/publish-instructions" "$PORT" --store memory --threads 1 >&2 \
        || { log "herald did not start under valgrind (bench/out/publish-instructions-server.log)"; exit 1; }
    pid=$SPAWNED_PID
    python3 - "$PORT" "$2" "$DEVICES" "$PAYLOAD" <<'PY'
import asyncio, base64, hashlib, hmac, http.client, json, sys, time
import websockets
port, n, devices, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
text = "x" * size
users = [f"u{i}" for i in range(100)]

def token(user, device):
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
    now = int(time.time())
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64(json.dumps({"app": "bench", "sub": user, "dev": device, "iat": now, "exp": now + 86400}).encode())
    sig = b64(hmac.new(b"bench-secret", head + b"." + claims, hashlib.sha256).digest())
    return (head + b"." + claims + b"." + sig).decode()

def publish():
    c = http.client.HTTPConnection("127.0.0.1", port)
    h = {"Authorization": "Bearer bench-key", "Content-Type": "application/json", "User-Agent": "bench/1", "Accept": "*/*"}
    for i in range(n):
        c.request("POST", f"/v1/apps/bench/users/{users[i % 100]}/notifications", headers=h,
                  body=json.dumps({"appNotificationId": f"m{i}", "payload": {"t": i, "n": i, "text": text} if size else {"t": i, "n": i}}))
        r = c.getresponse()
        r.read()
        assert r.status in (200, 201), r.status

async def device(user, name, live, expected):
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/ws", max_size=None, open_timeout=600, ping_interval=None) as ws:
        await ws.send(json.dumps({"type": "hello", "token": token(user, name), "deviceId": name}))
        while json.loads(await ws.recv())["type"] != "welcome":
            pass
        live.release()
        got = 0
        while got < expected:
            f = json.loads(await ws.recv())
            got += {"change": 1, "changes": len(f.get("changes", []))}.get(f["type"], 0)

async def main():
    live = asyncio.Semaphore(0)
    tasks = [asyncio.create_task(device(u, f"d{d}", live, sum(1 for i in range(n) if users[i % 100] == u)))
             for u in users for d in range(devices)]
    for _ in tasks:
        await live.acquire()
    await asyncio.to_thread(publish)
    await asyncio.wait_for(asyncio.gather(*tasks), 1800)

asyncio.run(main())
PY
    herald_stop "$pid"
    awk '/^totals:/ {print $2}' "$OUT/publish-instructions-$3.out"
}

per_publish() { # bin tag
    local with without
    with=$(count "$1" "$N" "$2-d$DEVICES-$N")
    without=$(count "$1" 0 "$2-d$DEVICES-0")
    echo $(( (with - without) / N ))
}

{
    echo "# Instructions per publish (callgrind)"
    echo
    echo "$(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD), $N publishes on one keep-alive connection to 100 users with $DEVICES WebSockets each, payload string $PAYLOAD bytes, memory store, one loop."
    echo
    echo "| binary | instructions per publish |"
    echo "|---|---|"
    echo "| $HERALD_BIN | $(per_publish "$HERALD_BIN" this) |"
    [ -n "${OTHER:-}" ] && echo "| $OTHER | $(per_publish "$OTHER" other) |"
} > "$OUT/publish-instructions.md"
cat "$OUT/publish-instructions.md"
