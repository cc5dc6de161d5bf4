#!/usr/bin/env bash
# Herald vs nginx+Nchan benchmark: one command, both targets, one results table.
#
#   bench/run.sh              # full run (about 13-15 minutes)
#   QUICK=1 bench/run.sh      # shorter steps, for a smoke test
#
# Writes bench/out/results.md (git-ignored) plus the raw logs beside it.
# Environment overrides (defaults in brackets):
#   IDLE_CONNS [10000]   FANOUT_USERS [1000]  FANOUT_DEVICES [3]
#   FANOUT_RATE [5000]   FANOUT_SECONDS [10]  RAMP [ramp:2500:2500:40000]
#   RAMP_SECONDS [5]     MAX_P99_MS [100]     NCHAN_PORT [18090] HERALD_PORT [18080]
#   LARGE_USERS [6000]   LARGE_RATE [5000]    (the large fan-out, x FANOUT_DEVICES)
#   RECONNECT_USERS [3334] (x FANOUT_DEVICES devices in the reconnect storm)
#   DURABLE_RAMP [ramp:2000:2000:30000]       (SQLite publishes, Herald only)
#   DURABLE_PAYLOAD_BYTES [0]  (a string of that many characters in each durable publish's payload)
#   SETTLE_SECONDS [10]  pause before each scenario on a running server
#   HERALD_BIN [.build/release/herald, built with `swift build -c release`]
#   SKIP_HERALD_BUILD=1  use an existing binary, do not run swift build
#   SKIP_HERALD=1 / SKIP_NCHAN=1   leave a target out
#   HERALD_EXTRA=0       skip the Herald-only scenarios (dismiss, reconnect, SQLite)
#   HERALD_TLS=1         also compare Herald plain and over TLS (wss://, https://):
#                        TLS_ROUNDS [2] rounds of plain then TLS, each on a fresh
#                        server: idle at TLS_IDLE_CONNS [4000], fan-out, saturation;
#                        TLS on HERALD_TLS_PORT [18443]. HERALD_TLS=only: that alone
#   FANOUT_PAIRS [5]     then that many more FANOUT_USERS fan-outs, Nchan (same
#                        bytes) and Herald back to back on fresh servers (0: none)
#   TABLE_ONLY=1         rewrite results.md from the logs of the last run
# Only loopback addresses are used; every step is bounded in time.
set -euo pipefail

LOG_TAG=run.sh
source "$(dirname "$0")/lib.sh"

QUICK=${QUICK:-0}
IDLE_CONNS=${IDLE_CONNS:-10000}
FANOUT_USERS=${FANOUT_USERS:-1000}
FANOUT_DEVICES=${FANOUT_DEVICES:-3}
FANOUT_RATE=${FANOUT_RATE:-5000}
FANOUT_SECONDS=${FANOUT_SECONDS:-10}
RAMP=${RAMP:-ramp:2500:2500:40000}
RAMP_SECONDS=${RAMP_SECONDS:-5}
# One Herald process holds every connection, and this machine caps a process
# at 20,000 open files: 6,000 x 3 is the largest population that fits.
LARGE_USERS=${LARGE_USERS:-6000}
LARGE_RATE=${LARGE_RATE:-5000}
RECONNECT_USERS=${RECONNECT_USERS:-3334}
# from 2,000/s: a run that misses 4,000/s still shows what it held
DURABLE_RAMP=${DURABLE_RAMP:-ramp:2000:2000:30000}
DURABLE_PAYLOAD_BYTES=${DURABLE_PAYLOAD_BYTES:-0}
DURABLE_ARGS=()
if [ "$DURABLE_PAYLOAD_BYTES" -gt 0 ]; then
    DURABLE_ARGS=(--pub-body "{\"appNotificationId\":\"m{n}\",\"payload\":{\"t\":{ts},\"n\":{n},\"body\":\"$(head -c "$DURABLE_PAYLOAD_BYTES" /dev/zero | tr '\0' x)\"}}")
fi
SETTLE_SECONDS=${SETTLE_SECONDS:-10}
MAX_P99_MS=${MAX_P99_MS:-100}
NCHAN_PORT=${NCHAN_PORT:-18090}
HERALD_PORT=${HERALD_PORT:-18080}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
HERALD_EXTRA=${HERALD_EXTRA:-1}
HERALD_TLS=${HERALD_TLS:-0}
HERALD_TLS_PORT=${HERALD_TLS_PORT:-18443}
TLS_ROUNDS=${TLS_ROUNDS:-2}
TLS_IDLE_CONNS=${TLS_IDLE_CONNS:-4000}
FANOUT_PAIRS=${FANOUT_PAIRS:-$([ "$QUICK" = 1 ] && echo 1 || echo 5)}
if [ "$QUICK" = 1 ]; then
    FANOUT_SECONDS=${QUICK_FANOUT_SECONDS:-4}
    RAMP_SECONDS=2
    SETTLE_SECONDS=2
    IDLE_CONNS=${QUICK_IDLE_CONNS:-4000}
