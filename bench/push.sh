#!/usr/bin/env bash
# Push benchmarks (SPEC section 10; figures in docs/BENCHMARKS.md, "Push"):
#
#   throughput  COUNT (10,000) disconnected devices with APNs handles, one
#               publish each at RATE (2,000/s), then app-wide sends to COUNT
#               others at once, through each of RECEIVERS on loopback:
#               nghttpd (C, accepts anything: Herald's own capacity) and the
#               APNs stand-in (Tests/e2e/push_standins.py, Python, checks
#               every push). Commit-to-2xx p50/p99, first ack to last push,
#               burst pushes per second, CPU of each process.
#   harm        Herald's CPU per live delivery and saturation with push on
#               (HANDLES, 10,000, idle handles: none due) against push off,
#               alternated PAIRS (3) times in one run; then, with perf, the
#               share of Herald's samples in push code in one more fan-out;
#               then, under callgrind, the instructions Herald executes per
#               live delivery with push off and on, IR_PAIRS (2) times each:
#               a count, not a time, so the noise of the CPU pairs drops out.
#   memory      WAITING (100,000) pushes for a stand-in that answers 503:
#               Herald's RSS while they wait and retry.
#
# HARM_FEATURE=webhooks makes harm compare webhooks off and on instead
# (SPEC 13: every publish an event to a 204 receiver, bench/webhooks.py
# receive; WEBHOOK_EVENTS=notification.read,notification.dismissed: an
# endpoint the publishes give nothing); PAIRS=0 and PERF=0 leave only the
# callgrind counts.
#
# SCENARIOS="throughput harm memory" picks some. Everything runs on
# 127.0.0.1, bounded in count and time; what it starts it stops, by pid.
set -euo pipefail
LOG_TAG=push
source "$(dirname "$0")/lib.sh"

SCENARIOS=${SCENARIOS:-"throughput harm memory"}
COUNT=${COUNT:-10000}
RATE=${RATE:-2000}
HANDLES=${HANDLES:-10000}
PAIRS=${PAIRS:-3}
IR_PAIRS=${IR_PAIRS:-2}
IR_RATE=${IR_RATE:-200}
HARM_STORE=${HARM_STORE:-memory}  # the callgrind pairs' store: memory or sqlite
HARM_FEATURE=${HARM_FEATURE:-push}  # what harm turns on: push or webhooks
PERF=${PERF:-1}
WAITING=${WAITING:-100000}
FANOUT_USERS=${FANOUT_USERS:-1000}
FANOUT_DEVICES=${FANOUT_DEVICES:-3}
FANOUT_RATE=${FANOUT_RATE:-1000}
FANOUT_SECONDS=${FANOUT_SECONDS:-10}
RAMP=${RAMP:-ramp:2000:2000:30000}
RAMP_SECONDS=${RAMP_SECONDS:-4}
MAX_P99_MS=${MAX_P99_MS:-50}
PORT=${PORT:-18180}
RECEIVERS=${RECEIVERS:-"nghttpd standin"}
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
    local name=$1 store=$2 state=$3
    local push=""
    if [ "$state" != off ] && [ "$HARM_FEATURE" = webhooks ] && [[ "$name" == harm-* || "$name" == ir-* ]]; then
        push=",\"webhooks\":$WEBHOOKS"
    elif [ "$state" != off ]; then
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
    HERALD_APP_EXTRA=$push herald_spawn "push-$name" "$WORK/$name" "$PORT" --store "$store" \
        || { log "herald did not start (see $OUT/push-$name-server.log)"; exit 1; }
    HERALD_PID=$SPAWNED_PID
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

{
    echo "# Push benchmarks"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), background CPU ${BG_BUSY}% before the run."
    echo
} > "$RESULTS"

