#!/bin/sh
# md's write journal (raid5-cache, write-through), raidnbd and the kernel both ways (RAID6 + journal disk).
# The array: RAID6, 4 x 32 MiB members, 64K chunk, left-symmetric, a 32 MiB journal on a fifth disk.
# The known writes: 2 MiB (full stripes, 1 MiB O_DIRECT requests), then four 4 KiB writes (one over
# the 2 MiB, three read-modify-write in stripes 17..19), no FLUSH. To prove the log is what makes
# the array right, 24 rows of pages those writes wrote (data, P and Q, on every member, from each
# member's "Data Offset") are then overwritten with 0xEE, as if the crash had lost those member
# writes: without a replay a check finds 192 sectors (raidnbd check, which never replays, says so).
#  A1. raidnbd create --write-journal: mdadm --examine of the journal "Device Role : Journal",
#      mdadm --detail "Consistency Policy : journal", md check 0.
#  A2. raidnbd serves (takes md's log), the known writes through the kernel NBD client (ctl status:
#      tail_moves 0, so every unit is after the tail), SIGKILL, lost pages.
#  A3. md assembles and replays raidnbd's log ("recovering 0 data-only stripes and N data-parity
#      stripes", N > 0): the data reads back, md check 0, raidnbd check 0.
#  A4. raidnbd serves md's replayed array: mkfs.ext4 + 24 MiB of files, umount, the ring wraps
#      (tail_moves >= 1), SIGKILL; md replays the wrapped log: fsck clean, files (md5), md check 0.
#  B1. mdadm --create --write-journal --assume-clean; the known writes through md (journal_tail
#      unchanged); simulated crash: the members' heads and the whole journal, saved while md ran,
#      put back after the stop, lost pages.
#  B2. raidnbd serves md's crashed array without role 1 (degraded): "write journal replayed",
#      read-write (not READ-ONLY, ctl status read_only false), the data reads back (some rebuilt
#      through replayed parity), a new write; orderly stop.
#  B3. md assembles that (role 1 stale, degraded), re-adds role 1, recovers: md check 0, data right;
#      raidnbd check 0.
#  B4. crash image again, raidnbd serves all four: replay, data right; raidnbd check 0, md check 0.
#  B5. ext4 + 24 MiB of files through md (md reclaims its log: journal_tail moves), simulated
#      crash (heads + journal back); raidnbd replays md's log: fsck clean, files; both checks 0.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 5x32M
# rig-timeout: 600
. /guest/lib.sh
ALL="/dev/vda /dev/vdb /dev/vdc /dev/vdd" # roles 0..3
J=/dev/vde                                # the journal
ALLJ="$ALL $J"
KEPTJ="/dev/vda /dev/vdc /dev/vdd $J" # role 1 left out in B2
rig_debug() {
  echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null
  for d in $ALLJ; do echo "-- $d:"; mdadm --examine "$d" 2>&1 | grep -E 'State|Events|Device Role|Journal|Data Offset'; done
  dmesg | grep -iE 'md0|md/raid|journal|r5l|r5c' | tail -n 30
}

# Little-endian fields of the v1.2 superblock (member byte 4096 + OFF), read with O_DIRECT.
sb_u32() { # DEV OFF
  dd if="$1" bs=4096 skip=1 count=1 iflag=direct status=none | od -An -tu4 -j "$2" -N 4 | tr -d ' '
}
sb_u64() { # DEV OFF
  su_lo=$(sb_u32 "$1" "$2"); su_hi=$(sb_u32 "$1" $(($2 + 4)))
  printf '%u\n' $((su_lo + su_hi * 4294967296))
}
journal_tail() { sb_u64 "$J" 152; } # sectors from the journal's data offset
data_offset() { mdadm --examine "$1" | sed -n 's/^ *Data Offset : \([0-9]*\) sectors.*/\1/p'; }
sb_state() { mdadm --examine "$1" | sed -n 's/^ *State : //p'; }