fi

TLS_CERT=$WORK/tls/cert.pem   # a throwaway self-signed certificate (HERALD_TLS)
TLS_KEY=$WORK/tls/key.pem

measure_background
if [ "$HERALD_TLS" = 0 ]; then build_loadgen; else build_loadgen openssl; fi

# ---------------------------------------------------------------- herald
HERALD_PID=""
HERALD_OK=0
HERALD_WHY=""
prepare_herald() {
    if [ "${SKIP_HERALD:-0}" = 1 ]; then HERALD_WHY="skipped (SKIP_HERALD=1)"; return 1; fi
    build_herald
    if [ ! -x "$HERALD_BIN" ]; then
        HERALD_WHY="no Herald binary at $HERALD_BIN"
        return 1
    fi
    return 0
}
# the loadgen command line for the Herald that runs: ws:// and http://, or
# wss:// and https:// verified against the run's certificate
set_herald_args() { # plain|tls
    if [ "$1" = tls ]; then
        herald_loadgen_args s "$TLS_CERT" "$HERALD_TLS_PORT" "$HERALD_TLS_PORT"
    else
        herald_loadgen_args "" "" "$HERALD_PORT" "$HERALD_PORT"
    fi
}
start_herald() { # name [store: memory (default), sqlite or sqlite-normal (--durability normal), a fresh file] [plain (default) or tls]
    local name=$1 d=$WORK/herald store=memory port=$HERALD_PORT more=()
    [ "${2:-memory}" != memory ] && store="sqlite:$d/herald.db"
    [ "${2:-memory}" = sqlite-normal ] && more=(--durability normal)
    if [ "${3:-plain}" = tls ]; then port=$HERALD_TLS_PORT more+=(--tls-cert "$TLS_CERT" --tls-key "$TLS_KEY"); fi
    set_herald_args "${3:-plain}"
    if ! herald_spawn "$name" "$d" "$port" --store "$store" ${more[@]+"${more[@]}"}; then
        HERALD_WHY="herald serve did not print 'listening on' (see bench/out/$name-server.log)"
        return 1
    fi
    HERALD_PID=$SPAWNED_PID
    # does it speak /v1/ws? one subscriber must get its welcome
    if ! "${HERALD_ARGS[@]}" --mode idle --users 1 --devices 1 --user-prefix "probe${RUN_ID}u" \
        --setup-timeout 10 --max-run 30 > "$OUT/$name-probe.log" 2>&1; then
        HERALD_WHY="herald does not serve /v1/ws yet (see bench/out/$name-probe.log)"
        stop_herald
        return 1
    fi
    return 0
}
stop_herald() {
    herald_stop "$HERALD_PID"
    HERALD_PID=""
}

# ---------------------------------------------------------------- targets
nchan_loadgen_args
# idle: RSS before/after opening IDLE_CONNS connections, measured here while
# the loadgen holds them
scenario_idle() { # name pids connections args...
    local name=$1 pids=$2 conns=$3
    shift 3
    local log=$OUT/$name-idle.log
    local -a pidarr
    IFS=, read -r -a pidarr <<< "$pids"
    sleep 1
    local before after
    before=$(rss_kib "${pidarr[@]}")
    "$@" --mode idle --conns "$conns" --devices 1 --conns-per-proc 4000 --user-prefix "i${RUN_ID}u" \
        --hold 60 --setup-timeout 60 > "$log" 2>&1 &
    local lg=$!
    STARTED_PIDS+=("$lg")
    local i
    for i in $(seq 1 900); do
        grep -q '^READY' "$log" && break
        kill -0 "$lg" 2>/dev/null || break
        sleep 0.1
    done
    sleep 3 # let the server settle
    after=$(rss_kib "${pidarr[@]}")
    kill -TERM "$lg" 2>/dev/null || true
    wait "$lg" 2>/dev/null || true
    forget_pid "$lg"
    local ready
    ready=$(res "$log" "phase=setup" ready)
    ready=${ready:-0}
    local per=0
    [ "$ready" -gt 0 ] && per=$(( (after - before) * 1024 / ready ))
    echo "RESULT mode=idle phase=script_rss rss_before_kib=$before rss_after_kib=$after conns=$ready bytes_per_conn=$per" >> "$log"
    log "$name idle: $ready connections, RSS $before -> $after KiB, $per bytes/connection"
}

