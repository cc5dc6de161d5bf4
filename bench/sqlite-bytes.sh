#!/usr/bin/env bash
# Bytes a durable publish writes to the SQLite store, with realistic data,
# beside the disk's floor (issue 43).
#
#   bench/sqlite-bytes.sh                       # about 4 minutes a page size
#   PAGE_SIZES="4096 16384" RATES="1000 4000" bench/sqlite-bytes.sh
#
# 1. The disk: bench/fsync_probe (16 KiB writes, each followed by fdatasync,
#    appended and overwriting, PROBE_SECONDS [8] each).
# 2. For each of PAGE_SIZES [4096]: a fresh file made with that page size,
#    seeded at --durability off through app-wide sends: PER_USER [1000]
#    notifications to each of USERS [1000] users, every BIG_EVERY [50]th
#    with a 64 KiB payload.
# 3. For each of RATES [1000 3000] publishes/s (the rate sets a group commit's
#    size: what arrives during a commit and its sync): a copy of the seeded
#    file served at full durability (the default), publishes from 512
#    connections round robin over the seeded users (one device each) for
#    STEP_SECONDS [10], counted per publish:
#    - log bytes and pages: the engine thread's bytes written (`wchar`) and
#      write calls / 2 (a log frame is a header and a page; the engine
#      writes only the log, but for the last pages of a pass it copies);
#    - checkpoint bytes: `herald-checkpt`'s, copying the log into the file;
#    - dirtied: the process's `write_bytes`, what it dirtied in the page
#      cache; counted a folio at a time, so on a kernel with large folios
#      (Linux 6.18 here) it overstates what a small write dirties;
#    - syncs, and publishes per sync (perf).
# HERALD_BIN runs another build (a scratch schema). Writes
# bench/out/sqlite-bytes.md and the logs beside it.
set -euo pipefail
LOG_TAG=sqlite-bytes
source "$(dirname "$0")/lib.sh"

USERS=${USERS:-1000}
PER_USER=${PER_USER:-1000}
BIG_EVERY=${BIG_EVERY:-50}
PAGE_SIZES=${PAGE_SIZES:-4096}
RATES=${RATES:-"1000 3000"}
STEP_SECONDS=${STEP_SECONDS:-10}
PROBE_SECONDS=${PROBE_SECONDS:-8}
PORT=${PORT:-18197}
HERALD_BIN=${HERALD_BIN:-$ROOT/.build/release/herald}
HERALD_LIMITS='{"publishesPerSecondPerApp":1000000}'
RESULTS=$OUT/sqlite-bytes.md
command -v perf >/dev/null || { log "perf is needed (Debian: linux-perf)"; exit 1; }

build_loadgen
make -s -C "$BENCH" fsync_probe
build_herald
measure_background
"$BENCH/fsync_probe" -s "$PROBE_SECONDS" "$WORK" > "$OUT/sqlite-bytes-fsync_probe.log"

