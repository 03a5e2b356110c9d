#!/bin/sh
# raidnbd serving arrays that mdadm made (PENDING until the raidnbd binary exists; enable by
# changing the rig-status line). For each line of ARRAYS: zero the members, mdadm --create
# --metadata=1.2 --assume-clean, ext4 + files through /dev/md0, whole-device sha256, stop md; then
# raidnbd serve the same members, nbd-client -C 2, and /dev/nbd0 must have md0's size and sha256,
# a clean fsck and the same files; for redundant levels again with the last member left out.
# rig-status: pending
# rig-needs: raidnbd
# rig-disks: 5x16M 24M
# rig-timeout: 900
. /guest/lib.sh
PORT=10809
EXPORT=md
SERVER_PID=""
start_server() { # MEMBER...
  echo "+ [$(rig_now)] raidnbd serve --listen 127.0.0.1:$PORT --export $EXPORT $*"
  raidnbd serve --listen 127.0.0.1:$PORT --export $EXPORT "$@" >> /tmp/raidnbd.log 2>&1 &
  SERVER_PID=$!
  wait_listen $PORT
}
stop_server() { kill "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=""; }
rig_debug() { echo "-- raidnbd log:"; tail -n 60 /tmp/raidnbd.log 2>/dev/null; }

# name | member disk indexes | mdadm options | 1 = also serve degraded
ARRAYS="
raid0-zones|0 1 5|--level=0 --chunk=64 --raid-devices=3|0
raid1|0 1|--level=1 --raid-devices=2|1
raid5-ls|0 1 2 3|--level=5 --layout=left-symmetric --chunk=64 --raid-devices=4|1
raid5-la|0 1 2|--level=5 --layout=left-asymmetric --chunk=32 --raid-devices=3|1
raid5-rs|0 1 2 3 4|--level=5 --layout=right-symmetric --chunk=64 --raid-devices=5|1
raid5-ra|0 1 2 3|--level=5 --layout=right-asymmetric --chunk=128 --raid-devices=4|1
raid6-ls|0 1 2 3|--level=6 --layout=left-symmetric --chunk=64 --raid-devices=4|1
raid6-ra|0 1 2 3 4|--level=6 --layout=right-asymmetric --chunk=32 --raid-devices=5|1
raid10-n2|0 1 2 3|--level=10 --layout=n2 --chunk=64 --raid-devices=4|1
raid10-n2-odd|0 1 2|--level=10 --layout=n2 --chunk=64 --raid-devices=3|1
raid10-f2|0 1 2 3|--level=10 --layout=f2 --chunk=64 --raid-devices=4|1
raid10-o2|0 1 2|--level=10 --layout=o2 --chunk=64 --raid-devices=3|1
"
run modprobe nbd nbds_max=4
while IFS='|' read -r name idx opts degraded; do
  [ -n "$name" ] || continue
  members=""
  for i in $idx; do members="$members $(disk "$i")"; done
  last=${members##* }

  step "$name: mdadm --create, ext4, fill"
  for m in $members; do blkdiscard "$m" 2>/dev/null || dd if=/dev/zero of="$m" bs=1M status=none 2>/dev/null || true; done
  run sh -c "mdadm --create /dev/md0 --metadata=1.2 --run --assume-clean --homehost=rig --name=$name $opts$members" < /dev/null
  mkfs_ext4 /dev/md0
  run mount -t ext4 /dev/md0 /mnt
  fill_tree /mnt 8 512 /tmp/files.sha256
  run umount /mnt
  MD_SHA=$(dev_sha256 /dev/md0)
  MD_SIZE=$(size_bytes /dev/md0)
  run mdadm --stop /dev/md0

  step "$name: raidnbd serve, compare through /dev/nbd0"
  start_server $members
  nbd_attach $PORT /dev/nbd0 $EXPORT 2
  expect_eq "$(size_bytes /dev/nbd0)" "$MD_SIZE" "$name: nbd0 size vs md0"
  expect_eq "$(dev_sha256 /dev/nbd0)" "$MD_SHA" "$name: sha256 of nbd0 vs md0"
  fsck_clean /dev/nbd0
  run mount -t ext4 -o ro /dev/nbd0 /mnt
  verify_tree /mnt /tmp/files.sha256
  run umount /mnt
  nbd_detach /dev/nbd0
  stop_server

  if [ "$degraded" = 1 ]; then
    step "$name: raidnbd serve without $last"
    start_server ${members% *}
    nbd_attach $PORT /dev/nbd0 $EXPORT 2
    expect_eq "$(dev_sha256 /dev/nbd0)" "$MD_SHA" "$name: sha256 of degraded nbd0 vs md0"
    nbd_detach /dev/nbd0
    stop_server
  fi
  for m in $members; do mdadm --zero-superblock "$m"; done
done <<LIST
$ARRAYS
LIST
