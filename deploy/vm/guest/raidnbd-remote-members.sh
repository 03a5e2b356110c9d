#!/bin/sh
# Network RAID in the guest: the kernel client over an array whose members are NBD exports.
# Four member servers on the guest's loopback (the guest has no network device; each is a
# `raidnbd serve` of a one-member linear array of a tmpfs file, ports 10811-10814), and the
# array server: raidnbd serve of a RAID5 over nbd://127.0.0.1:10811/ ... 10814/ (raidnbd
# create writes the superblocks through NBD):
#  1. nbd-client -C 2 attaches /dev/nbd0: mkfs.ext4, files, e2fsck clean, digest;
#  2. one member server is killed (SIGKILL) and restarted within --member-timeout: the array
#     reconnects (logged), nothing fails; files, fsck and digest the same;
#  3. an orderly stop; a new array server over the same member URIs: same digest and files.
# rig-status: enabled
# rig-needs: raidnbd
# rig-timeout: 600
. /guest/lib.sh
S=/shm
M=/mnt
rig_debug() {
  echo "-- array server log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null
  for p in 1 2 3 4; do echo "-- member server 1081$p:"; tail -n 5 "/tmp/member$p.log" 2>/dev/null; done
}
member_serve() { # N: serve /shm/mN.img as nbd://127.0.0.1:1081N/ in the background
  raidnbd serve --listen "127.0.0.1:1081$1" --control "/run/member$1.sock" "$S/m$1.img" >> "/tmp/member$1.log" 2>&1 &
  eval "MEMBER_PID_$1=$!"
  wait_listen "1081$1"
}
URIS="nbd://127.0.0.1:10811/ nbd://127.0.0.1:10812/ nbd://127.0.0.1:10813/ nbd://127.0.0.1:10814/"

step "four member servers (raidnbd linear arrays of tmpfs files), raidnbd create --level 5 over NBD"
run modprobe nbd nbds_max=4
mkdir -p "$S" "$M"
run mount -t tmpfs -o size=200M tmpfs "$S"
for n in 1 2 3 4; do
  run truncate -s 40M "$S/m$n.img"
  run raidnbd create --level linear "$S/m$n.img"
  member_serve "$n"
done
# shellcheck disable=SC2086
run raidnbd create --level 5 --chunk 64K $URIS

step "serve over the remote members, nbd-client -C 2, mkfs.ext4, files, fsck"
# shellcheck disable=SC2086
raidnbd_serve --member-timeout 20 $URIS
raidnbd_last_log | contains "NBD member connected" || fail "the array server did not connect its members"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 "$M"
fill_tree "$M/r1" 12 512 /tmp/r1.md5
run umount "$M"
fsck_clean /dev/nbd0
D1=$(dev_digest /dev/nbd0)

step "a member server dies and comes back within --member-timeout: reconnected, nothing fails"
eval "kill -KILL \$MEMBER_PID_3"
eval "wait \$MEMBER_PID_3" 2>/dev/null || true
member_serve 3
run mount -t ext4 /dev/nbd0 "$M"
fill_tree "$M/r2" 8 512 /tmp/r2.md5
run umount "$M"
drop_caches
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/r1" /tmp/r1.md5
verify_tree "$M/r2" /tmp/r2.md5
run umount "$M"
fsck_clean /dev/nbd0
raidnbd_last_log | contains "reconnected" || fail "the array server did not reconnect to the restarted member"
if raidnbd_last_log | contains "the member fails"; then fail "a member failed although its server came back in time"; fi
D2=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop

step "a new array server over the same member URIs: same digest and files"
# shellcheck disable=SC2086
raidnbd_serve $URIS
raidnbd_last_log | contains "clean" || fail "the array was not clean after the orderly stop"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(dev_digest /dev/nbd0)" "$D2" "digest after a new array server"
run mount -t ext4 -o ro /dev/nbd0 "$M"
verify_tree "$M/r1" /tmp/r1.md5
verify_tree "$M/r2" /tmp/r2.md5
run umount "$M"
nbd_detach /dev/nbd0
raidnbd_stop
[ "$D1" != "$D2" ] || fail "the new files did not change the digest"