# Whether perf can count system calls here (it needs linux-perf and
# tracepoints readable by this user); if not, or with COUNT_SYSCALLS=0,
# the syscall rows stay empty.
if [ "${COUNT_SYSCALLS:-1}" = 1 ] && command -v perf >/dev/null 2>&1 \
    && perf stat -e syscalls:sys_enter_sendto -- true >/dev/null 2>&1; then
    COUNT_SYSCALLS=1
else
    COUNT_SYSCALLS=0
fi
SYSCALL_EVENTS=syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_epoll_wait

scenario_fanout() { # name pids kind users rate args...
    local name=$1 pids=$2 kind=$3 users=$4 rate=$5
    shift 5
    local log=$OUT/$name-$kind.log stat=$OUT/$name-$kind.perfstat perf_pid="" seconds=$FANOUT_SECONDS
    # kind "syscalls": a fan-out of its own, 4 s, with the servers' system
    # calls counted over the whole run (setup included: a welcome per
    # connection, small beside the deliveries). Not during the measured
    # fan-outs: counting tracepoints costs the servers CPU (Herald's fan-out
    # CPU per delivery 53.7-54.7 -> 59.7-72.1 s per million with it on).
    if [ "$kind" = syscalls ]; then
        seconds=4
        perf stat -x, -e "$SYSCALL_EVENTS" -p "$pids" -o "$stat" 2>/dev/null &
        perf_pid=$!
    fi
    "$@" --mode fanout --users "$users" --devices "$FANOUT_DEVICES" --rate "$rate" \
        --duration "$seconds" --user-prefix "${kind:0:2}${RUN_ID}u" --server-pids "$pids" --pub-conns 64 \
        --setup-timeout 120 > "$log" 2>&1 || true
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid" 2>/dev/null; wait "$perf_pid" 2>/dev/null || true
        # sends: send/sendto, sendmsg and writev (what servers write sockets
        # with); writes: write() (Herald's loop wake-ups are eventfd writes)
        awk -F, '/sys_enter_(sendto|sendmsg|writev)/ {s+=$1} /sys_enter_write,/ {w+=$1}
                 /sys_enter_epoll_wait/ {e+=$1}
                 END {printf "RESULT mode=syscalls sends=%d writes=%d epoll_waits=%d\n", s, w, e}' "$stat" >> "$log"
    fi
    grep -v '^RESULT' "$log" | sed "s/^/[$name $kind] /" >&2
}

per_delivery() { # target kind key: that syscall count per delivery of the fan-out
    local n d
    n=$(val "$1" "$2" mode=syscalls "$3") d=$(val "$1" "$2" step=0 delivered)
    if [ -n "$n" ] && [ -n "$d" ] && [ "$d" != 0 ]; then awk -v n="$n" -v d="$d" 'BEGIN { printf "%.2f", n / d }'; fi
}

scenario_saturation() { # name pids kind devices ramp pub-conns args...
    local name=$1 pids=$2 kind=$3 devices=$4 ramp=$5 conns=$6
    shift 6
    local log=$OUT/$name-$kind.log
    "$@" --mode fanout --users "$FANOUT_USERS" --devices "$devices" --rate "$ramp" \
        --duration "$RAMP_SECONDS" --max-p99-ms "$MAX_P99_MS" --user-prefix "${kind:0:2}${RUN_ID}u" --server-pids "$pids" \
        --pub-conns "$conns" > "$log" 2>&1 || true
    grep -E '^(step|saturation|  stopping)' "$log" | sed "s/^/[$name $kind] /" >&2
}

