#!/usr/bin/env bash
# Push benchmarks (SPEC section 10; figures in docs/BENCHMARKS.md, "Push"):
#
#   throughput  COUNT (10,000) disconnected devices with APNs handles, one
#               publish each at RATE (2,000/s), through the APNs stand-in
#               (Tests/e2e/push_standins.py) on loopback: pushes per second,
#               and publish-acknowledged to stand-in-received p50/p99.
#   harm        Herald's CPU per live delivery and saturation with push on
#               (HANDLES, 10,000, idle handles: none due) against push off,
#               alternated PAIRS (3) times in one run.
#   memory      WAITING (100,000) pushes for a stand-in that answers 503:
#               Herald's RSS while they wait and retry.
#
# SCENARIOS="throughput harm memory" picks some. Everything runs on
# 127.0.0.1, bounded in count and time; what it starts it stops, by pid.
set -euo pipefail
LOG_TAG=push
source "$(dirname "$0")/lib.sh"
[[ -x /opt/swift/usr/bin/swift ]] && export PATH="/opt/swift/usr/bin:$PATH"

SCENARIOS=${SCENARIOS:-"throughput harm memory"}
COUNT=${COUNT:-10000}
RATE=${RATE:-2000}
HANDLES=${HANDLES:-10000}
PAIRS=${PAIRS:-3}
WAITING=${WAITING:-100000}
FANOUT_USERS=${FANOUT_USERS:-1000}
FANOUT_DEVICES=${FANOUT_DEVICES:-3}
FANOUT_RATE=${FANOUT_RATE:-1000}
FANOUT_SECONDS=${FANOUT_SECONDS:-10}
RAMP=${RAMP:-ramp:2000:2000:30000}
RAMP_SECONDS=${RAMP_SECONDS:-4}
MAX_P99_MS=${MAX_P99_MS:-50}
PORT=${PORT:-18180}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
STANDINS=$ROOT/Tests/e2e/push_standins.py
RESULTS=$OUT/push-results.md

build_loadgen
build_herald
measure_background

# A stand-in as its own process: its state folder holds its CA and keys.
standin() { # service state-dir args...
    local service=$1 dir=$2
    shift 2
    mkdir -p "$dir"
    python3 "$STANDINS" "$service" --port 0 --state "$dir" "$@" > "$dir/stdout" 2> "$OUT/push-standin-$service.log" &
    STANDIN_PID=$!
    STARTED_PIDS+=("$STANDIN_PID")
    local i
    for i in $(seq 1 100); do grep -q '^listening on' "$dir/stdout" 2>/dev/null && break; sleep 0.1; done
    STANDIN_URL=$(sed -n 's/^listening on //p' "$dir/stdout" | head -1)
    [ -n "$STANDIN_URL" ] || { log "the $service stand-in did not start (see $OUT/push-standin-$service.log)"; exit 1; }
}

# starts Herald on the bench app, with push through the APNs stand-in in
# STATE (or, with "off", none); sets HERALD_PID
herald_start() { # name store push-state|off
    local name=$1 store=$2 state=$3 d=$WORK/$1
    rm -rf "$d"; mkdir -p "$d"
    local push=""
    if [ "$state" != off ]; then
        push=$(python3 - "$state" "$STANDIN_URL" <<'EOF'
import json, sys
state, url = sys.argv[1], sys.argv[2]
info = json.load(open(f"{state}/standin.json"))
print(json.dumps({"alert": {"title": "/title", "body": "/body"},
                  "apns": {"teamId": info["teamId"], "keyId": info["keyId"], "keyFile": info["keyFile"], "topic": info["topic"],
                           "endpoint": url, "developmentEndpoint": url, "caFile": info["caFile"]}}))
EOF
)
        push=",\"push\":$push"
    fi
    echo "{\"apps\":[{\"id\":\"bench\",\"serverKey\":\"bench-key\",\"tokenSecret\":\"bench-secret\"$push}]}" > "$d/herald.json"
    "$HERALD_BIN" serve --host 127.0.0.1 --port "$PORT" --config "$d/herald.json" --store "$store" \
        > "$d/stdout" 2> "$OUT/push-$name-server.log" &
    HERALD_PID=$!
    STARTED_PIDS+=("$HERALD_PID")
    local i
    for i in $(seq 1 100); do grep -q '^listening on' "$d/stdout" 2>/dev/null && break; sleep 0.1; done
    grep -q '^listening on' "$d/stdout" || { log "herald did not start (see $OUT/push-$name-server.log)"; exit 1; }
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

{
    echo "# Push benchmarks"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), background CPU ${BG_BUSY}% before the run."
    echo
} > "$RESULTS"

if [[ " $SCENARIOS " == *" throughput "* ]]; then
    log "throughput: $COUNT disconnected devices, one publish each at $RATE/s"
    standin apns "$WORK/apns"
    herald_start throughput "sqlite:$WORK/throughput.db" "$WORK/apns"
    python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$COUNT"
    c0=$(cpu_ticks "$HERALD_PID")
    python3 "$BENCH/push_load.py" publish "http://127.0.0.1:$PORT" "$COUNT" "$RATE" > "$WORK/acks.json"
    # Wait (bounded) for every push to reach the stand-in.
    for _ in $(seq 1 600); do
        got=$(python3 "$STANDINS" count --state "$WORK/apns")
        [ "$got" -ge "$COUNT" ] && break
        sleep 0.1
    done
    c1=$(cpu_ticks "$HERALD_PID")
    python3 - "$WORK/acks.json" "$WORK/apns" "$COUNT" "$RATE" "$((c1 - c0))" >> "$RESULTS" <<'EOF'
