#!/bin/sh
# Rig self-check (no raidnbd), the kernel-client path: Debian's nbd-server inside the
# guest exports /dev/vda on 127.0.0.1:10809 as "standin"; the kernel client (nbd.ko via
# nbd-client, 2 connections: nbd-server advertises CAN_MULTI_CONN) attaches /dev/nbd0; ext4 is
# made, filled, checked through NBD, then checked again on the backing disk itself.
# rig-status: manual
# rig-disks: 128M
# rig-timeout: 300
. /guest/lib.sh
PORT=10809
rig_debug() { cat /tmp/nbd-server.log 2>/dev/null; ps; }

step "modprobe nbd"
run modprobe nbd nbds_max=4
[ -b /dev/nbd0 ] || fail "/dev/nbd0 missing after modprobe nbd"
grep -q '^nbd ' /proc/modules || fail "nbd not in /proc/modules"

step "nbd-server on 127.0.0.1:$PORT"
command -v nbd-server >/dev/null || fail "nbd-server is not in the initramfs: apt-get install nbd-server on the host"
cat > /etc/nbd-server/config <<CFG
[generic]
  listenaddr = 127.0.0.1
  port = $PORT
[standin]
  exportname = /dev/vda
  flush = true
  fua = true
  trim = true
CFG
run nbd-server -C /etc/nbd-server/config > /tmp/nbd-server.log 2>&1
wait_listen $PORT

step "nbd-client attach (-N standin -b 4096 -C 2)"
nbd_attach $PORT /dev/nbd0 standin 2
expect_eq "$(size_bytes /dev/nbd0)" "$(size_bytes /dev/vda)" "size of /dev/nbd0"
expect_eq "$(cat /sys/block/nbd0/queue/logical_block_size)" 4096 "nbd0 logical block size"

step "mkfs.ext4 on /dev/nbd0"
mkfs_ext4 /dev/nbd0

step "mount, write 24 files, umount"
run mount -t ext4 /dev/nbd0 /mnt
fill_tree /mnt 24 1024 /tmp/files.md5
cp /tmp/files.md5 "$RIG_RESULTS/standin-nbd.md5"
run umount /mnt

step "e2fsck -fn /dev/nbd0"
fsck_clean /dev/nbd0

step "remount through NBD and verify"
drop_caches
run mount -t ext4 -o ro /dev/nbd0 /mnt
verify_tree /mnt /tmp/files.md5
run umount /mnt
NBD_SUM=$(dev_digest /dev/nbd0)

step "disconnect"
nbd_detach /dev/nbd0
expect_eq "$(cat /sys/block/nbd0/size)" 0 "nbd0 size after disconnect"

step "verify on the backing disk /dev/vda"
drop_caches
expect_eq "$(dev_digest /dev/vda)" "$NBD_SUM" "digest of /dev/vda vs /dev/nbd0"
fsck_clean /dev/vda
run mount -t ext4 -o ro /dev/vda /mnt
verify_tree /mnt /tmp/files.md5
run umount /mnt
