#!/usr/bin/env bash
# Durable publishes on SQLite (issue 32), and what this disk allows.
#
#   bench/durable.sh        # about 6 minutes
#
# 1. The disk: `dd` writing 8 KiB blocks with O_DSYNC (one sync per write)
#    and 1 GiB in 1 MiB blocks (then one fdatasync), and PostgreSQL's
#    `pg_test_fsync` (8 KiB writes, each followed by fdatasync), in the
#    folder the database lives in; and bench/fsync_probe (16 KiB writes,
#    each followed by fdatasync, PROBE_SECONDS [8] each): appended to a
#    growing file and overwriting a written one, p50/p99/p99.9/max.
# 2. Herald on `--store sqlite:` for each of SETUPS [full:1 full:2 normal:1
#    normal:2] (durability:partitions; at full every answer waits for the
#    log's fsync; a partition is a file), one device per user, 512
#    publisher connections:
#    - run.sh's durable ramp (DURABLE_RAMP [ramp:2000:2000:30000], 5 s a
#      step): the most acknowledged publishes/s with p99 ≤ 100 ms;
#    - a steady RATE [4000] publishes/s for 10 s under `perf stat`: the
#      log syncs (fdatasync), the bytes the process wrote (/proc/PID/io
#      write_bytes) and the engine thread's CPU, per publish. Each bounds
#      the rate: syncs by pg_test_fsync's, bytes by dd's MB/s, an engine
#      by one core.
# Writes bench/out/durable-results.md and the logs beside it.
set -euo pipefail
LOG_TAG=durable
source "$(dirname "$0")/lib.sh"

