#!/usr/bin/env bash
# What checksums cost (create --integrity crc32c): the same RAID5 of four members with and
# without them, side by side in one run, members in memory (/dev/shm) and on disk ($TMPDIR,
# default /var/tmp), fio's nbd engine over TCP on 127.0.0.1: 1 MiB sequential reads and
# writes (QD8) and 4 KiB random reads and writes (QD32). Prints MB/s of each and the ratio
# with/without; the pairs alternate, ROUNDS times, and the ratio is of the sums.
#
#   deploy/bench/integrity-cost.sh [RAIDNBD]        # default: target/release/raidnbd
#   SIZE=256M RUNTIME=8 ROUNDS=3 deploy/bench/integrity-cost.sh
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/raidnbd}")
SIZE=${SIZE:-256M} SECONDS_EACH=${RUNTIME:-8} ROUNDS=${ROUNDS:-3}
BASE_PORT=${PORT:-10970}
PIDS=()
DIRS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; for d in "${DIRS[@]}"; do rm -rf "$d"; done' EXIT
for tool in jq fio bc; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# start NAME ROOT PORT [CREATE OPTION...]: a RAID5 of four SIZE members under ROOT, served on PORT
start() {
  local name=$1 root=$2 port=$3
  shift 3
  local dir
  dir=$(mktemp -d "$root/raidnbd-integrity-$name.XXXXXX")
  DIRS+=("$dir")
  "$BIN" create --level 5 --size "$SIZE" "$@" "$dir"/m0 "$dir"/m1 "$dir"/m2 "$dir"/m3 >/dev/null
  "$BIN" serve --listen "127.0.0.1:$port" --export a "$dir"/m0 "$dir"/m1 "$dir"/m2 "$dir"/m3 >"$dir/serve.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    fio --name=probe --ioengine=nbd --uri="nbd://127.0.0.1:$port/a" --rw=read --bs=4k --size=4k \
      --output-format=terse >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$dir/serve.log" >&2
  exit 1
}

# mbps URI RW BS QD: bytes/s of one fio run, in MB/s
mbps() {
  local out
  out=$(fio --name=bench --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" --time_based \
    --runtime="$SECONDS_EACH" --size="$((3 * ${SIZE%M}))M" --randrepeat=0 --output-format=json)
  local dir=read
  case $2 in *write) dir=write ;; esac
  # (fio's nbd engine prints a line before the JSON)
  echo "$out" | sed -n '/^{/,$p' | jq -r ".jobs[0].$dir.bw_bytes / 1000000"
}

echo "raidnbd: $BIN; RAID5 x4, $SIZE members; ${SECONDS_EACH}s per run, $ROUNDS rounds; load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-6s %-22s %12s %12s %8s\n' medium workload "plain MB/s" "crc32c MB/s" ratio
port=$BASE_PORT
for medium in shm disk; do
  root=/dev/shm
  [ "$medium" = disk ] && root=${TMPDIR:-/var/tmp}
  start plain "$root" "$port"
  start crc "$root" "$((port + 1))" --integrity crc32c
  plain="nbd://127.0.0.1:$port/a" crc="nbd://127.0.0.1:$((port + 1))/a"
  # Every block written once, so reads read (and verify) data, not holes.
  for uri in "$plain" "$crc"; do
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="$((3 * ${SIZE%M}))M" \
      --output-format=terse >/dev/null
  done
  for w in "read 1M 8 seq-read-1M-QD8" "write 1M 8 seq-write-1M-QD8" "randread 4k 32 rand-read-4K-QD32" \
    "randwrite 4k 32 rand-write-4K-QD32"; do
    set -- $w
    a=0 b=0
    for _ in $(seq "$ROUNDS"); do
      a=$(echo "$a + $(mbps "$plain" "$1" "$2" "$3")" | bc -l)
      b=$(echo "$b + $(mbps "$crc" "$1" "$2" "$3")" | bc -l)
    done
    printf '%-6s %-22s %12.1f %12.1f %8.3f\n' "$medium" "$4" "$(echo "$a / $ROUNDS" | bc -l)" \
      "$(echo "$b / $ROUNDS" | bc -l)" "$(echo "$b / $a" | bc -l)"
  done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  PIDS=()
  port=$((port + 2))
done
