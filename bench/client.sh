#!/usr/bin/env bash
# What a HeraldClient costs a device: memory per 1,000 cached notifications
# and the time to resume 1,000 missed changes (docs/BENCHMARKS.md, "HeraldClient").
#
#   bench/client.sh                 # release builds, a memory-store gateway on loopback
#
# Environment overrides: COUNT [1000] notifications per step, ROUNDS [5] resumes,
# SKIP_BUILD=1 (use the existing .build/release binaries).
# Writes bench/out/client.txt (git-ignored) as well as printing it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/bench/out
mkdir -p "$OUT"
COUNT=${COUNT:-1000}
ROUNDS=${ROUNDS:-5}

cd "$ROOT"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    swift build -c release --product herald
    swift build -c release --product herald-client-bench
fi

WORK=$(mktemp -d)
GW=
cleanup() { [ -n "$GW" ] && kill "$GW" 2>/dev/null && wait "$GW" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

.build/release/herald serve --host 127.0.0.1 --port 0 --store memory \
    --app bench --server-key bench-server-key --token-secret bench-token-secret-0123456789 \
    > "$WORK/listening" 2> "$WORK/herald.log" &
GW=$!
for _ in $(seq 100); do grep -q '^listening on ' "$WORK/listening" && break; sleep 0.1; done
URL=$(sed -n 's/^listening on //p' "$WORK/listening")
[ -n "$URL" ] || { echo "the gateway did not start:"; cat "$WORK/herald.log"; exit 1; }

{
    echo "herald-client-bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, gateway $URL (release, memory store)"
    timeout 600 .build/release/herald-client-bench --url "$URL" --app bench --server-key bench-server-key \
        --count "$COUNT" --rounds "$ROUNDS" --dir "$WORK"
} | tee "$OUT/client.txt"
