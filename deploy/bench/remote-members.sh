#!/usr/bin/env bash
# The member client (raidnbd's NBD client to remote members) against nbdkit's own one-hop proxy.
#
# Four `nbdkit memory` servers on Unix sockets are the members of a RAID0 x4 (CHUNK, default
# 512K) that raidnbd serves ("array": fio -> raidnbd -> 4 x nbdkit). Its peers, in the same run:
#   direct  one `nbdkit memory` of the array's exported size, read by fio directly
#   proxy   `nbdkit nbd socket=...` in front of that same server: nbdkit's one-hop proxy
#           (fio -> nbdkit -> nbdkit), the cost of one NBD client hop done by nbdkit
#   local   the same RAID0 x4 served by raidnbd over member files on /dev/shm (no hop)
# Workloads (fio --ioengine=nbd, each with numjobs=N connections for N in JOBS): 1 MiB
# sequential read and write at QD8, 4 KiB random read and write at QD32, over the whole
# export, time-based (RUNTIME s after a 1 s ramp). The servers are measured in turn, the
# order reversed every other round; the report gives the median IOPS of each over ROUNDS
# rounds and the ratios array/proxy, array/direct, array/local, then the server CPU per
# operation (user + sys from /proc/PID/stat over the run, ramp included) of the server fio
# talks to and of what is behind it (the four member nbdkits; the nbdkit behind the proxy).
# Every export is written once, sequentially, before the runs, so reads read data.
#
# Usage: deploy/bench/remote-members.sh                    (ROUNDS=3 RUNTIME=6 JOBS="1 4")
#        ROUNDS=1 RUNTIME=3 JOBS=1 deploy/bench/remote-members.sh
#        ONLY=rand JOBS=4 deploy/bench/remote-members.sh    (workloads whose name contains "rand")
#        RAIDNBD=/path/to/raidnbd MEMBER_SIZE=512M deploy/bench/remote-members.sh
# Needs: fio (with the nbd engine), nbdkit (memory and nbd plugins), nbdinfo, /usr/bin/python3,
# and a release build of raidnbd (target/release/raidnbd; this script does not build it).
set -euo pipefail

ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-6}
JOBS=${JOBS:-"1 4"}
ONLY=${ONLY:-}
MEMBER_SIZE=${MEMBER_SIZE:-256M}
CHUNK=${CHUNK:-512K}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RAIDNBD=${RAIDNBD:-$ROOT/target/release/raidnbd}

for tool in fio nbdkit nbdinfo "$RAIDNBD"; do
    command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done

# shellcheck source=deploy/bench/lib.sh
. "$(dirname "$0")/lib.sh"
work_dir raidnbd-remote # PIDS: the raidnbd servers started here (the nbdkits have pid files)

wait_for() { # uri: until the export answers
    for _ in $(seq 100); do
        nbdinfo --size "$1" >/dev/null 2>&1 && return
        sleep 0.1
    done
    echo "no NBD server at $1" >&2
    exit 1
}

uri_of() { echo "nbd+unix:///?socket=$WORK/$1.sock"; }

nbdkit_on() { # name plugin args...: an nbdkit on $WORK/name.sock
    local name=$1
    shift
    nbdkit -U "$WORK/$name.sock" -f -P "$WORK/$name.pid" "$@" >"$WORK/$name.log" 2>&1 &
    wait_for "$(uri_of "$name")"
}

raidnbd_array() { # name members...: create a RAID0 over the members and serve it on $WORK/name.sock
    local name=$1
    shift
    "$RAIDNBD" create --level 0 --chunk "$CHUNK" --force "$@" >"$WORK/$name-create.log" 2>&1 ||
        { cat "$WORK/$name-create.log" >&2; exit 1; }
    mkdir -p "$WORK/$name-state"
    STATE_DIRECTORY=$WORK/$name-state "$RAIDNBD" serve "$@" --listen "unix:$WORK/$name.sock" \
        --control "$WORK/$name-control.sock" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    wait_for "$(uri_of "$name")"
}

echo "starting servers in $WORK..." >&2
REMOTE=() LOCAL=()
for i in 0 1 2 3; do
    nbdkit_on "m$i" memory "$MEMBER_SIZE"
    REMOTE+=("$(uri_of "m$i")")
    truncate -s "$MEMBER_SIZE" "$WORK/l$i.img"
    LOCAL+=("$WORK/l$i.img")
done
raidnbd_array array "${REMOTE[@]}"
ARRAY_PID=${PIDS[-1]}
raidnbd_array local "${LOCAL[@]}"
LOCAL_PID=${PIDS[-1]}
ARRAY_BYTES=$(nbdinfo --size "$(uri_of array)")
nbdkit_on direct memory "$ARRAY_BYTES"
nbdkit_on proxy nbd "socket=$WORK/direct.sock"
for name in array local direct proxy; do
    size=$(nbdinfo --size "$(uri_of "$name")")
    [[ $size == "$ARRAY_BYTES" ]] || { echo "$name: $size bytes, not $ARRAY_BYTES" >&2; exit 1; }