import json, sys
acks = json.load(open(sys.argv[1]))
received = [json.loads(l) for l in open(f"{sys.argv[2]}/received.jsonl")]
count, rate, ticks = int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
by_id = {}
for r in received:
    by_id.setdefault(r["collapseId"], []).append(r["at"])
lat = sorted((min(v) - acks["ack_times"][k]) * 1000 for k, v in by_id.items() if k in acks["ack_times"])
dups = sum(len(v) - 1 for v in by_id.values())
first, last = min(r["at"] for r in received), max(r["at"] for r in received)
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
print("## Throughput through the APNs stand-in\n")
print(f"| published at | acknowledged | pushes received | duplicates | first to last push | publish ack to push received p50 / p99 | Herald CPU |")
print("|---|---|---|---|---|---|---|")
print(f"| {rate}/s | {acks['acked']} | {len(by_id)} of {count} | {dups} | {last - first:.2f} s | {p(0.5):.1f} / {p(0.99):.1f} ms | {ticks / 100:.1f} s |\n")
EOF
    herald_stop "$HERALD_PID"
    kill "$STANDIN_PID" 2>/dev/null || true
fi

if [[ " $SCENARIOS " == *" harm "* ]]; then
    log "harm: live fan-out with push off and on ($HANDLES idle handles), $PAIRS alternated pairs"
    standin apns "$WORK/apns-idle"
    echo "## Live delivery with push off and on ($HANDLES idle handles)" >> "$RESULTS"
    echo >> "$RESULTS"
    echo "| pair | push | fan-out CPU s per million deliveries | fan-out p99 ms | saturation deliveries/s |" >> "$RESULTS"
    echo "|---|---|---|---|---|" >> "$RESULTS"
    HERALD_ARGS=()
    herald_loadgen_args "" "" "$PORT" "$PORT"
    for pair in $(seq 1 "$PAIRS"); do
        for mode in off on; do
            state=off
            [ "$mode" = on ] && state=$WORK/apns-idle
            herald_start "harm-$mode" memory "$state"
            [ "$mode" = on ] && python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$HANDLES" idle
            sleep 2
            log="$OUT/push-harm-$mode-$pair.log"
            "${HERALD_ARGS[@]}" --mode fanout --users "$FANOUT_USERS" --devices "$FANOUT_DEVICES" --rate "$FANOUT_RATE" \
                --duration "$FANOUT_SECONDS" --user-prefix "f${RUN_ID}p$pair" --server-pids "$HERALD_PID" --pub-conns 64 \
                --setup-timeout 120 > "$log" 2>&1 || true
            sat="$OUT/push-harm-$mode-$pair-saturation.log"
            "${HERALD_ARGS[@]}" --mode fanout --users "$FANOUT_USERS" --devices "$FANOUT_DEVICES" --rate "$RAMP" \
                --duration "$RAMP_SECONDS" --max-p99-ms "$MAX_P99_MS" --user-prefix "s${RUN_ID}p$pair" --server-pids "$HERALD_PID" \
                --pub-conns 64 > "$sat" 2>&1 || true
            echo "| $pair | $mode | $(res "$log" step=0 cpu_s_per_m) | $(res "$log" step=0 p99_ms) | $(res "$sat" mode=saturation max_dps) |" >> "$RESULTS"
            herald_stop "$HERALD_PID"
        done
    done
    echo >> "$RESULTS"
    kill "$STANDIN_PID" 2>/dev/null || true
fi

if [[ " $SCENARIOS " == *" memory "* ]]; then
    log "memory: $WAITING pushes waiting for a stand-in that answers 503"
    standin apns "$WORK/apns-503" --outcome 503:ServiceUnavailable
    herald_start memory "sqlite:$WORK/memory.db" "$WORK/apns-503"
    python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$WAITING" w
    rss0=$(rss_kib "$HERALD_PID")
    python3 "$BENCH/push_load.py" publish "http://127.0.0.1:$PORT" "$WAITING" 5000 w > /dev/null
    samples=()
    for _ in $(seq 1 6); do sleep 5; samples+=("$(rss_kib "$HERALD_PID")"); done
    pending=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^herald_push_pending / {print $2}')
    retried=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^herald_push_sent_total\{service="apns",outcome="retried"\}/ {print $2}')
    {
        echo "## Memory while $WAITING pushes wait (the stand-in answers 503)"
        echo
        echo "| RSS after registering | RSS every 5 s after publishing (KiB) | pending | retried so far |"
        echo "|---|---|---|---|"
        echo "| $rss0 KiB | ${samples[*]} | $pending | $retried |"
        echo
    } >> "$RESULTS"
    herald_stop "$HERALD_PID"
    kill "$STANDIN_PID" 2>/dev/null || true
fi

log "results: $RESULTS"
cat "$RESULTS"
