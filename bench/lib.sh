# Helpers shared by bench/run.sh and bench/cluster.sh (sourced, not run).
#
# Sets ROOT, BENCH, OUT (bench/out, made), LOADGEN, RUN_ID, WORK (a temporary
# folder, removed on exit), STARTED_PIDS (processes to stop on exit, by pid),
# and installs bench_cleanup as the EXIT trap. The sourcing script sets
# LOG_TAG (its name in log lines) first.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
OUT=$BENCH/out
mkdir -p "$OUT"
LOADGEN=$BENCH/loadgen
RUN_ID=$(date +%s)
WORK=$(mktemp -d /tmp/herald-bench.XXXXXX)
STARTED_PIDS=()   # processes this script started (stopped on exit, by pid)

log() { printf '[%s] %s\n' "${LOG_TAG:-bench}" "$*" >&2; }

bench_cleanup() {
    local p
    for p in "${STARTED_PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    sleep 0.3
    for p in "${STARTED_PIDS[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap bench_cleanup EXIT

# forget a pid this script waited for, so cleanup never signals a reused pid
forget_pid() {
    local p keep=()
    for p in "${STARTED_PIDS[@]:-}"; do [ "$p" != "$1" ] && [ -n "$p" ] && keep+=("$p"); done
    STARTED_PIDS=("${keep[@]:-}")
}

# ---------------------------------------------------------------- quiet machine?
# the load generator and the servers share this machine's cores: anything else
# busy (a compiler, a test suite) skews every number, so measure and report it
busy_pct() { # percent of all CPU time not idle over $1 seconds
    local a b
    a=$(awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
    sleep "$1"
    b=$(awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
    echo "$a $b" | awk '{ busy = $3 - $1; idle = $4 - $2; if (busy + idle == 0) print 0; else printf "%.0f", 100 * busy / (busy + idle) }'
}
measure_background() { # sets BG_BUSY and LOAD_START
    BG_BUSY=$(busy_pct 2)
    LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
    if [ "$BG_BUSY" -gt 10 ]; then
        log "warning: the machine is already ${BG_BUSY}% busy before the benchmark; results will be noisy"
    fi
}

# ---------------------------------------------------------------- build
build_loadgen() { # [more tools to install if missing]
    log "building the load generator"
    local need=() tool
    for tool in make gcc curl "$@"; do command -v "$tool" >/dev/null || need+=("$tool"); done
    [ -f /usr/include/openssl/hmac.h ] || need+=(libssl-dev)
    if [ ${#need[@]} -gt 0 ]; then
        log "installing ${need[*]} (Debian)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    make -s -C "$BENCH" loadgen
}

# the toolchain where this project's machines keep it, when it is not on PATH
[[ -x /opt/swift/usr/bin/swift ]] && ! command -v swift >/dev/null && export PATH="/opt/swift/usr/bin:$PATH"
build_herald() { # unless SKIP_HERALD_BUILD=1; log in bench/out/herald-build.log
    if [ "${SKIP_HERALD_BUILD:-0}" != 1 ] && [ -f "$ROOT/Package.swift" ] && command -v swift >/dev/null; then
        log "building Herald: swift build -c release (log: bench/out/herald-build.log)"
        if ! (cd "$ROOT" && swift build -c release --product herald) > "$OUT/herald-build.log" 2>&1; then
            log "swift build -c release failed (see bench/out/herald-build.log)"
        fi
    fi
}

# ---------------------------------------------------------------- results
# sum of VmRSS (KiB) over the given pids
rss_kib() {
    local t=0 p v
    for p in "$@"; do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
        t=$((t + ${v:-0}))
    done
    echo "$t"
}

# value of key=... in the last RESULT line of a log matching a filter
res() { # file filter key
    { grep '^RESULT' "$1" | grep -- "$2" | tail -1 | tr ' ' '\n' | awk -F= -v k="$3" '$1==k {print $2}'; } 2>/dev/null || true
}

# table rows of bench/fsync_probe's RESULT lines in a log: the disk's floor
probe_rows() { # log
    grep '^RESULT way=' "$1" | tr ' ' '\n' | awk -F= '
        $1 == "way" { w = $2 } $1 == "bytes" { b = $2 } $1 == "per_s" { r = $2 }
        $1 == "p50_ms" { p50 = $2 } $1 == "p99_ms" { p99 = $2 } $1 == "p999_ms" { p999 = $2 }
        $1 == "max_ms" { printf "| disk: %d KiB write + fdatasync, %s (`fsync_probe`): p50 / p99 / p99.9 / max | %s / %s / %s / %s ms (%s/s) |\n", b / 1024, w, p50, p99, p999, $2, r }'
}

# writes FILE, a loadgen --around-steps hook that counts what herald PID does
# during a step: /proc I/O of the process and of each of its threads, by
# name (FILE.start, FILE.stop: "name field value" lines), and `perf stat`
# of its syncs and CPU per thread in between (FILE.perf, CSV)
count_around() { # pid file
    cat > "$2" <<EOF2
#!/bin/sh
snapshot() {
    awk '{print "process", \$1, \$2}' /proc/$1/io
    for t in /proc/$1/task/*; do awk -v c="\$(cat \$t/comm)" '{print c, \$1, \$2}' \$t/io 2>/dev/null; done
}
case "\$1" in
start) snapshot > "$2.start"
       perf stat --per-thread -e 'syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync,task-clock' -p $1 -x, -o "$2.perf" &
       echo \$! > "$2.perfpid"; sleep 0.5 ;;
stop)  kill -INT "\$(cat "$2.perfpid")"
       while kill -0 "\$(cat "$2.perfpid")" 2>/dev/null; do sleep 0.1; done
       snapshot > "$2.stop" ;;
esac
EOF2
    chmod +x "$2"
}
# what count_around's FILE saw of FIELD (write_bytes, wchar, syscw: proc(5))
# over the step, summed over the threads whose names match NAME (a regex;
# "process" for the whole process)
counted() { # file field name
    awk -v f="$2:" -v n="^($3)\$" '$2 == f && $1 ~ n { if (FILENAME ~ /start$/) s -= $3; else s += $3 } END { printf "%.0f\n", s }' "$1.start" "$1.stop"
}
# from count_around's FILE.perf: the syncs, and the CPU ms of threads matching NAME
perf_syncs() { awk -F, '$4 ~ /fdatasync|fsync/ {s += $2} END {print s + 0}' "$1.perf"; }
perf_cpu_ms() { awk -F, -v n="^$2" '$1 ~ n && $4 ~ /task-clock/ {s += $2} END {print s + 0}' "$1.perf"; }

# ---------------------------------------------------------------- herald
# the loadgen command line for Herald's wire contract: subscribers on each
# SUB_PORT in turn (connection k on the (k mod n)-th), publishes to each of
# PUB_PORTS (a space-separated list) in turn, by publisher connection;
# s = "s" for wss:// and https:// verified against CA
herald_loadgen_args() { # s ca pub-ports sub-port...
    local s=$1 ca=() p subs=() pubs=()
    [ -n "$2" ] && ca=(--ca "$2")
    for p in $3; do pubs+=(--pub-url "http$s://127.0.0.1:$p/v1/apps/{app}/users/{user}/notifications"); done
    shift 3
    for p in "$@"; do subs+=(--sub-url "ws$s://127.0.0.1:$p/v1/ws"); done
    HERALD_ARGS=("$LOADGEN"
        "${subs[@]}"
        --hello '{"type":"hello","token":"{token}","deviceId":"{device}"}'
        --resume-hello '{"type":"hello","token":"{token}","deviceId":"{device}","cursor":{cursor},"epoch":"{epoch}"}'
        --ready-match '"type":"welcome"'
        --msg-filter '"type":"change'
        --app bench --key bench-key --secret bench-secret
        "${pubs[@]}"
        --pub-header 'Authorization: Bearer {key}'
        --pub-header 'Content-Type: application/json'
        --pub-body '{"appNotificationId":"m{n}","payload":{"t":{ts},"n":{n}}}'
        "${ca[@]}")
}

# starts `herald serve --host 127.0.0.1 --port PORT --config <the bench app>
# ARGS...` in DIR (made fresh), stderr to bench/out/NAME-server.log; sets
# SPAWNED_PID and waits for its `listening on` line (1 if it never comes).
# HERALD_LIMITS, when set, is the config's "limits" object; HERALD_APP_EXTRA,
# more fields of the bench app (`,"push":{...}`); HERALD_PIN, a command it runs
# under (`taskset -c 0`).
herald_spawn() { # name dir port args...
    local name=$1 d=$2 port=$3
    shift 3
    rm -rf "$d"
    mkdir -p "$d"
    echo "{\"apps\":[{\"id\":\"bench\",\"serverKey\":\"bench-key\",\"tokenSecret\":\"bench-secret\"${HERALD_APP_EXTRA:-}}]${HERALD_LIMITS:+,\"limits\":$HERALD_LIMITS}}" > "$d/herald.json"
    ${HERALD_PIN:-} "$HERALD_BIN" serve --host 127.0.0.1 --port "$port" --config "$d/herald.json" "$@" \
        > "$d/stdout" 2> "$OUT/$name-server.log" &
    SPAWNED_PID=$!
    STARTED_PIDS+=("$SPAWNED_PID")
    local i
    for i in $(seq 1 100); do
        grep -q '^listening on' "$d/stdout" 2>/dev/null && break
        kill -0 "$SPAWNED_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q '^listening on' "$d/stdout" 2>/dev/null; then
        herald_stop "$SPAWNED_PID"
        return 1
    fi
    log "$name: herald pid $SPAWNED_PID: $(head -1 "$d/stdout")"
}

# SIGTERM, up to 12 s to finish, then SIGKILL
herald_stop() { # pid
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || true
    local i
    for i in $(seq 1 120); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$1" 2>/dev/null && kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    forget_pid "$1"
}

# ---------------------------------------------------------------- nchan
NCHAN_PORT=${NCHAN_PORT:-18090}
NCHAN_PIDS=""
# starts nginx + Nchan on NCHAN_PORT (installed from Debian when missing);
# NCHAN_WORKERS [2] worker processes, the whole under `$NCHAN_PIN` (e.g.
# `taskset -c 0`) when set. Sets NCHAN_PIDS (master, then workers).
start_nchan() {
    if [ ! -f /usr/lib/nginx/modules/ngx_nchan_module.so ] || ! command -v nginx >/dev/null; then
        log "installing nginx and libnginx-mod-nchan (Debian)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx libnginx-mod-nchan >/dev/null
    fi
    local d=$WORK/nchan
    rm -rf "$d"
    mkdir -p "$d/tmp"
    sed -e "s/127\.0\.0\.1:18090/127.0.0.1:$NCHAN_PORT/" -e "s/^worker_processes 2;/worker_processes ${NCHAN_WORKERS:-2};/" \
        "$BENCH/nchan/nginx.conf" > "$d/nginx.conf"
    ${NCHAN_PIN:-} nginx -c "$d/nginx.conf" -p "$d/"
    local i master=""
    for i in $(seq 1 50); do
        [ -s "$d/nginx.pid" ] && master=$(cat "$d/nginx.pid") && break
        sleep 0.1
    done
    [ -n "$master" ] || { log "nginx did not start"; cat "$d/error.log" >&2; return 1; }
    STARTED_PIDS+=("$master")
    for i in $(seq 1 50); do
        curl -sf "http://127.0.0.1:$NCHAN_PORT/healthz" >/dev/null && break
        sleep 0.1
    done
    NCHAN_PIDS=$(echo "$master" $(pgrep -P "$master") | tr ' ' ',')
    log "nginx+nchan on 127.0.0.1:$NCHAN_PORT, pids $NCHAN_PIDS"
}
stop_nchan() {
    local master=${NCHAN_PIDS%%,*}
    [ -n "$master" ] || return 0
    kill -QUIT "$master" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do kill -0 "$master" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$master" 2>/dev/null && kill -9 "$master" 2>/dev/null || true
    forget_pid "$master"
    NCHAN_PIDS=""
}

# the loadgen command lines for Nchan (set once NCHAN_PORT is)
nchan_loadgen_args() {
    NCHAN_ARGS=("$LOADGEN"
        --sub-url "ws://127.0.0.1:$NCHAN_PORT/sub/{user}"
        --pub-url "http://127.0.0.1:$NCHAN_PORT/pub/{user}"
        --pub-body '{"t":{ts},"n":{n}}')
    # The same work in bytes: Nchan relays a body shaped and sized like the
    # change frame Herald delivers for its publish (same fields, same lengths;
    # Herald's ids and times are of fixed length), instead of 30 bytes.
    NCHAN_SAME_BYTES_ARGS=("${NCHAN_ARGS[@]:0:5}"
        --pub-body '{"type":"change","change":{"seq":{n},"op":"upsert","notification":{"id":"n_01KAVQ3ZP5B8M2R6W9X0YB7CEH","appNotificationId":"m{n}","userId":"{user}","payload":{"t":{ts},"n":{n}},"priority":"normal","groupName":null,"displayTimeToLive":null,"targetPlatforms":null,"targetTags":null,"createdAt":"2026-11-24T10:00:00.000Z","updatedAt":"2026-11-24T10:00:00.000Z","expiresAt":"2026-12-24T10:00:00.000Z","readState":"unread","userActionState":"noInteraction","version":1}}}')
}
