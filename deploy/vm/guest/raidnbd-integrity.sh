#!/bin/sh
# Checksums (create --integrity crc32c) with the kernel: md assembles an array with them and
# ignores them; raidnbd notices that md wrote it and stamps them again; wrong bytes put on a
# member behind raidnbd's back are never served and are healed, so md's own check agrees.
#  1. raidnbd create --level 5 --integrity crc32c (4 x 32 MiB); serve; nbd-client; mkfs.ext4,
#     files, fsck; orderly stop;
#  2. mdadm --assemble: the same files, md check mismatch_cnt 0; md writes more files; stop;
#  3. raidnbd serves it again: logs that the array was written without it, checks it on its
#     own (ctl status: no checksum untrusted after, none reported wrong); every file right;
#  4. orderly stop; bytes flipped in member 2's data area (dd); raidnbd serves: every file
#     right (dropped caches), ctl check: member 2 named and healed, other members not;
#     orderly stop; mdadm --assemble: md check mismatch_cnt 0, fsck clean, files right.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 4x32M
# rig-timeout: 900
. /guest/lib.sh
ALL="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
M=/mnt/a
rig_debug() { echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null; }
attach() { nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2; }
role_field() { # MEMBER KEY: KEY's number in the integrity object of MEMBER's role (ctl status --json;
  # keys are sorted, so a role's "integrity" comes before its "member")
  raidnbd_ctl status --json | awk -v m="\"$1\"" -v k="\"$2\":" '$1 == k {v = $2; gsub(/[^0-9]/, "", v)} $1 == "\"member\":" && $2 == m"," && !done {print v; done=1}'
}
run mkdir -p $M
run modprobe nbd nbds_max=4

step "1. raidnbd create --integrity, ext4, files"
run raidnbd create --level 5 --integrity crc32c --consistency-policy resync --chunk 64K $ALL
raidnbd_serve $ALL
raidnbd_wait_idle
attach
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 $M
fill_tree $M/one 24 256 /tmp/one.md5
run umount $M
fsck_clean /dev/nbd0
nbd_detach /dev/nbd0
raidnbd_stop

step "2. mdadm assembles it (and ignores the checksums); md writes files"
run mdadm --assemble /dev/md0 $ALL
run mount -t ext4 /dev/md0 $M
verify_tree $M/one /tmp/one.md5
fill_tree $M/two 24 256 /tmp/two.md5
run umount $M
md_check_clean /dev/md0 "md check of raidnbd's array with checksums"
run mdadm --stop /dev/md0

step "3. raidnbd serves it again: it sees md's writes and stamps its checksums again"
raidnbd_serve $ALL
raidnbd_last_log | contains 'written without raidnbd' || fail "raidnbd did not notice that md wrote the array"
raidnbd_wait_idle
for m in $ALL; do
  expect_eq "$(role_field "$m" untrusted_bytes)" 0 "untrusted checksum bytes of $m after the check"
  expect_eq "$(role_field "$m" reports)" 0 "wrong-byte reports of $m (md's writes are not corruption)"
done
attach
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M/one /tmp/one.md5
verify_tree $M/two /tmp/two.md5
run umount $M
nbd_detach /dev/nbd0
raidnbd_stop

step "4. bytes flipped on /dev/vdc behind raidnbd's back: served right, named, healed"
offset=$(mdadm --examine /dev/vdc | sed -n 's/^ *Data Offset : \([0-9]*\) sectors.*/\1/p')
[ -n "$offset" ] || fail "no data offset for /dev/vdc"
for mib in 1 3 5 7 9 11; do
  run dd if=/dev/urandom of=/dev/vdc bs=512 count=1 seek=$((offset + mib * 2048 + 3)) conv=notrunc oflag=direct status=none
done
raidnbd_serve $ALL
attach
run mount -t ext4 -o ro /dev/nbd0 $M
drop_caches
verify_tree $M/one /tmp/one.md5
verify_tree $M/two /tmp/two.md5
run umount $M
nbd_detach /dev/nbd0
run raidnbd_ctl check
raidnbd_wait_idle
raidnbd_ctl status
reports=$(role_field /dev/vdc reports)
[ "${reports:-0}" -ge 1 ] || fail "member /dev/vdc was not named (reports: $reports)"
healed=$(role_field /dev/vdc healed_sectors)
[ "${healed:-0}" -ge 6 ] || fail "member /dev/vdc was not healed (healed sectors: $healed)"
for m in /dev/vda /dev/vdb /dev/vdd; do expect_eq "$(role_field "$m" reports)" 0 "reports of $m"; done
raidnbd_stop
run mdadm --assemble /dev/md0 $ALL
md_check_clean /dev/md0 "md check after raidnbd healed /dev/vdc"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M/one /tmp/one.md5
verify_tree $M/two /tmp/two.md5
run umount $M
run mdadm --stop /dev/md0