run dd if=/dev/urandom of=/tmp/a bs=1M count=2 status=none     # array blocks 0..511: stripes 0..15
run dd if=/dev/urandom of=/tmp/small bs=4096 count=4 status=none
run dd if=/dev/urandom of=/tmp/new bs=4096 count=1 status=none  # B2's write, block 545
dd if=/dev/zero bs=4096 count=16 status=none | tr '\000' '\356' > /tmp/ee # 64 KiB of 0xEE
ZERO_MD5=$(dd if=/dev/zero bs=4096 count=1 status=none | md5sum | cut -d' ' -f1)
# Stripe s = 128 KiB of the array (array blocks 32 s .. 32 s + 31), member data blocks 16 s .. 16 s + 15:
# P on role 3 - s % 4, Q on (P + 1) % 4, D0 on (P + 2) % 4, D1 on (P + 3) % 4.
#   s0: P3 Q0 D0=1 D1=2  s3, s7, s19: P0 Q1 D0=2 D1=3  s17: P2 Q3 D0=0 D1=1  s18: P1 Q2 D0=3 D1=0
# The small writes (4 KiB blocks of the array): s0 D0 row 5 (over the 2 MiB: the later unit
# wins), s17 D0 row 0, s18 D1 row 8, s19 D1 row 6.
SMALL_BLOCKS="5 544 600 630"
REGION=640 # blocks compared: stripes 0..19
# Pages the "crash lost": ROLE|MEMBER DATA BLOCK|COUNT|ARRAY BLOCK (data pages: checked against
# what was written first) or -|what. 24 rows: 192 sectors.
GARBAGE="
1|5|1|5|s0 D0 row 5 (the small write over the 2 MiB)
3|5|1|-|s0 P row 5
2|48|16|96|s3 D0 whole chunk
0|50|2|-|s3 P rows 2..3
1|112|4|-|s7 Q rows 0..3
0|272|1|544|s17 D0 row 0
3|272|1|-|s17 Q row 0
0|296|1|600|s18 D1 row 8
1|296|1|-|s18 P row 8
3|310|1|630|s19 D1 row 6
1|310|1|-|s19 Q row 6
"
STALE_SECTORS=192

dd if=/dev/zero of=/tmp/expected bs=4096 count=$REGION status=none
dd if=/tmp/a of=/tmp/expected bs=4096 conv=notrunc status=none
i=0
for b in $SMALL_BLOCKS; do
  dd if=/tmp/small of=/tmp/expected bs=4096 skip="$i" count=1 seek="$b" conv=notrunc status=none
  i=$((i + 1))
done
cp /tmp/expected /tmp/expected2 # after B2's write
dd if=/tmp/new of=/tmp/expected2 bs=4096 seek=545 conv=notrunc status=none

writes() { # DEV: the 2 MiB (O_DIRECT, 1 MiB requests), then the four 4 KiB writes; no FLUSH
  run dd if=/tmp/a of="$1" bs=1M count=2 oflag=direct conv=notrunc status=none
  w_i=0
  for b in $SMALL_BLOCKS; do
    run dd if=/tmp/small of="$1" bs=4096 skip="$w_i" count=1 seek="$b" oflag=direct conv=notrunc status=none
    w_i=$((w_i + 1))
  done
}
page_md5() { dd if="$1" bs=4096 skip="$2" count=1 iflag=direct status=none | md5sum | cut -d' ' -f1; }
file_page_md5() { dd if="$1" bs=4096 skip="$2" count=1 status=none | md5sum | cut -d' ' -f1; } # tmpfs: no O_DIRECT
lose_pages() { # the crash lost those member writes: the GARBAGE pages := 0xEE
  echo "$GARBAGE" | while IFS='|' read -r role blk cnt ablk what; do
    [ -n "$role" ] || continue
    dev=$(disk "$role")
    lp_do=$(data_offset "$dev") # sectors
    [ -n "$lp_do" ] && [ $((lp_do % 8)) -eq 0 ] || fail "data offset '$lp_do' of $dev"
    k=0
    while [ "$k" -lt "$cnt" ]; do
      got=$(page_md5 "$dev" $((lp_do / 8 + blk + k)))
      if [ "$ablk" = - ]; then
        [ "$got" != "$ZERO_MD5" ] || fail "role $role data block $((blk + k)) is zero: not written ($what)"
      else
        [ "$got" = "$(file_page_md5 /tmp/expected $((ablk + k)))" ] \
          || fail "role $role data block $((blk + k)) is not array block $((ablk + k)) as written ($what)"
      fi
      k=$((k + 1))
    done
    run dd if=/tmp/ee of="$dev" bs=4096 seek=$((lp_do / 8 + blk)) count="$cnt" oflag=direct conv=notrunc status=none
  done
}
md_check() { # -> mismatch_cnt of md's check of the running /dev/md0
  echo check > /sys/block/md0/md/sync_action
  md_wait_idle /dev/md0 >&2
  cat /sys/block/md0/md/mismatch_cnt
}
raidnbd_check() { # -> mismatch_cnt of raidnbd check (offline, all members; it never replays the log)
  raidnbd check --json $ALLJ > /tmp/check.json 2> /tmp/check.err || true
  cat /tmp/check.err >&2
  json_number mismatch_cnt /tmp/check.json
}
region_is() { # DEV EXPECTED WHAT
  dd if="$1" of=/tmp/got bs=4096 count=$REGION iflag=direct status=none
  cmp /tmp/got "$2" || fail "$3: the first $REGION blocks differ from what was written"
  echo "ok: $3: the data reads back"
}
wait_clean() { # wait up to 20 s for md0's array_state clean (md's safemode after writes)
  wc_n=0
  while [ "$(cat /sys/block/md0/md/array_state)" != clean ] && [ "$wc_n" -lt 100 ]; do sleep 0.2; wc_n=$((wc_n + 1)); done
  echo "array_state of md0: $(cat /sys/block/md0/md/array_state) (after $wc_n x 0.2 s)"
}
dmesg_mark() { DMESG_AT=$(dmesg | wc -l); }
dmesg_md() { dmesg | tail -n +$((DMESG_AT + 1)) | grep -iE 'md0|md/raid|journal|r5l|r5c' || true; }
recovered_stripes() { # -> N of md's "recovering 0 data-only stripes and N data-parity stripes" since dmesg_mark
  dmesg_md | sed -n 's/.*recovering \([0-9]*\) data-only stripes and \([0-9]*\) data-parity stripes.*/\1 \2/p' | tail -n 1
}

