#!/bin/sh
# Removing a member (md's backwards reshape) both ways: the kernel finishes raidnbd's shrink, raidnbd finishes the kernel's.
# A: raidnbd creates a RAID5 of 4 (vda..vdd, resync policy, 64 KiB chunk); `ctl grow
#    --raid-devices 3` without --array-size refuses (exit 2, the message ends in `--array-size
#    BYTES`, nothing changes); ext4 made that size through /dev/nbd0, files; `ctl grow
#    --raid-devices 3 --array-size BYTES` at 1 MB/s: the export has the new size at once, ctl
#    status shows a backwards reshape 4 -> 3, a new client reads the same bytes while it runs;
#    SIGKILL inside; mdadm --assemble continues it in the kernel to the end: 3 raid devices, the
#    same size and digest, e2fsck -fn clean, the files right, md's check 0, vdd a spare.
# B: mdadm creates a RAID5 of 4 (vde..vdh) using 24 MiB of each 32 MiB disk (room after the
#    data), ext4 of the 3-member size with files, `mdadm --grow --array-size`; a backwards
#    shrink to 3 members without a backup file (mdadm 4.2 cannot: the kernel is driven by sysfs
#    as mdadm would, reshape_direction=backwards, new_offset = data_offset + 1 MiB, raid_disks=3,
#    sync_action=reshape), slowed by speed_limit_max, `mdadm --stop` once reshape_position moved;
#    raidnbd serve continues it ("being reshaped", ctl status a backwards reshape, then none):
#    nbd0 the 3-member size, same digest, fsck clean, files right, vdh a spare, raidnbd check 0;
#    mdadm assembles the result: 3 devices and a spare, no reshape, same digest, fsck clean.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 8x32M
# rig-timeout: 900
. /guest/lib.sh
M=/mnt
rig_debug() {
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
  for d in /dev/vda /dev/vdd /dev/vde /dev/vdh; do mdadm --examine "$d" 2>&1 | head -n 45; done
}

run modprobe nbd nbds_max=4

step "A: raidnbd creates a RAID5 of 4; ctl grow --raid-devices 3 without --array-size names the size"
A="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
run raidnbd create --level 5 --chunk 64K --consistency-policy resync $A
raidnbd_serve $A
shrink_refusal A 3
A_NEW=$SHRINK_NEW

step "A: ext4 of the 3-member size through nbd0, files"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
run mkfs.ext4 -q -F -b 4096 /dev/nbd0 "$((A_NEW / 1024))k"
run mount -t ext4 /dev/nbd0 $M
fill_tree $M 24 1024 /tmp/a.md5
run umount $M
A_SUM=$(head_digest /dev/nbd0 "$A_NEW")
echo "ok: first $A_NEW bytes of nbd0: $A_SUM"
nbd_detach /dev/nbd0

step "A: ctl grow --raid-devices 3 --array-size $A_NEW at 1 MB/s; SIGKILL inside the reshape"
run raidnbd_ctl rebuild-speed 1M 1M
run raidnbd_ctl grow --raid-devices 3 --array-size "$A_NEW"
raidnbd_status_json
contains '"backwards": true' < /tmp/raidnbd-status.json || fail "A: ctl status shows no backwards reshape"
expect_eq "$(json_number from_raid_devices /tmp/raidnbd-status.json)" 4 "A: reshape from"
expect_eq "$(json_number to_raid_devices /tmp/raidnbd-status.json)" 3 "A: reshape to"
expect_eq "$(json_number size_bytes /tmp/raidnbd-status.json)" "$A_NEW" "A: export size once the reshape started"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" "$A_NEW" "A: nbd0 size during the reshape"
expect_eq "$(dev_digest /dev/nbd0)" "$A_SUM" "A: nbd0 digest during the reshape"
nbd_detach /dev/nbd0
n=0
until raidnbd_status_json > /dev/null && [ "$(json_number front_bytes /tmp/raidnbd-status.json)" -lt "$A_NEW" ]; do
  n=$((n + 1)); [ "$n" -le 150 ] || fail "A: the reshape does not move"
  sleep 0.2
done
raidnbd_ctl status
A_FRONT=$(json_number front_bytes /tmp/raidnbd-status.json)
[ "$A_FRONT" -gt 0 ] || fail "A: the reshape ended before the kill"
raidnbd_stop KILL
mdadm --examine /dev/vda | tee /tmp/a-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/a-examine.txt || fail "A: mdadm sees no reshape in progress"
contains "Delta Devices : -1" < /tmp/a-examine.txt || fail "A: mdadm does not see a member removed"

