#!/bin/sh
# md's partial parity log (PPL), raidnbd and the kernel both ways. A RAID5 (4 x 32 MiB, 64K
# chunk, left-symmetric) takes 4 MiB of data and a FLUSH, then four 4 KiB writes in row 0 of
# stripes 0..3 (each logged on a different member: the stripe's parity member) and a crash. To prove the
# log is what makes parity right, the parity rows of those four writes are then overwritten with
# 0xEE (as if the crash had lost the parity writes): without a replay a check finds 32 sectors.
#  A. raidnbd creates the array (PPL by default): mdadm --detail says "Consistency Policy : ppl"
#     and the kernel's check finds 0; raidnbd serves, the crash is a SIGKILL; md assembles the
#     dirty array, replays raidnbd's log: its check finds 0 mismatches, the data reads back.
#  B. mdadm --create --consistency-policy=ppl; the writes go through md; the crash is simulated
#     (each member's head, superblock and log, saved while md ran, is put back after the stop).
#     raidnbd check (offline, no replay) sees the 32 stale sectors; raidnbd serves the dirty array
#     without one member (degraded: read-write, data rebuilt through replayed parity) and again
#     with all four; after that both raidnbd check and md's check find 0.
#  C. A write in flight at a crash on the member lost afterwards: raidnbd marks the
#     parity rows bad (md's bad-block log) and fails reads of the lost chunk; mdadm
#     --examine-badblocks lists the rows and md, given the same members, fails those reads too.
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 4x32M
# rig-timeout: 900
. /guest/lib.sh
ALL="/dev/vda /dev/vdb /dev/vdc /dev/vdd"
KEPT="/dev/vda /dev/vdc /dev/vdd" # role 1 left out: stripe 0's unwritten chunk is rebuilt
rig_debug() {
  echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null
  mdadm --examine /dev/vda 2>&1 | head -n 30; dmesg | grep -i -e ppl -e md0 | tail -n 20
}

run dd if=/dev/urandom of=/tmp/a bs=1M count=4 status=none
run dd if=/dev/urandom of=/tmp/small bs=4096 count=4 status=none
run dd if=/dev/urandom of=/tmp/big bs=128K count=1 status=none
printf '\356%.0s' $(seq 4096) > /tmp/ee # 4 KiB of 0xEE
# The small writes, in 4 KiB blocks of the array: row 0 of stripes 0..3 (192 KiB each), in
# chunks on roles 0, 3, 2, 2: never on role 1, the member B2 leaves out (its rows 0..7 in
# stripes 0, 1 and 3 are data the writes left alone, rebuilt from the replayed parity).
SMALL_BLOCKS="0 48 96 160"
# Expected first 4 MiB of the array: /tmp/a with the four small writes over it.
cp /tmp/a /tmp/expected
i=0
for b in $SMALL_BLOCKS; do
  dd if=/tmp/small of=/tmp/expected bs=4096 skip="$i" count=1 seek="$b" conv=notrunc status=none
  i=$((i + 1))
done

cp /tmp/expected /tmp/expected-a # A's writes: also /tmp/big at 1920 KiB
dd if=/tmp/big of=/tmp/expected-a bs=128K seek=15 conv=notrunc status=none
data_offset() { mdadm --examine "$1" | sed -n 's/^ *Data Offset : \([0-9]*\) sectors.*/\1/p'; }
small_writes() { # DEV: the four 4 KiB writes, O_DIRECT, no FLUSH after them
  sw_i=0
  for b in $SMALL_BLOCKS; do
    run dd if=/tmp/small of="$1" bs=4096 skip="$sw_i" count=1 seek="$b" oflag=direct conv=notrunc status=none
    sw_i=$((sw_i + 1))
  done
}
stale_parity() { # the crash lost the parity writes: stripe s's parity (role 3 - s) rows 0..7 := 0xEE
  do_sectors=$(data_offset /dev/vda)
  for s in 0 1 2 3; do
    dev=$(disk $((3 - s)))
    run dd if=/tmp/ee of="$dev" bs=512 seek=$((do_sectors + s * 128)) count=8 oflag=direct conv=notrunc status=none
  done
}
md_check() { # -> mismatch_cnt of md's check of the running /dev/md0
  echo check > /sys/block/md0/md/sync_action
  md_wait_idle /dev/md0 >&2
  cat /sys/block/md0/md/mismatch_cnt
}
raidnbd_check() { raidnbd check --json $ALL | sed -n 's/.*"mismatch_cnt": *\([0-9]*\).*/\1/p'; }
first_4m_is_expected() { # DEV WHAT [EXPECTED]
  dd if="$1" of=/tmp/got bs=1M count=4 iflag=direct status=none
  cmp /tmp/got "${3:-/tmp/expected}" || fail "$2: the first 4 MiB differ from what was written"
  echo "ok: $2: the data reads back"
}

