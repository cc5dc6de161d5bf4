#!/usr/bin/env bash
# Herald as several nodes on PostgreSQL + a Redis bus (issue 11): one command,
# every scenario, one results table.
#
#   bench/cluster.sh            # everything, about 12-15 minutes
#   QUICK=1 bench/cluster.sh    # small and short, a smoke test (~3 minutes)
#   SCENARIOS="dismiss big" bench/cluster.sh   # a subset
#
# Writes bench/out/cluster.md (git-ignored) and the raw logs beside it
# (bench/out/cluster-*.log). Starts a throwaway PostgreSQL 15 and Redis on
# loopback (scripts/test-servers, installed with apt if missing) and the
# Herald nodes, and stops all of them by pid when it ends.
# Environment overrides (defaults in brackets):
#   SCENARIOS [dismiss fanout durable spread big]; also dismiss-paths: on one
#     two-node cluster, dismiss within node 1, within node 2, then node 1 to node 2
#   DISMISS_USERS [2000] DISMISS_RATE [1000]   (2 samples per user)
#   DISMISS_DRAIN [2]  s between the seed notifications and the updates
#   SETUPS [sqlite-1node pg-1node pg-2nodes]  which setups dismiss and fanout run
#   FANOUT_USERS [1000] FANOUT_DEVICES [3] FANOUT_RATES [1000,5000] FANOUT_SECONDS [10]
#   DURABLE_RAMP [ramp:1000:1000:12000] DURABLE_CONNS [64 512] RAMP_SECONDS [5]
#     (durable: SQLite; PostgreSQL with its default partitions, one per loop; and with --partitions 1, "pg1p")
#   MAX_P99_MS [100]  (durable: the best step with p99 under it and nothing lost)
#   BIG_NODES [4] BIG_USERS [15000] BIG_DEVICES [4] BIG_RATE [1500,5000] (one step each, all run: the first, 15,000 publishes, gives
#     every user its first change, which each node follows with a catch-up read) BIG_SECONDS [10]
#     (big: every device of user u on node u mod BIG_NODES: 4 x 15,000 connections)
#   SPREAD_USERS [1500] (spread: the same, but device d of every user on node
#     d mod BIG_NODES, so each user's hellos and presence reach every node at once)
#   BIG_CONNS_PER_PROC [8000]  loadgen subscribers per process (one source address each)
#   BIG_DRAIN [20]     s after a step's last publish before what has not arrived counts as lost
#   BASE_PORT [18180]  node i listens on BASE_PORT + i
#   PG_FSYNC [on]      fsync of the throwaway PostgreSQL (scripts/test-servers: off for tests); on,
#                      so PostgreSQL commits are as durable as SQLite's (--durability full)
#   HERALD_BIN [.build/release/herald]  SKIP_HERALD_BUILD=1
#   TABLE_ONLY=1       rewrite cluster.md from the logs of the last run
# Only loopback addresses are used; every step is bounded in time.
set -euo pipefail

LOG_TAG=cluster.sh
source "$(dirname "$0")/lib.sh"
source "$ROOT/scripts/test-servers"

QUICK=${QUICK:-0}
SCENARIOS=${SCENARIOS:-dismiss fanout durable spread big}
DISMISS_USERS=${DISMISS_USERS:-2000}
DISMISS_RATE=${DISMISS_RATE:-1000}
DISMISS_DRAIN=${DISMISS_DRAIN:-2} # s between the seed's last publish and the first update
FANOUT_USERS=${FANOUT_USERS:-1000}
FANOUT_DEVICES=${FANOUT_DEVICES:-3}
FANOUT_RATES=${FANOUT_RATES:-1000,5000}
FANOUT_SECONDS=${FANOUT_SECONDS:-10}
DURABLE_RAMP=${DURABLE_RAMP:-ramp:1000:1000:12000}
DURABLE_CONNS=${DURABLE_CONNS:-64 512}
RAMP_SECONDS=${RAMP_SECONDS:-5}
MAX_P99_MS=${MAX_P99_MS:-100}
BIG_NODES=${BIG_NODES:-4}
BIG_USERS=${BIG_USERS:-15000}
BIG_DEVICES=${BIG_DEVICES:-4}
BIG_RATE=${BIG_RATE:-1500,5000}
BIG_SECONDS=${BIG_SECONDS:-10}
BIG_CONNS_PER_PROC=${BIG_CONNS_PER_PROC:-8000}
BIG_DRAIN=${BIG_DRAIN:-20} # s after a step's last publish before deliveries are counted
SPREAD_USERS=${SPREAD_USERS:-1500}
BASE_PORT=${BASE_PORT:-18180}
PG_FSYNC=${PG_FSYNC:-on}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
if [ "$QUICK" = 1 ]; then
    DISMISS_USERS=500 FANOUT_SECONDS=3 RAMP_SECONDS=2 DURABLE_RAMP=ramp:1000:2000:5000
    BIG_USERS=1500 BIG_SECONDS=3
