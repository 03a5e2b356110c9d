#!/usr/bin/env bash
# Benchmark: the ways a file range can go to the socket, side by side. Four servers each
# serve their own 1 GiB file on /dev/shm: examples/serve_file.rs sending large reads from
# the file's mapping (the default), with `sendfile` (--no-send-from-mapping) and through a
# buffer (--no-send-file), and `nbdkit file` beside them. fio --ioengine=nbd runs 1 MiB QD8
# sequential reads against each in turn, the order reversed every other round, for ROUNDS
# rounds; each line prints the round and every server's bandwidth in MB/s.
#
# Usage: crates/nbd-server/bench/send-paths.sh           (1 connection, 5 rounds)
#        JOBS=4 ROUNDS=9 crates/nbd-server/bench/send-paths.sh   (fio numjobs=4: four connections)
# Needs: fio, nbdkit (Debian packages fio, nbdkit), cargo.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
JOBS=${JOBS:-1}
RUNTIME=${RUNTIME:-4}
BASE_PORT=${BASE_PORT:-11001}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

for tool in fio nbdkit; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install $tool" >&2; exit 1; }
done
echo "building serve_file (release)..." >&2
cargo build --release --quiet -p nbd-server --example serve_file --manifest-path "$ROOT/Cargo.toml"
BIN=$CARGO_TARGET_DIR/release/examples/serve_file

NAMES=(mapping sendfile buffer nbdkit)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for name in "${NAMES[@]}"; do rm -f "/dev/shm/send-paths-$name.img"; done
}
trap cleanup EXIT

for i in "${!NAMES[@]}"; do
    name=${NAMES[$i]} port=$((BASE_PORT + i)) img=/dev/shm/send-paths-${NAMES[$i]}.img
    fio --name=fill --filename="$img" --rw=write --bs=1m --size=1G --refill_buffers --output=/dev/null
    case $name in
    mapping) "$BIN" --file "$img" --listen "127.0.0.1:$port" >/dev/null 2>&1 & ;;
    sendfile) "$BIN" --file "$img" --listen "127.0.0.1:$port" --no-send-from-mapping >/dev/null 2>&1 & ;;
    buffer) "$BIN" --file "$img" --listen "127.0.0.1:$port" --no-send-file >/dev/null 2>&1 & ;;
    nbdkit) nbdkit -f -i 127.0.0.1 -p "$port" file "$img" >/dev/null 2>&1 & ;;
    esac
    PIDS+=($!)
done
sleep 1

read_mb_per_s() { # port -> MB/s of 1 MiB QD8 reads (fio's terse field 7 is KiB/s)
    fio --name=b --ioengine=nbd --uri="nbd://127.0.0.1:$1/" --size=1000M --bs=1m --iodepth=8 --rw=read \
        --numjobs="$JOBS" --group_reporting --time_based --runtime="$RUNTIME" --ramp_time=1 \
        --output-format=terse | tail -1 | awk -F';' '{printf "%.0f", $7 * 1.024 / 1000}'
}

echo "round ${NAMES[*]} (MB/s, 1 MiB QD8 reads, $JOBS connection(s) each)"
for round in $(seq "$ROUNDS"); do
    order=(0 1 2 3)
    (( round % 2 )) || order=(3 2 1 0)
    declare -A result=()
    for i in "${order[@]}"; do result[$i]=$(read_mb_per_s $((BASE_PORT + i))); done
    echo "$round ${result[0]} ${result[1]} ${result[2]} ${result[3]}"
done
