#!/bin/sh
# Reshapes through another level both ways: a raid0 grows by members (via raid4), and mdadm's raid5 -> raid6 grow.
# D: mdadm creates a RAID0 of 2 (vdd, vde, 4 MiB data offset), ext4 with files; mdadm's own grow
#    (`mdadm --grow --raid-devices=3 --add /dev/vdf`, no backup file: raid0 -> raid4 -> reshape)
#    slowed by speed_limit_max, `mdadm --stop` inside (mdadm's waiting child stopped first);
#    raidnbd serve finishes it ("being reshaped"): ctl status raid0 of 3, nbd0 3/2 the size, old
#    bytes unchanged, fsck clean, files right; mdadm assembles it: raid0 of 3, same digest, fsck.
# E: raidnbd creates a RAID5 of 4 (vdg..vdj), md assembles it, ext4 with files; `mdadm --grow
#    --level=6 --raid-devices=5 --add /dev/vdk` (takeover to left-symmetric-6, then a layout
#    reshape moving the data offset, Q rebuilt onto vdk as it goes), stopped inside; raidnbd serve
#    continues it to the end: raid6 left-symmetric, same digest, fsck, files, raidnbd check 0;
#    mdadm assembles it: raid6, left-symmetric, no reshape, same digest, fsck, md check 0.
# C (runs last, so that D and E run whatever it does): raidnbd creates a RAID0 of 2 (vda, vdb,
#    64 KiB chunk), ext4 with files through /dev/nbd0; `raidnbd ctl grow --add /dev/vdc` at 1 MB/s
#    (ctl status: raid4 while the data moves, a reshape 3 -> 4); SIGKILL inside; `mdadm --assemble
#    --run` continues the raid4 reshape in the kernel to the end (a raid4 of 4 without its parity
#    member: the kernel does not go back to raid0, mdadm's child would); `mdadm --grow --level=0`:
#    raid0 of 3, 3/2 the size, the old bytes unchanged, fsck clean, files right.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 11x32M
# rig-timeout: 900
. /guest/lib.sh
M=/mnt
rig_debug() {
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
  for d in /dev/vda /dev/vdc /dev/vdd /dev/vdf /dev/vdg /dev/vdk; do mdadm --examine "$d" 2>&1 | head -n 45; done
}

mdadm_children() { # PIDs of mdadm processes still running (mdadm --grow leaves one waiting)
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = mdadm ] && echo "${p#/proc/}"
  done
  return 0
}
stop_mdadm_children() { # mdadm's background child keeps the array open: stop it (we started it)
  for p in $(mdadm_children); do
    echo "-- mdadm child $p: $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)"
    kill "$p" 2>/dev/null || true
  done
  n=0
  while [ -n "$(mdadm_children)" ]; do
    n=$((n + 1)); [ "$n" -le 50 ] || fail "mdadm's child does not exit"
    sleep 0.2
  done
}
wait_md_reshape_moved() { # MDDEV: until reshape_position is past 0 (a forward reshape)
  n=0
  until rp=$(cat "/sys/block/${1#/dev/}/md/reshape_position") && [ "$rp" != none ] && [ "$rp" -gt 0 ]; do
    n=$((n + 1)); [ "$n" -le 300 ] || fail "md's reshape of $1 does not move"
    sleep 0.2
  done
  echo "reshape_position of $1: $rp"
}

run modprobe nbd nbds_max=4

step "D: mdadm creates a RAID0 of 2 with room before the data, ext4 and files"
D="/dev/vdd /dev/vde"
run sh -c "mdadm --create /dev/md1 --metadata=1.2 --run --homehost=rig --name=stripe --level=0 --chunk=64 --data-offset=4M --raid-devices=2 $D" < /dev/null
mkfs_ext4 /dev/md1
run mount -t ext4 /dev/md1 $M
fill_tree $M 24 1024 /tmp/d.md5
run umount $M
D_OLD=$(size_bytes /dev/md1)
D_SUM=$(dev_digest /dev/md1)

step "D: mdadm --grow --raid-devices=3 --add /dev/vdf (no backup file), stopped inside the reshape"
echo 1000 > /proc/sys/dev/raid/speed_limit_max
echo 1000 > /proc/sys/dev/raid/speed_limit_min
run sh -c "mdadm --grow /dev/md1 --raid-devices=3 --add /dev/vdf" < /dev/null
cat /proc/mdstat
expect_eq "$(cat /sys/block/md1/md/level)" raid4 "D: md's level while it reshapes"
wait_md_reshape_moved /dev/md1
cat /proc/mdstat
stop_mdadm_children
run mdadm --stop /dev/md1
echo 100000 > /proc/sys/dev/raid/speed_limit_max
mdadm --examine /dev/vdd | tee /tmp/d-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/d-examine.txt || fail "D: the stopped array records no reshape"
contains "New Offset" < /tmp/d-examine.txt || fail "D: md's grow did not move the data offset"
mdadm --examine /dev/vdf | head -n 45

