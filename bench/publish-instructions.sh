#!/usr/bin/env bash
# Instructions per publish (issue 32), counted by callgrind, not timed: the
# same for the same binary and inputs whatever else the machine does, so two
# builds compare on a noisy machine. Herald runs on the memory store with one
# loop under `valgrind --tool=callgrind`; one keep-alive connection publishes
# N notifications (100 users, small payloads, no subscribers); a second run
# publishes none. (total(N) - total(0)) / N is what one publish costs:
# request head, routing, body, validation, the engine's batch, the answer.
#
#   bench/publish-instructions.sh                 # the release build
#   OTHER=/path/to/herald bench/publish-instructions.sh   # and another, beside it
#
# N [2000], HERALD_BIN [.build/release/herald], SKIP_HERALD_BUILD=1.
# Writes bench/out/publish-instructions.md; callgrind files beside it.
set -euo pipefail
LOG_TAG=publish-instructions
source "$(dirname "$0")/lib.sh"

N=${N:-2000}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
PORT=${PORT:-18195}
command -v valgrind >/dev/null || { log "valgrind is needed (Debian: valgrind)"; exit 1; }
build_herald

# total instructions of a run of BIN with COUNT publishes
count() { # bin count tag
    local d
    d=$(mktemp -d)
    echo '{"apps":[{"id":"bench","serverKey":"bench-key","tokenSecret":"bench-secret"}]}' > "$d/h.json"
    valgrind --tool=callgrind --callgrind-out-file="$OUT/publish-instructions-$3.out" \
        "$1" serve --host 127.0.0.1 --port "$PORT" --config "$d/h.json" --store memory --threads 1 > "$d/out" 2> "$d/err" &
    local vg=$! i
    for i in $(seq 1 300); do grep -q '^listening' "$d/out" && break; sleep 0.2; done
    python3 - "$PORT" "$2" <<'PY'
import http.client, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
h = {"Authorization": "Bearer bench-key", "Content-Type": "application/json", "User-Agent": "bench/1", "Accept": "*/*"}
for i in range(n):
    c.request("POST", f"/v1/apps/bench/users/u{i % 100}/notifications", headers=h,
              body=json.dumps({"appNotificationId": f"m{i}", "payload": {"t": i, "n": i}}))
    r = c.getresponse()
    r.read()
    assert r.status in (200, 201), r.status
PY
    kill -TERM "$vg"
    wait "$vg" || true
    rm -rf "$d"
    awk '/^totals:/ {print $2}' "$OUT/publish-instructions-$3.out"
}

per_publish() { # bin tag
    local with without
    with=$(count "$1" "$N" "$2-$N")
    without=$(count "$1" 0 "$2-0")
    echo $(( (with - without) / N ))
}

{
    echo "# Instructions per publish (callgrind)"
    echo
    echo "$(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD), $N publishes on one keep-alive connection, memory store, one loop."
    echo
    echo "| binary | instructions per publish |"
    echo "|---|---|"
    echo "| $HERALD_BIN | $(per_publish "$HERALD_BIN" this) |"
    [ -n "${OTHER:-}" ] && echo "| $OTHER | $(per_publish "$OTHER" other) |"
} > "$OUT/publish-instructions.md"
cat "$OUT/publish-instructions.md"
