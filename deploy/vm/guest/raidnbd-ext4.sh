#!/bin/sh
# raidnbd with the real kernel client (PENDING until the raidnbd binary exists: `rig-status:
# pending` keeps run-all.sh from running it by default; enable it by changing that line).
# raidnbd creates a RAID5 (64 KiB chunk) on four virtio disks and serves it on 127.0.0.1:10809;
# nbd-client attaches /dev/nbd0 with 2 connections; ext4 is made, filled, fsck'ed. Then:
#  - mdadm --assemble of the same members must show the same bytes (whole-device sha256), a clean
#    fsck, the same files and a zero parity mismatch count (md's own check of raidnbd's parity);
#  - raidnbd restarts degraded (3 of 4 members), serves the same bytes, accepts new files;
#  - mdadm assembles that degraded array (the left-out member is stale), sees every file, and
#    re-adds the member; after md's recovery the parity check is clean again.
# rig-status: pending
# rig-needs: raidnbd
# rig-disks: 4x64M
# rig-timeout: 600
. /guest/lib.sh
PORT=10809
EXPORT=rig
MEMBERS="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
# How raidnbd is told a member is missing is raidnbd's CLI; here the member is simply left out.
DEGRADED_MEMBERS="/dev/vda /dev/vdb /dev/vdc"
SERVER_PID=""
start_server() { # MEMBER...
  echo "+ [$(rig_now)] raidnbd serve --listen 127.0.0.1:$PORT --export $EXPORT $*"
  raidnbd serve --listen 127.0.0.1:$PORT --export $EXPORT "$@" >> /tmp/raidnbd.log 2>&1 &
  SERVER_PID=$!
  wait_listen $PORT
}
stop_server() {
  kill "$SERVER_PID"
  wait "$SERVER_PID" || true
  SERVER_PID=""
}
rig_debug() { echo "-- raidnbd log:"; tail -n 60 /tmp/raidnbd.log 2>/dev/null; mdadm --examine /dev/vda 2>&1; }

step "raidnbd create --level 5 --chunk 64K"
run raidnbd create --level 5 --chunk 64K $MEMBERS
mdadm --examine /dev/vda | grep -q 'Raid Level : raid5' || fail "mdadm --examine does not see a raid5 member"

step "raidnbd serve + nbd-client -C 2"
run modprobe nbd nbds_max=4
start_server $MEMBERS
nbd_attach $PORT /dev/nbd0 $EXPORT 2

step "mkfs.ext4, mount, write 24 files, umount, fsck"
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 /mnt
fill_tree /mnt 24 1024 /tmp/files.sha256
run umount /mnt
fsck_clean /dev/nbd0
drop_caches
NBD_SHA=$(dev_sha256 /dev/nbd0)
NBD_SIZE=$(size_bytes /dev/nbd0)

step "remount through NBD and verify, disconnect"
run mount -t ext4 -o ro /dev/nbd0 /mnt
verify_tree /mnt /tmp/files.sha256
run umount /mnt
nbd_detach /dev/nbd0
stop_server

step "mdadm --assemble of the raidnbd array"
run mdadm --assemble /dev/md0 $MEMBERS
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "degraded members"
expect_eq "$(size_bytes /dev/md0)" "$NBD_SIZE" "md0 size vs nbd0 size"
expect_eq "$(dev_sha256 /dev/md0)" "$NBD_SHA" "sha256 of md0 vs nbd0"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 /mnt
verify_tree /mnt /tmp/files.sha256
run umount /mnt
echo check > /sys/block/md0/md/sync_action
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/mismatch_cnt)" 0 "md parity mismatch_cnt of raidnbd's array"
run mdadm --stop /dev/md0

step "raidnbd degraded restart (3 of 4)"
start_server $DEGRADED_MEMBERS
nbd_attach $PORT /dev/nbd0 $EXPORT 2
expect_eq "$(dev_sha256 /dev/nbd0)" "$NBD_SHA" "sha256 of degraded nbd0"
fsck_clean /dev/nbd0
run mount -t ext4 /dev/nbd0 /mnt
verify_tree /mnt /tmp/files.sha256
mkdir /mnt/degraded
fill_tree /mnt/degraded 6 512 /tmp/degraded.sha256
run umount /mnt
fsck_clean /dev/nbd0
nbd_detach /dev/nbd0
stop_server

step "mdadm assembles the degraded array, re-adds the member"
run mdadm --assemble --run /dev/md0 $MEMBERS || true
[ -b /dev/md0 ] && [ "$(cat /sys/block/md0/md/array_state)" != inactive ] || fail "mdadm did not start md0"
expect_eq "$(cat /sys/block/md0/md/degraded)" 1 "degraded members (left-out member is stale)"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 /mnt
verify_tree /mnt /tmp/files.sha256
verify_tree /mnt/degraded /tmp/degraded.sha256
run umount /mnt
run mdadm /dev/md0 --add /dev/vdd
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "degraded members after recovery"
echo check > /sys/block/md0/md/sync_action
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/mismatch_cnt)" 0 "mismatch_cnt after recovery"
run mdadm --stop /dev/md0
