#!/usr/bin/env bash
# What sparse members save: a RAID5 of four sparse SIZE members holding DATA bytes; one member
# fails and a spare is rebuilt, and the whole array is copied to a file with nbdcopy. Beside
# it, in the same run, a full copy: the same rebuild on an array whose members are full of
# data (FULL each), which is what md's recovery does on every array (it copies every sector):
# its rate says how long a full rebuild of a SIZE member takes here, and md's own default
# ceiling (sync_speed_max, 200 MB/s) how long it takes md at best.
#
#   deploy/bench/sparse-rebuild.sh [RAIDNBD]              # default: target/release/raidnbd
#   SIZE=64G DATA=1G FULL=1G deploy/bench/sparse-rebuild.sh
#
# Members are sparse files in $TMPDIR (default /var/tmp: a disk file system, as a real
# member's); the rebuild runs at full speed (ctl rebuild-speed 2G 2G).
set -euo pipefail
BIN=$(readlink -f "${1:-target/release/raidnbd}")
SIZE=${SIZE:-64G} DATA=${DATA:-1G} FULL=${FULL:-1G}
BASE_PORT=${PORT:-10960}
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/raidnbd-sparse.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
for tool in jq qemu-io nbdcopy nbdinfo bc; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

# start N MEMBER_SIZE: a fresh RAID5 in $WORK/N on port BASE_PORT+N; sets DIR, PORT, SOCK, PID, URI
start() {
  DIR=$WORK/$1 PORT=$((BASE_PORT + $1)) SOCK=$WORK/$1/c.sock URI="nbd://127.0.0.1:$((BASE_PORT + $1))/a"
  mkdir -p "$DIR"
  "$BIN" create --level 5 --size "$2" "$DIR"/m0 "$DIR"/m1 "$DIR"/m2 "$DIR"/m3 >/dev/null 2>&1
  truncate -s "$2" "$DIR"/spare
  "$BIN" serve --listen "127.0.0.1:$PORT" --control "$SOCK" --fault-injection --export a \
    "$DIR"/m0 "$DIR"/m1 "$DIR"/m2 "$DIR"/m3 >"$DIR/serve.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
  for _ in $(seq 200); do
    [ -S "$SOCK" ] && nbdinfo --size "$URI" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$DIR/serve.log" >&2
  exit 1
}
ctl() { "$BIN" ctl --socket "$SOCK" "$@"; }
stop() { kill "$PID"; while kill -0 "$PID" 2>/dev/null; do sleep 0.1; done; rm -rf "$DIR"; }
now() { date +%s.%N; }
# rebuild: fail m1, add the spare, wait; prints "seconds copied_bytes hole_bytes"
rebuild() {
  ctl rebuild-speed 2G 2G >/dev/null
  ctl fault "$DIR"/m1 all >/dev/null
  local t0
  t0=$(now)
  ctl add "$DIR"/spare >/dev/null
  ctl wait >/dev/null
  local secs
  secs=$(echo "$(now) - $t0" | bc -l)
  ctl status --json | jq -r --arg s "$secs" '.[0].last_recovery | "\($s) \(.copied_bytes) \(.hole_bytes)"'
}

echo "raidnbd: $BIN; members in $WORK; load $(cut -d' ' -f1 /proc/loadavg)"

# 1. Sparse: SIZE members, DATA written in four places.
start 1 "$SIZE"
size=$(nbdinfo --size "$URI")
data=$(numfmt --from=iec "$DATA")
piece=$((data / 4 / 4096 * 4096))
for i in 0 1 2 3; do
  qemu-io -f raw "$URI" -c "write -P $((0x30 + i)) $((size / 4 * i)) $piece" >/dev/null
done
t0=$(now)
map_extents=$(nbdinfo --map "$URI" | wc -l)
map_secs=$(echo "$(now) - $t0" | bc -l)
read -r sparse_secs copied holes <<<"$(rebuild)"
t0=$(now)
nbdcopy "$URI" "$WORK/copy.raw"
copy_secs=$(echo "$(now) - $t0" | bc -l)
copy_alloc=$(($(stat -c %b "$WORK/copy.raw") * 512))
rm -f "$WORK/copy.raw"
mismatch=$(ctl check >/dev/null && ctl wait >/dev/null && ctl status --json | jq '.[0].last_check.mismatch_cnt')
stop

# 2. Full: FULL members written from end to end, the same rebuild.
start 2 "$FULL"
full_size=$(nbdinfo --size "$URI")
step=$((256 << 20))
for ((at = 0; at < full_size; at += step)); do
  n=$((full_size - at < step ? full_size - at : step))
  qemu-io -f raw "$URI" -c "write -P 0x55 $at $n" >/dev/null
done
read -r full_secs full_copied _ <<<"$(rebuild)"
stop

awk -v size="$size" -v data="$data" -v ss="$sparse_secs" -v copied="$copied" -v holes="$holes" \
  -v cs="$copy_secs" -v calloc="$copy_alloc" -v ms="$map_secs" -v mext="$map_extents" -v fs="$full_secs" -v fcopied="$full_copied" \
  -v member="$(numfmt --from=iec "$SIZE")" -v mismatch="$mismatch" 'BEGIN {
  full_rate = fcopied / fs
  printf "sparse RAID5 4 x %d GiB holding %d MiB (array %d GiB):\n", member / 2^30, data / 2^20, size / 2^30
  printf "  nbdinfo --map of the array: %.2f s, %d extents\n", ms, mext
  printf "  rebuild of one member: %.1f s, %d MiB copied, %.1f GiB left holes; check after: mismatch_cnt %d\n",
    ss, copied / 2^20, holes / 2^30, mismatch
  printf "  nbdcopy of the array to a file: %.1f s, %d MiB allocated\n", cs, calloc / 2^20
  printf "full copy (members full of data): rebuild at %.1f MB/s (%d MiB in %.1f s)\n", full_rate / 1e6, fcopied / 2^20, fs
  printf "  a full copy of a %d GiB member at that rate: %.0f s; md at its 200 MB/s ceiling: %.0f s\n",
    member / 2^30, member / full_rate, member / 200e6
  printf "ratio: sparse rebuild / full copy at our rate = %.4f; / md at 200 MB/s = %.4f\n",
    ss / (member / full_rate), ss / (member / 200e6) }'
