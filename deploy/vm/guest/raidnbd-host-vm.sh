#!/bin/sh
# "VM-rig use" with raidnbd (PENDING until the raidnbd binary exists; enable by changing the
# rig-status line): raidnbd creates a RAID5 over four host image files and serves it on the host's
# 127.0.0.1; qemu is the NBD client (-drive file=nbd://...), the guest (no network device) sees
# /dev/vda and runs mkfs.ext4, fills it, runs e2fsck -fn and verifies the files after a remount.
# rig-status: pending
# rig-needs: raidnbd
# rig-host-images: 4x64M
# rig-host-pre: {raidnbd} create --level 5 --chunk 64K {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-host-server: {raidnbd} serve --listen 127.0.0.1:{port} --export vm {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-nbd-drive: nbd://127.0.0.1:{port}/vm
# rig-timeout: 300
. /guest/lib.sh

step "nbd drive is /dev/vda"
expect_eq "$(cat /sys/block/vda/serial)" rig-n0 "serial of vda"
# RAID5 of 4 x 64 MiB: 3 members of data less md metadata.
[ "$(size_bytes /dev/vda)" -gt $((160 * 1024 * 1024)) ] || fail "/dev/vda is only $(size_bytes /dev/vda) bytes"

step "mkfs.ext4, mount, write 16 files, umount, fsck"
mkfs_ext4 /dev/vda
run mount -t ext4 /dev/vda /mnt
fill_tree /mnt 16 1024 /tmp/files.sha256
run umount /mnt
fsck_clean /dev/vda

step "remount and verify"
drop_caches
run mount -t ext4 -o ro /dev/vda /mnt
verify_tree /mnt /tmp/files.sha256
run umount /mnt
sync
