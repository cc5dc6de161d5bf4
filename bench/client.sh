#!/usr/bin/env bash
# What a HeraldClient costs a device: memory per 1,000 cached notifications,
# the time to resume 1,000 missed changes, and the CPU of one HTTP call over
# http and https (docs/BENCHMARKS.md, "HeraldClient").
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
TLS=
cleanup() {
    for p in $GW $TLS; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

.build/release/herald serve --host 127.0.0.1 --port 0 --store memory \
    --app bench --server-key bench-server-key --token-secret bench-token-secret-0123456789 \
    > "$WORK/listening" 2> "$WORK/herald.log" &
GW=$!
for _ in $(seq 100); do grep -q '^listening on ' "$WORK/listening" && break; sleep 0.1; done
URL=$(sed -n 's/^listening on //p' "$WORK/listening")
[ -n "$URL" ] || { echo "the gateway did not start:"; cat "$WORK/herald.log"; exit 1; }

# The same app behind TLS, with a certificate for 127.0.0.1 the client trusts.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$WORK/tls.key" -out "$WORK/tls.crt" 2>/dev/null
.build/release/herald serve --host 127.0.0.1 --port 0 --store memory \
    --app bench --server-key bench-server-key --token-secret bench-token-secret-0123456789 \
    --tls-cert "$WORK/tls.crt" --tls-key "$WORK/tls.key" > "$WORK/listening-tls" 2> "$WORK/herald-tls.log" &
TLS=$!
for _ in $(seq 100); do grep -q '^listening on ' "$WORK/listening-tls" && break; sleep 0.1; done
TLS_URL=$(sed -n 's/^listening on //p' "$WORK/listening-tls")
[ -n "$TLS_URL" ] || { echo "the TLS gateway did not start:"; cat "$WORK/herald-tls.log"; exit 1; }

{
    echo "herald-client-bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, gateway $URL (release, memory store)"
    timeout 600 .build/release/herald-client-bench --url "$URL" --app bench --server-key bench-server-key \
        --count "$COUNT" --rounds "$ROUNDS" --dir "$WORK" --tls-url "$TLS_URL" --ca "$WORK/tls.crt"
} | tee "$OUT/client.txt"
