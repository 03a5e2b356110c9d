#!/bin/sh
# Level changes that move no data (md's takeover) both ways with the kernel.
# A: raidnbd creates a RAID5 of 3 (vda..vdc, resync policy, 64 KiB chunk), ext4 with files
#    through /dev/nbd0; `raidnbd ctl grow --level 6 --add /dev/vdd` (Q rebuilt onto vdd while
#    the filesystem is mounted and written); mdadm assembles the result: raid6, layout
#    left-symmetric-6, fsck clean, files right, md's check 0; the kernel takes it back to raid5
#    (`mdadm --grow --level=5`), and raidnbd serves that: raid5, files right, fsck clean;
#    raidnbd makes it a raid6 again (the spare takes Q) and moves Q into the rotation
#    (`ctl grow --layout left-symmetric`, md's reshape), SIGKILLed inside; mdadm --assemble
#    continues the reshape in the kernel: raid6 left-symmetric, same digest, fsck, md check 0.
# B: mdadm creates a RAID1 of 2 (vde, vdf), ext4 with files; the kernel takes it over to raid5
#    (`mdadm --grow --level=5`); raidnbd serves it (raid5 of 2, files right, fsck clean,
#    `raidnbd check` 0), `raidnbd ctl grow --level 1`; mdadm assembles a raid1 again: fsck
#    clean, files right, md's check 0.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 6x32M
# rig-timeout: 900
. /guest/lib.sh
M=/mnt
rig_debug() {
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
  mdadm --examine /dev/vda 2>&1 | head -n 40
  mdadm --examine /dev/vde 2>&1 | head -n 40
}

run modprobe nbd nbds_max=4

step "A: raidnbd creates a RAID5 of 3, ext4 and files through nbd0"
A="/dev/vda /dev/vdb /dev/vdc"
run raidnbd create --level 5 --chunk 64K --consistency-policy resync $A
raidnbd_serve $A
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 $M
fill_tree $M 12 1024 /tmp/a.md5

step "A: ctl grow --level 6 --add /dev/vdd while mounted; Q is rebuilt"
run raidnbd_ctl rebuild-speed 4M 8M
run raidnbd_ctl grow --level 6 --add /dev/vdd
raidnbd_status_json | contains '"level": "raid6"' || fail "ctl status does not say raid6"
mkdir -p $M/more
fill_tree $M/more 6 512 /tmp/a-more.md5
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_status_json | contains '"state": "recovering"' && fail "Q is not rebuilt"
run umount $M
nbd_detach /dev/nbd0
raidnbd_stop

step "A: mdadm assembles raidnbd's raid6 (left-symmetric-6)"
run mdadm --assemble /dev/md0 --run $A /dev/vdd
cat /proc/mdstat
expect_eq "$(cat /sys/block/md0/md/level)" raid6 "A: md's level"
mdadm --detail /dev/md0 | contains "Layout : left-symmetric-6" || fail "A: md's layout is not left-symmetric-6"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M /tmp/a.md5
verify_tree $M/more /tmp/a-more.md5
run umount $M
md_check_clean /dev/md0 "A: md's check of raidnbd's raid6"

step "A: the kernel takes it back to raid5; raidnbd serves that"
run sh -c "mdadm --grow /dev/md0 --level=5" < /dev/null
md_wait_idle /dev/md0
cat /proc/mdstat
expect_eq "$(cat /sys/block/md0/md/level)" raid5 "A: md's level after its takeover"
A_SUM=$(dev_digest /dev/md0)
run mdadm --stop /dev/md0
raidnbd_serve $A /dev/vdd
raidnbd_status_json | contains '"level": "raid5"' || fail "raidnbd does not serve a raid5"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(dev_digest /dev/nbd0)" "$A_SUM" "A: nbd0 vs md0 digest"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/a.md5
run umount $M

step "A: raid5 -> raid6 again (the spare vdd takes Q), then Q into the rotation; SIGKILL inside"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl grow --level 6
run raidnbd_ctl wait --timeout 300
raidnbd_status_json | contains '"state": "recovering"' && fail "Q is not rebuilt"
run raidnbd_ctl rebuild-speed 1M 1M
run raidnbd_ctl grow --layout left-symmetric
n=0
until raidnbd_status_json | contains '"front_bytes": [1-9]'; do
  n=$((n + 1)); [ "$n" -le 150 ] || fail "the reshape does not move"
  sleep 0.2
done
nbd_detach /dev/nbd0
raidnbd_stop KILL
mdadm --examine /dev/vda | contains "Reshape pos'n" || fail "mdadm sees no reshape in progress"

step "A: mdadm --assemble continues raidnbd's layout change in the kernel"
echo 100000 > /proc/sys/dev/raid/speed_limit_max
run mdadm --assemble /dev/md0 --run $A /dev/vdd
cat /proc/mdstat
run mdadm --wait /dev/md0 || true
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/level)" raid6 "A: md's level"
mdadm --detail /dev/md0 | contains "Layout : left-symmetric$" || fail "A: md's layout is not left-symmetric"
expect_eq "$(dev_digest /dev/md0)" "$A_SUM" "A: md0 after the layout change vs before"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M /tmp/a.md5
run umount $M
md_check_clean /dev/md0 "A: md's check after the layout change"
run mdadm --stop /dev/md0

step "B: mdadm creates a RAID1 of 2, ext4 and files; the kernel takes it over to raid5"
B="/dev/vde /dev/vdf"
run sh -c "mdadm --create /dev/md1 --metadata=1.2 --run --assume-clean --homehost=rig --name=mirror --level=1 --raid-devices=2 $B" < /dev/null
mkfs_ext4 /dev/md1
run mount -t ext4 /dev/md1 $M
fill_tree $M 12 1024 /tmp/b.md5
run umount $M
run sh -c "mdadm --grow /dev/md1 --level=5" < /dev/null
cat /proc/mdstat
expect_eq "$(cat /sys/block/md1/md/level)" raid5 "B: md's level after its takeover"
B_SUM=$(dev_digest /dev/md1)
run mdadm --stop /dev/md1

step "B: raidnbd serves md's raid5 of 2 and takes it back to raid1"
raidnbd_serve $B
raidnbd_status_json | contains '"level": "raid5"' || fail "raidnbd does not serve md's raid5"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(dev_digest /dev/nbd0)" "$B_SUM" "B: nbd0 vs md1 digest"
fsck_clean /dev/nbd0
run raidnbd_ctl grow --level 1
raidnbd_status_json | contains '"level": "raid1"' || fail "raidnbd did not change to raid1"
run mount -t ext4 /dev/nbd0 $M
verify_tree $M /tmp/b.md5
mkdir -p $M/more
fill_tree $M/more 6 512 /tmp/b-more.md5
run umount $M
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check $B

step "B: mdadm assembles raidnbd's raid1"
run mdadm --assemble /dev/md1 --run $B
cat /proc/mdstat
expect_eq "$(cat /sys/block/md1/md/level)" raid1 "B: md's level"
fsck_clean /dev/md1
run mount -t ext4 -o ro /dev/md1 $M
verify_tree $M /tmp/b.md5
verify_tree $M/more /tmp/b-more.md5
run umount $M
md_check_clean /dev/md1 "B: md's check of raidnbd's raid1"
run mdadm --stop /dev/md1