# Seeds port $1 and waits until the gateway has stored every notification.
seed() {
    python3 - "$1" "$USERS" "$PER_USER" "$BIG_EVERY" <<'EOF'
import http.client, json, sys, time
from concurrent.futures import ThreadPoolExecutor
port, users, per_user, big_every = map(int, sys.argv[1:])
chunks = [[f"u{u}" for u in range(i, min(i + 1000, users))] for i in range(0, users, 1000)]
big = "x" * (64 * 1024 - 100)
def send(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for chunk in chunks:
        body = json.dumps({"userIds": chunk, "appNotificationId": f"s{i}",
                           "payload": {"i": i, "b": big if i % big_every == 0 else ""}})
        c.request("POST", "/v1/apps/bench/notifications", body, {"Authorization": "Bearer bench-key"})
        r = c.getresponse(); r.read()
        assert r.status == 202, r.status
    c.close()
with ThreadPoolExecutor(4) as pool:
    list(pool.map(send, range(per_user)))
while True:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics"); m = c.getresponse().read().decode()
    done = next(int(l.split()[1]) for l in m.splitlines() if l.startswith("herald_publishes_total "))
    if done >= users * per_user: break
    time.sleep(1)
EOF
}

HERALD_ARGS=()
herald_loadgen_args "" "" "$PORT" "$PORT"
per() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "n/a" }'; }
rows=()
for page in $PAGE_SIZES; do
    db=$WORK/seed-$page.db
    python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('PRAGMA page_size = ' + sys.argv[2]); c.execute('PRAGMA journal_mode = WAL'); c.close()" "$db" "$page"
    herald_spawn "sqlite-bytes-seed-$page" "$WORK/seed" "$PORT" --store "sqlite:$db" --durability off || { log "herald did not start"; exit 1; }
    t0=$(date +%s)
    seed "$PORT"
    herald_stop "$SPAWNED_PID"
    log "page size $page: seeded $((USERS * PER_USER)) notifications in $(( $(date +%s) - t0 )) s, file $(du -m "$db" | cut -f1) MiB"
    for rate in $RATES; do
        # with its log, if the seeding gateway had to be killed before it closed
        for f in "$db" "$db-wal"; do [ ! -f "$f" ] || cp "$f" "$WORK/run.db${f#"$db"}"; done
        herald_spawn "sqlite-bytes-$page-$rate" "$WORK/run" "$PORT" --store "sqlite:$WORK/run.db" || { log "herald did not start"; exit 1; }
        pid=$SPAWNED_PID
        count_around "$pid" "$WORK/count"
        "${HERALD_ARGS[@]}" --mode fanout --users "$USERS" --devices 1 --rate "$rate" --duration "$STEP_SECONDS" \
            --server-pids "$pid" --pub-conns 512 --around-steps "$WORK/count" > "$OUT/sqlite-bytes-$page-$rate.log" 2>&1 || true
        herald_stop "$pid"
        n=$(res "$OUT/sqlite-bytes-$page-$rate.log" step=0 published)
        syncs=$(perf_syncs "$WORK/count")
        rows+=("| $page | $rate | ${n:-n/a} | $(per "$(counted "$WORK/count" wchar herald-engine-.*)" "${n:-0}") | $(per "$(counted "$WORK/count" syscw herald-engine-.*)" "$(( ${n:-0} * 2 ))") | $(per "$(counted "$WORK/count" wchar herald-checkpt)" "${n:-0}") | $(per "$(counted "$WORK/count" write_bytes process)" "${n:-0}") | $(per "${n:-0}" "$syncs") | $(res "$OUT/sqlite-bytes-$page-$rate.log" step=0 p99_ms) |")
        log "${rows[-1]}"
        # who wrote what (bytes dirtied, bytes passed to write), by thread
        awk '$2 == "write_bytes:" || $2 == "wchar:" { v[$1 " " $2] += (FILENAME ~ /start$/ ? -$3 : $3) }
             END { for (k in v) if (v[k] > 0) printf "%s %.0f\n", k, v[k] }' "$WORK/count.start" "$WORK/count.stop" | sort \
            > "$OUT/sqlite-bytes-$page-$rate-threads.txt"
        rm -f "$WORK"/run.db*
    done
    rm -f "$db"*
done

{
    echo "# SQLite bytes per publish"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$ROOT" rev-parse --short HEAD), background CPU ${BG_BUSY}% before the run; $USERS users × $PER_USER notifications seeded (every ${BIG_EVERY}th 64 KiB), $STEP_SECONDS s a step."
    echo
    echo "| figure | value |"
    echo "|---|---|"
    probe_rows "$OUT/sqlite-bytes-fsync_probe.log"
    echo
    echo "| page size | publishes/s | publishes | log bytes / publish | log pages / publish | checkpoint bytes / publish | dirtied bytes / publish | publishes / sync | p99 ms |"
    echo "|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
} > "$RESULTS"
log "results: $RESULTS"
cat "$RESULTS"
