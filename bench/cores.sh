#!/usr/bin/env bash
# Scaling with cores (issue 32): each target's saturation on one core
# against two, Herald and Nchan in one run, so the two gains compare.
#
#   bench/cores.sh            # ROUNDS [2] rounds of the four ramps (about 8 min)
#
# Method. Each ramp is run.sh's saturation (1,000 users × 3 devices, RAMP
# [ramp:2500:2500:40000] publishes/s, RAMP_SECONDS [5] s steps, stopping
# at the first step with p99 > 100 ms or a loss) on a fresh server:
# - one core: the server under `taskset -c 0` (Herald `--threads 1`, so one
#   loop and one partition; Nchan one worker), the load generator on core 1;
# - two cores: the server under `taskset -c 0,1` (Herald `--threads 2`: two
#   loops, two partitions; Nchan two workers), the load generator still on
#   core 1, as this machine has no third core to put it apart.
# Nchan publishes bodies of the size of Herald's change frame (run.sh's
# "same bytes"). The gain is two cores' saturation over one core's. On a
# two-core machine the two-core figure is held down by the load generator
# sharing core 1, for both targets alike.
# Writes bench/out/cores-results.md and the ramps' logs beside it.
set -euo pipefail
LOG_TAG=cores
source "$(dirname "$0")/lib.sh"

RAMP=${RAMP:-ramp:2500:2500:40000}
RAMP_SECONDS=${RAMP_SECONDS:-5}
ROUNDS=${ROUNDS:-2}
HERALD_PORT=${HERALD_PORT:-18194}
NCHAN_PORT=${NCHAN_PORT:-18095}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
RESULTS=$OUT/cores-results.md
command -v taskset >/dev/null || { log "taskset is needed (Debian: util-linux)"; exit 1; }

build_loadgen
build_herald
measure_background
nchan_loadgen_args
HERALD_ARGS=()
herald_loadgen_args "" "" "$HERALD_PORT" "$HERALD_PORT"

saturate() { # log pids loadgen-args...: prints the highest deliveries/s held
    local log=$1 pids=$2
    shift 2
    taskset -c 1 "$@" --mode fanout --users 1000 --devices 3 --rate "$RAMP" --duration "$RAMP_SECONDS" \
        --max-p99-ms 100 --user-prefix "c${RUN_ID}$RANDOM" --server-pids "$pids" --pub-conns 128 > "$log" 2>&1 || true
    res "$log" mode=saturation max_dps
}

declare -A SAT
for round in $(seq 1 "$ROUNDS"); do
    for cores in 1 2; do
        cpus=$([ "$cores" = 1 ] && echo 0 || echo 0,1)
        NCHAN_WORKERS=$cores NCHAN_PIN="taskset -c $cpus" start_nchan
        SAT[nchan,$cores,$round]=$(saturate "$OUT/cores-nchan-$cores-$round.log" "$NCHAN_PIDS" "${NCHAN_SAME_BYTES_ARGS[@]}")
        stop_nchan
        log "round $round, $cores core(s): Nchan ${SAT[nchan,$cores,$round]} deliveries/s"
        sleep 2
        HERALD_PIN="taskset -c $cpus" herald_spawn "cores-herald-$cores" "$WORK/herald" "$HERALD_PORT" --store memory --threads "$cores" \
            || { log "herald did not start"; exit 1; }
        pid=$SPAWNED_PID
        SAT[herald,$cores,$round]=$(saturate "$OUT/cores-herald-$cores-$round.log" "$pid" "${HERALD_ARGS[@]}")
        herald_stop "$pid"
        log "round $round, $cores core(s): Herald ${SAT[herald,$cores,$round]} deliveries/s"
        sleep 2
    done
done

gain() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%.2f×", b / a; else print "n/a" }'; }
{
    echo "# Scaling with cores"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), background CPU ${BG_BUSY}% before the run; saturation in deliveries/s (p99 ≤ 100 ms, nothing lost), $RAMP at $RAMP_SECONDS s a step; load generator on core 1."
    echo
    echo "| round | target | one core | two cores | gain from the second core |"
    echo "|---|---|---|---|---|"
    for round in $(seq 1 "$ROUNDS"); do
        for t in herald nchan; do
            echo "| $round | $t | ${SAT[$t,1,$round]:-} | ${SAT[$t,2,$round]:-} | $(gain "${SAT[$t,1,$round]:-0}" "${SAT[$t,2,$round]:-0}") |"
        done
    done
    echo
} > "$RESULTS"
log "results: $RESULTS"
cat "$RESULTS"
