#!/bin/sh
# Living with an array: fail a member under a writer, add a spare, rebuild online; then raidnbd check and mdadm agree.
# raidnbd serves a RAID5 (4 x 24 MiB, 64 KiB chunk) with ext4 mounted from /dev/nbd0 (-C 2); a
# background writer rewrites 40 slot files of 256 KiB in place (random data, fsync, md5 per
# slot) the whole time:
#  - `raidnbd ctl fail /dev/vdb` through the control socket: status says faulty/degraded, the
#    writer goes on, the static files read back right (reconstruction under writes);
#  - `raidnbd ctl add /dev/vde` (a spare): a recovery runs while the writer writes (its speed
#    capped with `ctl rebuild-speed` so that the two overlap); `ctl status --json` is polled
#    until it is idle with every role in sync; the writer goes on a while, then stops; every file
#    matches its checksum (after dropping caches), umount, e2fsck -fn clean; an online
#    `ctl check` finds 0 mismatches;
#  - after an orderly stop, `raidnbd check` (offline) of vda vdc vdd vde: mismatch_cnt 0;
#  - mdadm --assemble of the rebuilt member set (vda vde vdc vdd): not degraded, same digest as
#    /dev/nbd0 had, md's own check (sync_action=check) mismatch_cnt 0, fsck clean, same files.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 5x24M
# rig-timeout: 600
. /guest/lib.sh
MEMBERS="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
REBUILT="/dev/vda /dev/vde /dev/vdc /dev/vdd"
M=/mnt
rig_debug() {
  writer_debug
  raidnbd_ctl status 2>&1
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
}

last_check_mismatches() { # from ctl status --json
  raidnbd_ctl status --json | awk '/"last_check"/ {f=1} f && /"mismatch_cnt"/ && !done {gsub(/[^0-9]/, ""); print; done=1}'
}

step "raidnbd create RAID5, serve, ext4, static files"
run raidnbd create --level 5 --chunk 64K $MEMBERS
run modprobe nbd nbds_max=4
raidnbd_serve $MEMBERS
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 $M
fill_tree $M/static 8 1024 /tmp/static.md5
raidnbd_ctl status

step "writer running; ctl fail /dev/vdb"
writer_start $M/w
wait_writes 40 # every slot file exists
run raidnbd_ctl fail /dev/vdb
raidnbd_ctl status
expect_eq "$(raidnbd_role_state /dev/vdb)" faulty "state of /dev/vdb after ctl fail"
raidnbd_status_json | contains '"state": "active, degraded' || fail "ctl status does not say degraded"
wait_writes 15
drop_caches
verify_tree $M/static /tmp/static.md5

step "ctl add /dev/vde: rebuild while the writer writes"
# At most 4 MB/s: the rebuild (23 MiB per member) overlaps the writer for several seconds even when
# the writer is slow and the worker would otherwise run at full speed.
run raidnbd_ctl rebuild-speed 2M 4M
run raidnbd_ctl add /dev/vde
n=0 # the worker starts the recovery asynchronously
until raidnbd_ctl status --json | contains '"kind": "recovery"'; do
  n=$((n + 1)); [ "$n" -le 50 ] || fail "no recovery running 10 s after ctl add"
  sleep 0.2
done
raidnbd_ctl status
WRITES_BEFORE=$(writer_count)
raidnbd_wait_idle 400
raidnbd_ctl status
WRITES_DURING=$(( $(writer_count) - WRITES_BEFORE ))
echo "ok: the writer wrote $WRITES_DURING slot files during the rebuild"
[ "$WRITES_DURING" -gt 0 ] || fail "no write happened during the rebuild"
for m in $REBUILT; do expect_eq "$(raidnbd_role_state "$m")" in_sync "state of $m after the rebuild"; done
run raidnbd_ctl rebuild-speed 1M 200M # md's defaults again, for the check below
wait_writes 15

step "stop the writer, verify, umount, fsck, online check"
writer_stop
verify_writer
run umount $M
drop_caches
run mount -t ext4 -o ro /dev/nbd0 $M
verify_tree $M/static /tmp/static.md5
verify_writer
run umount $M
fsck_clean /dev/nbd0
run raidnbd_ctl check
raidnbd_wait_idle 300
expect_eq "$(last_check_mismatches)" 0 "mismatch_cnt of the online check"
NBD_SUM=$(dev_digest /dev/nbd0)
nbd_detach /dev/nbd0
raidnbd_stop

step "raidnbd check (offline) of the rebuilt array"
run raidnbd check --json $REBUILT > /tmp/check.json
cat /tmp/check.json
expect_eq "$(json_number mismatch_cnt /tmp/check.json)" 0 "mismatch_cnt of raidnbd check"

step "mdadm --assemble of the rebuilt member set, md check"
run mdadm --assemble /dev/md0 $REBUILT
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "md degraded members"
expect_eq "$(dev_digest /dev/md0)" "$NBD_SUM" "digest of md0 vs nbd0"
md_check_clean /dev/md0 "md mismatch_cnt of the rebuilt array"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 $M
verify_tree $M/static /tmp/static.md5
verify_writer
run umount $M
run mdadm --stop /dev/md0
