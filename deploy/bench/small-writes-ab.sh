#!/usr/bin/env bash
# Two raidnbd binaries, A and B, serving one member file written with O_DIRECT (a linear
# array on a disk filesystem, DIR), run in turn (A B A B ...) under fio's 4 KiB random writes
# at QD32: the receive path of small writes of one build against another's on this shared
# machine. Per run, from the server's own metrics scraped before and after: IOPS, server CPU
# per operation, copies per byte written (1 + raidnbd_data_copied_bytes / written bytes).
#
#   deploy/bench/small-writes-ab.sh OLD_RAIDNBD NEW_RAIDNBD
#   PAIRS=4 RUNTIME=6 DIR=/var/tmp deploy/bench/small-writes-ab.sh A B
# Needs: fio (nbd engine), curl, a filesystem in DIR that takes O_DIRECT (not tmpfs).
set -euo pipefail
A=$(readlink -f "$1") B=$(readlink -f "$2")
PAIRS=${PAIRS:-4} RUNTIME=${RUNTIME:-6} DIR=${DIR:-/var/tmp}
PORT=${PORT:-41101} METRICS_PORT=${METRICS_PORT:-41102}
# shellcheck source=deploy/bench/lib.sh
. "$(dirname "$0")/lib.sh"
work_dir raidnbd-small-writes-ab "$DIR"

metric() { # TEXT NAME: the value of the first sample of NAME
    awk -v n="$2" '$1 == n || index($1, n "{") == 1 {print $2; exit}' <<<"$1"
}

run() { # label binary
    local label=$1 bin=$2 before after
    rm -f "$WORK/m0"
    "$bin" create --level linear --size 256M "$WORK/m0" >/dev/null 2>&1
    "$bin" serve --listen "127.0.0.1:$PORT" --metrics "127.0.0.1:$METRICS_PORT" --export x "$WORK/m0" \
        >"$WORK/serve.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do curl -sf "127.0.0.1:$METRICS_PORT/metrics" >/dev/null && break; sleep 0.1; done
    grep -q "alignment=1 " "$WORK/serve.log" && { echo "$DIR does not take O_DIRECT" >&2; exit 1; }
    local fio=(fio --name=w --ioengine=nbd "--uri=nbd://127.0.0.1:$PORT/x" --rw=randwrite --bs=4k --iodepth=32
        --size=128M --time_based --output=/dev/null)
    "${fio[@]}" --runtime=2 # warm-up
    before=$(curl -s "127.0.0.1:$METRICS_PORT/metrics")
    "${fio[@]}" "--runtime=$RUNTIME"
    after=$(curl -s "127.0.0.1:$METRICS_PORT/metrics")
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
    local cpu written copied
    cpu=$(echo "$(metric "$after" raidnbd_process_cpu_seconds_total) - $(metric "$before" raidnbd_process_cpu_seconds_total)" | bc -l)
    written=$(echo "$(metric "$after" raidnbd_export_written_bytes_total) - $(metric "$before" raidnbd_export_written_bytes_total)" | bc)
    copied=$(echo "$(metric "$after" raidnbd_data_copied_bytes_total) - $(metric "$before" raidnbd_data_copied_bytes_total)" | bc)
    awk -v l="$label" -v cpu="$cpu" -v w="$written" -v c="$copied" -v t="$RUNTIME" \
        'BEGIN {ops = w / 4096; printf "%-3s IOPS %7.0f  server CPU/op %6.1f us  copies/B %.2f\n", l, ops / t, cpu / ops * 1e6, 1 + c / w}'
}

for pair in $(seq "$PAIRS"); do
    echo "pair $pair"
    run A "$A"
    run B "$B"
done