fi
SETUPS=${SETUPS:-sqlite-1node pg-1node pg-2nodes}
SETTLE=${SETTLE:-3} # pause between scenarios (closed connections, timers)

# ---------------------------------------------------------------- servers
NODE_PIDS=()
BUS_DB=0
start_servers() {
    HERALD_TEST_POSTGRES_FSYNC=$PG_FSYNC start_test_postgres
    start_test_redis
    # test-servers replaced the EXIT trap with its own (stop PostgreSQL and
    # Redis); stop what this script started before that
    herald_on_exit bench_cleanup
    PG_SETTINGS=$(psql -At "$HERALD_TEST_POSTGRES_URL" -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ', fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')")
    REDIS_VERSION=$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')
    log "$PG_SETTINGS; Redis $REDIS_VERSION"
}

# N nodes on ports BASE_PORT+1.. sharing the store (postgres or a fresh sqlite
# file for N=1) and, for postgres, the bus on a Redis channel set of their own
start_nodes() { # name n store(postgres|sqlite) [herald args...]
    local name=$1 n=$2 store=$3 i args
    shift 3
    stop_nodes
    BUS_DB=$((BUS_DB + 1))
    for i in $(seq 1 "$n"); do
        if [ "$store" = sqlite ]; then
            args=(--store "sqlite:$WORK/$name-$i/herald.db")
        else
            args=(--store "$HERALD_TEST_POSTGRES_URL" --bus "$HERALD_TEST_REDIS_URL/$BUS_DB")
        fi
        args+=("$@")
        herald_spawn "$name-n$i" "$WORK/$name-$i" $((BASE_PORT + i)) "${args[@]}" || {
            log "$name: node $i did not start (bench/out/$name-n$i-server.log)"
            return 1
        }
        NODE_PIDS+=("$SPAWNED_PID")
    done
    [ "$store" = sqlite ] && return 0
    for i in $(seq 1 "$n"); do # subscribed to the bus before anything is published
        local t
        for t in $(seq 1 100); do
            curl -sf "http://127.0.0.1:$((BASE_PORT + i))/metrics" | grep -q '^herald_bus_connected 1' && break
            sleep 0.1
        done
    done
}
stop_nodes() {
    local p
    for p in "${NODE_PIDS[@]:-}"; do [ -n "$p" ] && herald_stop "$p"; done
    NODE_PIDS=()
}
node_pids() { local IFS=,; echo "${NODE_PIDS[*]}"; }
# every node's /metrics after a scenario, for where the time went
# (herald_store_latency_seconds: batch begin to commit, on a receiving node the
# empty transaction a bus record waits for; herald_delivery_latency_seconds:
# commit, or arrival from the bus, to the hand-off to the sockets)
scrape_metrics() { # name
    local i
    for i in "${!NODE_PIDS[@]}"; do
        curl -sf "http://127.0.0.1:$((BASE_PORT + i + 1))/metrics" > "$OUT/cluster-$1-metrics-n$((i + 1)).txt" || true
    done
}
ports() { local i; for i in "$@"; do echo $((BASE_PORT + i)); done; }

