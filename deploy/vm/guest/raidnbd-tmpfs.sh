#!/bin/sh
# Members that are files in memory: the kernel NBD client and ext4 over reads sent from the member files
# and writes received straight into the member files.
# raidnbd serves a RAID1 of two 32 MiB files on a guest tmpfs; reads of 128 KiB and more are answered
# from the member files in place (their pages go to the socket from the files' mappings), which the
# export's metrics count (busybox wget of --metrics):
#  1. create, serve, nbd-client -C 2; mkfs.ext4, files, fsck clean; a whole-device digest with
#     1 MiB O_DIRECT reads: the in-place counter grew by at least the device size;
#  2. `ctl fail` of m0 (its file keeps the old data): new files; after dropping caches every
#     file matches, fsck is clean, two digests agree and were read in place (from m1 only);
#  3. a spare is added and rebuilt slowly (`ctl rebuild-speed 128K`): while it recovers (its file is
#     zeros beyond the recovery point) the digest and every file are still right;
#  4. after the rebuild and an orderly stop, `raidnbd check` of m1 + spare: 0 mismatches;
#  5. a RAID0 of two new tmpfs files: the kernel client's 128 KiB writes (mkfs.ext4, files, a
#     whole-device O_DIRECT overwrite) are received into the member files (the write in-place
#     counter grew by at least half the overwrite); files, fsck and digests right, also after
#     an orderly stop and a new server.
# rig-status: enabled
# rig-needs: raidnbd
# rig-timeout: 600
. /guest/lib.sh
S=/shm
M=/mnt
METRICS=127.0.0.1:9109
rig_debug() {
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null
}

step "tmpfs members, raidnbd create --level 1, modprobe nbd"
run modprobe nbd nbds_max=4
mkdir -p "$S" "$M"
run mount -t tmpfs -o size=160M tmpfs "$S"
for f in m0 m1 spare; do run truncate -s 32M "$S/$f.img"; done
run raidnbd create --level 1 "$S/m0.img" "$S/m1.img"

step "serve, nbd-client -C 2, mkfs.ext4, files, fsck, digest read in place"
raidnbd_serve --metrics "$METRICS" "$S/m0.img" "$S/m1.img"
raidnbd_last_log | contains "engine.*inline" || fail "tmpfs members must run on the inline engine"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
# Requests of 128 KiB and more are read in place: the kernel sends up to max_sectors_kb (128 by
# default), so whole-device O_DIRECT reads and readahead qualify.
echo "nbd0 queue: max_sectors_kb $(cat /sys/block/nbd0/queue/max_sectors_kb)"
SIZE=$(size_bytes /dev/nbd0)
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 "$M"
fill_tree "$M/s1" 12 512 /tmp/s1.md5
run umount "$M"
fsck_clean /dev/nbd0
before=$(in_place_bytes)
D1=$(dev_digest /dev/nbd0)
grep '^raidnbd_export_request' /tmp/metrics.txt | grep 'command="read"' | grep -v bucket | head -n 4
expect_grew "$before" "$(in_place_bytes)" "$SIZE" "digest D1"

step "ctl fail m0, new files, verify from m1"
run raidnbd_ctl fail "$S/m0.img"
expect_eq "$(raidnbd_role_state "$S/m0.img")" faulty "state of m0 after ctl fail"
run mount -t ext4 /dev/nbd0 "$M"
fill_tree "$M/s2" 12 512 /tmp/s2.md5
run umount "$M"
drop_caches
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/s1" /tmp/s1.md5
verify_tree "$M/s2" /tmp/s2.md5
run umount "$M"
fsck_clean /dev/nbd0
before=$(in_place_bytes)
D2=$(dev_digest /dev/nbd0)
[ "$D2" != "$D1" ] || fail "the new files did not change the digest"
expect_eq "$(dev_digest /dev/nbd0)" "$D2" "second digest while degraded"
expect_grew "$before" "$(in_place_bytes)" $((2 * SIZE)) "two digests while degraded"

step "add a spare, reads while it recovers slowly"
# 128 KiB/s: the 31 MiB rebuild outlasts the reads below by minutes, even under TCG.
run raidnbd_ctl rebuild-speed 128K 128K
run raidnbd_ctl remove "$S/m0.img"
run raidnbd_ctl add "$S/spare.img"
n=0 # the worker assigns the spare and starts the recovery asynchronously
until [ "$(raidnbd_role_state "$S/spare.img")" = recovering ]; do
  n=$((n + 1)); [ "$n" -le 50 ] || { raidnbd_ctl status; fail "the spare is not recovering 10 s after ctl add"; }
  sleep 0.2
done
echo "ok: the spare is recovering"
expect_eq "$(dev_digest /dev/nbd0)" "$D2" "digest while recovering"
drop_caches
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/s1" /tmp/s1.md5
verify_tree "$M/s2" /tmp/s2.md5
run umount "$M"
expect_eq "$(raidnbd_role_state "$S/spare.img")" recovering "state of the spare after the reads"

step "rebuild to the end, orderly stop, raidnbd check"
run raidnbd_ctl rebuild-speed 100M 1G
raidnbd_wait_idle 300
expect_eq "$(dev_digest /dev/nbd0)" "$D2" "digest after the rebuild"
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check "$S/m1.img" "$S/spare.img" || fail "raidnbd check found mismatches (rc=$?)"
echo "ok: raidnbd check of m1 + spare clean"

step "RAID0 of two tmpfs files: writes received into the member files"
run rm "$S/m0.img" # failed and removed above; makes room on the tmpfs
for f in r0 r1; do run truncate -s 32M "$S/$f.img"; done
run raidnbd create --level 0 --chunk 64K "$S/r0.img" "$S/r1.img"
raidnbd_serve --metrics "$METRICS" "$S/r0.img" "$S/r1.img"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
SIZE=$(size_bytes /dev/nbd0)
before=$(in_place_bytes write)
run dd if=/dev/urandom of=/tmp/pattern bs=1M count=$((SIZE / 1048576 + 1)) status=none
# 1 MiB O_DIRECT writes reach the server as 128 KiB requests; one whose payload came in with
# its header is taken from the read buffer instead, so most, not all, go in place.
fill_dev /dev/nbd0 /tmp/pattern
expect_grew "$before" "$(in_place_bytes write)" $((SIZE / 2)) "whole-device O_DIRECT overwrite"
D3=$(dev_digest /dev/nbd0)
expect_eq "$D3" "$(head -c "$SIZE" /tmp/pattern | md5sum | cut -d' ' -f1)" "digest of the overwritten device"
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 "$M"
fill_tree "$M/s3" 12 512 /tmp/s3.md5
run umount "$M"
fsck_clean /dev/nbd0
drop_caches
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/s3" /tmp/s3.md5
run umount "$M"
D4=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop

step "a new server over the same RAID0 reads what was received in place"
raidnbd_serve "$S/r0.img" "$S/r1.img"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(dev_digest /dev/nbd0)" "$D4" "digest after restart"
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/s3" /tmp/s3.md5
run umount "$M"
fsck_clean /dev/nbd0
nbd_detach /dev/nbd0
raidnbd_stop
