#!/bin/sh
# A restart of raidnbd is not an outage for qemu: a disk with reconnect-delay rides through a stop and a crash of the server.
# raidnbd creates a RAID5 (64 KiB chunk) over four host image files and serves it on the host's
# 127.0.0.1 (host/raidnbd-restarting-server.sh); qemu attaches it as a virtio disk through its
# NBD client with reconnect-delay=60 (-drive file=nbd://127.0.0.1:PORT/vm,file.reconnect-delay=60).
# The guest makes ext4 on /dev/vda and runs the background writer (40 slot files of 256 KiB
# rewritten in place with fsync, md5 of each) for 200 writes (50 MiB), while the host server
# restarts raidnbd twice under them: after 16 MiB of writes (mkfs included) SIGTERM (exit 0) and a
# new server 2 s later, after 8 MiB more SIGKILL (a crash) and a new server. Every file matches after a remount,
# e2fsck -fn is clean, the guest's kernel log has no I/O error (virtio or ext4). The host then
# checks that both restarts happened, `raidnbd check` finds 0 mismatches, and the export read
# again with qemu-img has the guest's digest (host/raidnbd-host-verify.sh).
# rig-status: enabled
# rig-needs: raidnbd
# rig-host-images: 4x32M
# rig-host-pre: {raidnbd} create --level 5 --chunk 64K {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-host-server: {repo}/deploy/vm/host/raidnbd-restarting-server.sh {raidnbd} {workdir} {port} {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-nbd-drive: nbd://127.0.0.1:{port}/vm,file.reconnect-delay=60
# rig-host-post: test "$(cat {workdir}/restarts)" = 2 || { echo "the host server restarted raidnbd $(cat {workdir}/restarts) times, not 2"; exit 1; }
# rig-host-post: {repo}/deploy/vm/host/raidnbd-host-verify.sh {raidnbd} {results} {workdir}/h0.img {workdir}/h1.img {workdir}/h2.img {workdir}/h3.img
# rig-timeout: 600
. /guest/lib.sh
M=/mnt
rig_debug() { writer_debug; dmesg | tail -n 30; }

step "nbd drive is /dev/vda: mkfs.ext4, mount"
expect_eq "$(cat /sys/block/vda/serial)" rig-n0 "serial of vda"
mkfs_ext4 /dev/vda
run mount -t ext4 /dev/vda $M
dmesg -c > /dev/null # from here on, the kernel log must stay free of I/O errors

step "writer: 200 writes while the host restarts raidnbd twice"
writer_start $M/w
wait_writes 200

step "stop the writer, verify, remount, fsck, kernel log, digest"
writer_stop
verify_writer
run umount $M
drop_caches
run mount -t ext4 -o ro /dev/vda $M
verify_writer
run umount $M
fsck_clean /dev/vda
ERRORS=$(dmesg | grep -E 'I/O error|Buffer I/O|EXT4-fs (error|warning)|blk_update_request|critical (medium|target)' || true)
[ -z "$ERRORS" ] || fail "the kernel logged I/O errors across the restarts: $ERRORS"
echo "ok: no I/O error in the kernel log"
dev_digest /dev/vda > "$RIG_RESULTS/vda.md5"
echo "ok: digest of /dev/vda $(cat "$RIG_RESULTS/vda.md5")"
sync