step "A1. raidnbd create --write-journal; md accepts the array and its journal"
run raidnbd create --level 6 --chunk 64K --write-journal $J $ALL > /tmp/create.txt
cat /tmp/create.txt
contains 'consistency policy: journal' < /tmp/create.txt || fail "raidnbd create did not choose the journal policy"
mdadm --examine $J | tee /tmp/examine-j.txt
contains 'Device Role : Journal' < /tmp/examine-j.txt || fail "mdadm --examine of the journal does not say Device Role : Journal"
mdadm --examine /dev/vda | contains 'Layout : left-symmetric' || fail "not left-symmetric"
dmesg_mark
run mdadm --assemble /dev/md0 $ALLJ
mdadm --detail /dev/md0 | tee /tmp/detail.txt
contains 'Consistency Policy : journal' < /tmp/detail.txt || fail "mdadm --detail does not show the journal policy"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "md degraded members"
dmesg_md
expect_eq "$(md_check)" 0 "md's check of the array raidnbd created"
run mdadm --stop /dev/md0

step "A2. raidnbd serves (md's log after md's stop); writes; SIGKILL; lost member writes"
run modprobe nbd nbds_max=4
raidnbd_serve $ALLJ
raidnbd_last_log | grep -i journal || true
raidnbd_last_log | contains 'write journal replayed' || fail "raidnbd did not take md's log (no 'write journal replayed')"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
writes /dev/nbd0
raidnbd_status_json > /dev/null
sed -n '/"journal"/,/}/p' /tmp/raidnbd-status.json
expect_eq "$(sed -n '/"journal"/,/}/p' /tmp/raidnbd-status.json | grep -c '"tail_moves": 0')" 1 \
  "journal tail_moves is 0 (everything written is after the tail)"
units=$(sed -n '/"journal"/,/}/p' /tmp/raidnbd-status.json | sed -n 's/.*"units_written": *\([0-9]*\).*/\1/p')
[ "${units:-0}" -ge 5 ] || fail "journal units_written is '${units}', expected at least 5"
raidnbd_stop KILL
nbd_detach /dev/nbd0
run sync
echo "journal_tail after the crash: $(journal_tail); superblock state: $(sb_state /dev/vda)"
expect_eq "$(raidnbd_check)" 0 "raidnbd check (no replay) after the crash, before any page is lost"
lose_pages
expect_eq "$(raidnbd_check)" $STALE_SECTORS "raidnbd check (no replay) after the lost member writes (precondition)"

step "A3. md assembles the crashed array and replays raidnbd's journal"
dmesg_mark
run mdadm --assemble /dev/md0 $ALLJ
dmesg_md
rec=$(recovered_stripes)
echo "md recovered (data-only, data-parity): ${rec:-none}"
[ -n "$rec" ] || fail "no 'recovering ... data-parity stripes' line from md"
expect_eq "${rec%% *}" 0 "md's data-only stripes"
[ "${rec##* }" -gt 0 ] || fail "md replayed 0 data-parity stripes of raidnbd's journal"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "md degraded members"
region_is /dev/md0 /tmp/expected "md after replaying raidnbd's journal"
expect_eq "$(md_check)" 0 "md's check after replaying raidnbd's journal"
run mdadm --stop /dev/md0
expect_eq "$(raidnbd_check)" 0 "raidnbd check after md's replay"

