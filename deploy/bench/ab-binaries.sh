#!/usr/bin/env bash
# Two raidnbd binaries, A and B, on the same arrays and workloads, run in turn (A B A B ...),
# so a change to the engine is measured against the build before it in one run on this
# shared machine: the ratio B/A per pair, and its median.
#
#   deploy/bench/ab-binaries.sh OLD_RAIDNBD NEW_RAIDNBD
#   PAIRS=5 RUNTIME=5 ARRAYS="raid0 raid5 raid5-resync raid1" deploy/bench/ab-binaries.sh A B
#   WORKLOADS="randwrite:4k:32 randread:4k:32" ARRAYS=raid5 PAIRS=11 deploy/bench/ab-binaries.sh A B
#
# Arrays: 4 members of 256 MiB in /dev/shm (raid1: 2), 64 KiB chunks, created fresh for each
# run by the binary under test; raid5 has its default policy (md's PPL), raid5-resync none.
# Workloads (fio's nbd engine, one connection, 200 MiB span): 4 KiB random writes and reads
# at QD32, 1 MiB sequential writes and reads at QD8. Prints two lines per array and workload:
#   ARRAY WORKLOAD iops    A-iops... | B-iops... | B/A per pair | median B/A
#   ARRAY WORKLOAD cpu/op  the server's CPU (user + sys, /proc/PID/stat) per operation, in µs:
#                          steadier than throughput on a shared machine
set -euo pipefail
A=$(readlink -f "$1") B=$(readlink -f "$2")
PAIRS=${PAIRS:-5} RUNTIME=${RUNTIME:-5} ARRAYS=${ARRAYS:-"raid0 raid5 raid5-resync raid1"}
WORKLOADS=${WORKLOADS:-"randwrite:4k:32 randread:4k:32 write:1m:8 read:1m:8"}
PORT=${PORT:-10930}
WORK=$(mktemp -d /dev/shm/raidnbd-ab.XXXXXX)
trap 'pkill -f "raidnbd-ab.*serve" 2>/dev/null || true; rm -rf "$WORK"' EXIT

create_args() {
  case $1 in
    raid0) echo "--level 0 --chunk 64K" ;;
    raid5) echo "--level 5 --chunk 64K" ;;
    raid5-resync) echo "--level 5 --chunk 64K --consistency-policy resync" ;;
    raid1) echo "--level 1" ;;
  esac
}

members() { [ "$1" = raid1 ] && echo 2 || echo 4; }

# run BIN ARRAY RW BS QD -> "IOPS CPU-µs-per-op" of one fio run against a fresh array served by BIN
run() {
  local bin=$1 array=$2 rw=$3 bs=$4 qd=$5 dir n m=() pid iops ios ticks0 ticks1
  dir=$(mktemp -d "$WORK/run.XXXXXX")
  n=$(members "$array")
  for i in $(seq 0 $((n - 1))); do m+=("$dir/m$i"); done
  # shellcheck disable=SC2046
  "$bin" create $(create_args "$array") --size 256M "${m[@]}" >/dev/null 2>&1
  STATE_DIRECTORY=$dir "$bin" serve --listen "127.0.0.1:$PORT" --export a "${m[@]}" >"$dir/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do nbdinfo --size "nbd://127.0.0.1:$PORT/a" >/dev/null 2>&1 && break; sleep 0.1; done
  ticks0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  fio --name=ab --ioengine=nbd --uri="nbd://127.0.0.1:$PORT/a" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --size=200m --time_based --runtime="$RUNTIME" --output-format=json --output="$dir/fio.json" >/dev/null 2>&1
  ticks1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  local dir_key=read
  case $rw in *write*) dir_key=write ;; esac
  iops=$(jq ".jobs[0].$dir_key.iops" "$dir/fio.json")
  ios=$(jq ".jobs[0].$dir_key.total_ios" "$dir/fio.json")
  rm -rf "$dir"
  awk -v i="$iops" -v t=$((ticks1 - ticks0)) -v n="$ios" -v hz="$(getconf CLK_TCK)" \
    'BEGIN {printf "%.0f %.2f", i, t * 1e6 / hz / (n > 0 ? n : 1)}'
}

# median of the numbers on stdin
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

command -v jq >/dev/null || { echo "needs jq (apt-get install jq)" >&2; exit 1; }
echo "A=$A"
echo "B=$B"
echo "pairs=$PAIRS runtime=${RUNTIME}s, load $(cut -d' ' -f1 /proc/loadavg)"
for array in $ARRAYS; do
  for w in $WORKLOADS; do
    IFS=: read -r rw bs qd <<<"$w"
    as=() bs_=() ratios=() acpu=() bcpu=() cratios=()
    for _ in $(seq "$PAIRS"); do
      read -r a ac <<<"$(run "$A" "$array" "$rw" "$bs" "$qd")"
      read -r b bc <<<"$(run "$B" "$array" "$rw" "$bs" "$qd")"
      as+=("$a"); bs_+=("$b"); ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}')")
      acpu+=("$ac"); bcpu+=("$bc"); cratios+=("$(awk -v a="$ac" -v b="$bc" 'BEGIN {printf "%.2f", b / a}')")
    done
    printf '%-13s %-9s %-4s iops   A %s | B %s | B/A %s | median %s\n' "$array" "$rw" "$bs" "${as[*]}" \
      "${bs_[*]}" "${ratios[*]}" "$(printf '%s\n' "${ratios[@]}" | median)"
    printf '%-13s %-9s %-4s cpu/op A %s | B %s | B/A %s | median %s\n' "$array" "$rw" "$bs" "${acpu[*]}" \
      "${bcpu[*]}" "${cratios[*]}" "$(printf '%s\n' "${cratios[@]}" | median)"
  done
done
