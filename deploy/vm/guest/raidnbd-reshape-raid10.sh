#!/bin/sh
# RAID10 (n2) reshapes both ways: members added and removed, the kernel finishes raidnbd's and raidnbd finishes the kernel's.
# Every part: ext4 on the array with files (md5), e2fsck -fn after each hand-over, md's check 0.
# A: raidnbd creates a RAID10 n2 of 4 (vda..vdd, resync policy, 64 KiB chunk), ext4 and files
#    through /dev/nbd0; `ctl grow --raid-devices 5 --add /dev/vde` at 512 KB/s (ctl status: a
#    reshape 4 -> 5; a new client reads the same bytes while it runs, then writes more files);
#    SIGKILL inside; mdadm --assemble continues it in the kernel (then the kernel resyncs the
#    new tail): 5 raid devices, the 5-member size, the old size's bytes as nbd0 had them
#    before the kill, fsck clean, every file right, md check 0.
# B: mdadm creates a RAID10 n2 of 4 (vdf..vdi, 4 MiB data offset), ext4 and files; `mdadm --grow
#    --raid-devices=5 --add /dev/vdj` (no backup file) slowed, `mdadm --stop` inside; raidnbd
#    serve continues it ("being reshaped", ctl status a reshape, then none): nbd0 the 5-member
#    size, old bytes unchanged, fsck, files, raidnbd check 0; mdadm assembles the result: 5
#    devices, no reshape, same whole-device digest, md check 0.
# C: raidnbd creates a RAID10 n2 of 5 (vdk..vdo); `ctl grow --raid-devices 4` without
#    --array-size refuses (exit 2, names the size); ext4 of that size, files; `ctl grow
#    --raid-devices 4 --array-size BYTES` at 512 KB/s (a backwards reshape 5 -> 4, the export
#    has the new size at once, same bytes; more files written while it runs), SIGKILL inside;
#    mdadm --assemble continues it in the kernel: 4 raid devices, same size and digest as nbd0
#    before the kill, fsck, every file, md check 0, vdo a spare.
# D: mdadm creates a RAID10 n2 of 5 (vdp..vdt, 24 of 32 MiB used), ext4 of the 4-member size,
#    `mdadm --grow --array-size`, `mdadm --grow --raid-devices=4` (mdadm 4.2 starts a raid10
#    shrink itself, data start +1 chunk; sysfs would be used if it refused), slowed, `mdadm
#    --stop` inside; raidnbd serve finishes the backwards reshape: the 4-member size, same
#    digest, fsck, files, vdt a spare without a role, raidnbd check 0; mdadm assembles 4 devices
#    and a spare, no reshape, same digest, fsck, md check 0.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 20x32M
# rig-timeout: 900
. /guest/lib.sh
M=/mnt
rig_debug() {
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 80 "$RAIDNBD_LOG" 2>/dev/null
  for d in /dev/vda /dev/vde /dev/vdf /dev/vdj /dev/vdk /dev/vdo /dev/vdp /dev/vdt; do
    echo "-- mdadm --examine $d:"; mdadm --examine "$d" 2>&1 | head -n 45
  done
  echo "-- dmesg (md):"; dmesg | grep -i 'md[0-9]\|raid10\|md:' | tail -n 40
}

