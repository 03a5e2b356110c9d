#!/usr/bin/env bash
# How fast a RAID5 grows from 4 members to 5 when each member is throttled like a cloud volume,
# against what the members' bandwidth allows, and what it costs a client's 4 KiB reads.
#
#   deploy/bench/reshape-speed.sh [RAIDNBD]              # default: target/release/raidnbd
#   BW=20M SIZE=256M CHUNK=64K RUNTIME=10 deploy/bench/reshape-speed.sh
#
# The array: RAID5 of 4 x SIZE members in /dev/shm (consistency policy resync), each throttled
# to BW bytes/s for reads and writes together (`serve --member-bw`), grown by one with
# `ctl grow --add`. The data that must move is the old array (3 x SIZE of data): every old
# member reads its data rows (3/4 of its rows) and writes the new layout's rows (3/4 of its
# rows, data and parity), so at best each old member does 1.5 x SIZE of I/O at BW:
# ideal rate = old array / (1.5 x SIZE / BW) = 2 x BW of array data per second.
# Three runs, each on a fresh array:
#   1. no client: the reshape at full speed (ctl rebuild-speed 1G 1G); rate = old size / time;
#   2. a client reading 4 KiB at queue depth 1 (fio, nbd engine), idle first, then during a
#      reshape paced like md's (the minimum speed while clients are busy): its mean and 99th
#      percentile completion latency, idle and during, and how fast the reshape went;
#   3. the same with the reshape held at BW/s whatever the clients do (ctl rebuild-speed BW BW:
#      half of what the members allow).
# (With mdadm's default data offset, members below a few GiB leave room for a no-backup grow
# only with small chunks: raidnbd and mdadm both refuse 512 KiB chunks on 256 MiB members.)
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/raidnbd}")
BW=${BW:-20M} SIZE=${SIZE:-256M} CHUNK=${CHUNK:-64K} RUNTIME=${RUNTIME:-10}
BASE_PORT=${PORT:-10940}
WORK=$(mktemp -d /dev/shm/raidnbd-reshape.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
command -v jq >/dev/null && command -v fio >/dev/null || { echo "needs jq and fio" >&2; exit 1; }

# start N: a fresh array in $WORK/N, served throttled on port BASE_PORT+N with control socket
# $WORK/N/c.sock; sets DIR, PORT, SOCK, PID
start() {
  DIR=$WORK/$1 PORT=$((BASE_PORT + $1)) SOCK=$WORK/$1/c.sock
  mkdir -p "$DIR"
  "$BIN" create --level 5 --chunk "$CHUNK" --consistency-policy resync --size "$SIZE" \
    "$DIR"/m0 "$DIR"/m1 "$DIR"/m2 "$DIR"/m3 >/dev/null 2>&1
  truncate -s "$SIZE" "$DIR"/m4
  "$BIN" serve --listen "127.0.0.1:$PORT" --control "$SOCK" --member-bw "$BW" --export a \
    "$DIR"/m0 "$DIR"/m1 "$DIR"/m2 "$DIR"/m3 >"$DIR/serve.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 200); do
    [ -S "$SOCK" ] && nbdinfo --size "nbd://127.0.0.1:$PORT/a" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$DIR/serve.log" >&2
  exit 1
}
ctl() { "$BIN" ctl --socket "$SOCK" "$@"; }
stop() { kill "$PID"; while kill -0 "$PID" 2>/dev/null; do sleep 0.1; done; rm -rf "$DIR"; }
reads() { # fio 4 KiB random reads at QD1 for RUNTIME s -> "mean_us p99_us"
  fio --name=lat --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/a" --rw=randread --bs=4k --iodepth=1 \
    --time_based --runtime="$RUNTIME" --output-format=json --output="$WORK/fio.json" >/dev/null
  jq -r '.jobs[0].read.clat_ns | "\(.mean / 1000 | floor) \(.percentile["99.000000"] / 1000 | floor)"' "$WORK/fio.json"
}

echo "raidnbd: $BIN"
echo "RAID5 4 -> 5 members of $SIZE, chunk $CHUNK, each member throttled to $BW/s; load $(cut -d' ' -f1 /proc/loadavg)"

start 1
size=$(ctl status --json | jq '.[0].size_bytes')
ctl rebuild-speed 1G 1G >/dev/null
t0=$(date +%s.%N)
ctl grow --add "$DIR"/m4 >/dev/null
ctl wait >/dev/null
secs=$(echo "$(date +%s.%N) - $t0" | bc -l)
stop
awk -v size="$size" -v secs="$secs" -v bw="$(numfmt --from=iec "$BW")" 'BEGIN {
  rate = size / secs; ideal = 2 * bw
  printf "reshape alone: %d MiB moved in %.1f s = %.1f MB/s; the members allow %.1f MB/s; ratio %.2f\n",
    size / 1048576, secs, rate / 1e6, ideal / 1e6, rate / ideal }'

during() { # N WHAT [MIN MAX]
  start "$1"
  local what=$2
  [ $# -lt 4 ] || ctl rebuild-speed "$3" "$4" >/dev/null
  read -r idle_mean idle_p99 <<<"$(reads)"
  ctl grow --add "$DIR"/m4 >/dev/null
  read -r busy_mean busy_p99 <<<"$(reads)"
  front=$(ctl status --json | jq '.[0].reshape.front_bytes // 0')
  stop
  awk -v w="$what" -v im="$idle_mean" -v ip="$idle_p99" -v bm="$busy_mean" -v bp="$busy_p99" -v f="$front" \
    -v t="$RUNTIME" 'BEGIN {
    printf "client 4K reads, %s: idle mean %d us p99 %d us; during the reshape mean %d us p99 %d us; ratio mean %.2f p99 %.2f; the reshape meanwhile %.1f MB/s\n",
      w, im, ip, bm, bp, bm / im, bp / ip, f / t / 1e6 }'
}
during 2 "reshape paced like md's"
during 3 "reshape held at $BW/s" "$BW" "$BW"
