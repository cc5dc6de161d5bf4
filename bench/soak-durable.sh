#!/usr/bin/env bash
# A long run of durable publishes (issue 13): Herald on SQLite at the default
# durability (a 201 means the notification is on disk), RATE publishes/s from
# PUB_CONNS publisher connections to USERS users with one WebSocket device
# each, for MINUTES steps of 60 s. Notifications expire TTL_SECONDS after
# their publish and changes are kept CHANGE_RETENTION_SECONDS, so the
# checkpoints, the expiry sweep (whose deletes reach the devices too) and
# pruning all run while the database grows. Every step reports its achieved
# rate, p50/p99 publish-to-delivery, loss and duplicates; every 10 s the
# database and log file sizes and the gateway's RSS are sampled.
#
#   bench/soak-durable.sh              # 10 minutes at 10,000/s (issue 13's target)
#   RATE=3000 bench/soak-durable.sh    # a rate this 2-core machine sustains
#
# Writes bench/out/soak-durable.md (git-ignored) and the raw logs beside it.
# Environment overrides (defaults in brackets): RATE [10000] MINUTES [10]
# USERS [1000] PUB_CONNS [512] TTL_SECONDS [120] CHANGE_RETENTION_SECONDS
# [120] MAX_P99_MS [50] HERALD_PORT [18080] HERALD_BIN SKIP_HERALD_BUILD=1
set -euo pipefail

LOG_TAG=soak-durable
source "$(dirname "$0")/lib.sh"

RATE=${RATE:-10000}
MINUTES=${MINUTES:-10}
USERS=${USERS:-1000}
PUB_CONNS=${PUB_CONNS:-512}
TTL_SECONDS=${TTL_SECONDS:-120}
CHANGE_RETENTION_SECONDS=${CHANGE_RETENTION_SECONDS:-120}
MAX_P99_MS=${MAX_P99_MS:-50}
HERALD_PORT=${HERALD_PORT:-18080}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}

measure_background
build_loadgen
build_herald
[ -x "$HERALD_BIN" ] || { log "no Herald binary at $HERALD_BIN"; exit 1; }

D=$WORK/herald
HERALD_LIMITS="{\"changeRetentionSeconds\":$CHANGE_RETENTION_SECONDS}"
herald_spawn soak-durable "$D" "$HERALD_PORT" --store "sqlite:$D/herald.db" \
    || { log "herald did not start (see bench/out/soak-durable-server.log)"; exit 1; }
PID=$SPAWNED_PID
herald_loadgen_args "" "" "$HERALD_PORT" "$HERALD_PORT"

# sizes and RSS every 10 s until the load generator is done
SAMPLES=$OUT/soak-durable-samples.log
: > "$SAMPLES"
(
    start=$(date +%s)
    while kill -0 "$PID" 2>/dev/null; do
        printf '%d %d %d %d\n' $(($(date +%s) - start)) "$(stat -c %s "$D/herald.db" 2>/dev/null || echo 0)" \
            "$(stat -c %s "$D/herald.db-wal" 2>/dev/null || echo 0)" "$(rss_kib "$PID")" >> "$SAMPLES"
        sleep 10
    done
) &
SAMPLER=$!
STARTED_PIDS+=("$SAMPLER")

rates=$(for _ in $(seq 1 "$MINUTES"); do printf '%s,' "$RATE"; done)
LOG=$OUT/soak-durable.log
log "$MINUTES steps of 60 s at $RATE publishes/s, $USERS users x 1 device, $PUB_CONNS publisher connections"
"${HERALD_ARGS[@]}" --mode fanout --users "$USERS" --devices 1 --rate "${rates%,}" --duration 60 \
    --pub-conns "$PUB_CONNS" --server-pids "$PID" --user-prefix "s${RUN_ID}u" --setup-timeout 120 --keep-going --max-p99-ms "$MAX_P99_MS" \
    --pub-body "{\"appNotificationId\":\"m{n}\",\"ttlSeconds\":$TTL_SECONDS,\"payload\":{\"t\":{ts},\"n\":{n}}}" \
    > "$LOG" 2>&1 || true
kill "$SAMPLER" 2>/dev/null || true
wait "$SAMPLER" 2>/dev/null || true
forget_pid "$SAMPLER"
curl -sf "http://127.0.0.1:$HERALD_PORT/metrics" > "$OUT/soak-durable-metrics.txt" || true
herald_stop "$PID"

# a histogram of the scrape as "≤bound: count" pairs, empty buckets left out
histogram() { # name
    awk -v n="$1_bucket" 'index($0, n "{") == 1 {
            split($0, a, "\""); c = $NF - prev; prev = $NF
            if (c > 0) printf "%s≤%s s: %d", sep, a[2], c; if (c > 0) sep = ", " }' "$OUT/soak-durable-metrics.txt"
}

{
    echo "# Durable publishes, $MINUTES steps of 60 s at $RATE/s"
    echo
    echo "Run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, $(uname -sr); commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')."
    echo "Background CPU use before the run: ${BG_BUSY}%; load average $LOAD_START at the start."
    echo "SQLite at the default durability; $USERS users × 1 device; $PUB_CONNS publisher connections;"
    echo "notifications expire after $TTL_SECONDS s, changes are kept $CHANGE_RETENTION_SECONDS s; 60 s steps with a 2 s drain between them."
    echo
    echo "| minute | target publishes/s | achieved | failed publishes | p50 ms | p99 ms | max ms | lost | duplicates |"
    echo "|---|---|---|---|---|---|---|---|---|"
    grep '^RESULT mode=fanout step=' "$LOG" | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}
        printf "| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", v["step"] + 1, v["target_rate"], v["pub_rate"], v["pub_errors"], v["p50_ms"], v["p99_ms"], v["max_ms"], v["lost"], v["dup"]}'
    echo
    grep '^RESULT mode=fanout step=' "$LOG" | awk -v max="$MAX_P99_MS" '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}
        n++; if (v["p99_ms"] + 0 > worst) worst = v["p99_ms"] + 0; if (v["p99_ms"] + 0 <= max && v["lost"] == 0 && v["dup"] == 0 && v["pub_errors"] == 0) ok++}
        END {printf "Worst step p99 %.1f ms; %d of %d steps with p99 ≤ %s ms and every publish acknowledged, nothing lost or duplicated.\n", worst, ok, n, max}'
    echo
    if grep -q '^herald_maintenance_seconds_bucket' "$OUT/soak-durable-metrics.txt" 2>/dev/null; then
        echo "The engine's maintenance transactions (expiry sweeps, pruning calls, lastSeen flushes; no batch runs meanwhile), by duration: $(histogram herald_maintenance_seconds)."
        echo "Store batches, begin to durable: $(histogram herald_store_latency_seconds)."
        echo "The gateway's log about pruning: $(grep -c 'pruned' "$OUT/soak-durable-server.log" || true) rounds; $(grep 'pruned' "$OUT/soak-durable-server.log" | tail -1 | sed 's/.*pruned/last: pruned/')."
        echo
    fi
    echo "Database (MB), write-ahead log (MB) and gateway RSS (MB) every minute:"
    echo
    echo '```'
    awk '$1 % 60 < 10 {printf "%4d s  db %7.1f  wal %6.1f  rss %6.1f\n", $1, $2 / 1e6, $3 / 1e6, $4 / 1024}' "$SAMPLES"
    echo '```'
} > "$OUT/soak-durable.md"
log "wrote $OUT/soak-durable.md"
cat "$OUT/soak-durable.md"