done
echo "RAID0 x4, $CHUNK chunk, members of $MEMBER_SIZE: $ARRAY_BYTES bytes" >&2

echo "filling array, local and direct (proxy shares direct) with one sequential write..." >&2
for name in array local direct; do
    fio --name=fill --ioengine=nbd --uri="$(uri_of "$name")" --rw=write --bs=1m --iodepth=8 \
        --size="$ARRAY_BYTES" --output=/dev/null
done

SERVERS=(array proxy direct local)
# name  fio-arguments
WORKLOADS=(
    "seqread-1m-qd8 --rw=read --bs=1m --iodepth=8"
    "seqwrite-1m-qd8 --rw=write --bs=1m --iodepth=8"
    "randread-4k-qd32 --rw=randread --bs=4k --iodepth=32"
    "randwrite-4k-qd32 --rw=randwrite --bs=4k --iodepth=32"
)

cpu_ticks() { # pids...: their utime + stime, in clock ticks
    local pid total=0
    for pid in "$@"; do total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
    echo "$total"
}

front_pids() { # server -> the process fio talks to
    case $1 in
    array) echo "$ARRAY_PID" ;;
    local) echo "$LOCAL_PID" ;;
    *) cat "$WORK/$1.pid" ;;
    esac
}

back_pids() { # server -> the processes behind it (none for direct and local)
    case $1 in
    array) cat "$WORK"/m[0-3].pid ;;
    proxy) cat "$WORK/direct.pid" ;;
    esac
}

run_fio() { # uri jobs workload-args... ; prints "iops"
    local uri=$1 jobs=$2
    shift 2
    fio --name=bench --ioengine=nbd --uri="$uri" --size="$ARRAY_BYTES" \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --numjobs="$jobs" --group_reporting \
        --output-format=json "$@" |
        /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()  # fio prints "fio: connected to NBD server" before the JSON
job = json.loads(text[text.index("{"):])["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
print(side["iops"])'
}

RESULTS=$WORK/results.txt
for round in $(seq "$ROUNDS"); do
    for jobs in $JOBS; do
        for workload in "${WORKLOADS[@]}"; do
            read -r name args <<<"$workload"
            [[ $name == *"$ONLY"* ]] || continue
            order=("${SERVERS[@]}")
            (( round % 2 )) || mapfile -t order < <(printf '%s\n' "${SERVERS[@]}" | tac)
            for server in "${order[@]}"; do
                mapfile -t front < <(front_pids "$server")
                mapfile -t back < <(back_pids "$server")
                front0=$(cpu_ticks "${front[@]}") back0=$(cpu_ticks "${back[@]}")
                # shellcheck disable=SC2086
                iops=$(run_fio "$(uri_of "$server")" "$jobs" $args)
                front1=$(cpu_ticks "${front[@]}") back1=$(cpu_ticks "${back[@]}")
                echo "$round $name $jobs $server $iops $((front1 - front0)) $((back1 - back0))" |
                    tee -a "$RESULTS" >&2
            done
        done
    done
done

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$RESULTS" "$RUNTIME" "$(getconf CLK_TCK)" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
runtime = float(sys.argv[2]) + 1  # fio ramp time is 1 s
hz = float(sys.argv[3])
keys = list(dict.fromkeys((r[1], r[2]) for r in rows))
servers = ["array", "proxy", "direct", "local"]
rounds = len({r[0] for r in rows})

def med(name, jobs, server, col):
    """Median over rounds: IOPS (col 4), or CPU us/op of the front (5) or back (6) processes."""
    sel = [r for r in rows if (r[1], r[2], r[3]) == (name, jobs, server)]
    if col == 4:
        return statistics.median(float(r[4]) for r in sel)
    return statistics.median(float(r[col]) / hz / (float(r[4]) * runtime) * 1e6 for r in sel)

print(f"IOPS, median of {rounds} round(s); array = raidnbd over 4 nbdkit memory members (Unix sockets)")
print(f"{'workload':<18} {'jobs':>4} " + " ".join(f"{s:>8}" for s in servers)
      + f" {'array/proxy':>12} {'array/direct':>13} {'array/local':>12}")
for name, jobs in keys:
    iops = {s: med(name, jobs, s, 4) for s in servers}
    print(f"{name:<18} {jobs:>4} " + " ".join(f"{iops[s]:>8.0f}" for s in servers)
          + f" {iops['array'] / iops['proxy']:>12.2f} {iops['array'] / iops['direct']:>13.2f}"
          + f" {iops['array'] / iops['local']:>12.2f}")
print()
print("server CPU us/op (user + sys over the run), median of rounds")
cols = [("array", 5, "raidnbd-array"), ("array", 6, "4 members"), ("proxy", 5, "nbdkit-proxy"),
        ("proxy", 6, "behind-proxy"), ("direct", 5, "nbdkit-direct"), ("local", 5, "raidnbd-local")]
print(f"{'workload':<18} {'jobs':>4} " + " ".join(f"{c[2]:>14}" for c in cols))
for name, jobs in keys:
    print(f"{name:<18} {jobs:>4} " + " ".join(f"{med(name, jobs, s, col):>14.1f}" for s, col, _ in cols))
EOF