# ---------------------------------------------------------------- scenarios
# runs a loadgen command line into bench/out/cluster-NAME.log, scraping every
# node's /metrics when a line matching MARKER appears (NAME-pre) and at the
# end; and the CPU time PostgreSQL (all its processes), Redis and the nodes
# used from start to end (a RESULT mode=cpu line)
scraped_run() { # name marker command...
    local name=$1 marker=$2 log=$OUT/cluster-$1.log lg i t0 pg0 rd0 nd0
    shift 2
    t0=$(date +%s.%N) pg0=$(cpu_s $(pg_pids)) rd0=$(cpu_s $(redis_pid)) nd0=$(cpu_s "${NODE_PIDS[@]}")
    "$@" > "$log" 2>&1 &
    lg=$!
    STARTED_PIDS+=("$lg")
    for i in $(seq 1 6000); do
        grep -q -- "$marker" "$log" && break
        kill -0 "$lg" 2>/dev/null || break
        sleep 0.1
    done
    scrape_metrics "$name-pre"
    wait "$lg" || true
    forget_pid "$lg"
    scrape_metrics "$name"
    echo "RESULT mode=cpu wall_s=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}') pg_s=$(echo "$(cpu_s $(pg_pids)) $pg0" | awk '{printf "%.1f", $1 - $2}') redis_s=$(echo "$(cpu_s $(redis_pid)) $rd0" | awk '{printf "%.1f", $1 - $2}') nodes_s=$(echo "$(cpu_s "${NODE_PIDS[@]}") $nd0" | awk '{printf "%.1f", $1 - $2}')" >> "$log"
}
# utime + stime (s) summed over the given pids
cpu_s() {
    local p t=0 hz
    hz=$(getconf CLK_TCK)
    for p in "$@"; do
        t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}' || echo 0)))
    done
    awk -v t="$t" -v hz="$hz" 'BEGIN { printf "%.2f", t / hz }'
}
# the throwaway PostgreSQL's postmaster and its children; the Redis server
pg_pids() {
    local pm
    pm=$(head -1 "$(dirname "$HERALD_TEST_POSTGRES_CTL")/data/postmaster.pid" 2>/dev/null) || return 0
    echo "$pm" $(pgrep -P "$pm")
}
redis_pid() { cat "$(dirname "$HERALD_TEST_REDIS_CTL")/pid" 2>/dev/null || true; }

# dismiss: device 0 of each user on node A sends a WebSocket update; the
# user's devices 1 and 2 on node B receive the change
dismiss() { # name nodeA nodeB
    local name=$1 a b
    a=$(ports "$2") b=$(ports "$3")
    herald_loadgen_args "" "" "$a" "$a" "$b" "$b"
    # the nodes' histograms once the seed notifications are delivered (the
    # updates start right after that line) and at the end: their difference
    # is the updates alone
    scraped_run "$name" '^seed:' "${HERALD_ARGS[@]}" --mode dismiss --users "$DISMISS_USERS" --devices 3 \
        --rate "$DISMISS_RATE" --drain "$DISMISS_DRAIN" --user-prefix "cd${RUN_ID}${name}u" --setup-timeout 60 --max-run 300
    grep -v '^RESULT' "$OUT/cluster-$name.log" | sed "s/^/[$name] /" >&2
}

# the floor under the PostgreSQL setups: one durable transaction shaped like
# an update's batch (pipelined BEGIN, the user's feed row locked and its head
# moved, the notification's row and a change of ~700 bytes written, COMMIT)
# at DISMISS_RATE on the same PostgreSQL, by pgbench, with no Herald, over as
# long as the updates take; p50/p99 of its latency from each transaction's
# scheduled start. Eight connections, so one slow commit does not hold the
# next ones back (Herald's group commit does not either).
pg_floor() {
    local log=$OUT/cluster-dismiss-pg-floor.log secs script
    secs=$(awk -v u="$DISMISS_USERS" -v r="$DISMISS_RATE" 'BEGIN { s = u / r; print (s < 5 ? 5 : int(s + 0.5)) }')
    psql -q "$HERALD_TEST_POSTGRES_URL" <<SQL
DROP TABLE IF EXISTS floor_feeds, floor_notes, floor_changes;
CREATE TABLE floor_feeds (id int PRIMARY KEY, head bigint NOT NULL);
CREATE TABLE floor_notes (id int PRIMARY KEY, read_state text NOT NULL, seq bigint NOT NULL);
CREATE TABLE floor_changes (id int, seq bigint, change text, PRIMARY KEY (id, seq));
INSERT INTO floor_feeds SELECT g, 0 FROM generate_series(1, $DISMISS_USERS) g;
INSERT INTO floor_notes SELECT g, 'unread', 0 FROM generate_series(1, $DISMISS_USERS) g;
SQL
    script=$WORK/pg-floor.sql
    cat > "$script" <<SQL
\\set u random(1, $DISMISS_USERS)
\\startpipeline
BEGIN;
UPDATE floor_feeds SET head = head + 1 WHERE id = :u;
UPDATE floor_notes SET read_state = 'read', seq = (SELECT head FROM floor_feeds WHERE id = :u) WHERE id = :u;
INSERT INTO floor_changes SELECT :u, head, repeat('x', 700) FROM floor_feeds WHERE id = :u;
COMMIT;
\\endpipeline
SQL
    rm -f "$WORK"/pg-floor-log*
    "$herald_pg_bin/pgbench" -n -M prepared -f "$script" -R "$DISMISS_RATE" -T "$secs" -c 8 -j 1 \
        -l --log-prefix="$WORK/pg-floor-log" "$HERALD_TEST_POSTGRES_URL" > "$log" 2>&1 || true
    # per transaction: client, count, latency (us), ...
    cat "$WORK"/pg-floor-log* 2>/dev/null | awk '{ print $3 }' | sort -n | awk '{ a[NR] = $1 }
        END { if (NR) printf "RESULT mode=pgfloor samples=%d p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f\n",
              NR, a[int(NR * .5) + 1] / 1000, a[int(NR * .99) + 1] / 1000, a[int(NR * .999) + 1] / 1000, a[NR] / 1000 }' >> "$log"
    psql -q "$HERALD_TEST_POSTGRES_URL" -c "DROP TABLE floor_feeds, floor_notes, floor_changes"
    grep '^RESULT' "$log" | sed "s/^/[pg-floor] /" >&2
}