SERVER_NOTES=""
# is every server process still there? (notes it for the results if not)
server_alive() { # name pids scenario
    local p
    for p in ${2//,/ }; do
        if ! kill -0 "$p" 2>/dev/null; then
            SERVER_NOTES="$SERVER_NOTES $1 process $p exited during or before the $3 scenario (see bench/out/$1-*.log)."
            log "$1: process $p is gone after $3"
            return 1
        fi
    done
}

run_target() { # name pids idle-connections (0: no idle scenario) large(1|0) args...
    local name=$1 pids=$2 idle=$3 large=$4
    shift 4
    # each scenario starts after the last one's connections are closed and
    # their timers have run (Herald's hello deadline is 10 s)
    if [ "$idle" -gt 0 ]; then
        scenario_idle "$name" "$pids" "$idle" "$@"
        server_alive "$name" "$pids" idle || return 1
        sleep "$SETTLE_SECONDS"
    fi
    scenario_fanout "$name" "$pids" fanout "$FANOUT_USERS" "$FANOUT_RATE" "$@"
    server_alive "$name" "$pids" fan-out || return 1
    if [ "$large" = 1 ]; then
        sleep "$SETTLE_SECONDS"
        scenario_fanout "$name" "$pids" large "$LARGE_USERS" "$LARGE_RATE" "$@"
        server_alive "$name" "$pids" large-fan-out || return 1
    fi
    sleep "$SETTLE_SECONDS"
    scenario_saturation "$name" "$pids" saturation "$FANOUT_DEVICES" "$RAMP" 128 "$@"
    server_alive "$name" "$pids" saturation || return 1
    if [ "$COUNT_SYSCALLS" = 1 ]; then
        sleep "$SETTLE_SECONDS"
        scenario_fanout "$name" "$pids" syscalls "$FANOUT_USERS" "$FANOUT_RATE" "$@"
    fi
}

# Herald plain and over TLS, alternated TLS_ROUNDS times, each on a fresh
# server (memory store), so that the ratios compare runs made back to back
run_tls_comparison() {
    mkdir -p "$WORK/tls"
    if ! openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
        -addext subjectAltName=IP:127.0.0.1 -days 2 -keyout "$TLS_KEY" -out "$TLS_CERT" > "$OUT/herald-tls-cert.log" 2>&1; then
        log "no certificate for the TLS comparison (see bench/out/herald-tls-cert.log)"
        return 1
    fi
    local r proto name
    for r in $(seq 1 "$TLS_ROUNDS"); do
        for proto in plain tls; do
            name=herald-$proto$r
            log "=== Herald $proto, round $r of $TLS_ROUNDS ==="
            if ! start_herald "$name" memory "$proto"; then
                log "$name: $HERALD_WHY"
                continue
            fi
            if [ "$proto" = tls ]; then # what the handshakes negotiate, for the results
                timeout 10 openssl s_client -connect "127.0.0.1:$HERALD_TLS_PORT" -CAfile "$TLS_CERT" < /dev/null 2> /dev/null |
                    grep -E '^(New,|Server Temp Key|Peer signature type|Verify return)' > "$OUT/herald-tls-session.log" || true
            fi
            run_target "$name" "$HERALD_PID" "$TLS_IDLE_CONNS" 0 "${HERALD_ARGS[@]}" || true
            stop_herald
        done
    done
}

# The p99 and CPU comparison at FANOUT_USERS x FANOUT_DEVICES, FANOUT_PAIRS
# times more: an Nchan (same bytes) and a Herald fan-out back to back, each on
# a fresh server, Nchan first in odd pairs and Herald first in even ones. The
# two targets' phases above are minutes apart, and this machine's speed
# drifts that much; a pair's two runs are seconds apart.
run_pairs() {
    local r first
    rm -f "$OUT"/pair[0-9]*-*.log
    for r in $(seq 1 "$FANOUT_PAIRS"); do
        log "=== fan-out pair $r of $FANOUT_PAIRS ==="
        for first in 1 0; do
            if [ $(( (r + first) % 2 )) = 0 ]; then
                start_nchan || return 1
                scenario_fanout "pair$r-nchan-same" "$NCHAN_PIDS" fanout "$FANOUT_USERS" "$FANOUT_RATE" "${NCHAN_SAME_BYTES_ARGS[@]}"
                stop_nchan
            else
                start_herald "pair$r-herald" || return 1
                scenario_fanout "pair$r-herald" "$HERALD_PID" fanout "$FANOUT_USERS" "$FANOUT_RATE" "${HERALD_ARGS[@]}"
                stop_herald
            fi
        done
    done
}

# ---------------------------------------------------------------- run
HAVE_NCHAN=0
HAVE_HERALD=0
if [ "${TABLE_ONLY:-0}" = 1 ]; then
    SKIP_NCHAN=1 SKIP_HERALD=1
    [ -f "$OUT/nchan-fanout.log" ] && HAVE_NCHAN=1
    [ -f "$OUT/herald-fanout.log" ] && HAVE_HERALD=1
fi
if [ "${SKIP_NCHAN:-0}" != 1 ] && [ "$HERALD_TLS" != only ]; then
    log "=== nginx + Nchan ==="
    start_nchan
    run_target nchan "$NCHAN_PIDS" "$IDLE_CONNS" 1 "${NCHAN_ARGS[@]}" || true
    stop_nchan
    log "=== nginx + Nchan, bodies of Herald's frame size ==="
    start_nchan
    run_target nchan-same "$NCHAN_PIDS" 0 1 "${NCHAN_SAME_BYTES_ARGS[@]}" || true
    stop_nchan
    HAVE_NCHAN=1
fi

if prepare_herald; then
    log "=== Herald ($HERALD_BIN) ==="
    # a fresh server for each scenario group keeps RSS baselines clean
    if [ "$HERALD_TLS" != only ] && start_herald herald; then
        HAVE_HERALD=1
        if run_target herald "$HERALD_PID" "$IDLE_CONNS" 1 "${HERALD_ARGS[@]}" && [ "$HERALD_EXTRA" = 1 ]; then
            "${HERALD_ARGS[@]}" --mode dismiss --users "$FANOUT_USERS" --devices "$FANOUT_DEVICES" --rate 2000 \
                --user-prefix "d${RUN_ID}u" > "$OUT/herald-dismiss.log" 2>&1 || true
            grep -v '^RESULT' "$OUT/herald-dismiss.log" | sed 's/^/[herald dismiss] /' >&2
            "${HERALD_ARGS[@]}" --mode reconnect --users "$RECONNECT_USERS" --devices "$FANOUT_DEVICES" --burst 10 \
                --rate 5000 --user-prefix "c${RUN_ID}u" --setup-timeout 120 > "$OUT/herald-reconnect.log" 2>&1 || true
            grep -v '^RESULT' "$OUT/herald-reconnect.log" | sed 's/^/[herald reconnect] /' >&2
        fi
        stop_herald
    fi
    # the same saturation ramp with the durable store, then publish throughput
    # alone (one device per user, many concurrent publishers); fresh files
    if [ "$HAVE_HERALD" = 1 ] && [ "$HERALD_EXTRA" = 1 ] && start_herald herald sqlite; then
        scenario_saturation herald "$HERALD_PID" sqlite-saturation "$FANOUT_DEVICES" "$RAMP" 128 "${HERALD_ARGS[@]}"
        stop_herald
    fi
    if [ "$HAVE_HERALD" = 1 ] && [ "$HERALD_EXTRA" = 1 ] && start_herald herald sqlite-normal; then
        scenario_saturation herald "$HERALD_PID" sqlite-normal-saturation "$FANOUT_DEVICES" "$RAMP" 128 "${HERALD_ARGS[@]}"
        stop_herald
    fi
    if [ "$HAVE_HERALD" = 1 ] && [ "$HERALD_EXTRA" = 1 ] && start_herald herald sqlite; then
        scenario_saturation herald "$HERALD_PID" durable 1 "$DURABLE_RAMP" 512 "${HERALD_ARGS[@]}" ${DURABLE_ARGS[@]+"${DURABLE_ARGS[@]}"}
        stop_herald
    fi
    if [ "$HAVE_HERALD" = 1 ] && [ "$HAVE_NCHAN" = 1 ] && [ "${SKIP_NCHAN:-0}" != 1 ] && [ "$FANOUT_PAIRS" -gt 0 ]; then
        run_pairs || log "fan-out pairs cut short: a server did not start"
    fi
    [ "$HERALD_TLS" = 0 ] || run_tls_comparison || true
fi
if [ "$HAVE_HERALD" = 0 ] && [ "$HERALD_TLS" != only ]; then
    log "Herald not benchmarked: ${HERALD_WHY:-unavailable}"
fi

# ---------------------------------------------------------------- table
val() { # target logkind filter key
    local f=$OUT/$1-$2.log
    [ -f "$f" ] || { echo ""; return; }
    res "$f" "$3" "$4"
}
ratio() { # herald nchan
    if [ -n "$1" ] && [ -n "$2" ]; then
        awk -v h="$1" -v n="$2" 'BEGIN { if (n + 0 == 0) print "—"; else printf "%.2f", h / n }'
    else
        echo "—"
    fi
}
row() { # label herald nchan [nchan with bodies of Herald's frame size]
    local h=${2:-} n=${3:-} e=${4:-}
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "${h:-—}" "${n:-—}" "$(ratio "$h" "$n")" "${e:-—}" "$(ratio "$h" "$e")"
}

steps() { # saturation log: one line per step
    [ -f "$1" ] || return 0
    grep '^RESULT mode=fanout step=' "$1" | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]} printf "  %6s pub/s -> %7s deliveries/s  p99 %8s ms  lost %s ok=%s\n", v["target_rate"], v["dps"], v["p99_ms"], v["lost"], v["ok"]}' || true
}

