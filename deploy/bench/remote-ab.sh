#!/usr/bin/env bash
# Two raidnbd binaries, A and B, serving the same RAID0 x4 (512 KiB chunk) over four
# `nbdkit memory` members on Unix sockets, run in turn (A B A B ...): the member client of one
# build against another's on this shared machine. Per run: fio's IOPS and the server's CPU
# (user + sys from /proc/PID/stat over the run) per operation.
#
#   deploy/bench/remote-ab.sh OLD_RAIDNBD NEW_RAIDNBD
#   PAIRS=3 RUNTIME=10 WORKLOADS="randwrite:4k:32 read:1m:32" deploy/bench/remote-ab.sh A B
# Needs: fio (nbd engine), nbdkit (memory plugin), /usr/bin/python3.
set -euo pipefail
A=$(readlink -f "$1") B=$(readlink -f "$2")
PAIRS=${PAIRS:-2} RUNTIME=${RUNTIME:-10}
WORKLOADS=${WORKLOADS:-"randwrite:4k:32 read:1m:32"}
# shellcheck source=deploy/bench/lib.sh
. "$(dirname "$0")/lib.sh"
work_dir raidnbd-remote-ab

run() { # binary rw bs depth: prints "iops cpu_us_per_op"
    local bin=$1 rw=$2 bs=$3 depth=$4 members=() i
    for i in 0 1 2 3; do
        rm -f "$WORK/m$i.sock"
        nbdkit -U "$WORK/m$i.sock" -f -P "$WORK/m$i.pid" memory 256M >/dev/null 2>&1 &
        members+=("nbd+unix:///?socket=$WORK/m$i.sock")
    done
    for _ in $(seq 50); do [[ -S $WORK/m3.sock ]] && break; sleep 0.1; done
    "$bin" create --level 0 --chunk 512K --force "${members[@]}" >"$WORK/create.log" 2>&1
    mkdir -p "$WORK/state"
    STATE_DIRECTORY=$WORK/state "$bin" serve "${members[@]}" --listen "unix:$WORK/array.sock" \
        --control "$WORK/control.sock" >"$WORK/serve.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 50); do [[ -S $WORK/array.sock ]] && break; sleep 0.1; done
    local before after
    before=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
    fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/array.sock" --size=900M --rw="$rw" \
        --bs="$bs" --iodepth="$depth" --time_based --runtime="$RUNTIME" --output-format=json >"$WORK/fio.json"
    after=$(awk '{print $14 + $15}' "/proc/$SERVER/stat")
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
    for i in 0 1 2 3; do kill "$(cat "$WORK/m$i.pid")"; done
    wait 2>/dev/null || true
    /usr/bin/python3 - "$WORK/fio.json" "$((after - before))" "$(getconf CLK_TCK)" "$RUNTIME" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
ops = side["iops"] * float(sys.argv[4])
print(f'{side["iops"]:.0f} {int(sys.argv[2]) / int(sys.argv[3]) / ops * 1e6:.1f}')
PY
}

for workload in $WORKLOADS; do
    IFS=: read -r rw bs depth <<<"$workload"
    line_iops="" line_cpu=""
    for _ in $(seq "$PAIRS"); do
        read -r ia ca < <(run "$A" "$rw" "$bs" "$depth")
        read -r ib cb < <(run "$B" "$rw" "$bs" "$depth")
        line_iops+=" $ia/$ib" line_cpu+=" $ca/$cb"
    done
    echo "$workload IOPS A/B:$line_iops   server CPU us/op A/B:$line_cpu"
done