# md's raid10 near size (raid10_size): S(rd) = floor((Dev / chunk) * rd / copies) * chunk.
r10_size() { # COMPONENT_KIB RAID_DISKS -> bytes (n2, 64 KiB chunk)
  echo $(( ($1 / 64) * $2 / 2 * 64 * 1024 ))
}
# Until md runs nothing and has nothing pending: no reshape, resync (the tail after a grow),
# recovery. Prints the states it passes through.
md_wait_settled() { # MDDEV
  b=/sys/block/${1#/dev/}/md
  ms_n=0 ms_last=""
  while :; do
    mdadm --wait "$1" > /dev/null 2>&1 || true
    ms_now="action=$(cat $b/sync_action) reshape_position=$(cat $b/reshape_position) resync_start=$(cat $b/resync_start) raid_disks=$(cat $b/raid_disks) size=$(size_bytes "$1")"
    [ "$ms_now" = "$ms_last" ] || echo "   [$(rig_now)] $1: $ms_now"
    ms_last=$ms_now
    if [ "$(cat $b/sync_action)" = idle ] && [ "$(cat $b/reshape_position)" = none ] && [ "$(cat $b/resync_start)" = none ]; then
      break
    fi
    ms_n=$((ms_n + 1)); [ "$ms_n" -le 600 ] || { cat /proc/mdstat; fail "$1 still busy after 600 s"; }
    sleep 1
  done
  echo "ok: [$(rig_now)] $1 settled"
}
examine_field() { # DEV FIELD: the value of "FIELD : value" in mdadm --examine
  mdadm --examine "$1" | sed -n "s/^ *$2 : //p" | head -n 1
}

run modprobe nbd nbds_max=4
fast_md

#### A: raidnbd grows a RAID10 n2 4 -> 5, the kernel finishes it
step "A: raidnbd creates a RAID10 n2 of 4, ext4 and files through nbd0"
A="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
run raidnbd create --level 10 --layout n2 --chunk 64K --consistency-policy resync $A
mdadm --examine /dev/vda | head -n 30
raidnbd_serve $A
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 $M
fill_tree $M 12 1024 /tmp/a.md5
run umount $M
A_SIZE=$(size_bytes /dev/nbd0)
A_SUM=$(dev_digest /dev/nbd0)
echo "ok: nbd0 $A_SIZE bytes, digest $A_SUM"
nbd_detach /dev/nbd0
expect_eq "$(raidnbd_status_json > /dev/null; json_number size_bytes /tmp/raidnbd-status.json)" "$A_SIZE" "A: export size"

step "A: ctl grow --raid-devices 5 --add /dev/vde at 512 KB/s, a client reads and writes, SIGKILL inside"
run raidnbd_ctl rebuild-speed 512K 512K
run raidnbd_ctl grow --raid-devices 5 --add /dev/vde
raidnbd_status_json
contains '"reshape": {' < /tmp/raidnbd-status.json || fail "A: ctl status shows no reshape"
expect_eq "$(json_number from_raid_devices /tmp/raidnbd-status.json)" 4 "A: reshape from"
expect_eq "$(json_number to_raid_devices /tmp/raidnbd-status.json)" 5 "A: reshape to"
contains '"backwards": false' < /tmp/raidnbd-status.json || fail "A: ctl status does not show a forward reshape"
expect_eq "$(json_number size_bytes /tmp/raidnbd-status.json)" "$A_SIZE" "A: export size while growing"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" "$A_SIZE" "A: nbd0 size during the reshape"
expect_eq "$(dev_digest /dev/nbd0)" "$A_SUM" "A: nbd0 digest during the reshape"
run mount -t ext4 /dev/nbd0 $M
fill_tree $M/during 6 1024 /tmp/a2.md5
verify_tree $M /tmp/a.md5
run umount $M
A_SUM=$(dev_digest /dev/nbd0)
echo "ok: nbd0 digest after the writes during the reshape: $A_SUM"
nbd_detach /dev/nbd0
n=0
until raidnbd_status_json | contains '"front_bytes": [1-9]'; do
  n=$((n + 1)); [ "$n" -le 150 ] || fail "A: the reshape does not move"
  sleep 0.2
done
raidnbd_ctl status
contains '"reshape": {' < /tmp/raidnbd-status.json || fail "A: the reshape ended before the kill"
echo "A: front at $(json_number front_bytes /tmp/raidnbd-status.json) bytes of $A_SIZE"
raidnbd_stop KILL
mdadm --examine /dev/vda | tee /tmp/a-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/a-examine.txt || fail "A: mdadm sees no reshape in progress"
contains "Delta Devices : 1" < /tmp/a-examine.txt || fail "A: mdadm does not see a member added"
contains "New Offset" < /tmp/a-examine.txt || fail "A: no new offset recorded"
mdadm --examine /dev/vde | head -n 45

step "A: mdadm --assemble continues the reshape in the kernel, then the tail resync"
fast_md
run mdadm --assemble /dev/md0 --run $A /dev/vde
cat /proc/mdstat
md_wait_settled /dev/md0
cat /proc/mdstat
echo "-- the kernel's log of md0:"; dmesg | grep 'md0' | tail -n 20
mdadm --detail /dev/md0 | tee /tmp/a-detail.txt
expect_eq "$(cat /sys/block/md0/md/raid_disks)" 5 "A: raid disks after the kernel finished"
A_BIG=$(r10_size "$(cat /sys/block/md0/md/component_size)" 5)
expect_eq "$(size_bytes /dev/md0)" "$A_BIG" "A: md0 size (the 5-member size)"
[ "$A_BIG" -gt "$A_SIZE" ] || fail "A: md0 is not larger than the 4-member array ($A_SIZE)"
expect_eq "$(head_digest /dev/md0 "$A_SIZE")" "$A_SUM" "A: md0's first $A_SIZE bytes vs nbd0 before the kill"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M /tmp/a.md5
verify_tree $M/during /tmp/a2.md5
run umount $M
md_check_clean /dev/md0 "A: md's check after the grow"
run mdadm --stop /dev/md0

#### B: mdadm grows a RAID10 n2 4 -> 5, raidnbd finishes it
step "B: mdadm creates a RAID10 n2 of 4 with room before the data, ext4 and files"
B="/dev/vdf /dev/vdg /dev/vdh /dev/vdi"
run sh -c "mdadm --create /dev/md1 --metadata=1.2 --run --assume-clean --homehost=rig --name=grow10 --level=10 --layout=n2 --chunk=64 --data-offset=4M --raid-devices=4 $B" < /dev/null
mdadm --examine /dev/vdf | head -n 30
mkfs_ext4 /dev/md1
run mount -t ext4 /dev/md1 $M
fill_tree $M 12 1024 /tmp/b.md5
run umount $M
B_SIZE=$(size_bytes /dev/md1)
B_SUM=$(dev_digest /dev/md1)
B_BIG=$(r10_size "$(cat /sys/block/md1/md/component_size)" 5)
echo "ok: md1 $B_SIZE bytes (5 members: $B_BIG), digest $B_SUM"

step "B: mdadm --grow --raid-devices=5 --add /dev/vdj (no backup file), stopped inside"
slow_md
echo 1000 > /sys/block/md1/md/sync_speed_max
echo 1000 > /sys/block/md1/md/sync_speed_min
run sh -c "mdadm --grow /dev/md1 --raid-devices=5 --add /dev/vdj" < /dev/null
n=0
# let the kernel copy 4 MiB first (raidnbd then resumes well inside the array)
until [ "$(cat /sys/block/md1/md/reshape_position)" != none ] && [ "$(cat /sys/block/md1/md/reshape_position)" -ge 8192 ]; do
  n=$((n + 1)); [ "$n" -le 300 ] || { cat /proc/mdstat; fail "B: md's reshape does not move (or ended before the stop)"; }
  sleep 0.2
done
cat /proc/mdstat
echo "B: reshape_position $(cat /sys/block/md1/md/reshape_position) sectors"
run mdadm --stop /dev/md1
fast_md
mdadm --examine /dev/vdf | tee /tmp/b-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/b-examine.txt || fail "B: the stopped array records no reshape"
contains "New Offset" < /tmp/b-examine.txt || fail "B: md's grow did not move the data offset"
contains "Delta Devices : 1" < /tmp/b-examine.txt || fail "B: the stopped array records no member added"

step "B: raidnbd serve continues the kernel's raid10 reshape"
raidnbd_serve $B /dev/vdj
raidnbd_last_log | contains "being reshaped" || fail "B: raidnbd does not say the array is being reshaped"
raidnbd_status_json
contains '"reshape": {' < /tmp/raidnbd-status.json || fail "B: ctl status shows no reshape"
expect_eq "$(json_number from_raid_devices /tmp/raidnbd-status.json)" 4 "B: reshape from"
expect_eq "$(json_number to_raid_devices /tmp/raidnbd-status.json)" 5 "B: reshape to"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_wait_idle 300
raidnbd_status_json
contains '"reshape": null' < /tmp/raidnbd-status.json || fail "B: the reshape did not finish"
raidnbd_ctl status
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" "$B_BIG" "B: nbd0 size (the 5-member size)"
expect_eq "$(head_digest /dev/nbd0 "$B_SIZE")" "$B_SUM" "B: nbd0's first $B_SIZE bytes vs md1 before the grow"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/b.md5
run umount $M
B_FULL=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check $B /dev/vdj

step "B: mdadm assembles what raidnbd finished"
run mdadm --assemble /dev/md1 --run $B /dev/vdj
cat /proc/mdstat
mdadm --detail /dev/md1 | tee /tmp/b-detail.txt
expect_eq "$(cat /sys/block/md1/md/raid_disks)" 5 "B: raid disks"
expect_eq "$(cat /sys/block/md1/md/reshape_position)" none "B: no reshape left"
expect_eq "$(cat /sys/block/md1/md/resync_start)" none "B: nothing left to resync"
expect_eq "$(size_bytes /dev/md1)" "$B_BIG" "B: md1 size"
expect_eq "$(dev_digest /dev/md1)" "$B_FULL" "B: md1 vs nbd0 whole-device digest"
fsck_clean /dev/md1
md_check_clean /dev/md1 "B: md's check of raidnbd's grow"
run mdadm --stop /dev/md1

#### C: raidnbd shrinks a RAID10 n2 5 -> 4, the kernel finishes it
step "C: raidnbd creates a RAID10 n2 of 5; ctl grow --raid-devices 4 without --array-size names the size"
C="/dev/vdk /dev/vdl /dev/vdm /dev/vdn /dev/vdo"
run raidnbd create --level 10 --layout n2 --chunk 64K --consistency-policy resync $C
raidnbd_serve $C
shrink_refusal C 4
C_NEW=$SHRINK_NEW

step "C: ext4 of the 4-member size through nbd0, files"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
run mkfs.ext4 -q -F -b 4096 /dev/nbd0 "$((C_NEW / 1024))k"
run mount -t ext4 /dev/nbd0 $M
fill_tree $M 12 1024 /tmp/c.md5
run umount $M
C_SUM=$(head_digest /dev/nbd0 "$C_NEW")
echo "ok: first $C_NEW bytes of nbd0: $C_SUM"
nbd_detach /dev/nbd0

step "C: ctl grow --raid-devices 4 --array-size $C_NEW at 512 KB/s, a client reads and writes, SIGKILL inside"
run raidnbd_ctl rebuild-speed 512K 512K
run raidnbd_ctl grow --raid-devices 4 --array-size "$C_NEW"
raidnbd_status_json
contains '"backwards": true' < /tmp/raidnbd-status.json || fail "C: ctl status shows no backwards reshape"
expect_eq "$(json_number from_raid_devices /tmp/raidnbd-status.json)" 5 "C: reshape from"
expect_eq "$(json_number to_raid_devices /tmp/raidnbd-status.json)" 4 "C: reshape to"
expect_eq "$(json_number size_bytes /tmp/raidnbd-status.json)" "$C_NEW" "C: export size once the reshape started"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" "$C_NEW" "C: nbd0 size during the reshape"
expect_eq "$(dev_digest /dev/nbd0)" "$C_SUM" "C: nbd0 digest during the reshape"
run mount -t ext4 /dev/nbd0 $M
fill_tree $M/during 6 1024 /tmp/c2.md5
verify_tree $M /tmp/c.md5
run umount $M
C_SUM=$(dev_digest /dev/nbd0)
echo "ok: nbd0 digest after the writes during the reshape: $C_SUM"
nbd_detach /dev/nbd0
n=0
until raidnbd_status_json > /dev/null && [ "$(json_number front_bytes /tmp/raidnbd-status.json)" -lt "$C_NEW" ]; do
  n=$((n + 1)); [ "$n" -le 150 ] || fail "C: the reshape does not move"
  sleep 0.2
done
raidnbd_ctl status
contains '"reshape": {' < /tmp/raidnbd-status.json || fail "C: the reshape ended before the kill"
C_FRONT=$(json_number front_bytes /tmp/raidnbd-status.json)
echo "C: front at $C_FRONT bytes of $C_NEW"
[ "$C_FRONT" -gt 0 ] || fail "C: the reshape ended before the kill"
raidnbd_stop KILL
mdadm --examine /dev/vdk | tee /tmp/c-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/c-examine.txt || fail "C: mdadm sees no reshape in progress"
contains "Delta Devices : -1" < /tmp/c-examine.txt || fail "C: mdadm does not see a member removed"
contains "New Offset" < /tmp/c-examine.txt || fail "C: no new offset recorded"

step "C: mdadm --assemble continues the backwards reshape in the kernel"
fast_md
run mdadm --assemble /dev/md2 --run $C
cat /proc/mdstat
md_wait_settled /dev/md2
cat /proc/mdstat
echo "-- the kernel's log of md2:"; dmesg | grep 'md2' | tail -n 20
mdadm --detail /dev/md2 | tee /tmp/c-detail.txt
expect_eq "$(cat /sys/block/md2/md/raid_disks)" 4 "C: raid disks after the kernel finished"
expect_eq "$(size_bytes /dev/md2)" "$C_NEW" "C: md2 size"
contains 'spare.*/dev/vdo' < /tmp/c-detail.txt || fail "C: vdo is not a spare of md2"
expect_eq "$(dev_digest /dev/md2)" "$C_SUM" "C: md2 digest vs nbd0 before the kill"
fsck_clean /dev/md2
run mount -t ext4 -o ro /dev/md2 $M
verify_tree $M /tmp/c.md5
verify_tree $M/during /tmp/c2.md5
run umount $M
md_check_clean /dev/md2 "C: md's check after the shrink"
run mdadm --stop /dev/md2
expect_eq "$(examine_field /dev/vdo 'Device Role')" spare "C: vdo's role on disk"

#### D: mdadm shrinks a RAID10 n2 5 -> 4, raidnbd finishes it
step "D: mdadm creates a RAID10 n2 of 5 using 24 of 32 MiB, ext4 of the 4-member size, --array-size"
D="/dev/vdp /dev/vdq /dev/vdr /dev/vds /dev/vdt"
run sh -c "mdadm --create /dev/md3 --metadata=1.2 --run --assume-clean --homehost=rig --name=shrink10 --level=10 --layout=n2 --chunk=64 --size=24M --raid-devices=5 $D" < /dev/null
mdadm --examine /dev/vdp | head -n 30
D_NEW=$(r10_size "$(cat /sys/block/md3/md/component_size)" 4)
D_NEW_KIB=$((D_NEW / 1024))
run mkfs.ext4 -q -F -b 4096 /dev/md3 "${D_NEW_KIB}k"
run mount -t ext4 /dev/md3 $M
fill_tree $M 12 1024 /tmp/d.md5
run umount $M
run sh -c "mdadm --grow /dev/md3 --array-size=$D_NEW_KIB" < /dev/null
expect_eq "$(size_bytes /dev/md3)" "$D_NEW" "D: md3 size after --array-size"
D_SUM=$(dev_digest /dev/md3)

step "D: mdadm --grow --raid-devices=4 (a backwards reshape), stopped inside"
md_shrink_stopped_inside D /dev/md3 4
fast_md
mdadm --examine /dev/vdp | tee /tmp/d-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/d-examine.txt || fail "D: the stopped array records no reshape"
contains "New Offset" < /tmp/d-examine.txt || fail "D: the kernel's shrink did not move the data offset"
contains "Delta Devices : -1" < /tmp/d-examine.txt || fail "D: the stopped array records no member removed"

step "D: raidnbd serve continues the kernel's backwards raid10 reshape"
raidnbd_serve $D
raidnbd_last_log | contains "being reshaped" || fail "D: raidnbd does not say the array is being reshaped"
raidnbd_status_json
contains '"backwards": true' < /tmp/raidnbd-status.json || fail "D: ctl status shows no backwards reshape"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_wait_idle 300
raidnbd_status_json
contains '"reshape": null' < /tmp/raidnbd-status.json || fail "D: the reshape did not finish"
raidnbd_ctl status
expect_eq "$(raidnbd_role_state /dev/vdt)" "" "D: vdt has no role"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" "$D_NEW" "D: nbd0 size"
expect_eq "$(dev_digest /dev/nbd0)" "$D_SUM" "D: nbd0 digest vs md3 before the shrink"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/d.md5
run umount $M
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check $D

step "D: mdadm assembles what raidnbd finished"
MD=/sys/block/md3/md
run mdadm --assemble /dev/md3 --run $D
cat /proc/mdstat
mdadm --detail /dev/md3 | tee /tmp/d-detail.txt
expect_eq "$(cat $MD/raid_disks)" 4 "D: raid disks"
expect_eq "$(cat $MD/reshape_position)" none "D: no reshape left"
contains 'spare.*/dev/vdt' < /tmp/d-detail.txt || fail "D: vdt is not a spare of md3"
expect_eq "$(cat $MD/resync_start)" none "D: nothing left to resync"
expect_eq "$(size_bytes /dev/md3)" "$D_NEW" "D: md3 size"
expect_eq "$(dev_digest /dev/md3)" "$D_SUM" "D: md3 digest"
fsck_clean /dev/md3
md_check_clean /dev/md3 "D: md's check of raidnbd's shrink"
run mdadm --stop /dev/md3
