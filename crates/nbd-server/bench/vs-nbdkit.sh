#!/usr/bin/env bash
# Benchmark: nbd-server (examples/serve_file.rs, a FileDevice) against nbdkit's file
# plugin, both serving the same file on /dev/shm, driven by fio --ioengine=nbd over
# loopback TCP. The two servers are measured alternately, workload by workload, for
# ROUNDS rounds; the report gives the median of each and the ratio ours/nbdkit.
#
# Usage: crates/nbd-server/bench/vs-nbdkit.sh            (defaults below)
#        ROUNDS=5 RUNTIME=10 SIZE=1G crates/nbd-server/bench/vs-nbdkit.sh
#        ONLY=seq crates/nbd-server/bench/vs-nbdkit.sh     (workloads whose name contains "seq")
#        OURS=raidnbd crates/nbd-server/bench/vs-nbdkit.sh  (the product: `raidnbd serve` of a
#            linear array whose one member is the file; nbdkit serves the member file itself)
# Needs: fio, nbdkit (Debian packages fio, nbdkit), /usr/bin/python3, cargo.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-8}
SIZE=${SIZE:-1G}
ONLY=${ONLY:-}
OURS=${OURS:-serve_file} # serve_file (the crate's example, a FileDevice) or raidnbd
OURS_ARGS=${OURS_ARGS:-} # extra server arguments, e.g. "--threads 4"
IMG=${IMG:-/dev/shm/nbd-bench.img}
OURS_PORT=${OURS_PORT:-10911}
NBDKIT_PORT=${NBDKIT_PORT:-10912}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

for tool in fio nbdkit; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install $tool" >&2; exit 1; }
done

case $OURS in
serve_file)
    echo "building serve_file (release)..." >&2
    cargo build --release --quiet -p nbd-server --example serve_file --manifest-path "$ROOT/Cargo.toml"
    ;;
raidnbd)
    echo "building raidnbd (release)..." >&2
    cargo build --release --quiet --bin raidnbd --manifest-path "$ROOT/Cargo.toml"
    ;;
*) echo "OURS must be serve_file or raidnbd" >&2; exit 1 ;;
esac

WORK=$(mktemp -d)
cleanup() {
    [[ -n ${OURS_PID:-} ]] && kill "$OURS_PID" 2>/dev/null || true
    [[ -f $WORK/nbdkit.pid ]] && kill "$(cat "$WORK/nbdkit.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK" "$IMG"
}
trap cleanup EXIT

echo "filling $IMG ($SIZE) with random data..." >&2
fio --name=fill --filename="$IMG" --rw=write --bs=1m --size="$SIZE" --refill_buffers --output=/dev/null

# The array is smaller than its member (md metadata), so fio covers 95 % of each export.
FIO_SIZE=$SIZE
if [[ $OURS == raidnbd ]]; then
    FIO_SIZE=95%
    "$CARGO_TARGET_DIR/release/raidnbd" create --level linear --force "$IMG" >"$WORK/create.log" 2>&1
    # shellcheck disable=SC2086
    "$CARGO_TARGET_DIR/release/raidnbd" serve "$IMG" --listen "127.0.0.1:$OURS_PORT" $OURS_ARGS >"$WORK/ours.log" 2>&1 &
else
    # shellcheck disable=SC2086
    "$CARGO_TARGET_DIR/release/examples/serve_file" --file "$IMG" --listen "127.0.0.1:$OURS_PORT" $OURS_ARGS \
        >"$WORK/ours.log" 2>&1 &
fi
OURS_PID=$!
nbdkit -f -P "$WORK/nbdkit.pid" -i 127.0.0.1 -p "$NBDKIT_PORT" file "$IMG" >"$WORK/nbdkit.log" 2>&1 &
for _ in $(seq 50); do
    grep -qE "listening|serving export" "$WORK/ours.log" && [[ -s $WORK/nbdkit.pid ]] && break
    sleep 0.1
done

# name  fio-arguments
WORKLOADS=(
    "randread-4k-qd32 --rw=randread --bs=4k --iodepth=32"
    "randwrite-4k-qd32 --rw=randwrite --bs=4k --iodepth=32"
    "seqread-1m-qd8 --rw=read --bs=1m --iodepth=8"
    "seqwrite-1m-qd8 --rw=write --bs=1m --iodepth=8"
)

cpu_ticks() { # utime + stime of a process, in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat"
}

run_fio() { # port workload-args... ; prints "iops bw_bytes_per_s"
    local port=$1
    shift
    fio --name=bench --ioengine=nbd --uri="nbd://127.0.0.1:$port/" --size="$FIO_SIZE" \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --numjobs=1 --output-format=json "$@" |
        /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()  # fio prints "fio: connected to NBD server" before the JSON
job = json.loads(text[text.index("{"):])["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
print(side["iops"], side["bw_bytes"])'
}

RESULTS=$WORK/results.txt
for round in $(seq "$ROUNDS"); do
    for workload in "${WORKLOADS[@]}"; do
        read -r name args <<<"$workload"
        [[ $name == *"$ONLY"* ]] || continue
        # Alternate which server goes first to cancel drift.
        if (( round % 2 )); then order="ours nbdkit"; else order="nbdkit ours"; fi
        for server in $order; do
            port=$OURS_PORT pid=$OURS_PID
            [[ $server == nbdkit ]] && port=$NBDKIT_PORT pid=$(cat "$WORK/nbdkit.pid")
            before=$(cpu_ticks "$pid")
            # shellcheck disable=SC2086
            result=$(run_fio "$port" $args)
            after=$(cpu_ticks "$pid")
            # Server CPU seconds used during the run (includes the 1 s ramp).
            cpu=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN {print t / hz}')
            echo "$round $name $server $result $cpu" | tee -a "$RESULTS" >&2
        done
    done
done

/usr/bin/python3 - "$RESULTS" "$RUNTIME" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
names = list(dict.fromkeys(r[1] for r in rows))
runtime = float(sys.argv[2]) + 1  # fio ramp time is 1 s
print(f"{'workload':<20} {'ours IOPS':>10} {'nbdkit IOPS':>11} {'ours MB/s':>9} {'nbdkit MB/s':>11} "
      f"{'ratio':>6} {'ours CPU us/op':>14} {'nbdkit CPU us/op':>16}")
for name in names:
    med = {}
    for server in ("ours", "nbdkit"):
        sel = [r for r in rows if r[1] == name and r[2] == server]
        iops = statistics.median(float(r[3]) for r in sel)
        bw = statistics.median(float(r[4]) for r in sel)
        # CPU per operation: server CPU seconds over the operations of the whole run.
        cpu = statistics.median(float(r[5]) / (float(r[3]) * runtime) * 1e6 for r in sel)
        med[server] = (iops, bw, cpu)
    ratio = med["ours"][0] / med["nbdkit"][0]
    print(f"{name:<20} {med['ours'][0]:>10.0f} {med['nbdkit'][0]:>11.0f} {med['ours'][1] / 1e6:>9.0f} "
          f"{med['nbdkit'][1] / 1e6:>11.0f} {ratio:>6.2f} {med['ours'][2]:>14.1f} {med['nbdkit'][2]:>16.1f}")
print(f"ratio = ours / nbdkit (median of {len(rows) // (2 * len(names))} alternated rounds)")
EOF