step "A: mdadm --assemble continues the backwards reshape in the kernel"
echo 100000 > /proc/sys/dev/raid/speed_limit_max
run mdadm --assemble /dev/md0 --run $A
cat /proc/mdstat
run mdadm --wait /dev/md0 || true
md_wait_idle /dev/md0
cat /proc/mdstat
mdadm --detail /dev/md0 | tee /tmp/a-detail.txt
expect_eq "$(cat /sys/block/md0/md/raid_disks)" 3 "A: raid disks after the kernel finished"
expect_eq "$(cat /sys/block/md0/md/reshape_position)" none "A: no reshape left"
expect_eq "$(size_bytes /dev/md0)" "$A_NEW" "A: md0 size"
contains 'spare.*/dev/vdd' < /tmp/a-detail.txt || fail "A: vdd is not a spare of md0"
expect_eq "$(dev_digest /dev/md0)" "$A_SUM" "A: md0 digest vs nbd0 before the shrink"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M /tmp/a.md5
run umount $M
md_check_clean /dev/md0 "A: md's check after the shrink"
run mdadm --stop /dev/md0
expect_eq "$(mdadm --examine /dev/vdd | sed -n 's/^ *Device Role : //p')" spare "A: vdd's role on disk"

step "B: mdadm creates a RAID5 of 4 with room after the data, ext4 of the 3-member size, --array-size"
B="/dev/vde /dev/vdf /dev/vdg /dev/vdh"
run sh -c "mdadm --create /dev/md1 --metadata=1.2 --run --assume-clean --homehost=rig --name=shrink --level=5 --chunk=64 --size=24M --raid-devices=4 $B" < /dev/null
mdadm --examine /dev/vde | head -n 30
B_COMP_KIB=$(cat /sys/block/md1/md/component_size)
B_NEW_KIB=$((B_COMP_KIB * 2))
B_NEW=$((B_NEW_KIB * 1024))
run mkfs.ext4 -q -F -b 4096 /dev/md1 "${B_NEW_KIB}k"
run mount -t ext4 /dev/md1 $M
fill_tree $M 24 1024 /tmp/b.md5
run umount $M
run sh -c "mdadm --grow /dev/md1 --array-size=$B_NEW_KIB" < /dev/null
expect_eq "$(size_bytes /dev/md1)" "$B_NEW" "B: md1 size after --array-size"
B_SUM=$(dev_digest /dev/md1)

step "B: the kernel starts a backwards shrink to 3 members, stopped inside it"
md_shrink_stopped_inside B /dev/md1 3
fast_md
mdadm --examine /dev/vde | tee /tmp/b-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/b-examine.txt || fail "B: the stopped array records no reshape"
contains "New Offset" < /tmp/b-examine.txt || fail "B: the kernel's shrink did not move the data offset"
contains "Delta Devices : -1" < /tmp/b-examine.txt || fail "B: the stopped array records no member removed"

step "B: raidnbd serve continues the kernel's backwards reshape"
raidnbd_serve $B
raidnbd_last_log | contains "being reshaped" || fail "B: raidnbd does not say the array is being reshaped"
raidnbd_status_json
contains '"backwards": true' < /tmp/raidnbd-status.json || fail "B: ctl status shows no backwards reshape"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_status_json
contains '"reshape": null' < /tmp/raidnbd-status.json || fail "B: the reshape did not finish"
contains '"/dev/vdh"' < /tmp/raidnbd-status.json || fail "B: vdh is not in the status"
raidnbd_ctl status
expect_eq "$(raidnbd_role_state /dev/vdh)" "" "B: vdh has no role"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" "$B_NEW" "B: nbd0 size"
expect_eq "$(dev_digest /dev/nbd0)" "$B_SUM" "B: nbd0 digest vs md1 before the shrink"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/b.md5
run umount $M
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check $B

step "B: mdadm assembles what raidnbd finished"
run mdadm --assemble /dev/md1 --run $B
cat /proc/mdstat
mdadm --detail /dev/md1 | tee /tmp/b-detail.txt
expect_eq "$(cat /sys/block/md1/md/raid_disks)" 3 "B: raid disks"
expect_eq "$(cat /sys/block/md1/md/reshape_position)" none "B: no reshape left"
contains 'spare.*/dev/vdh' < /tmp/b-detail.txt || fail "B: vdh is not a spare of md1"
expect_eq "$(size_bytes /dev/md1)" "$B_NEW" "B: md1 size"
expect_eq "$(dev_digest /dev/md1)" "$B_SUM" "B: md1 digest"
fsck_clean /dev/md1
md_check_clean /dev/md1 "B: md's check of raidnbd's shrink"
run mdadm --stop /dev/md1