# Herald's herald_push_* figures: "delivered" for the apns service, or
# with "latency", p50 and p99 of commit-to-2xx as histogram bucket bounds.
push_metric() { # delivered | latency
    curl -s "http://127.0.0.1:$PORT/metrics" | python3 -c '
import sys
what, buckets, delivered = sys.argv[1], [], 0
for line in sys.stdin:
    if line.startswith("herald_push_sent_total{service=\"apns\",outcome=\"delivered\"}"):
        delivered = int(float(line.split()[1]))
    elif line.startswith("herald_push_latency_seconds_bucket"):
        buckets.append((line.split("le=\"")[1].split("\"")[0], int(float(line.split()[1]))))
if what == "delivered":
    print(delivered)
else:
    total = buckets[-1][1]
    q = lambda f: next(le for le, n in buckets if n >= f * total)
    ms = lambda le: "over 10 s" if le == "+Inf" else f"{float(le) * 1000:g} ms"
    print(f"{ms(q(0.5))} / {ms(q(0.99))}")
' "$1"
}

wait_delivered() { # count: bounded wait until Herald counts that many delivered
    local n=0
    for _ in $(seq 1 1200); do
        n=$(push_metric delivered)
        [ "$n" -ge "$1" ] && return 0
        sleep 0.05
    done
    log "only $n of $1 pushes delivered in time"
}

# One receiver's run: COUNT paced publishes at RATE, then an app-wide
# burst to COUNT other users. Receiver "standin" checks every push (JWT,
# headers, payload) and records it; "nghttpd" (Debian's nghttp2 server,
# in C) accepts anything, so what is measured is Herald's own cost.
throughput_run() { # receiver
    local receiver=$1
    standin apns "$WORK/apns-$receiver"
    if [ "$receiver" = nghttpd ]; then
        nghttpd --echo-upload -m 1000 "$((PORT + 1))" "$WORK/apns-$receiver/server.pem" "$WORK/apns-$receiver/server.pem" \
            > "$OUT/push-nghttpd.log" 2>&1 &
        RECEIVER_PID=$!
        STARTED_PIDS+=("$RECEIVER_PID")
        STANDIN_URL=https://127.0.0.1:$((PORT + 1))
        for _ in $(seq 1 50); do curl -s --cacert "$WORK/apns-$receiver/ca.pem" -o /dev/null "$STANDIN_URL/" && break; sleep 0.1; done
    else
        RECEIVER_PID=$STANDIN_PID
    fi
    herald_start "throughput-$receiver" "sqlite:$WORK/throughput-$receiver.db" "$WORK/apns-$receiver"
    python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$COUNT" p
    python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$COUNT" q
    local c0 r0 c1 r1 done_at latency burst_start burst_done
    c0=$(cpu_ticks "$HERALD_PID"); r0=$(cpu_ticks "$RECEIVER_PID")
    python3 "$BENCH/push_load.py" publish "http://127.0.0.1:$PORT" "$COUNT" "$RATE" p > "$WORK/acks-$receiver.json"
    wait_delivered "$COUNT"
    done_at=$(date +%s.%N)
    c1=$(cpu_ticks "$HERALD_PID"); r1=$(cpu_ticks "$RECEIVER_PID")
    latency=$(push_metric latency)
    burst_start=$(python3 "$BENCH/push_load.py" burst "http://127.0.0.1:$PORT" "$COUNT" q)
    wait_delivered "$((COUNT * 2))"
    burst_done=$(date +%s.%N)
    python3 - "$receiver" "$WORK/acks-$receiver.json" "$WORK/apns-$receiver" "$COUNT" "$RATE" "$done_at" "$latency" \
        "$((c1 - c0))" "$((r1 - r0))" "$burst_start" "$burst_done" >> "$WORK/throughput-rows.md" <<'EOF'
import json, os, sys
receiver, acks, state = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
count, rate, done_at, latency = int(sys.argv[4]), sys.argv[5], float(sys.argv[6]), sys.argv[7]
ticks, receiver_ticks, burst = int(sys.argv[8]), int(sys.argv[9]), float(sys.argv[11]) - float(sys.argv[10])
first_ack = min(acks["ack_times"].values())
checked = "none: it accepts anything"
path = f"{state}/received.jsonl"
if os.path.exists(path):
    by_id = {}
    for line in open(path):
        r = json.loads(line)
        by_id.setdefault(r["collapseId"], []).append(r["at"])
    lat = sorted((min(v) - acks["ack_times"][k]) * 1000 for k, v in by_id.items() if k in acks["ack_times"])
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    dups = sum(len(v) - 1 for v in by_id.values())
    paced = sum(1 for k in by_id if k in acks["ack_times"])
    checked = f"{paced} of {count} paced, {dups} twice; ack to received p50 / p99 {p(0.5):.1f} / {p(0.99):.1f} ms"
print(f"| {receiver} | {acks['acked']} at {rate}/s | {done_at - first_ack:.2f} s | {latency} | {checked} "
      f"| {count / burst:,.0f}/s ({burst:.2f} s) | {ticks / 100:.1f} / {receiver_ticks / 100:.1f} / {acks['cpu']:.1f} s |")
EOF
    herald_stop "$HERALD_PID"
    kill "$STANDIN_PID" "$RECEIVER_PID" 2>/dev/null || true
}

