#!/bin/sh
# Full-stripe gathering under the kernel client's own request sizes: ext4 on /dev/nbd0 over a
# RAID5 of 4 tmpfs members throttled like small cloud volumes (serve --member-bw 20M
# --member-iops 200), 512K chunk, a 48 MiB file written with dd (page cache, then fsync):
#  1. gathering off (--write-gather-us 0): dd's time; no write gathered;
#  2. gathering on (serve's default): the same dd; `ctl status` counts the gathered writes
#     (asserted > 0); both times and their ratio are printed (a measurement, not asserted:
#     the guest runs under TCG);
#  3. the files read back right and e2fsck is clean after each.
# rig-status: enabled
# rig-needs: raidnbd
# rig-timeout: 600
. /guest/lib.sh
S=/shm
M=/mnt
rig_debug() { echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null; }
MEMBERS="$S/m0.img $S/m1.img $S/m2.img $S/m3.img"
THROTTLE="--member-bw 20M --member-iops 200"

step "RAID5 of 4 tmpfs members, 512K chunk"
run modprobe nbd nbds_max=2
mkdir -p "$S" "$M"
run mount -t tmpfs -o size=400M tmpfs "$S"
# shellcheck disable=SC2086
run raidnbd create --level 5 --chunk 512K --size 80M $MEMBERS
run dd if=/dev/urandom of=/tmp/big bs=1M count=48 status=none
BIG_MD5=$(md5sum < /tmp/big)

dd_seconds() { # FILE: copy /tmp/big to FILE on the mounted array with fsync; print the seconds
  ds_t0=$(rig_now)
  dd if=/tmp/big of="$1" bs=1M conv=fsync status=none || fail "dd to $1"
  rig_elapsed "$ds_t0"
}

for mode in off on; do
  step "gathering $mode: ext4, dd of 48 MiB, fsck"
  if [ "$mode" = off ]; then GATHER="--write-gather-us 0"; else GATHER=""; fi
  # shellcheck disable=SC2086
  raidnbd_serve $THROTTLE $GATHER $MEMBERS
  nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
  mkfs_ext4 /dev/nbd0
  run mount -t ext4 /dev/nbd0 "$M"
  secs=$(dd_seconds "$M/big")
  echo "ok: gathering $mode: 48 MiB in $secs s"
  eval "SECS_$mode=$secs"
  run umount "$M"
  fsck_clean /dev/nbd0
  drop_caches
  run mount -t ext4 -o ro /dev/nbd0 "$M"
  expect_eq "$(md5sum < "$M/big")" "$BIG_MD5" "the file written with gathering $mode"
  run umount "$M"
  raidnbd_status_json > /dev/null
  gathered=$(json_number gathered_writes /tmp/raidnbd-status.json)
  echo "ok: gathering $mode: $gathered writes gathered"
  if [ "$mode" = off ]; then
    expect_eq "$gathered" 0 "gathered writes with gathering off"
  else
    [ "${gathered:-0}" -gt 0 ] || fail "no write was gathered"
  fi
  nbd_detach /dev/nbd0
  raidnbd_stop
done
# shellcheck disable=SC2154
echo "ok: dd of 48 MiB to ext4 on a throttled RAID5: $SECS_off s without gathering, $SECS_on s with" \
  "($(awk -v a="$SECS_off" -v b="$SECS_on" 'BEGIN{printf "%.2f", a / b}')x)"