step "A4. raidnbd serves again: ext4 through the kernel client, the ring wraps; SIGKILL; md replays"
raidnbd_serve $ALLJ
raidnbd_last_log | grep 'write journal' || fail "raidnbd did not take md's log after md's replay"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
mkfs_ext4 /dev/nbd0
mkdir -p /mnt/a
run mount -t ext4 /dev/nbd0 /mnt/a
fill_tree /mnt/a/f 24 1024 /tmp/a4.md5
run umount /mnt/a
run blockdev --flushbufs /dev/nbd0
raidnbd_status_json > /dev/null
sed -n '/"journal"/,/}/p' /tmp/raidnbd-status.json
moves=$(sed -n '/"journal"/,/}/p' /tmp/raidnbd-status.json | sed -n 's/.*"tail_moves": *\([0-9]*\).*/\1/p')
[ "${moves:-0}" -ge 1 ] || fail "journal tail_moves is '${moves}': the ring did not wrap"
raidnbd_stop KILL
nbd_detach /dev/nbd0
echo "journal_tail after the crash: $(journal_tail) sectors"
dmesg_mark
run mdadm --assemble /dev/md0 $ALLJ
dmesg_md
rec=$(recovered_stripes)
echo "md recovered (data-only, data-parity): ${rec:-none}"
[ -n "$rec" ] || fail "no 'recovering ... data-parity stripes' line from md"
expect_eq "${rec%% *}" 0 "md's data-only stripes"
[ "${rec##* }" -gt 0 ] || fail "md replayed 0 data-parity stripes of raidnbd's wrapped journal"
fsck_clean /dev/md0
run mount -t ext4 -o ro /dev/md0 /mnt/a
verify_tree /mnt/a/f /tmp/a4.md5
run umount /mnt/a
expect_eq "$(md_check)" 0 "md's check after replaying raidnbd's wrapped journal"
run mdadm --stop /dev/md0

step "B1. mdadm --create --write-journal; writes through md; simulated crash"
for d in $ALLJ; do run dd if=/dev/zero of="$d" bs=1M count=32 oflag=direct status=none; done
run mdadm --create /dev/md0 --metadata=1.2 --run --level=6 --layout=left-symmetric --chunk=64 --raid-devices=4 \
  --write-journal $J --assume-clean $ALL
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/consistency_policy)" journal "md's consistency_policy"
wait_clean
tail0=$(journal_tail)
writes /dev/md0
wait_clean
expect_eq "$(journal_tail)" "$tail0" "journal_tail after the writes (md did not reclaim the log)"
DO=$(data_offset /dev/vda)
i=0
for d in $ALL; do # superblock, as the running md left it
  run dd if="$d" of=/tmp/head$i bs=512 count="$DO" iflag=direct status=none
  i=$((i + 1))
done
run dd if=$J of=/tmp/journal bs=1M count=32 iflag=direct status=none # superblock and log
run mdadm --stop /dev/md0
crash_image() { # put the saved heads and journal back and lose the GARBAGE pages
  i=0
  for d in $ALL; do run dd if=/tmp/head$i of="$d" bs=512 oflag=direct conv=notrunc status=none; i=$((i + 1)); done
  run dd if=/tmp/journal of=$J bs=1M oflag=direct conv=notrunc status=none
  expect_eq "$(journal_tail)" "$tail0" "journal_tail of the saved journal"
  lose_pages
}
crash_image
echo "superblock state of the saved head: $(sb_state /dev/vda)"
expect_eq "$(raidnbd_check)" $STALE_SECTORS "raidnbd check (no replay) of md's crashed array (precondition)"

step "B2. raidnbd serves md's crashed array degraded: replay, read-write, data right"
raidnbd_serve $KEPTJ
raidnbd_last_log | grep -i -e journal -e read-only || true
raidnbd_last_log | contains 'write journal replayed' || fail "raidnbd did not replay md's journal"
! raidnbd_last_log | grep -i -e 'READ-ONLY' -e 'read-only' > /dev/null || fail "md's crashed journal array was served read-only"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
region_is /dev/nbd0 /tmp/expected "raidnbd, degraded, after replaying md's journal"
# Writable: s17 D0 row 1 (role 0; P role 2, Q role 3; D1 on the left-out role 1 is unwritten).
run dd if=/tmp/new of=/dev/nbd0 bs=4096 count=1 seek=545 oflag=direct status=none
region_is /dev/nbd0 /tmp/expected2 "raidnbd, degraded, after a new write"
raidnbd_status_json > /dev/null
sed -n '/"journal"/,/}/p' /tmp/raidnbd-status.json
expect_eq "$(grep -c '"read_only": false' /tmp/raidnbd-status.json)" 1 "ctl status read_only false"
nbd_detach /dev/nbd0
raidnbd_stop
for d in $ALLJ; do echo "$d: $(mdadm --examine "$d" | grep -E 'State :|Events|Device Role' | tr -s ' ' | tr '\n' ' ')"; done