if [[ " $SCENARIOS " == *" throughput "* ]]; then
    command -v nghttpd >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-server >/dev/null
    : > "$WORK/throughput-rows.md"
    for receiver in $RECEIVERS; do
        log "throughput through $receiver: $COUNT disconnected devices, one publish each at $RATE/s, then an app-wide burst"
        throughput_run "$receiver"
    done
    {
        echo "## Throughput: $COUNT disconnected devices with APNs handles"
        echo
        echo "| receiver | publishes | first ack to last push 2xx | commit to 2xx p50 / p99 (Herald's histogram bounds) | pushes the receiver checked | burst: app-wide sends to $COUNT others | CPU, paced: Herald / receiver / publisher |"
        echo "|---|---|---|---|---|---|---|"
        cat "$WORK/throughput-rows.md"
        echo
    } >> "$RESULTS"
fi

if [[ " $SCENARIOS " == *" harm "* ]]; then
    log "harm: live fan-out with $HARM_FEATURE off and on ($HANDLES idle handles), $PAIRS alternated pairs"
    standin apns "$WORK/apns-idle"
    if [ "$HARM_FEATURE" = webhooks ]; then
        python3 "$BENCH/webhooks.py" receive > "$WORK/webhooks.json" 2> "$OUT/push-webhook-receiver.log" &
        STARTED_PIDS+=("$!")
        for _ in $(seq 1 100); do [ -s "$WORK/webhooks.json" ] && break; sleep 0.1; done
        WEBHOOKS=$(head -1 "$WORK/webhooks.json")
    fi
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
            # The same registrations either way (off: without a handle), so only push differs.
            if [ "$mode" = on ]; then
                python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$HANDLES" idle
            else
                python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$HANDLES" idle plain
            fi
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
    # Apart from the pairs, whose CPU figures perf would inflate: which
    # share of Herald's samples the push code takes in the same fan-out.
    if [ "$PERF" = 1 ] && command -v perf >/dev/null; then
        herald_start harm-profiled memory "$WORK/apns-idle"
        python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$HANDLES" idle
        perf record -q -g -p "$HERALD_PID" -o "$WORK/harm.perf" -- sleep "$FANOUT_SECONDS" >/dev/null 2>&1 &
        perf_pid=$!
        "${HERALD_ARGS[@]}" --mode fanout --users "$FANOUT_USERS" --devices "$FANOUT_DEVICES" --rate "$FANOUT_RATE" \
            --duration "$FANOUT_SECONDS" --user-prefix "f${RUN_ID}perf" --server-pids "$HERALD_PID" --pub-conns 64 \
            --setup-timeout 120 > "$OUT/push-harm-profiled.log" 2>&1 || true
        wait "$perf_pid" || true
        # Samples with a push frame anywhere on their stack, of all of Herald's.
        share=$(perf script -i "$WORK/harm.perf" 2>/dev/null | awk '
            /^[^ \t]/ { n++; inpush = 0; next }
            /Push(Dispatch|Message|Settings|Handle)/ && !inpush { p++; inpush = 1 }
            END { if (n) printf "%.1f %% of %d samples", 100 * p / n, n }')
        echo "Push on, profiled apart (perf record -g): Herald's samples with push code on the stack: $share." >> "$RESULTS"
        echo >> "$RESULTS"
        herald_stop "$HERALD_PID"
    fi
    # Instructions per live delivery, counted by callgrind over the fan-out
    # steps alone (loadgen --around-steps switches counting on and off).
    if command -v valgrind >/dev/null; then
        printf '#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$CG_OUT" %s "$@"\n' "$HERALD_BIN" > "$WORK/herald-callgrind"
        printf '#!/bin/sh\ncallgrind_control -i "$( [ "$2" = start ] && echo on || echo off )" "$1" > /dev/null\n' > "$WORK/callgrind-switch"
        chmod +x "$WORK/herald-callgrind" "$WORK/callgrind-switch"
        # Maintenance passes (lastSeen flush every 30 s, pruning every 60 s)
        # fall into some windows and not others, whatever the deliveries:
        # their share is shown, and the comparison is made without them.
        echo "| run | push | deliveries | instructions per delivery (callgrind, fan-out steps only) | of which maintenance passes | per delivery without them | of which recording pushes |" >> "$RESULTS"
        echo "|---|---|---|---|---|---|---|" >> "$RESULTS"
        for pair in $(seq 1 "$IR_PAIRS"); do
            for mode in off on; do
                state=off plain=plain
                [ "$mode" = on ] && state=$WORK/apns-idle plain=""
                [ "$HARM_FEATURE" = webhooks ] && plain=plain  # no push configured: devices without handles
                store=$HARM_STORE
                [ "$store" = sqlite ] && store=sqlite:$WORK/ir-$mode-$pair.db
                CG_OUT=$OUT/push-ir-$mode-$pair.callgrind HERALD_BIN=$WORK/herald-callgrind herald_start "ir-$mode" "$store" "$state"
                python3 "$BENCH/push_load.py" register "http://127.0.0.1:$PORT" "$HANDLES" idle $plain
                log="$OUT/push-ir-$mode-$pair.log"
                "${HERALD_ARGS[@]}" --mode fanout --users "$FANOUT_USERS" --devices "$FANOUT_DEVICES" --rate "$IR_RATE" \
                    --duration "$FANOUT_SECONDS" --drain 5 --user-prefix "i${RUN_ID}p$pair" --pub-conns 8 --setup-timeout 300 \
                    --around-steps "$WORK/callgrind-switch $HERALD_PID" > "$log" 2>&1 || true
                herald_stop "$HERALD_PID"
                # Inclusive counts: all, Maintenance.run, PushDispatch.note + record.
                row=$(callgrind_annotate --inclusive=yes "$OUT/push-ir-$mode-$pair.callgrind" 2>/dev/null | swift demangle --simplified | awk \
                    -v d="$(res "$log" step=0 delivered)" -v pair="$pair" -v mode="$mode" \
                    -v f="$( [ "$HARM_FEATURE" = webhooks ] && echo WebhookDispatch || echo PushDispatch )" '
                    function n(s) { gsub(",", "", s); return s + 0 }
                    /PROGRAM TOTALS/ { t = n($1) }
                    /[:.]Maintenance\.run\(/ && !m { m = n($1) }
                    $0 ~ "[:.]" f "\\.record\\(" && !r { r = n($1) }
                    $0 ~ "[:.]" f "\\.note\\(" && !o { o = n($1) }
                    END { if (d > 0) printf "| %s | %s | %d | %.0f | %.0f | %.0f | %.0f |", pair, mode, d, t / d, m / d, (t - m) / d, (r + o) / d
                          else printf "| %s | %s | 0 | - | - | - | - |", pair, mode }')
                echo "$row" >> "$RESULTS"
            done
        done
        echo >> "$RESULTS"
    fi
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
