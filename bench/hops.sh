#!/usr/bin/env bash
# Hops per delivery (issue 32): how often each of Herald's threads is woken
# per delivery in a live fan-out. Herald runs on STORE (memory); loadgen's
# fan-out sends USERS × DEVICES at RATE publishes/s for DURATION s; `perf
# stat --per-thread` counts each thread's context switches (a thread that
# sleeps and is woken switches out once) and scheduler wake-ups over the
# steps alone (loadgen --around-steps starts and stops it). A thread that
# sleeps between hand-offs is woken about once per hand-off it receives, so
# the per-delivery figure of the engine and of the loops counts the hops a
# delivery takes, less what batching folds together.
set -euo pipefail
LOG_TAG=hops
source "$(dirname "$0")/lib.sh"

USERS=${USERS:-1000}
DEVICES=${DEVICES:-3}
RATE=${RATE:-1000}
DURATION=${DURATION:-10}
STORE=${STORE:-memory}
SERVE_ARGS=${SERVE_ARGS:-}   # more flags for herald serve (e.g. --threads 1)
PORT=${PORT:-18190}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
RESULTS=$OUT/hops-results.md

command -v perf >/dev/null || { log "perf is needed (Debian: linux-perf)"; exit 1; }
build_loadgen
build_herald
measure_background

store=$STORE
[ "$store" = sqlite ] && store=sqlite:$WORK/hops.db
herald_spawn hops "$WORK/herald" "$PORT" --store "$store" ${SERVE_ARGS:-} || { log "herald did not start (see $OUT/hops-server.log)"; exit 1; }
pid=$SPAWNED_PID

# start: perf attached to Herald (given a moment to attach before the first
# publish); stop: perf ends on SIGINT and writes its counts.
cat > "$WORK/perf-around" <<EOF
#!/bin/sh
case "\$1" in
start) perf stat --per-thread -e context-switches,sched:sched_wakeup,task-clock -p $pid -x, -o "$WORK/perf.csv" &
       echo \$! > "$WORK/perf.pid"; sleep 0.5 ;;
stop)  kill -INT "\$(cat "$WORK/perf.pid")"
       while kill -0 "\$(cat "$WORK/perf.pid")" 2>/dev/null; do sleep 0.1; done ;;
esac
EOF
chmod +x "$WORK/perf-around"

HERALD_ARGS=()
herald_loadgen_args "" "" "$PORT" "$PORT"
"${HERALD_ARGS[@]}" --mode fanout --users "$USERS" --devices "$DEVICES" --rate "$RATE" --duration "$DURATION" \
    --user-prefix "h$RUN_ID" --server-pids "$pid" --pub-conns 32 --setup-timeout 120 \
    --around-steps "$WORK/perf-around" > "$OUT/hops-loadgen.log" 2>&1 || true
herald_stop "$pid"
delivered=$(res "$OUT/hops-loadgen.log" step=0 delivered)
published=$(res "$OUT/hops-loadgen.log" step=0 published)

{
    echo "# Hops per delivery"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), store $STORE, $USERS × $DEVICES at $RATE publishes/s for $DURATION s, background CPU ${BG_BUSY}% before the run: $published publishes, $delivered deliveries."
    echo
    echo "| thread | context switches per delivery | wake-ups it made per delivery | CPU µs per delivery |"
    echo "|---|---|---|---|"
    # perf -x, --per-thread: "comm-tid,count,unit,event,..."; threads summed by name.
    awk -F, -v d="${delivered:-0}" '
        $4 ~ /context-switches/ || $4 ~ /sched_wakeup/ || $4 ~ /task-clock/ {
            name = $1; sub(/-[0-9]+$/, "", name)
            # task-clock is in ms
            if ($4 ~ /context/) { cs[name] += $2; tcs += $2 }
            else if ($4 ~ /wakeup/) { wk[name] += $2; twk += $2 }
            else { cpu[name] += $2; tcpu += $2 }
            seen[name] = 1
        }
        END {
            for (n in seen) if (d > 0) printf "| %s | %.3f | %.3f | %.2f |\n", n, cs[n] / d, wk[n] / d, cpu[n] * 1000 / d
            if (d > 0) printf "| all of Herald | %.3f | %.3f | %.2f |\n", tcs / d, twk / d, tcpu * 1000 / d
        }' "$WORK/perf.csv" | sort
    echo
} > "$RESULTS"
log "results: $RESULTS"
cat "$RESULTS"