step "D: raidnbd serve finishes md's raid0 grow"
raidnbd_serve $D /dev/vdf
raidnbd_last_log | contains "being reshaped" || fail "D: raidnbd does not say the array is being reshaped"
raidnbd_status_json | contains '"reshape": {' || fail "D: ctl status shows no reshape"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_status_json
contains '"reshape": null' < /tmp/raidnbd-status.json || fail "D: the reshape did not finish"
contains '"level": "raid0"' < /tmp/raidnbd-status.json || fail "D: not a raid0 again"
raidnbd_ctl status
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(size_bytes /dev/nbd0)" $((D_OLD / 2 * 3)) "D: nbd0 size"
expect_eq "$(head_digest /dev/nbd0 "$D_OLD")" "$D_SUM" "D: nbd0's first $D_OLD bytes vs md1 before the grow"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/d.md5
run umount $M
D_SUM3=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop

step "D: mdadm assembles what raidnbd finished"
run mdadm --assemble /dev/md1 --run $D /dev/vdf
cat /proc/mdstat
expect_eq "$(cat /sys/block/md1/md/level)" raid0 "D: md's level"
expect_eq "$(cat /sys/block/md1/md/raid_disks)" 3 "D: raid disks"
expect_eq "$(dev_digest /dev/md1)" "$D_SUM3" "D: md1 vs nbd0 digest"
fsck_clean /dev/md1
run mdadm --stop /dev/md1

step "E: raidnbd creates a RAID5 of 4, md assembles it, ext4 and files"
E="/dev/vdg /dev/vdh /dev/vdi /dev/vdj"
run raidnbd create --level 5 --chunk 64K --consistency-policy resync $E
run mdadm --assemble /dev/md2 --run $E
mkfs_ext4 /dev/md2
run mount -t ext4 /dev/md2 $M
fill_tree $M 24 1024 /tmp/e.md5
run umount $M
E_SUM=$(dev_digest /dev/md2)

step "E: mdadm --grow --level=6 --raid-devices=5 --add /dev/vdk (no backup file), stopped inside"
echo 1000 > /proc/sys/dev/raid/speed_limit_max
echo 1000 > /proc/sys/dev/raid/speed_limit_min
echo "+ [$(rig_now)] mdadm --grow /dev/md2 --level=6 --raid-devices=5 --add /dev/vdk"
mdadm --grow /dev/md2 --level=6 --raid-devices=5 --add /dev/vdk < /dev/null > /tmp/e-grow.txt 2>&1 && rc=0 || rc=$?
cat /tmp/e-grow.txt
echo "mdadm --grow --level=6 exited with rc=$rc"
cat /proc/mdstat
mdadm --detail /dev/md2
[ "$rc" -eq 0 ] || fail "E: mdadm --grow --level=6 --raid-devices=5 failed (rc=$rc)"
expect_eq "$(cat /sys/block/md2/md/level)" raid6 "E: md's level while it reshapes"
wait_md_reshape_moved /dev/md2
cat /proc/mdstat
stop_mdadm_children
run mdadm --stop /dev/md2
echo 100000 > /proc/sys/dev/raid/speed_limit_max
mdadm --examine /dev/vdg | tee /tmp/e-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/e-examine.txt || fail "E: the stopped array records no reshape"
contains "New Offset" < /tmp/e-examine.txt || fail "E: md's reshape did not move the data offset"
mdadm --examine /dev/vdk | head -n 45

step "E: raidnbd serve continues the kernel's raid6 layout reshape"
raidnbd_serve $E /dev/vdk
raidnbd_last_log | contains "being reshaped" || fail "E: raidnbd does not say the array is being reshaped"
raidnbd_status_json | contains '"reshape": {' || fail "E: ctl status shows no reshape"
contains '"level": "raid6"' < /tmp/raidnbd-status.json || fail "E: raidnbd does not serve a raid6"
run raidnbd_ctl rebuild-speed 100M 200M
run raidnbd_ctl wait --timeout 300
raidnbd_status_json
contains '"reshape": null' < /tmp/raidnbd-status.json || fail "E: the reshape did not finish"
contains '"level": "raid6"' < /tmp/raidnbd-status.json || fail "E: not a raid6"
contains '"layout": "64K chunk, left-symmetric"' < /tmp/raidnbd-status.json || fail "E: the layout is not left-symmetric"
contains '"state": "recovering"' < /tmp/raidnbd-status.json && fail "E: Q is not rebuilt"
raidnbd_ctl status
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
expect_eq "$(dev_digest /dev/nbd0)" "$E_SUM" "E: nbd0 vs md2 before the grow"
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M /tmp/e.md5
run umount $M
nbd_detach /dev/nbd0
raidnbd_stop
run raidnbd check $E /dev/vdk