# publish-to-delivery: publishes on node P, FANOUT_USERS x FANOUT_DEVICES on
# node S, one step per rate of FANOUT_RATES
fanout() { # name nodeP nodeS
    local name=$1 p s
    p=$(ports "$2") s=$(ports "$3")
    herald_loadgen_args "" "" "$p" "$s"
    scraped_run "$name" '^setup:' "${HERALD_ARGS[@]}" --mode fanout --users "$FANOUT_USERS" --devices "$FANOUT_DEVICES" \
        --rate "$FANOUT_RATES" --duration "$FANOUT_SECONDS" --max-p99-ms 1e9 --pub-conns 64 \
        --user-prefix "cf${RUN_ID}${name}u" --server-pids "$(node_pids)" --setup-timeout 60 --max-run 600
    grep -v '^RESULT' "$OUT/cluster-$name.log" | sed "s/^/[$name] /" >&2
}

# durable publishes: acknowledged (committed) publishes/s, one device per
# user, CONNS keep-alive publisher connections, DURABLE_RAMP
durable() { # name conns
    local name=$1 p
    p=$(ports 1)
    herald_loadgen_args "" "" "$p" "$p"
    scraped_run "$name" '^setup:' "${HERALD_ARGS[@]}" --mode fanout --users "$FANOUT_USERS" --devices 1 \
        --rate "$DURABLE_RAMP" --duration "$RAMP_SECONDS" --max-p99-ms "$MAX_P99_MS" --pub-conns "$2" \
        --user-prefix "cu${RUN_ID}${name}u" --server-pids "$(node_pids)" --setup-timeout 60 --max-run 900
    grep -E '^(step|saturation|  stopping)' "$OUT/cluster-$name.log" | sed "s/^/[$name] /" >&2
}

# the big one: BIG_NODES nodes, publishes spread over all of them (by
# publisher connection, as behind a load balancer); placement "user": all
# devices of user u on node u mod BIG_NODES, "connection": device d of every
# user on node d mod BIG_NODES; RSS of all nodes before and once every device
# is ready, CPU over the step
big() { # name users placement
    local name=$1 i subs=()
    for i in $(seq 1 "$BIG_NODES"); do subs+=($(ports "$i")); done
    herald_loadgen_args "" "" "${subs[*]}" "${subs[@]}"
    scraped_run "$name" '^setup:' "${HERALD_ARGS[@]}" --mode fanout --users "$2" --devices "$BIG_DEVICES" --url-by "$3" \
        --rate "$BIG_RATE" --keep-going --duration "$BIG_SECONDS" --drain "$BIG_DRAIN" --max-p99-ms 1e9 --pub-conns 64 \
        --conns-per-proc "$BIG_CONNS_PER_PROC" --connect-concurrency 100 --user-prefix "cb${RUN_ID}${name}u" \
        --server-pids "$(node_pids)" --setup-timeout 300 --max-run 900
    grep -v '^RESULT' "$OUT/cluster-$name.log" | sed "s/^/[$name] /" >&2
    for i in "${!NODE_PIDS[@]}"; do # what each process held at the end
        echo "RESULT mode=node node=$((i + 1)) pid=${NODE_PIDS[$i]} rss_kib=$(rss_kib "${NODE_PIDS[$i]}") fds=$(ls "/proc/${NODE_PIDS[$i]}/fd" 2>/dev/null | wc -l)" >> "$OUT/cluster-$name.log"
    done
}