step "A1. raidnbd create; md accepts the array and its log"
run raidnbd create --level 5 --chunk 64K $ALL > /tmp/create.txt
cat /tmp/create.txt
contains 'consistency policy: ppl' < /tmp/create.txt || fail "raidnbd create did not choose ppl for raid5"
run mdadm --assemble /dev/md0 $ALL
mdadm --detail /dev/md0 | tee /tmp/detail.txt
contains 'Consistency Policy : ppl' < /tmp/detail.txt || fail "mdadm --detail does not show the ppl policy"
expect_eq "$(md_check)" 0 "md's check of the array raidnbd created"
run mdadm --stop /dev/md0

step "A2. raidnbd serves; data, FLUSH, four small writes, SIGKILL; stale parity"
run modprobe nbd nbds_max=4
raidnbd_serve $ALL
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
run dd if=/tmp/a of=/dev/nbd0 bs=1M oflag=direct status=none
run sync
# One 128 KiB write over two chunks of stripe 10 (parity on role 1): the log headers that
# name it carry raidnbd's data checksums in the reserved bytes md fills with 0xFF and never
# reads. It goes first: a write that finds its log area full waits for a member flush (then
# wraps), and such a flush after the small writes would make them durable, parity included,
# so the parity made stale below would no longer be what a crash could leave.
run dd if=/tmp/big of=/dev/nbd0 bs=128K count=1 seek=15 oflag=direct status=none
small_writes /dev/nbd0
raidnbd_stop KILL
nbd_detach /dev/nbd0
expect_eq "$(mdadm --examine /dev/vda | sed -n 's/^ *State : //p')" active "superblock state after the crash"
stale_parity
expect_eq "$(raidnbd_check)" 32 "raidnbd check (no replay) after the parity rows went stale (precondition)"

step "A3. md assembles the dirty array and replays raidnbd's log"
run mdadm --assemble /dev/md0 $ALL
dmesg | grep -i -e 'ppl' -e 'md0' | tail -n 5
first_4m_is_expected /dev/md0 "md after replaying raidnbd's log" /tmp/expected-a
expect_eq "$(md_check)" 0 "md's check after replaying raidnbd's log"
run mdadm --stop /dev/md0

step "B1. mdadm --create --consistency-policy=ppl; writes through md; simulated crash"
for d in $ALL; do run dd if=/dev/zero of="$d" bs=1M count=32 oflag=direct status=none; done
run mdadm --create /dev/md0 --metadata=1.2 --run --level=5 --layout=left-symmetric --chunk=64 --raid-devices=4 \
  --consistency-policy=ppl --assume-clean $ALL
# md marks the array clean again 200 ms after the last write; the heads below must all be
# taken while it is still dirty (else the freshest superblock says clean and no replay runs).
run sh -c 'echo 600 > /sys/block/md0/md/safe_mode_delay'
run dd if=/tmp/a of=/dev/md0 bs=1M oflag=direct status=none
run sync
small_writes /dev/md0
DO=$(data_offset /dev/vda)
i=0
for d in $ALL; do # superblock (dirty) and log, as the running md left them
  run dd if="$d" of=/tmp/head$i bs=512 count="$DO" iflag=direct status=none
  i=$((i + 1))
done
run mdadm --stop /dev/md0
crash_image() { # put the saved heads back and make the four parity rows stale
  i=0
  for d in $ALL; do run dd if=/tmp/head$i of="$d" bs=512 oflag=direct conv=notrunc status=none; i=$((i + 1)); done
  stale_parity
}
crash_image
for d in $ALL; do
  expect_eq "$(mdadm --examine "$d" | sed -n 's/^ *State : //p')" active "superblock state of the saved head of $d"
done
expect_eq "$(raidnbd_check)" 32 "raidnbd check (no replay) of md's crashed array (precondition)"

step "B2. raidnbd serves md's dirty array degraded: replay, read-write, data rebuilt right"
raidnbd_serve $KEPT
raidnbd_last_log | contains 'partial parity log replayed' || fail "raidnbd did not replay md's log"
! raidnbd_last_log | contains 'READ-ONLY' || fail "a dirty degraded raid5 with PPL was served read-only"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
first_4m_is_expected /dev/nbd0 "raidnbd, degraded, after replaying md's log"
# Writable; stripe 40 has its parity (role 3) and this chunk (role 0) on members that are here.
run dd if=/tmp/small of=/dev/nbd0 bs=4096 count=1 seek=1920 oflag=direct status=none
nbd_detach /dev/nbd0
raidnbd_stop