step "B3. md assembles raidnbd's degraded array, re-adds role 1; md check; raidnbd check"
dmesg_mark
run mdadm --assemble --run /dev/md0 $ALLJ || true
[ -b /dev/md0 ] && [ "$(cat /sys/block/md0/md/array_state)" != inactive ] || fail "mdadm did not start md0"
dmesg_md
expect_eq "$(cat /sys/block/md0/md/degraded)" 1 "md degraded members (role 1 is stale)"
region_is /dev/md0 /tmp/expected2 "md, degraded, after raidnbd's replay and write"
run mdadm /dev/md0 --add /dev/vdb
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "md degraded members after recovery"
expect_eq "$(md_check)" 0 "md's check after raidnbd's degraded replay and md's recovery"
region_is /dev/md0 /tmp/expected2 "md after recovery"
run mdadm --stop /dev/md0
expect_eq "$(raidnbd_check)" 0 "raidnbd check of md's recovered array"

step "B4. crash image again; raidnbd serves all four: replay; both checks find 0"
crash_image
raidnbd_serve $ALLJ
raidnbd_last_log | contains 'write journal replayed' || fail "raidnbd did not replay md's journal"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
region_is /dev/nbd0 /tmp/expected2 "raidnbd after replaying md's journal"
nbd_detach /dev/nbd0
raidnbd_stop
expect_eq "$(raidnbd_check)" 0 "raidnbd check after its replay of md's journal"
dmesg_mark
run mdadm --assemble /dev/md0 $ALLJ
dmesg_md
mdadm --detail /dev/md0 | contains 'Consistency Policy : journal' || fail "md lost the journal policy"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "md degraded members"
expect_eq "$(md_check)" 0 "md's check after raidnbd's replay"
region_is /dev/md0 /tmp/expected2 "md after raidnbd's replay"

step "B5. ext4 through md (md reclaims its log); simulated crash; raidnbd replays md's log"
tailb=$(journal_tail)
mkfs_ext4 /dev/md0
mkdir -p /mnt/b
run mount -t ext4 /dev/md0 /mnt/b
fill_tree /mnt/b/f 24 1024 /tmp/b5.md5
run umount /mnt/b
wait_clean
tail1=$(journal_tail)
echo "md's journal_tail: $tailb before ext4, $tail1 after"
[ "$tail1" != "$tailb" ] || fail "md did not move its journal tail (expected a reclaim after ~50 MiB of log)"
for n in 1 2 3; do
  i=0
  for d in $ALL; do run dd if="$d" of=/tmp/head$i bs=512 count="$DO" iflag=direct status=none; i=$((i + 1)); done
  run dd if=$J of=/tmp/journal bs=1M count=32 iflag=direct status=none
  [ "$(journal_tail)" != "$tail1" ] || break
  tail1=$(journal_tail); echo "md moved its tail during the copy: again"
done
run mdadm --stop /dev/md0
tail0=$tail1
crash_restore() { # the saved heads and journal back (no page is lost: where ext4 wrote is not known here)
  i=0
  for d in $ALL; do run dd if=/tmp/head$i of="$d" bs=512 oflag=direct conv=notrunc status=none; i=$((i + 1)); done
  run dd if=/tmp/journal of=$J bs=1M oflag=direct conv=notrunc status=none
  expect_eq "$(journal_tail)" "$tail0" "journal_tail of the saved journal"
}
crash_restore
raidnbd_serve $ALLJ
raidnbd_last_log | grep 'write journal' || true
rew=$(raidnbd_last_log | sed -n 's/.*write journal replayed: [0-9]* units, \([0-9]*\) stripes rewritten.*/\1/p')
[ "${rew:-0}" -gt 0 ] || fail "raidnbd rewrote '${rew}' stripes from md's log (expected some)"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
fsck_clean /dev/nbd0
run mount -t ext4 -o ro /dev/nbd0 /mnt/b
verify_tree /mnt/b/f /tmp/b5.md5
run umount /mnt/b
nbd_detach /dev/nbd0
raidnbd_stop
expect_eq "$(raidnbd_check)" 0 "raidnbd check after its replay of md's log"
run mdadm --assemble /dev/md0 $ALLJ
expect_eq "$(md_check)" 0 "md's check after raidnbd's replay of md's log"
run mdadm --stop /dev/md0
step "done"