# the fan-out pairs (run_pairs) found in the logs: one row each, and how
# many Herald matched Nchan in
pairs_table() {
    [ -f "$OUT/pair1-herald-fanout.log" ] || return 0
    local r=1 h n hc nc p99s="" cpus=""
    echo
    echo "Fan-out ${FANOUT_USERS}×${FANOUT_DEVICES} at ${FANOUT_RATE}/s, ${FANOUT_SECONDS} s, in pairs: Nchan with bodies of Herald's frame size and Herald back to back, each on a fresh server (Nchan first in odd pairs, Herald in even ones):"
    echo
    echo "| pair | p99 ms: Herald / Nchan | Herald/Nchan | CPU s per million deliveries: Herald / Nchan | Herald/Nchan | lost / duplicate: Herald, Nchan |"
    echo "|---|---|---|---|---|---|"
    while [ -f "$OUT/pair$r-herald-fanout.log" ]; do
        h=$(val "pair$r-herald" fanout step=0 p99_ms) n=$(val "pair$r-nchan-same" fanout step=0 p99_ms)
        hc=$(val "pair$r-herald" fanout step=0 cpu_s_per_m) nc=$(val "pair$r-nchan-same" fanout step=0 cpu_s_per_m)
        printf '| %s | %s / %s | %s | %s / %s | %s | %s / %s, %s / %s |\n' "$r" "${h:-—}" "${n:-—}" "$(ratio "$h" "$n")" \
            "${hc:-—}" "${nc:-—}" "$(ratio "$hc" "$nc")" \
            "$(val "pair$r-herald" fanout step=0 lost)" "$(val "pair$r-herald" fanout step=0 dup)" \
            "$(val "pair$r-nchan-same" fanout step=0 lost)" "$(val "pair$r-nchan-same" fanout step=0 dup)"
        p99s="$p99s $(ratio "$h" "$n")" cpus="$cpus $(ratio "$hc" "$nc")"
        r=$((r + 1))
    done
    echo
    awk -v p="$p99s" -v c="$cpus" 'function met(s,   a, n, i, k) { n = split(s, a, " "); for (i = 1; i <= n; i++) if (a[i] != "—" && a[i] + 0 <= 1) k++; return k + 0 }
        BEGIN { n = split(p, x, " "); printf "Herald'"'"'s p99 no worse than Nchan'"'"'s in %d of %d pairs; its CPU per delivery no more than Nchan'"'"'s in %d of %d.\n", met(p), n, met(c), n }'
}

main_table() {
    if [ "$HAVE_HERALD" = 0 ]; then echo "**Herald not benchmarked:** ${HERALD_WHY:-unavailable}."; echo; fi
    if [ "$HAVE_NCHAN" = 0 ]; then echo "**Nchan not benchmarked** (SKIP_NCHAN=1)."; echo; fi
    echo "| metric | Herald | Nchan | Herald/Nchan | Nchan, same bytes | Herald/Nchan, same bytes |"
    echo "|---|---|---|---|---|---|"
    row "idle: WebSocket connections held" "$(val herald idle phase=setup ready)" "$(val nchan idle phase=setup ready)"
    row "idle: server RSS per connection (bytes, lower is better)" "$(val herald idle script_rss bytes_per_conn)" "$(val nchan idle script_rss bytes_per_conn)"
    row "idle: connection setup rate (connections/s)" "$(val herald idle phase=setup setup_rate)" "$(val nchan idle phase=setup setup_rate)"
    for kind in fanout large; do
        users=$FANOUT_USERS rate=$FANOUT_RATE
        [ "$kind" = large ] && users=$LARGE_USERS rate=$LARGE_RATE
        F="fan-out ${users}×${FANOUT_DEVICES} at ${rate}/s, ${FANOUT_SECONDS} s"
        row "$F: deliveries/s" "$(val herald $kind step=0 dps)" "$(val nchan $kind step=0 dps)" "$(val nchan-same $kind step=0 dps)"
        row "$F: p50 latency (ms)" "$(val herald $kind step=0 p50_ms)" "$(val nchan $kind step=0 p50_ms)" "$(val nchan-same $kind step=0 p50_ms)"
        row "$F: p99 latency (ms)" "$(val herald $kind step=0 p99_ms)" "$(val nchan $kind step=0 p99_ms)" "$(val nchan-same $kind step=0 p99_ms)"
        row "$F: p99.9 latency (ms)" "$(val herald $kind step=0 p999_ms)" "$(val nchan $kind step=0 p999_ms)" "$(val nchan-same $kind step=0 p999_ms)"
        row "$F: max latency (ms)" "$(val herald $kind step=0 max_ms)" "$(val nchan $kind step=0 max_ms)" "$(val nchan-same $kind step=0 max_ms)"
        row "$F: lost / duplicate deliveries" "$(val herald $kind step=0 lost) / $(val herald $kind step=0 dup)" \
            "$(val nchan $kind step=0 lost) / $(val nchan $kind step=0 dup)" \
            "$(val nchan-same $kind step=0 lost) / $(val nchan-same $kind step=0 dup)"
        row "$F: server CPU s per million deliveries" "$(val herald $kind step=0 cpu_s_per_m)" "$(val nchan $kind step=0 cpu_s_per_m)" "$(val nchan-same $kind step=0 cpu_s_per_m)"
        [ "$kind" = fanout ] && for k in sends writes epoll_waits; do
            row "${FANOUT_USERS}×${FANOUT_DEVICES} at ${FANOUT_RATE}/s, 4 s, a run of its own: server $k per delivery (perf stat)" \
                "$(per_delivery herald syscalls $k)" "$(per_delivery nchan syscalls $k)" "$(per_delivery nchan-same syscalls $k)"
        done
    done
    S="saturation ($RAMP, ${RAMP_SECONDS} s steps): max deliveries/s with p99 ≤ ${MAX_P99_MS} ms and no loss"
    row "$S" "$(val herald saturation mode=saturation max_dps)" "$(val nchan saturation mode=saturation max_dps)" "$(val nchan-same saturation mode=saturation max_dps)"
    row "… at publishes/s" "$(val herald saturation mode=saturation at_rate)" "$(val nchan saturation mode=saturation at_rate)" "$(val nchan-same saturation mode=saturation at_rate)"
    row "$S, Herald on SQLite (Nchan in memory)" "$(val herald sqlite-saturation mode=saturation max_dps)" \
        "$(val nchan saturation mode=saturation max_dps)" "$(val nchan-same saturation mode=saturation max_dps)"
    row "$S, Herald on SQLite at --durability normal (Nchan in memory)" "$(val herald sqlite-normal-saturation mode=saturation max_dps)" \
        "$(val nchan saturation mode=saturation max_dps)" "$(val nchan-same saturation mode=saturation max_dps)"
    pairs_table
    if [ -f "$OUT/herald-dismiss.log" ] || [ -f "$OUT/herald-reconnect.log" ]; then
        echo
        echo "Herald only (Nchan has no equivalent):"
        echo
        echo "| metric | Herald |"
        echo "|---|---|"
        D=$OUT/herald-dismiss.log
        C=$OUT/herald-reconnect.log
        [ -f "$D" ] && printf '| dismiss on device 0 → change on the other devices, p50 / p99 / max (ms) | %s / %s / %s |\n' \
            "$(res "$D" mode=dismiss p50_ms)" "$(res "$D" mode=dismiss p99_ms)" "$(res "$D" mode=dismiss max_ms)"
        [ -f "$D" ] && printf '| dismiss: changes received / expected | %s / %s |\n' "$(res "$D" mode=dismiss received)" "$(res "$D" mode=dismiss expected)"
        [ -f "$C" ] && printf '| reconnect %s devices after 10 missed notifications each: all resumed (s) | %s |\n' \
            "$(res "$C" mode=reconnect devices)" "$(res "$C" mode=reconnect wall_s)"
        [ -f "$C" ] && printf '| reconnect: per-device catch-up + welcome p50 / p99 (ms) | %s / %s |\n' "$(res "$C" mode=reconnect p50_ms)" "$(res "$C" mode=reconnect p99_ms)"
        [ -f "$C" ] && printf '| reconnect: missed notifications received / missing / duplicates | %s / %s / %s |\n' \
            "$(res "$C" mode=reconnect received)" "$(res "$C" mode=reconnect missing)" "$(res "$C" mode=reconnect dup)"
        U=$OUT/herald-durable.log
        [ -f "$U" ] && printf '| durable publishes, SQLite (%s, 512 publisher connections, 1 device per user%s): max acknowledged publishes/s with p99 ≤ %s ms | %s |\n' \
            "$DURABLE_RAMP" "$([ "$DURABLE_PAYLOAD_BYTES" -gt 0 ] && echo ", payloads of $DURABLE_PAYLOAD_BYTES characters")" \
            "$MAX_P99_MS" "$(res "$U" mode=saturation at_rate)"
    fi
    echo
    echo "Saturation steps (deliveries/s, p99 ms) — Nchan:"
    echo
    echo '```'
    steps "$OUT/nchan-saturation.log"
    echo '```'
    if [ -f "$OUT/nchan-same-saturation.log" ]; then
        echo
        echo "Saturation steps — Nchan, bodies of Herald's frame size:"
        echo
        echo '```'
        steps "$OUT/nchan-same-saturation.log"
        echo '```'
    fi
    for kind in saturation sqlite-saturation sqlite-normal-saturation durable; do
        [ -f "$OUT/herald-$kind.log" ] || continue
        echo
        echo "Steps — Herald $kind:"
        echo
        echo '```'
        steps "$OUT/herald-$kind.log"
        echo '```'
    done
}

# one metric of the TLS comparison: its value in each round, plain and TLS,
# and TLS/plain of the means
tls_row() { # label getter args... (the getter is called as: getter target args...)
    local label=$1 getter=$2 r v p="" t=""
    shift 2
    for r in $(seq 1 "$TLS_ROUNDS"); do
        v=$("$getter" "herald-plain$r" "$@")
        p="$p ${v:-—}"
        v=$("$getter" "herald-tls$r" "$@")
        t="$t ${v:-—}"
    done
    awk -v label="$label" -v p="$p" -v t="$t" '
        function mean(s,   a, n, i, k, sum) {
            n = split(s, a, " ")
            for (i = 1; i <= n; i++) if (a[i] != "—") { sum += a[i]; k++ }
            return k ? sum / k : ""
        }
        function list(s) { sub(/^ /, "", s); gsub(/ /, " / ", s); return s }
        BEGIN {
            mp = mean(p); mt = mean(t)
            printf "| %s | %s | %s | %s |\n", label, list(p), list(t), (mp != "" && mt != "" && mp + 0 != 0) ? sprintf("%.2f", mt / mp) : "—"
        }'
}
setup_cpu_ms() { # target: server CPU ms per connection while the fan-out's subscribers connected
    local cpu ready
    cpu=$(val "$1" fanout phase=setup server_cpu_s)
    ready=$(val "$1" fanout phase=setup ready)
    if [ -n "$cpu" ] && [ "${ready:-0}" -gt 0 ]; then
        awk -v c="$cpu" -v n="$ready" 'BEGIN { printf "%.3f", 1000 * c / n }'
    fi
}
core_pct() { # target: server CPU over the fan-out step (publishing + 2 s drain), % of one core
    local cpu
    cpu=$(val "$1" fanout step=0 server_cpu_s)
    if [ -n "$cpu" ]; then awk -v c="$cpu" -v s="$FANOUT_SECONDS" 'BEGIN { printf "%.0f", 100 * c / (s + 2) }'; fi
}

tls_table() {
    echo "## Herald: TLS vs plain"
    echo
    echo "Herald plain, then over TLS, $TLS_ROUNDS times in a row, each on a fresh server (memory store);"
    echo "a self-signed ECDSA P-256 certificate, every connection a full handshake"
    echo "($(tr '\n' ';' < "$OUT/herald-tls-session.log" 2>/dev/null | sed 's/;$//; s/;/, /g'))."
    echo "Values are round 1 / round 2 / …; the ratio is TLS/plain of the means."
    echo
    echo "| metric | plain | TLS | TLS/plain |"
    echo "|---|---|---|---|"
    tls_row "idle: WebSocket connections held" val idle phase=setup ready
    tls_row "idle: server RSS per connection (bytes)" val idle script_rss bytes_per_conn
    tls_row "idle: connection setup (connections/s)" val idle phase=setup setup_rate
    tls_row "server CPU per connection set up (ms, the fan-out's subscribers)" setup_cpu_ms
    F="fan-out ${FANOUT_USERS}×${FANOUT_DEVICES} at ${FANOUT_RATE}/s, ${FANOUT_SECONDS} s"
    tls_row "$F: deliveries/s" val fanout step=0 dps
    tls_row "$F: p50 latency (ms)" val fanout step=0 p50_ms
    tls_row "$F: p99 latency (ms)" val fanout step=0 p99_ms
    tls_row "$F: p99.9 latency (ms)" val fanout step=0 p999_ms
    tls_row "$F: max latency (ms)" val fanout step=0 max_ms
    tls_row "$F: lost deliveries" val fanout step=0 lost
    tls_row "$F: duplicate deliveries" val fanout step=0 dup
    tls_row "$F: server CPU, % of one core" core_pct
    tls_row "$F: server CPU s per million deliveries" val fanout step=0 cpu_s_per_m
    tls_row "saturation ($RAMP, ${RAMP_SECONDS} s steps): max deliveries/s with p99 ≤ ${MAX_P99_MS} ms and no loss" \
        val saturation mode=saturation max_dps
    local r proto
    for r in $(seq 1 "$TLS_ROUNDS"); do
        for proto in plain tls; do
            [ -f "$OUT/herald-$proto$r-saturation.log" ] || continue
            echo
            echo "Saturation steps — Herald $proto, round $r:"
            echo
            echo '```'
            steps "$OUT/herald-$proto$r-saturation.log"
            echo '```'
        done
    done
}

{
    if [ "$HERALD_TLS" = only ]; then echo "# Herald: TLS vs plain"; else echo "# Herald vs nginx + Nchan"; fi
    echo
    echo "Run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr);"
    if [ "$HERALD_TLS" = only ]; then
        echo "commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')."
    else
        echo "commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'); nginx $(nginx -v 2>&1 | sed 's/.*nginx\///') with Nchan $(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo '?'), 2 workers."
    fi
    echo "Load generator and servers share the same cores over loopback; background CPU use before the run: ${BG_BUSY}%;"
    echo "load average (1, 5, 15 min) $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end."
    if [ -n "$SERVER_NOTES" ]; then echo; echo "**Server lost:**$SERVER_NOTES"; fi
    echo
    [ "$HERALD_TLS" = only ] || main_table
    if [ "$HERALD_TLS" != 0 ]; then echo; tls_table; fi
    echo
    echo "Raw logs: bench/out/*.log. Method: bench/README.md."
} > "$OUT/results.md"

log "wrote $OUT/results.md"
cat "$OUT/results.md"