big_table() { # name placement
    local F=$OUT/cluster-$1.log ready b0 b1 cpu
    if [ -f "$F" ]; then
        ready=$(res "$F" phase=setup ready)
        b0=$(res "$F" phase=setup rss_before_kib) b1=$(res "$F" phase=setup rss_ready_kib)
        echo
        echo "$1: $BIG_NODES nodes, $(res "$F" phase=setup conns) connections, $BIG_DEVICES devices per user ($2), publishes spread over the nodes at $BIG_RATE/s for $BIG_SECONDS s:"
        echo
        echo "| metric | value |"
        echo "|---|---|"
        echo "| WebSocket connections ready / expected | $(na "$ready") / $(na "$(res "$F" phase=setup conns)") (failed $(na "$(res "$F" phase=setup failed)")) |"
        echo "| setup (s, connections/s) | $(na "$(res "$F" phase=setup setup_s)"), $(na "$(res "$F" phase=setup setup_rate)") |"
        [ -n "$b1" ] && [ "${ready:-0}" -gt 0 ] && echo "| nodes' RSS before → all ready (KiB); per connection (bytes) | $b0 → $b1; $(( (b1 - b0) * 1024 / ready )) |"
        echo "| server CPU while connecting (s, all nodes) | $(na "$(res "$F" phase=setup server_cpu_s)") |"
        local st r
        for st in 0 1 2 3; do
            r=$(res "$F" "step=$st " target_rate)
            [ -n "$r" ] || continue
            cpu=$(res "$F" "step=$st " server_cpu_s)
            echo "| fan-out at $r/s: published ok / failed / unsent | $(na "$(res "$F" "step=$st " published)") / $(na "$(res "$F" "step=$st " pub_errors)") / $(na "$(res "$F" "step=$st " unsent)") |"
            echo "| fan-out at $r/s: deliveries / expected; lost; duplicates | $(na "$(res "$F" "step=$st " delivered)") / $(na "$(res "$F" "step=$st " expected)"); $(na "$(res "$F" "step=$st " lost)"); $(na "$(res "$F" "step=$st " dup)") |"
            echo "| fan-out at $r/s: deliveries/s; p50 / p99 / max (ms) | $(na "$(res "$F" "step=$st " dps)"); $(na "$(res "$F" "step=$st " p50_ms)") / $(na "$(res "$F" "step=$st " p99_ms)") / $(na "$(res "$F" "step=$st " max_ms)") |"
            [ -n "$cpu" ] && echo "| fan-out at $r/s: server CPU, all nodes (s over the step + drain; cores) | $cpu; $(awk -v c="$cpu" -v s="$BIG_SECONDS" -v d="$BIG_DRAIN" 'BEGIN { printf "%.2f", c / (s + d) }') |"
        done
        echo "| CPU over the whole run ($(na "$(res "$F" mode=cpu wall_s)") s: setup, steps, drains): nodes / PostgreSQL / Redis (s) | $(na "$(res "$F" mode=cpu nodes_s)") / $(na "$(res "$F" mode=cpu pg_s)") / $(na "$(res "$F" mode=cpu redis_s)") |"
        local n
        for n in $(seq 1 "$BIG_NODES"); do
            [ -f "$OUT/cluster-$1-metrics-n$n.txt" ] || continue
            echo "| node $n: bus catch-ups; feed-audit catch-ups; store time per publish (ms) | $(awk '$1 == "herald_bus_catchups_total" {print $2}' "$OUT/cluster-$1-metrics-n$n.txt"); $(na "$(awk '$1 == "herald_bus_missed_total" {print $2}' "$OUT/cluster-$1-metrics-n$n.txt")"); $(na "$(store_ms_per_publish "$1" "n$n")") |"
        done
        grep '^RESULT mode=node' "$F" | while read -r line; do
            echo "| node $(echo "$line" | tr ' ' '\n' | awk -F= '$1=="node" {print $2}') after the run (connections closed): RSS KiB, open files | $(echo "$line" | tr ' ' '\n' | awk -F= '$1=="rss_kib" {r=$2} $1=="fds" {f=$2} END {print r ", " f}') |"
        done
    fi
}

