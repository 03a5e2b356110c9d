#!/bin/sh
# A restart of raidnbd is not an outage for the kernel client: `raidnbd attach` rides through stops, an upgrade and a crash.
# raidnbd serves a RAID5 (4 x 24 MiB virtio disks, 64 KiB chunk, PPL by default) on the guest's
# loopback; `raidnbd attach nbd://127.0.0.1:10809/rig /dev/nbd0 -C 2 --request-timeout 5s
# --dead-conn-timeout 60s` attaches it (netlink, a dead-connection timeout, reconfigure on the
# driver's link-dead events). ext4 on /dev/nbd0 with a background writer (40 slot files of 256 KiB
# rewritten in place with fsync, md5 of each) the whole time, while raidnbd is
#  - stopped (SIGTERM, exit 0) and started again after a 2 s gap,
#  - upgraded: stopped and a copy of the binary started from another path,
#  - crashed (SIGKILL) and started again (PPL recovery);
# after each, the writer goes on (more writes) and attach logged both connections replaced.
# Then: every file matches, e2fsck -fn clean after a remount, and the guest's kernel log has no
# I/O error, no ext4 error and no "Buffer I/O" line. SIGTERM to attach detaches /dev/nbd0.
# Control: Debian's nbd-client (no dead-connection timeout) attached to /dev/nbd1 fails a read
# across a stop of raidnbd, and the same kernel-log check then finds its I/O error.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 4x24M
# rig-timeout: 600
. /guest/lib.sh
MEMBERS="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
M=/mnt
ATTACH_LOG=/tmp/attach.log
ATTACH_PID=""
URI="nbd://127.0.0.1:$RAIDNBD_PORT/$RAIDNBD_EXPORT"
rig_debug() {
  writer_debug
  echo "-- attach log:"; tail -n 40 "$ATTACH_LOG" 2>/dev/null
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
  echo "-- kernel log (nbd):"; dmesg | grep -i nbd | tail -n 30
}
replaced() { grep -c 'connection replaced' "$ATTACH_LOG" || true; }
kernel_errors() { # lines of the kernel log that mean a failed I/O or a filesystem error
  dmesg | grep -E 'I/O error|Buffer I/O|EXT4-fs (error|warning)|blk_update_request|critical (medium|target)' || true
}
restart() { # HOW: stop (SIGTERM), upgrade (another binary) or crash (SIGKILL); start again
  before=$(replaced)
  writes=$(writer_count)
  case $1 in
    crash) raidnbd_stop KILL ;;
    *) raidnbd_stop ;;
  esac
  sleep 2 # the gap: nothing listens
  [ "$1" != upgrade ] || { cp "$(command -v raidnbd)" /tmp/raidnbd-upgraded; RAIDNBD_BIN=/tmp/raidnbd-upgraded; }
  raidnbd_serve $MEMBERS
  n=0
  until [ "$(replaced)" -ge $((before + 2)) ]; do
    n=$((n + 1)); [ "$n" -le 600 ] || fail "attach did not replace both connections 120 s after the $1 restart"
    sleep 0.2
  done
  expect_eq "$(established_to "$RAIDNBD_PORT")" 2 "connections to raidnbd after the $1 restart"
  wait_writes 10
  echo "ok: [$(rig_now)] $1 restart: writer went from $writes to $(writer_count) writes"
}

step "raidnbd create RAID5, serve, attach with a dead-connection timeout"
run raidnbd create --level 5 --chunk 64K $MEMBERS
run modprobe nbd nbds_max=4
raidnbd_serve $MEMBERS
echo "+ [$(rig_now)] raidnbd attach $URI /dev/nbd0 -C 2 --request-timeout 5s --dead-conn-timeout 60s"
raidnbd attach "$URI" /dev/nbd0 -C 2 --request-timeout 5s --dead-conn-timeout 60s > "$ATTACH_LOG" 2>&1 &
ATTACH_PID=$!
n=0
while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
  kill -0 "$ATTACH_PID" 2>/dev/null || { cat "$ATTACH_LOG"; fail "raidnbd attach exited"; }
  n=$((n + 1)); [ "$n" -le 100 ] || fail "/dev/nbd0 has size 0 after raidnbd attach"
  sleep 0.2
done
expect_eq "$(established_to "$RAIDNBD_PORT")" 2 "connections to 127.0.0.1:$RAIDNBD_PORT"
expect_eq "$(cat /sys/block/nbd0/queue/logical_block_size)" 4096 "logical block size of nbd0"
mkfs_ext4 /dev/nbd0
run mount -t ext4 /dev/nbd0 $M
fill_tree $M/static 8 512 /tmp/static.md5
dmesg -c > /dev/null # from here on, the kernel log must stay free of I/O errors

step "writer running; raidnbd stopped and started again"
writer_start $M/w
wait_writes 40 # every slot file exists
restart stop

step "raidnbd upgraded (another binary) under the writer"
restart upgrade

step "raidnbd crashed (SIGKILL) and started again under the writer"
restart crash
raidnbd_last_log | grep -iE 'dirty|parity log|ppl' | head -n 5 || true

step "stop the writer, verify, remount, fsck, kernel log"
writer_stop
verify_writer
drop_caches
verify_tree $M/static /tmp/static.md5
run umount $M
run mount -t ext4 -o ro /dev/nbd0 $M
verify_writer
run umount $M
fsck_clean /dev/nbd0
echo "-- kernel log of the restarts (nbd):"; dmesg | grep -i nbd | tail -n 20 || true
ERRORS=$(kernel_errors)
[ -z "$ERRORS" ] || fail "the kernel logged I/O errors across the restarts: $ERRORS"
echo "ok: no I/O error in the kernel log"
expect_eq "$(replaced)" 6 "connections attach replaced (2 per restart)"

step "SIGTERM to attach detaches /dev/nbd0"
kill -TERM "$ATTACH_PID"
wait "$ATTACH_PID" && rc=0 || rc=$?
ATTACH_PID=""
expect_eq "$rc" 0 "exit status of raidnbd attach after SIGTERM"
grep -q detached "$ATTACH_LOG" || fail "attach did not log the detach"
expect_eq "$(cat /sys/block/nbd0/size)" 0 "size of nbd0 after the detach"

step "control: nbd-client without a dead-connection timeout fails across a stop"
nbd_attach "$RAIDNBD_PORT" /dev/nbd1 "$RAIDNBD_EXPORT" 1
run dd if=/dev/nbd1 of=/dev/null bs=4096 count=1 iflag=direct status=none
raidnbd_stop
sleep 1
if dd if=/dev/nbd1 of=/dev/null bs=4096 count=1 skip=100 iflag=direct status=none; then
  fail "a read on /dev/nbd1 succeeded with raidnbd stopped"
fi
kernel_errors | contains nbd1 || fail "the kernel-log check did not see the control's I/O error"
echo "ok: without attach, the stop failed a read (kernel log: $(kernel_errors | head -n 1))"
raidnbd_serve $MEMBERS
nbd_detach /dev/nbd1
raidnbd_stop
