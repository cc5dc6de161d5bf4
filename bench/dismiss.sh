#!/usr/bin/env bash
# Dismiss latency (issue 5's target: p99 < 2 ms) on a fresh server per round,
# alone: run.sh measures it on the server its saturation ramp just loaded.
# 1,000 users × 3 devices, 1,000 dismisses at 2,000/s, the latency from the
# dismiss on device 0 to the change on the other two. With OTHER, that build
# runs beside this one, the order turned every round, so drift favours neither.
#
#   bench/dismiss.sh                                  # the release build, ROUNDS [6]
#   OTHER=/path/to/older/herald SKIP_HERALD_BUILD=1 bench/dismiss.sh
#
# Writes bench/out/dismiss.md.
set -euo pipefail
LOG_TAG=dismiss
source "$(dirname "$0")/lib.sh"

ROUNDS=${ROUNDS:-6}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
PORT=${PORT:-18099}
make -s -C "$BENCH" >&2
build_herald
herald_loadgen_args "" "" "$PORT" "$PORT"

one() { # round bin
    local HERALD_BIN=$2   # herald_spawn starts $HERALD_BIN (dynamic scope)
    herald_spawn dismiss "$WORK/dismiss" "$PORT" --store memory >&2
    local pid=$SPAWNED_PID
    "${HERALD_ARGS[@]}" --mode dismiss --users 1000 --devices 3 --rate 2000 --user-prefix "r$1u" > "$OUT/dismiss.log" 2>&1 || true
    herald_stop "$pid"
    forget_pid "$pid"
    echo "| $1 | $2 | $(grep '^RESULT mode=dismiss sent' "$OUT/dismiss.log" | grep -o 'p50_ms=[^ ]*\|p99_ms=[^ ]*\|max_ms=[^ ]*' | cut -d= -f2 | paste -sd'|' | sed 's/|/ | /g') |"
}

{
    echo "# Dismiss latency on fresh servers"
    echo
    echo "$(date -u +%FT%TZ), commit $(git -C "$ROOT" rev-parse --short HEAD)."
    echo
    echo "| round | binary | p50 ms | p99 ms | max ms |"
    echo "|---|---|---|---|---|"
    for round in $(seq 1 "$ROUNDS"); do
        if [ -z "${OTHER:-}" ]; then one "$round" "$HERALD_BIN"
        elif [ $((round % 2)) = 1 ]; then one "$round" "$HERALD_BIN"; one "$round" "$OTHER"
        else one "$round" "$OTHER"; one "$round" "$HERALD_BIN"; fi
    done
} > "$OUT/dismiss.md"
cat "$OUT/dismiss.md"