# a scenario on one SQLite node, one PostgreSQL + Redis node, then across two
# of those (node 1 to node 2)
three_setups() { # scenario (the setups of SETUPS)
    if [[ " $SETUPS " == *" sqlite-1node "* ]]; then
        start_nodes sq 1 sqlite && "$1" "$1-sqlite-1node" 1 1
        sleep "$SETTLE"
    fi
    if [[ " $SETUPS " == *" pg-1node "* ]]; then
        start_nodes pg1 1 postgres && "$1" "$1-pg-1node" 1 1
        sleep "$SETTLE"
    fi
    if [[ " $SETUPS " == *" pg-2nodes "* ]]; then
        start_nodes pg2 2 postgres && "$1" "$1-pg-2nodes" 1 2
        sleep "$SETTLE"
    fi
}

want() { [[ " $SCENARIOS " == *" $1 "* ]]; }

# ---------------------------------------------------------------- run
if [ "${TABLE_ONLY:-0}" != 1 ]; then
    rm -f "$OUT"/cluster-*.log "$OUT"/cluster-*-metrics-n*.txt
    measure_background
    build_loadgen
    build_herald
    [ -x "$HERALD_BIN" ] || { log "no Herald binary at $HERALD_BIN"; exit 1; }
    start_servers
    # raise the loadgen's and nodes' open-file limits to the hard limit
    ulimit -n "$(ulimit -Hn)"
    if want dismiss; then
        log "=== cross-node dismiss ==="
        three_setups dismiss
        if [[ " $SETUPS " == *" pg-"* ]]; then pg_floor; fi
    fi
    if want dismiss-paths; then
        # one two-node cluster, fresh users each time: is it the bus hop, or
        # being in a cluster at all?
        log "=== dismiss on one two-node cluster: on node 1, on node 2, node 1 to node 2 ==="
        if start_nodes pgp 2 postgres; then
            dismiss dismiss-paths-1to1 1 1
            dismiss dismiss-paths-2to2 2 2
            dismiss dismiss-paths-1to2 1 2
        fi
        sleep "$SETTLE"
    fi
    if want fanout; then
        log "=== publish-to-delivery, one node vs two ==="
        three_setups fanout
    fi
    if want durable; then
        log "=== durable publishes/s ==="
        for c in $DURABLE_CONNS; do
            start_nodes sq 1 sqlite && durable "durable-sqlite-$c" "$c"
            sleep "$SETTLE"
            start_nodes pg1 1 postgres && durable "durable-pg-$c" "$c"
            sleep "$SETTLE"
            # one partition, one writing session: what the partitions' sessions add
            start_nodes pg1p 1 postgres --partitions 1 && durable "durable-pg1p-$c" "$c"
            sleep "$SETTLE"
        done
    fi
    if want spread; then
        log "=== $BIG_NODES nodes, each user's devices spread over them: $SPREAD_USERS x $BIG_DEVICES ==="
        start_nodes spread "$BIG_NODES" postgres && big spread "$SPREAD_USERS" connection
        sleep "$SETTLE"
    fi
    if want big; then
        log "=== $BIG_NODES nodes x $((BIG_USERS * BIG_DEVICES / BIG_NODES)) connections ==="
        start_nodes big "$BIG_NODES" postgres && big big "$BIG_USERS" user
    fi
    stop_nodes
    LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "RESULT mode=run bg_busy=$BG_BUSY load_start=${LOAD_START// /,} load_end=${LOAD_END// /,} redis=$REDIS_VERSION" > "$OUT/cluster-run.log"
    echo "$PG_SETTINGS" > "$OUT/cluster-pg.log"
fi

