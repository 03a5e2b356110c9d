#!/bin/sh
# Rig self-check (no raidnbd), the guest's md driver and mdadm: RAID5 (metadata 1.2, 64 KiB chunk) over four
# virtio disks, initial resync, ext4 made and filled, fsck, stop, re-assemble (clean, 4/4),
# verify, then a degraded assembly from three members and verify again (reconstruction reads).
# rig-status: manual
# rig-disks: 4x48M
# rig-timeout: 400
. /guest/lib.sh
rig_debug() { mdadm --detail /dev/md0 2>/dev/null; }
MEMBERS="/dev/vda /dev/vdb /dev/vdc /dev/vdd"

step "mdadm --create raid5 (with resync)"
run mdadm --create /dev/md0 --metadata=1.2 --run --level=5 --raid-devices=4 --chunk=64 \
  --name=standin --homehost=rig $MEMBERS
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/level)" raid5 "md0 level"
expect_eq "$(cat /sys/block/md0/md/mismatch_cnt)" 0 "mismatch_cnt after resync"

step "mkfs.ext4, mount, write 24 files, umount"
mkfs_ext4 /dev/md0
run mount -t ext4 /dev/md0 /mnt
fill_tree /mnt 24 1024 /tmp/files.md5
run umount /mnt
fsck_clean /dev/md0
MD_SUM=$(dev_digest /dev/md0)
MD_SIZE=$(size_bytes /dev/md0)

step "parity check (sync_action=check)"
md_check_clean /dev/md0 "mismatch_cnt after check"

step "stop and re-assemble"
run mdadm --stop /dev/md0
mdadm --examine /dev/vda | tee "$RIG_RESULTS/standin-mdadm-vda.examine.txt" | contains 'Raid Level : raid5' \
  || fail "--examine /dev/vda does not show raid5"
run mdadm --assemble /dev/md0 $MEMBERS
expect_eq "$(cat /sys/block/md0/md/raid_disks)" 4 "raid_disks"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "degraded members"
expect_eq "$(size_bytes /dev/md0)" "$MD_SIZE" "md0 size after assemble"
expect_eq "$(dev_digest /dev/md0)" "$MD_SUM" "digest of md0 after assemble"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 /mnt
verify_tree /mnt /tmp/files.md5
run umount /mnt
run mdadm --stop /dev/md0

step "degraded assembly from 3 of 4 members"
run mdadm --assemble --run /dev/md0 /dev/vda /dev/vdb /dev/vdc
expect_eq "$(cat /sys/block/md0/md/degraded)" 1 "degraded members"
drop_caches
expect_eq "$(dev_digest /dev/md0)" "$MD_SUM" "digest of degraded md0"
run mount -t ext4 -o ro /dev/md0 /mnt
verify_tree /mnt /tmp/files.md5
run umount /mnt
run mdadm --stop /dev/md0
