#!/bin/sh
# raidnbd + kernel NBD client + ext4 at RAID5, RAID6, RAID10: degraded, crash, resync, mdadm both ways.
# One pass per level (RAID5 over 4 members, RAID6 over 5, RAID10 n2 over 4; 16 MiB members;
# "left out" = the last member, for RAID6 the last two):
#  1. raidnbd create; serve; nbd-client -N rig -b 4096 -C 2 (2 connections checked); mkfs.ext4,
#     mount, files + checksums, umount, e2fsck -fn clean; whole-device digest D1;
#  2. mdadm --assemble of raidnbd's array: same size, digest D1, files, md check mismatch_cnt 0;
#  3. raidnbd serves again, new files; orderly stop; serves with members left out: writable,
#     old files there, more files written, fsck clean, digest D3;
#  4. mdadm --assemble --run of all members: the left-out ones are stale, md runs degraded with
#     digest D3 and every file; mdadm re-adds them, recovers, md check mismatch_cnt 0;
#  5. `raidnbd check` (offline) of md's recovered array: 0 mismatches; raidnbd serves it: digest D3;
#  6. crash (SIGKILL after writes): raidnbd serves all members again and resyncs (`ctl status
#     --json` until idle); files and fsck fine; after an orderly stop the superblocks say clean;
#  7. crash again, then serve with members left out: RAID6 dirty + degraded must be served
#     read-only (the write hole) until `serve --force`; RAID5 (md's partial parity log, its
#     default) replays its log and stays writable, as RAID10 does; files and fsck fine.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 5x16M
# rig-timeout: 900
. /guest/lib.sh
ALL="/dev/vda /dev/vdb /dev/vdc /dev/vdd /dev/vde"
rig_debug() {
  echo "-- raidnbd log:"; tail -n 60 "$RAIDNBD_LOG" 2>/dev/null
  for m in $ALL; do echo "-- $m:"; mdadm --examine "$m" 2>&1 | grep -E 'State|Events|Device Role|Raid Level'; done
}
without() { # "LIST" ITEM...: LIST minus the ITEMs
  w_list=$1; shift
  for w in $w_list; do case " $* " in *" $w "*) ;; *) printf '%s ' "$w" ;; esac; done
}
count() { set -- $1; echo $#; }
attach() { nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2; }
sb_state() { mdadm --examine "$1" | sed -n 's/^ *State : //p'; } # clean | active
write_files() { # SET COUNT: mount nbd0, write COUNT files of 512 KiB under $M/SET, umount
  run mount -t ext4 /dev/nbd0 "$M"
  fill_tree "$M/$1" "$2" 512 "/tmp/$name.$1.md5"
  run umount "$M"
}
verify_files() { # DEV SET...: mount DEV read-only, verify the SETs, umount
  vf_dev=$1; shift
  run mount -t ext4 -o ro "$vf_dev" "$M"
  for s in "$@"; do verify_tree "$M/$s" "/tmp/$name.$s.md5"; done
  run umount "$M"
}

run modprobe nbd nbds_max=4
FORCE=""

pass() { # NAME MD-LEVEL "CREATE OPTIONS" "MEMBERS" "LEFT-OUT MEMBERS"
  name=$1 md_level=$2 create_opts=$3 members=$4 out=$5
  kept=$(without "$members" $out)
  first=${members%% *}
  M=/mnt/$name
  mkdir -p "$M"

  step "$name: raidnbd create $create_opts ($(count "$members") members)"
  run raidnbd create $FORCE $create_opts $members
  mdadm --examine "$first" | contains "Raid Level : $md_level\$" || fail "mdadm --examine $first does not show $md_level"
  FORCE=--force # the next passes overwrite this pass's superblocks on purpose

  step "$name: serve, nbd-client -C 2, mkfs.ext4, files, fsck"
  raidnbd_serve $members
  attach
  expect_eq "$(blockdev --getro /dev/nbd0)" 0 "$name: nbd0 read-only flag"
  mkfs_ext4 /dev/nbd0
  write_files f1 12
  fsck_clean /dev/nbd0
  D1=$(dev_digest /dev/nbd0)
  SIZE=$(size_bytes /dev/nbd0)
  nbd_detach /dev/nbd0
  raidnbd_stop

  step "$name: mdadm --assemble of raidnbd's array, md check"
  run mdadm --assemble /dev/md0 $members
  expect_eq "$(cat /sys/block/md0/md/level)" "$md_level" "$name: md level"
  expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "$name: md degraded members"
  expect_eq "$(size_bytes /dev/md0)" "$SIZE" "$name: md0 size vs nbd0"
  expect_eq "$(dev_digest /dev/md0)" "$D1" "$name: digest of md0 vs nbd0"
  verify_files /dev/md0 f1
  md_check_clean /dev/md0 "$name: md mismatch_cnt of raidnbd's array"
  run mdadm --stop /dev/md0

  step "$name: serve, write; serve without$(printf ' %s' $out), write"
  raidnbd_serve $members
  attach
  write_files f2 6
  nbd_detach /dev/nbd0
  raidnbd_stop
  raidnbd_serve $kept
  raidnbd_last_log | contains DEGRADED || fail "raidnbd does not say the array is degraded"
  attach
  expect_eq "$(blockdev --getro /dev/nbd0)" 0 "$name: degraded nbd0 read-only flag (cleanly stopped)"
  expect_eq "$(size_bytes /dev/nbd0)" "$SIZE" "$name: degraded nbd0 size"
  verify_files /dev/nbd0 f1 f2
  write_files f3 6
  fsck_clean /dev/nbd0
  D3=$(dev_digest /dev/nbd0)
  nbd_detach /dev/nbd0
  raidnbd_stop
  expect_eq "$(sb_state "$first")" clean "$name: superblock state after a degraded orderly stop"

  step "$name: mdadm assembles degraded, re-adds$(printf ' %s' $out), md check"
  run mdadm --assemble --run /dev/md0 $members || true
  [ -b /dev/md0 ] && [ "$(cat /sys/block/md0/md/array_state)" != inactive ] || fail "mdadm did not start md0"
  expect_eq "$(cat /sys/block/md0/md/degraded)" "$(count "$out")" "$name: md degraded members (left-out ones are stale)"
  expect_eq "$(dev_digest /dev/md0)" "$D3" "$name: digest of degraded md0 vs nbd0"
  fsck_clean /dev/md0
  verify_files /dev/md0 f1 f2 f3
  for m in $out; do run mdadm /dev/md0 --add "$m"; done
  md_wait_idle /dev/md0
  expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "$name: md degraded members after recovery"
  md_check_clean /dev/md0 "$name: md mismatch_cnt after recovery"
  run mdadm --stop /dev/md0

  step "$name: raidnbd check + serve of md's recovered array"
  run raidnbd check --json $members > /tmp/$name.check.json
  cat /tmp/$name.check.json
  expect_eq "$(json_number mismatch_cnt /tmp/$name.check.json)" 0 "$name: raidnbd check mismatch_cnt"
  raidnbd_serve $members
  attach
  expect_eq "$(dev_digest /dev/nbd0)" "$D3" "$name: digest of nbd0 after md's recovery"

  step "$name: crash (SIGKILL), serve all members: resync, clean stop"
  write_files f4 4
  raidnbd_stop KILL
  nbd_detach /dev/nbd0
  echo "ok: superblock of $first after the crash: State : $(sb_state "$first")"
  raidnbd_serve $members
  raidnbd_wait_idle 300
  attach
  fsck_clean /dev/nbd0
  verify_files /dev/nbd0 f1 f4 # f2, f3: checked after every earlier restart
  nbd_detach /dev/nbd0
  raidnbd_stop
  expect_eq "$(sb_state "$first")" clean "$name: superblock state after resync and an orderly stop"

  step "$name: crash, serve without$(printf ' %s' $out): read-only for RAID6 (no log)"
  raidnbd_serve $members
  attach
  write_files f5 4
  raidnbd_stop KILL
  nbd_detach /dev/nbd0
  case "$(sb_state "$first")" in active*) dirty=1 ;; *) dirty=0 ;; esac
  case "$md_level" in raid6) want_ro=$dirty ;; *) want_ro=0 ;; esac
  raidnbd_serve $kept
  attach
  expect_eq "$(blockdev --getro /dev/nbd0)" "$want_ro" "$name: nbd0 read-only when degraded after a crash (dirty=$dirty)"
  [ "$want_ro" = 0 ] || raidnbd_last_log | contains 'Serving READ-ONLY' || fail "raidnbd served read-only without saying so"
  [ "$md_level$dirty" != raid51 ] || raidnbd_last_log | contains 'partial parity log replayed' \
    || fail "$name: the dirty raid5 did not replay its parity log"
  fsck_clean /dev/nbd0
  verify_files /dev/nbd0 f1 f5 # the oldest files and the ones written just before the crash
  nbd_detach /dev/nbd0
  raidnbd_stop
  if [ "$want_ro" = 1 ]; then
    raidnbd_serve --force $kept
    attach
    expect_eq "$(blockdev --getro /dev/nbd0)" 0 "$name: nbd0 read-only flag with serve --force"
    nbd_detach /dev/nbd0
    raidnbd_stop
  fi
}

pass raid5 raid5 "--level 5 --chunk 64K" "/dev/vda /dev/vdb /dev/vdc /dev/vdd" "/dev/vdd"
pass raid6 raid6 "--level 6 --chunk 64K" "$ALL" "/dev/vdd /dev/vde"
pass raid10 raid10 "--level 10 --layout n2 --chunk 64K" "/dev/vda /dev/vdb /dev/vdc /dev/vdd" "/dev/vdd"