step "B3. raidnbd serves md's dirty array whole; then both checks find 0"
crash_image
raidnbd_serve $ALL
raidnbd_last_log | contains 'partial parity log replayed' || fail "raidnbd did not replay md's log"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
first_4m_is_expected /dev/nbd0 "raidnbd after replaying md's log"
nbd_detach /dev/nbd0
raidnbd_stop
expect_eq "$(raidnbd_check)" 0 "raidnbd check after its replay of md's log"
run mdadm --assemble /dev/md0 $ALL
mdadm --detail /dev/md0 | contains 'Consistency Policy : ppl' || fail "md lost the ppl policy"
expect_eq "$(md_check)" 0 "md's check after raidnbd's replay"
first_4m_is_expected /dev/md0 "md after raidnbd's replay"
run mdadm --stop /dev/md0

step "C1. a write in flight at a crash, then its member on role 1 lost: EIO, not garbage"
# Chunks 0 and 1 of stripe 0 (roles 0 and 1; parity on role 3) are rewritten by one 128 KiB
# request (the kernel client's largest), no FLUSH, SIGKILL. The crash is made to have kept the
# write on roles 1 and 3 but not on role 0 (its chunk is put back), and role 1 is then lost:
# parity matches neither the old nor the new data, so role 1's chunk cannot be rebuilt.
# raidnbd marks stripe 0's parity rows bad (md's bad-block log on role 3) and fails reads of
# that chunk; md, given the same members, fails them too.
run dd if=/dev/urandom of=/tmp/c bs=64K count=2 status=none
raidnbd_serve $ALL
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
run dd if=/tmp/c of=/dev/nbd0 bs=128K count=1 oflag=direct status=none
raidnbd_stop KILL
nbd_detach /dev/nbd0
DO=$(data_offset /dev/vda)
run dd if=/tmp/expected of=/dev/vda bs=512 seek="$DO" count=128 oflag=direct conv=notrunc status=none
read_fails() { # DEV SKIP(64K blocks) WHAT
  if dd if="$1" of=/dev/null bs=64K skip="$2" count=1 iflag=direct status=none 2>/dev/null; then
    fail "$3: read succeeded (it can only be garbage)"
  fi
  echo "ok: $3: the read fails"
}
chunk_is() { # DEV SKIP FILE SKIP WHAT
  dd if="$1" of=/tmp/got bs=64K skip="$2" count=1 iflag=direct status=none
  dd if="$3" of=/tmp/want bs=64K skip="$4" count=1 status=none
  cmp /tmp/got /tmp/want || fail "$5: wrong bytes"
  echo "ok: $5"
}
raidnbd_serve $KEPT
raidnbd_last_log | contains 'parity sectors marked bad' || fail "raidnbd did not mark the unreplayable rows bad"
nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 1
read_fails /dev/nbd0 1 "raidnbd, chunk 1 of stripe 0 (role 1 lost, write in flight)"
chunk_is /dev/nbd0 0 /tmp/expected 0 "raidnbd, chunk 0: the old data the crash kept"
chunk_is /dev/nbd0 2 /tmp/expected 2 "raidnbd, chunk 2: not written"
chunk_is /dev/nbd0 5 /tmp/expected 5 "raidnbd, role 1 of stripe 1 rebuilt through parity"
raidnbd_ctl status | tee /tmp/status.txt
contains 'bad: 128 sectors' < /tmp/status.txt || fail "ctl status does not show the bad sectors"
nbd_detach /dev/nbd0
raidnbd_stop

step "C2. mdadm and the kernel read raidnbd's bad-block log"
mdadm --examine-badblocks "$(disk 3)" | tee /tmp/bb.txt
contains "$DO for 128 sectors" < /tmp/bb.txt || fail "mdadm --examine-badblocks does not list stripe 0's parity rows"
run mdadm --assemble --run /dev/md0 $KEPT
read_fails /dev/md0 1 "md, chunk 1 of stripe 0"
chunk_is /dev/md0 0 /tmp/expected 0 "md, chunk 0"
chunk_is /dev/md0 5 /tmp/expected 5 "md, role 1 of stripe 1 rebuilt through parity"
run mdadm --stop /dev/md0
step "done"