step "E: mdadm assembles what raidnbd finished"
run mdadm --assemble /dev/md2 --run $E /dev/vdk
cat /proc/mdstat
mdadm --detail /dev/md2 | tee /tmp/e-detail.txt
expect_eq "$(cat /sys/block/md2/md/level)" raid6 "E: md's level"
expect_eq "$(cat /sys/block/md2/md/raid_disks)" 5 "E: raid disks"
expect_eq "$(cat /sys/block/md2/md/reshape_position)" none "E: no reshape left"
contains "Layout : left-symmetric$" < /tmp/e-detail.txt || fail "E: md's layout is not left-symmetric"
expect_eq "$(dev_digest /dev/md2)" "$E_SUM" "E: md2 digest"
fsck_clean /dev/md2
md_check_clean /dev/md2 "E: md's check of the raid6"
run mdadm --stop /dev/md2

step "C: raidnbd creates a RAID0 of 2, ext4 and files through nbd0"
C="/dev/vda /dev/vdb"
run raidnbd create --level 0 --chunk 64K $C
raidnbd_serve $C
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 $M
fill_tree $M 24 1024 /tmp/c.md5
run umount $M
C_OLD=$(size_bytes /dev/nbd0)
C_SUM=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0

step "C: ctl grow --add /dev/vdc at 1 MB/s, SIGKILL inside the reshape"
run raidnbd_ctl rebuild-speed 1M 1M
run raidnbd_ctl grow --add /dev/vdc
raidnbd_status_json
contains '"level": "raid4"' < /tmp/raidnbd-status.json || fail "C: not a raid4 while the data moves"
expect_eq "$(json_number from_raid_devices /tmp/raidnbd-status.json)" 3 "C: reshape from"
expect_eq "$(json_number to_raid_devices /tmp/raidnbd-status.json)" 4 "C: reshape to"
n=0
until raidnbd_status_json > /dev/null && [ "$(json_number front_bytes /tmp/raidnbd-status.json)" -gt 0 ]; do
  n=$((n + 1)); [ "$n" -le 150 ] || fail "C: the reshape does not move"
  sleep 0.2
done
raidnbd_ctl status
raidnbd_stop KILL
mdadm --examine /dev/vda | tee /tmp/c-examine.txt | head -n 45
contains "Reshape pos'n" < /tmp/c-examine.txt || fail "C: mdadm sees no reshape in progress"
contains "Raid Level : raid4" < /tmp/c-examine.txt || fail "C: not a raid4 on disk"
mdadm --examine /dev/vdc | head -n 45

step "C: mdadm --assemble --run continues the raid4 reshape in the kernel"
echo 100000 > /proc/sys/dev/raid/speed_limit_max
run mdadm --assemble /dev/md0 --run $C /dev/vdc
cat /proc/mdstat
run mdadm --wait /dev/md0 || true
md_wait_idle /dev/md0
cat /proc/mdstat
expect_eq "$(cat /sys/block/md0/md/level)" raid4 "C: md's level when the kernel finished"
expect_eq "$(cat /sys/block/md0/md/raid_disks)" 4 "C: raid disks when the kernel finished"
expect_eq "$(cat /sys/block/md0/md/reshape_position)" none "C: no reshape left"
expect_eq "$(cat /sys/block/md0/md/degraded)" 1 "C: raid4 without its parity member"

step "C: mdadm --grow --level=0 takes it back to raid0 of 3"
run sh -c "mdadm --grow /dev/md0 --level=0" < /dev/null
cat /proc/mdstat
expect_eq "$(cat /sys/block/md0/md/level)" raid0 "C: md's level"
expect_eq "$(cat /sys/block/md0/md/raid_disks)" 3 "C: raid disks"
expect_eq "$(size_bytes /dev/md0)" $((C_OLD / 2 * 3)) "C: md0 size"
expect_eq "$(head_digest /dev/md0 "$C_OLD")" "$C_SUM" "C: md0's first $C_OLD bytes vs nbd0 before the grow"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M /tmp/c.md5
run umount $M
run mdadm --stop /dev/md0
