#!/usr/bin/env bash
# How fast a RAID5 grows from 4 members to 5 when each member is throttled like a cloud volume,
# against what the members' bandwidth allows, and what it costs a client's 4 KiB reads.
#
#   deploy/bench/reshape-speed.sh [RAIDNBD]              # default: target/release/raidnbd
#   BW=20M SIZE=256M CHUNK=512K RUNTIME=10 deploy/bench/reshape-speed.sh
#
# The array: RAID5 of 4 x SIZE members in /dev/shm (consistency policy resync), each throttled
# to BW bytes/s for reads and writes together (`serve --member-bw`), grown by one with
# `ctl grow --add`. The data that must move is the old array (3 x SIZE of data): every old
# member reads its data rows (3/4 of its rows) and writes the new layout's rows (3/4 of its
# rows, data and parity), so at best each old member does 1.5 x SIZE of I/O at BW:
# ideal rate = old array / (1.5 x SIZE / BW) = 2 x BW of array data per second.
# Two runs:
#   1. no client: the reshape at full speed (ctl rebuild-speed 1G 1G); rate = old size / time;
#   2. a client reading 4 KiB at queue depth 1 (fio, nbd engine), idle first, then during a
#      reshape (paced like a rebuild: the minimum speed while clients are busy, as md); its
#      mean and 99th percentile completion latency, idle and during.
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/raidnbd}")
BW=${BW:-20M} SIZE=${SIZE:-256M} CHUNK=${CHUNK:-512K} RUNTIME=${RUNTIME:-10}
PORT=${PORT:-10940}
WORK=$(mktemp -d /dev/shm/raidnbd-reshape.XXXXXX)
SOCK=$WORK/c.sock
trap 'kill $(cat $WORK/pid 2>/dev/null) 2>/dev/null || true; rm -rf "$WORK"' EXIT
command -v jq >/dev/null && command -v fio >/dev/null || { echo "needs jq and fio" >&2; exit 1; }
to_bytes() { numfmt --from=iec "$1"; }

# fresh: a new array, served throttled; prints its size in bytes
fresh() {
  rm -f "$WORK"/m* "$WORK"/serve.log
  "$BIN" create --level 5 --chunk "$CHUNK" --consistency-policy resync --size "$SIZE" \
    "$WORK"/m0 "$WORK"/m1 "$WORK"/m2 "$WORK"/m3 >/dev/null 2>&1
  truncate -s "$SIZE" "$WORK"/m4
  "$BIN" serve --listen "127.0.0.1:$PORT" --control "$SOCK" --member-bw "$BW" --export a \
    "$WORK"/m0 "$WORK"/m1 "$WORK"/m2 "$WORK"/m3 >"$WORK/serve.log" 2>&1 &
  echo $! > "$WORK/pid"
  for _ in $(seq 100); do nbdinfo --size "nbd://127.0.0.1:$PORT/a" >/dev/null 2>&1 && break; sleep 0.1; done
  "$BIN" ctl --socket "$SOCK" status --json | jq '.[0].size_bytes'
}
stop() { kill "$(cat "$WORK/pid")"; wait "$(cat "$WORK/pid")" 2>/dev/null || true; }
reads() { # fio 4 KiB random reads at QD1 for RUNTIME s -> "mean_us p99_us"
  fio --name=lat --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/a" --rw=randread --bs=4k --iodepth=1 \
    --time_based --runtime="$RUNTIME" --output-format=json --output="$WORK/fio.json" >/dev/null
  jq -r '.jobs[0].read.clat_ns | "\(.mean / 1000 | floor) \(.percentile["99.000000"] / 1000 | floor)"' "$WORK/fio.json"
}

echo "raidnbd: $BIN"
echo "RAID5 4 -> 5 members of $SIZE, chunk $CHUNK, each member throttled to $BW/s; load $(cut -d' ' -f1 /proc/loadavg)"

size=$(fresh)
"$BIN" ctl --socket "$SOCK" rebuild-speed 1G 1G >/dev/null
start=$(date +%s.%N)
"$BIN" ctl --socket "$SOCK" grow --add "$WORK"/m4 >/dev/null
"$BIN" ctl --socket "$SOCK" wait >/dev/null
secs=$(echo "$(date +%s.%N) - $start" | bc -l)
stop
bw=$(to_bytes "$BW") member=$(to_bytes "$SIZE")
awk -v size="$size" -v secs="$secs" -v bw="$bw" 'BEGIN {
  rate = size / secs; ideal = 2 * bw
  printf "reshape alone:   %d MiB moved in %.1f s = %.1f MB/s; members allow %.1f MB/s; ratio %.2f\n",
    size / 1048576, secs, rate / 1e6, ideal / 1e6, rate / ideal }'

fresh >/dev/null
read -r idle_mean idle_p99 <<<"$(reads)"
"$BIN" ctl --socket "$SOCK" grow --add "$WORK"/m4 >/dev/null
read -r busy_mean busy_p99 <<<"$(reads)"
front=$("$BIN" ctl --socket "$SOCK" status --json | jq '.[0].reshape.front_bytes // "ended"')
stop
awk -v im="$idle_mean" -v ip="$idle_p99" -v bm="$busy_mean" -v bp="$busy_p99" -v f="$front" 'BEGIN {
  printf "client 4K reads: idle mean %d us p99 %d us; during the reshape mean %d us p99 %d us; ratio mean %.2f p99 %.2f (reshape front after: %s bytes)\n",
    im, ip, bm, bp, bm / im, bp / ip, f }'
