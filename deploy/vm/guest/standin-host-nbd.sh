#!/bin/sh
# Rig self-check (no raidnbd), "VM-rig use" mode: an NBD server on the HOST's 127.0.0.1 (stand-in: nbdkit's
# file plugin over a host image) and qemu itself as the NBD client (-drive file=nbd://...); the
# guest, which has no network device, sees the export as /dev/vda. ext4 is made, filled and
# checked in the guest; the host then runs e2fsck -fn on the image the server wrote.
# rig-status: manual
# rig-host-images: 256M
# rig-host-server: nbdkit --foreground --ipaddr 127.0.0.1 --port {port} file {workdir}/h0.img
# rig-nbd-drive: nbd://127.0.0.1:{port}/standin
# rig-host-post: e2fsck -fn {workdir}/h0.img
# rig-timeout: 300
. /guest/lib.sh

step "nbd drive is /dev/vda"
expect_eq "$(cat /sys/block/vda/serial)" rig-n0 "serial of vda"
expect_eq "$(size_bytes /dev/vda)" $((256 * 1024 * 1024)) "size of /dev/vda"

step "mkfs.ext4 on /dev/vda"
mkfs_ext4 /dev/vda

step "mount, write 16 files, umount, fsck"
run mount -t ext4 /dev/vda /mnt
fill_tree /mnt 16 1024 /tmp/files.md5
run umount /mnt
fsck_clean /dev/vda

step "remount and verify"
drop_caches
run mount -t ext4 -o ro /dev/vda /mnt
verify_tree /mnt /tmp/files.md5
run umount /mnt
sync
