#!/bin/sh
# Superblock handling after a crash, checked against md's own behaviour (a regression test for
# four bugs this scenario once reproduced). A RAID5 (4 x 16 MiB) is written through raidnbd and the
# server is killed (SIGKILL): the superblocks say "active" (dirty). Then:
#  1. `raidnbd check` (offline, members opened read-only) of the dirty array writes no superblock;
#  2. `raidnbd serve --read-only` of the dirty array likewise;
#  3. the automatic read-only serve of a dirty + degraded RAID5 (without the last member) leaves
#     the superblocks alone, as md does for a read-only array (else the left-out member turns stale);
#  4. after `serve --force` of the dirty + degraded array, writes and an orderly stop, the array is
#     clean: md itself, started with start_dirty_degraded=1, finds the resync impossible, calls it
#     done and records clean (checked at the end as the reference), and `mdadm --assemble --run`
#     accepts the array.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 4x16M
# rig-timeout: 300
. /guest/lib.sh
ALL="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
KEPT="/dev/vda /dev/vdb /dev/vdc"
BUGS=""
bug() { echo "BUG: $*"; BUGS="$BUGS
 - $*"; }
rig_debug() { echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null; }
events() { mdadm --examine "$1" | sed -n 's/^ *Events : //p'; }
sb_state() { mdadm --examine "$1" | sed -n 's/^ *State : //p'; }
events_all() { for m in $ALL; do printf '%s ' "$(events "$m")"; done; }
write_and_crash() { # [--force] MEMBER...: serve, write 1 MiB through nbd0, SIGKILL
  raidnbd_serve "$@"
  nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
  run dd if=/dev/urandom of=/dev/nbd0 bs=64k count=16 oflag=direct status=none
  raidnbd_stop KILL
  nbd_detach /dev/nbd0
}

step "setup: raidnbd create RAID5, write, crash"
run raidnbd create --level 5 --consistency-policy resync --chunk 64K $ALL # no parity log: md's own dirty+degraded rules
run modprobe nbd nbds_max=4
write_and_crash $ALL
expect_eq "$(sb_state /dev/vda)" active "superblock state after the crash (precondition)"
E0=$(events_all)
echo "ok: events after the crash: $E0"

step "1. raidnbd check of the dirty array"
raidnbd check $ALL > /tmp/check.log 2>&1 && rc=0 || rc=$?
cat /tmp/check.log
expect_eq "$rc" 0 "raidnbd check exit status"
! grep -q 'superblock write failed' /tmp/check.log \
  || bug "raidnbd check (read-only) of a dirty array writes superblocks: $(grep -c 'superblock write failed' /tmp/check.log) x 'superblock write failed: device marked faulty'"
[ "$(events_all)" = "$E0" ] || bug "raidnbd check changed Events: $E0-> $(events_all)"

step "2. serve --read-only of the dirty array"
raidnbd_serve --read-only $ALL
sleep 2
raidnbd_stop
! raidnbd_last_log | contains 'superblock write failed' \
  || bug "serve --read-only of a dirty array writes superblocks at SIGTERM: $(raidnbd_last_log | grep -c 'superblock write failed') x 'superblock write failed: device marked faulty'"
[ "$(events_all)" = "$E0" ] || bug "serve --read-only changed Events: $E0-> $(events_all)"

step "3. automatic read-only serve of the dirty, degraded array"
raidnbd_serve $KEPT
raidnbd_last_log | contains 'Serving READ-ONLY' || fail "raidnbd did not serve the dirty degraded RAID5 read-only (precondition)"
sleep 2
raidnbd_stop
[ "$(events_all)" = "$E0" ] \
  || bug "the READ-ONLY (dirty + degraded) serve wrote superblocks at SIGTERM: Events $E0-> $(events_all); /dev/vdd is now stale"

step "4. serve --force of the dirty, degraded array, write, orderly stop; mdadm --assemble"
write_and_crash --force $KEPT # a dirty degraded array whatever steps 1-3 did
raidnbd_serve --force $KEPT
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
run dd if=/dev/urandom of=/dev/nbd0 bs=64k count=16 oflag=direct status=none
nbd_detach /dev/nbd0
raidnbd_stop
echo "ok: superblock of /dev/vda after serve --force + SIGTERM: State : $(sb_state /dev/vda)"
if run mdadm --assemble --run /dev/md0 $ALL; then
  run mdadm --stop /dev/md0
else
  bug "after serve --force (dirty + degraded) and an orderly stop the superblocks say '$(sb_state /dev/vda)'; mdadm --assemble --run refuses: $(dmesg | grep -o 'cannot start dirty degraded array' | tail -n 1)"
fi

step "md reference: start_dirty_degraded, stop, clean"
# Whatever raidnbd left, make the array dirty + degraded again and let md handle it.
mdadm --stop /dev/md0 2>/dev/null || true
write_and_crash --force $KEPT
echo 1 > /sys/module/md_mod/parameters/start_dirty_degraded
run mdadm --assemble --run /dev/md0 $KEPT
md_wait_idle /dev/md0
run mdadm --stop /dev/md0
echo 0 > /sys/module/md_mod/parameters/start_dirty_degraded
expect_eq "$(sb_state /dev/vda)" clean "md: superblock state after a dirty degraded start and a stop"

step "verdict"
[ -z "$BUGS" ] || fail "raidnbd bugs reproduced:$BUGS"
