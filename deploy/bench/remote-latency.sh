#!/usr/bin/env bash
# Members behind nbdkit's delay filter (DELAY per read and write, default 2 ms): a RAID0 x4
# (64 KiB chunk) of `nbdkit memory` members on Unix sockets, 4 KiB random reads. The array at
# QD against the sum of its four members' own IOPS, each measured at QD/4 (the depth it sees
# inside the array), all four at once; and the array at QD*4 against the members at QD each.
# Two rounds.
#
#   deploy/bench/remote-latency.sh
#   QD=32 DELAY=2ms RUNTIME=8 RAIDNBD=target/release/raidnbd deploy/bench/remote-latency.sh
# Needs: fio (nbd engine), nbdkit (memory plugin, delay filter), /usr/bin/python3, bc.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAIDNBD=${RAIDNBD:-$ROOT/target/release/raidnbd}
QD=${QD:-32} RUNTIME=${RUNTIME:-8} DELAY=${DELAY:-2ms}
# shellcheck source=deploy/bench/lib.sh
. "$(dirname "$0")/lib.sh"
work_dir raidnbd-latency

MEMBERS=()
for i in 0 1 2 3; do
    nbdkit -U "$WORK/m$i.sock" -f -P "$WORK/m$i.pid" --filter=delay memory 256M delay-read="$DELAY" delay-write="$DELAY" \
        >"$WORK/nbdkit$i.log" 2>&1 &
    MEMBERS+=("nbd+unix:///?socket=$WORK/m$i.sock")
done
for _ in $(seq 50); do [[ -S $WORK/m3.sock ]] && break; sleep 0.1; done
"$RAIDNBD" create --level 0 --chunk 64K --force "${MEMBERS[@]}" >"$WORK/create.log" 2>&1
mkdir -p "$WORK/state"
STATE_DIRECTORY=$WORK/state "$RAIDNBD" serve "${MEMBERS[@]}" --listen "unix:$WORK/array.sock" --control "$WORK/control.sock" \
    >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 50); do [[ -S $WORK/array.sock ]] && break; sleep 0.1; done

iops() { # fio JSON on stdin -> the read IOPS of all its jobs, summed
    /usr/bin/python3 -c 'import json, sys; t = sys.stdin.read(); j = json.loads(t[t.index("{"):]); print(sum(x["read"]["iops"] for x in j["jobs"]))'
}
members_at() { # depth: the four members at once, each at depth
    local args=() i
    for i in 0 1 2 3; do args+=(--name="m$i" --uri="nbd+unix:///?socket=$WORK/m$i.sock" --iodepth="$1"); done
    fio --ioengine=nbd --rw=randread --bs=4k --size=200M --time_based --runtime="$RUNTIME" --ramp_time=1 \
        --output-format=json "${args[@]}" | iops
}
array_at() { # depth
    fio --ioengine=nbd --name=array --uri="nbd+unix:///?socket=$WORK/array.sock" --iodepth="$1" --rw=randread --bs=4k \
        --size=800M --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json | iops
}
ratio() { echo "scale=2; $1 / $2" | bc; }
for round in 1 2; do
    a=$(array_at "$QD") m=$(members_at $((QD / 4)))
    a4=$(array_at $((QD * 4))) m4=$(members_at "$QD")
    printf 'round %s: array QD%s %.0f, members at QD%s each %.0f: %s;  array QD%s %.0f, members at QD%s each %.0f: %s\n' \
        "$round" "$QD" "$a" $((QD / 4)) "$m" "$(ratio "$a" "$m")" $((QD * 4)) "$a4" "$QD" "$m4" "$(ratio "$a4" "$m4")"
done