DURABLE_RAMP=${DURABLE_RAMP:-ramp:2000:2000:30000}
RATE=${RATE:-4000}
# durability:partitions, each run on a fresh store, one after another.
SETUPS=${SETUPS:-full:1 full:2 normal:1 normal:2}
PROBE_SECONDS=${PROBE_SECONDS:-8}
PORT=${PORT:-18196}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
RESULTS=$OUT/durable-results.md
PG_TEST_FSYNC=$(ls /usr/lib/postgresql/*/bin/pg_test_fsync 2>/dev/null | tail -1 || true)
command -v perf >/dev/null || { log "perf is needed (Debian: linux-perf)"; exit 1; }

build_loadgen
make -s -C "$BENCH" fsync_probe
build_herald
measure_background

# ---- the disk
dd_out=$(dd if=/dev/zero of="$WORK/dd.bin" bs=8k count=2000 oflag=dsync 2>&1 | tail -1)
dd_secs=$(echo "$dd_out" | awk -F', ' '{print $3}' | awk '{print $1}')
dd_syncs=$(awk -v s="$dd_secs" 'BEGIN { printf "%.0f", 2000 / s }')
dd_mbs=$(dd if=/dev/zero of="$WORK/dd.bin" bs=1M count=1024 conv=fdatasync 2>&1 | tail -1 | awk -F', ' '{print $4}')
rm -f "$WORK/dd.bin"
pgtf=""
if [ -n "$PG_TEST_FSYNC" ]; then
    "$PG_TEST_FSYNC" -s 3 -f "$WORK/pgtf.bin" > "$OUT/durable-pg_test_fsync.log" 2>&1 || true
    # "fdatasync   NNNN.NNN ops/sec" under "one 8kB write"
    pgtf=$(awk '/Compare file sync methods using one 8kB write/ {on=1} on && $1 == "fdatasync" {print int($2); exit}' "$OUT/durable-pg_test_fsync.log")
fi
"$BENCH/fsync_probe" -s "$PROBE_SECONDS" "$WORK" > "$OUT/durable-fsync_probe.log"
log "disk: $(grep '^RESULT' "$OUT/durable-fsync_probe.log" | tr '\n' ' ')"
log "disk: dd 8 KiB O_DSYNC writes $dd_syncs/s, 1 MiB blocks $dd_mbs; pg_test_fsync fdatasync ${pgtf:-n/a} ops/s"

HERALD_ARGS=()
herald_loadgen_args "" "" "$PORT" "$PORT"

# ---- each setup: the ramp, then the steady step, counted
ramp_rows="" steady_rows=""
per() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "n/a" }'; }
for setup in $SETUPS; do
    durability=${setup%%:*} parts=${setup##*:}
    db="$WORK/db-$durability-$parts"
    args=(--store "sqlite:$db/herald.db" --durability "$durability" --partitions "$parts")
    rm -rf "$db"; mkdir -p "$db"
    herald_spawn "durable-ramp-$durability-$parts" "$WORK/herald" "$PORT" "${args[@]}" || { log "herald did not start"; exit 1; }
    pid=$SPAWNED_PID
    "${HERALD_ARGS[@]}" --mode fanout --users 1000 --devices 1 --rate "$DURABLE_RAMP" --duration 5 --max-p99-ms 100 \
        --user-prefix "r${RUN_ID}u" --server-pids "$pid" --pub-conns 512 > "$OUT/durable-ramp-$durability-$parts.log" 2>&1 || true
    herald_stop "$pid"
    ramp_max=$(res "$OUT/durable-ramp-$durability-$parts.log" mode=saturation at_rate)
    rm -rf "$db"; mkdir -p "$db"  # the steady step on a fresh store too

    herald_spawn "durable-steady-$durability-$parts" "$WORK/herald" "$PORT" "${args[@]}" || { log "herald did not start"; exit 1; }
    pid=$SPAWNED_PID
    count_around "$pid" "$WORK/count-around"
    "${HERALD_ARGS[@]}" --mode fanout --users 1000 --devices 1 --rate "$RATE" --duration 10 \
        --user-prefix "s${RUN_ID}u" --server-pids "$pid" --pub-conns 512 --around-steps "$WORK/count-around" > "$OUT/durable-steady-$durability-$parts.log" 2>&1 || true
    herald_stop "$pid"
    published=$(res "$OUT/durable-steady-$durability-$parts.log" step=0 published)
    p99=$(res "$OUT/durable-steady-$durability-$parts.log" step=0 p99_ms)
    syncs=$(perf_syncs "$WORK/count-around")
    engine_ms=$(perf_cpu_ms "$WORK/count-around" herald-engine)
    bytes=$(counted "$WORK/count-around" write_bytes process)
    ramp_rows+="| $durability | $parts | ${ramp_max:-n/a} |"$'\n'
    steady_rows+="| $durability | $parts | ${published:-n/a} | ${p99:-n/a} | $(per "$syncs" 10) | $(per "${published:-0}" "$syncs") | $(per "$bytes" "${published:-0}") | $(per "$(awk -v m="$engine_ms" 'BEGIN { print m * 1000 }')" "${published:-0}") |"$'\n'
    log "$setup: ramp ${ramp_max:-n/a}/s; steady ${published:-n/a} at p99 ${p99:-n/a} ms"
done

{
    echo "# Durable publishes on SQLite"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), background CPU ${BG_BUSY}% before the run, database in $WORK."
    echo
    echo "| figure | value |"
    echo "|---|---|"
    echo "| disk: 8 KiB writes with O_DSYNC (\`dd\`) | $dd_syncs/s |"
    echo "| disk: 8 KiB write + fdatasync (\`pg_test_fsync\`) | ${pgtf:-n/a}/s |"
    echo "| disk: 1 GiB in 1 MiB blocks, then fdatasync (\`dd\`) | $dd_mbs |"
    probe_rows "$OUT/durable-fsync_probe.log"
    echo
    echo "Acknowledged publishes/s with p99 ≤ 100 ms ($DURABLE_RAMP, 5 s steps), each setup on a fresh store:"
    echo
    echo "| durability | partitions (files) | publishes/s |"
    echo "|---|---|---|"
    printf '%s' "$ramp_rows"
    echo
    echo "A steady $RATE/s for 10 s, counted:"
    echo
    echo "| durability | partitions | publishes | publish-to-delivery p99 (ms) | log syncs/s | publishes a sync | bytes written a publish | engine threads' CPU a publish (µs) |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s' "$steady_rows"
    echo
} > "$RESULTS"
log "results: $RESULTS"
cat "$RESULTS"