# ---------------------------------------------------------------- table
R=$OUT/cluster-run.log
v() { res "$OUT/cluster-$1.log" "$2" "$3"; }
# the upper bound (ms) of the histogram bucket holding quantile q of a
# Prometheus histogram in a scraped /metrics file
# Prometheus histogram in a scraped /metrics file, less the counts of an
# earlier scrape of the same node
hist_ms() { # file earlier-file metric q
    [ -f "$1" ] && [ -f "$2" ] || return 0
    awk -v m="$3_bucket" -v q="$4" 'index($0, m "{") == 1 {
            split($0, a, "\""); if (FILENAME == ARGV[1]) { le[n] = a[2]; c[n] = $NF; n++ } else { c0[k++] = $NF }
        }
        END { if (!n) exit
              for (i = 0; i < n; i++) c[i] -= c0[i]
              if (c[n - 1] <= 0) exit
              for (i = 0; i < n; i++) if (c[i] >= q * c[n - 1]) { print (le[i] == "+Inf" ? "inf" : le[i] * 1000); exit } }' "$1" "$2"
}
# a node's store time (BEGIN to COMMIT, summed) per publish after the
# subscribers were ready, in ms: how much of the engine thread each publish
# costs in the store
store_ms_per_publish() { # log-name [node: n1]
    local a=$OUT/cluster-$1-metrics-${2:-n1}.txt b=$OUT/cluster-$1-pre-metrics-${2:-n1}.txt
    [ -f "$a" ] && [ -f "$b" ] || return 0
    awk '$1 == "herald_store_latency_seconds_sum" { s[FILENAME] = $2 } $1 == "herald_publishes_total" { p[FILENAME] = $2 }
         END { n = p[ARGV[1]] - p[ARGV[2]]; if (n > 0) printf "%.3f", 1000 * (s[ARGV[1]] - s[ARGV[2]]) / n }' "$a" "$b"
}
hist_pair() { # prefix node metric: "≤p50 / ≤p99" in ms over the updates
    echo "≤$(na "$(hist_ms "$1-metrics-$2.txt" "$1-pre-metrics-$2.txt" "$3" .5)") / ≤$(na "$(hist_ms "$1-metrics-$2.txt" "$1-pre-metrics-$2.txt" "$3" .99)")"
}
na() { echo "${1:-—}"; }
step_row() { # label log step
    local f=$OUT/cluster-$2.log
    printf '| %s | %s | %s | %s | %s | %s | %s / %s | %s |\n' "$1" \
        "$(na "$(res "$f" "step=$3 " target_rate)")" "$(na "$(res "$f" "step=$3 " pub_rate)")" "$(na "$(res "$f" "step=$3 " p50_ms)")" \
        "$(na "$(res "$f" "step=$3 " p99_ms)")" "$(na "$(res "$f" "step=$3 " max_ms)")" \
        "$(na "$(res "$f" "step=$3 " lost)")" "$(na "$(res "$f" "step=$3 " dup)")" \
        "$(na "$(res "$f" "step=$3 " cpu_s_per_m)")"
}
{
    echo "# Herald cluster (PostgreSQL + Redis)"
    echo
    echo "Run $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr);"
    echo "commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'); $(cat "$OUT/cluster-pg.log" 2>/dev/null); Redis $(res "$R" mode=run redis)."
    echo "Background CPU use before the run: $(res "$R" mode=run bg_busy)%; load average (1, 5, 15 min)"
    echo "$(res "$R" mode=run load_start | tr , ' ') at the start, $(res "$R" mode=run load_end | tr , ' ') at the end."
    echo
    echo "Cross-node dismiss ($DISMISS_USERS users x 3 devices, device 0 sends a WebSocket update at $DISMISS_RATE/s; devices 1 and 2 receive the change):"
    echo
    echo "| setup | samples | p50 ms | p99 ms | p99.9 ms | max ms | missing |"
    echo "|---|---|---|---|---|---|---|"
    for k in sqlite-1node pg-1node pg-2nodes paths-1to1 paths-2to2 paths-1to2; do
        [ -f "$OUT/cluster-dismiss-$k.log" ] || continue
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$k" "$(na "$(v "dismiss-$k" mode=dismiss received)")" \
            "$(na "$(v "dismiss-$k" mode=dismiss p50_ms)")" "$(na "$(v "dismiss-$k" mode=dismiss p99_ms)")" \
            "$(na "$(v "dismiss-$k" mode=dismiss p999_ms)")" "$(na "$(v "dismiss-$k" mode=dismiss max_ms)")" \
            "$(na "$(v "dismiss-$k" mode=dismiss missing)")"
    done
    if [ -f "$OUT/cluster-dismiss-pg-floor.log" ]; then
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "PostgreSQL alone: one such transaction per update (pgbench, no Herald)" \
            "$(na "$(v dismiss-pg-floor mode=pgfloor samples)")" "$(na "$(v dismiss-pg-floor mode=pgfloor p50_ms)")" \
            "$(na "$(v dismiss-pg-floor mode=pgfloor p99_ms)")" "$(na "$(v dismiss-pg-floor mode=pgfloor p999_ms)")" \
            "$(na "$(v dismiss-pg-floor mode=pgfloor max_ms)")" "—"
    fi
    echo
    echo "Where the time goes (each node's own histograms over the updates alone, bucket bounds in ms, p50 / p99): store batch"
    echo "= BEGIN to COMMIT of an engine batch (node 1: the update's commit; node 2: the empty transaction"
    echo "a record from the bus waits for before delivery); hand-off = commit (node 1) or arrival from"
    echo "the bus (node 2) to the followers' sockets."
    echo
    echo "| setup | node 1 store batch | node 1 hand-off | node 2 store batch | node 2 hand-off | node 2 bus catch-ups (whole run) |"
    echo "|---|---|---|---|---|---|"
    for k in pg-1node pg-2nodes; do
        m=$OUT/cluster-dismiss-$k
        printf '| %s | %s | %s | %s | %s | %s |\n' "$k" "$(hist_pair "$m" n1 herald_store_latency_seconds)" \
            "$(hist_pair "$m" n1 herald_delivery_latency_seconds)" "$(hist_pair "$m" n2 herald_store_latency_seconds)" \
            "$(hist_pair "$m" n2 herald_delivery_latency_seconds)" \
            "$(na "$(awk '$1 == "herald_bus_catchups_total" {print $2}' "$m-metrics-n2.txt" 2>/dev/null)")"
    done
    echo
    echo "Publish-to-delivery ($FANOUT_USERS users x $FANOUT_DEVICES devices, publishes on node 1, $FANOUT_SECONDS s per rate):"
    echo
    echo "| setup | publishes/s | achieved | p50 ms | p99 ms | max ms | lost / dup | server CPU s per million deliveries |"
    echo "|---|---|---|---|---|---|---|---|"
    for k in sqlite-1node pg-1node pg-2nodes; do
        for s in 0 1 2 3; do
            [ -n "$(v "fanout-$k" "step=$s " target_rate)" ] && step_row "$k" "fanout-$k" "$s"
        done
    done
    echo
    echo "Node 1's store time per publish (BEGIN to COMMIT summed over its batches, divided by its publishes, ms):"
    echo "fan-out $(for k in sqlite-1node pg-1node pg-2nodes; do printf '%s %s; ' "$k" "$(na "$(store_ms_per_publish "fanout-$k")")"; done)"
    echo "durable $(for c in $DURABLE_CONNS; do for st in sqlite pg pg1p; do printf '%s-%s %s; ' "$st" "$c" "$(na "$(store_ms_per_publish "durable-$st-$c")")"; done; done)"
    echo
    echo "CPU seconds over each whole run (setup, steps, drains), nodes / PostgreSQL / Redis:"
    echo "$(for k in fanout-sqlite-1node fanout-pg-1node fanout-pg-2nodes; do printf '%s %s / %s / %s (%s s); ' "$k" "$(na "$(v "$k" mode=cpu nodes_s)")" "$(na "$(v "$k" mode=cpu pg_s)")" "$(na "$(v "$k" mode=cpu redis_s)")" "$(na "$(v "$k" mode=cpu wall_s)")"; done)"
    echo
    echo "Durable publishes ($DURABLE_RAMP, $RAMP_SECONDS s steps, 1 device per user): best step with p99 ≤ $MAX_P99_MS ms and nothing lost:"
    echo
    echo "| store | publisher connections | acknowledged publishes/s | p99 ms at that step |"
    echo "|---|---|---|---|"
    for c in $DURABLE_CONNS; do
        for st in sqlite pg pg1p; do
            f=$OUT/cluster-durable-$st-$c.log
            at=$(res "$f" mode=saturation at_rate)
            printf '| %s | %s | %s | %s |\n' "$st" "$c" "$(na "$at")" "$(na "$( [ -n "$at" ] && grep "^RESULT mode=fanout .*target_rate=$at " "$f" | tail -1 | tr ' ' '\n' | awk -F= '$1=="p99_ms" {print $2}')")"
        done
    done
    big_table big "every device of user u on node u mod $BIG_NODES"
    big_table spread "device d of every user on node d mod $BIG_NODES"
    echo
    echo "Raw logs: bench/out/cluster-*.log. Method: bench/README.md (Cluster)."
} > "$OUT/cluster.md"
log "wrote $OUT/cluster.md"
cat "$OUT/cluster.md"
