#!/bin/sh
# Reshape both ways: the kernel finishes a grow raidnbd started, and raidnbd finishes one the kernel started.
# A: raidnbd creates a RAID5 of 3 (vda..vdc, resync policy, 64 KiB chunk), ext4 with files through
#    /dev/nbd0; `raidnbd ctl grow --add /dev/vdd` slowed to 1 MB/s; SIGKILL once the reshape is
#    under way; mdadm --assemble continues it in the kernel (mdstat says reshape) to the end:
#    4 raid devices, the larger size, e2fsck -fn clean, the files right, md's check 0 mismatches.
# B: raidnbd creates a RAID5 of 3 (vde..vdg; its headroom is room to move the data start), md
#    assembles it, ext4 with files;
#    mdadm --grow --raid-devices=4 --add /dev/vdh (no backup file) slowed by speed_limit_max;
#    mdadm --stop once reshape_position moved; raidnbd serve continues it to the end (ctl status
#    says reshape, then idle), /dev/nbd0 has the larger size, e2fsck clean, the files right,
#    raidnbd check 0; then mdadm assembles the result: 4 devices, no reshape, fsck clean.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 8x32M
# rig-timeout: 900
. /guest/lib.sh
M=/mnt
rig_debug() {
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
  mdadm --examine /dev/vda 2>&1 | head -n 40
  mdadm --examine /dev/vde 2>&1 | head -n 40
}

json_field() { # KEY: the first "KEY": VALUE of the last status, unquoted
  sed -n "s/.*\"$1\": *\"\\{0,1\\}\\([^\",}]*\\).*/\\1/p" /tmp/raidnbd-status.json | head -n 1
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
run umount $M
nbd_detach /dev/nbd0
A_SIZE=$(raidnbd_status_json > /dev/null; json_number size_bytes /tmp/raidnbd-status.json)

step "A: ctl grow --add /dev/vdd, SIGKILL inside the reshape"
run raidnbd_ctl rebuild-speed 1M 1M
run raidnbd_ctl grow --raid-devices 4 --add /dev/vdd
n=0
until raidnbd_status_json | contains '"front_bytes": [1-9]'; do
  n=$((n + 1)); [ "$n" -le 150 ] || fail "the reshape does not move"
  sleep 0.2
done
raidnbd_ctl status
raidnbd_stop KILL
mdadm --examine /dev/vda | contains "Reshape pos'n" || fail "mdadm sees no reshape in progress"

step "A: mdadm --assemble continues the reshape in the kernel"
echo 100000 > /proc/sys/dev/raid/speed_limit_max
run mdadm --assemble /dev/md0 --run $A /dev/vdd
cat /proc/mdstat
run mdadm --wait /dev/md0 || true
md_wait_idle /dev/md0
cat /proc/mdstat
expect_eq "$(cat /sys/block/md0/md/raid_disks)" 4 "A: raid disks after the kernel finished"
[ "$(size_bytes /dev/md0)" -gt "$A_SIZE" ] || fail "A: md0 is not larger than the 3-member array ($A_SIZE)"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M /tmp/a.md5
run umount $M
md_check_clean /dev/md0 "A: md's check after the grow"
run mdadm --stop /dev/md0

step "B: raidnbd creates a RAID5 of 3, md assembles it, ext4 and files"
B="/dev/vde /dev/vdf /dev/vdg"
run raidnbd create --level 5 --chunk 64K --consistency-policy resync $B
run mdadm --assemble /dev/md1 --run $B
mkfs_ext4 /dev/md1
run mount -t ext4 /dev/md1 $M
fill_tree $M 12 1024 /tmp/b.md5
run umount $M
B_SIZE=$(size_bytes /dev/md1)

step "B: mdadm --grow --raid-devices=4 (no backup file), stopped inside the reshape"
echo 1000 > /proc/sys/dev/raid/speed_limit_max
echo 1000 > /proc/sys/dev/raid/speed_limit_min
run sh -c "mdadm --grow /dev/md1 --raid-devices=4 --add /dev/vdh" < /dev/null
n=0
until [ "$(cat /sys/block/md1/md/reshape_position)" != none ] && [ "$(cat /sys/block/md1/md/reshape_position)" -gt 0 ]; do
  n=$((n + 1)); [ "$n" -le 300 ] || fail "md's reshape does not move"
  sleep 0.2
done
cat /proc/mdstat
run mdadm --stop /dev/md1
mdadm --examine /dev/vde | contains "Reshape pos'n" || fail "the stopped array records no reshape"
mdadm --examine /dev/vde | contains "New Offset" || fail "md's grow did not move the data offset (it needs a backup file)"

step "B: raidnbd serve continues the kernel's reshape"
raidnbd_serve $B /dev/vdh
raidnbd_last_log | contains "being reshaped" || fail "raidnbd does not say the array is being reshaped"
raidnbd_status_json | contains '"reshape": {' || fail "ctl status shows no reshape"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_status_json | contains '"reshape": null' || fail "the reshape did not finish"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
[ "$(size_bytes /dev/nbd0)" -gt "$B_SIZE" ] || fail "B: nbd0 is not larger than the 3-member array ($B_SIZE)"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/b.md5
run umount $M
B_SUM=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check $B /dev/vdh

step "B: mdadm assembles what raidnbd finished"
run mdadm --assemble /dev/md1 --run $B /dev/vdh
cat /proc/mdstat
expect_eq "$(cat /sys/block/md1/md/raid_disks)" 4 "B: raid disks"
expect_eq "$(cat /sys/block/md1/md/reshape_position)" none "B: no reshape left"
expect_eq "$(dev_digest /dev/md1)" "$B_SUM" "B: md1 vs nbd0 digest"
fsck_clean /dev/md1
run mdadm --stop /dev/md1
