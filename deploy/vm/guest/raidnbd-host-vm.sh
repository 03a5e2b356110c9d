#!/bin/sh
# The VM-rig use: raidnbd on the host's 127.0.0.1 serves a RAID5 of image files, qemu is the NBD client.
# raidnbd creates a RAID5 (64 KiB chunk) over four host image files and serves it on the host's
# 127.0.0.1; qemu attaches it with -drive file=nbd://127.0.0.1:PORT/vm,format=raw (a virtio disk)
# (the guest has no network device) and the guest sees /dev/vda: mkfs.ext4, files, e2fsck -fn,
# remount and verify, whole-device digest into the results. After the guest passes, the host
# (host/raidnbd-host-verify.sh) checks the images offline with `raidnbd check` (0 mismatches),
# serves them read-only again and reads the export with qemu-img: same digest as the guest saw,
# and e2fsck -fn on the host is clean.
# rig-status: enabled
# rig-needs: raidnbd
# rig-host-images: 4x32M
# rig-host-pre: {raidnbd} create --level 5 --chunk 64K {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-host-server: {raidnbd} serve --listen 127.0.0.1:{port} --export vm --control {workdir}/control.sock {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-nbd-drive: nbd://127.0.0.1:{port}/vm
# rig-host-post: {repo}/deploy/vm/host/raidnbd-host-verify.sh {raidnbd} {results} {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-timeout: 300
. /guest/lib.sh

step "nbd drive is /dev/vda"
expect_eq "$(cat /sys/block/vda/serial)" rig-n0 "serial of vda"
# RAID5 of 4 x 32 MiB: 3 members of data less md metadata.
[ "$(size_bytes /dev/vda)" -ge $((90 * 1024 * 1024)) ] || fail "/dev/vda is only $(size_bytes /dev/vda) bytes"

step "mkfs.ext4, mount, write 16 files, umount, fsck"
mkfs_ext4 /dev/vda
run mount -t ext4 /dev/vda /mnt
fill_tree /mnt 16 1024 /tmp/files.md5
run umount /mnt
fsck_clean /dev/vda

step "remount and verify, digest"
drop_caches
run mount -t ext4 -o ro /dev/vda /mnt
verify_tree /mnt /tmp/files.md5
run umount /mnt
dev_digest /dev/vda > "$RIG_RESULTS/vda.md5"
echo "ok: digest of /dev/vda $(cat "$RIG_RESULTS/vda.md5") ($(size_bytes /dev/vda) bytes)"
sync
