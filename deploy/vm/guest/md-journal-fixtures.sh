#!/bin/sh
# Generator (not a test): md RAID4/5/6 write-journal (raid5-cache, write-through) fixtures for crates/raid-core/tests/fixtures/mdadm-journal.
# mdadm --create --write-journal (RAID6 4 x 16M ls chunk 64 + a 32M journal; RAID5 3 x 16M ls chunk
# 32 + 16M journal; RAID4 3 x 16M chunk 32 + 16M journal), per array, read with O_DIRECT: every
# device's first 16 KiB (the superblock; the rest up to data_offset checked zero) and the journal's
# log (from its data_offset) after create (running, then stopped), after assembly, after known O_DIRECT writes of
# random data (array still running: log not reclaimed, journal_tail unchanged), after the stop,
# after a re-assembly, and after a simulated crash (the running heads and log put back, written
# data/parity pages overwritten with 0xee) and md's journal replay; the members' data areas after
# the writes and after the replay. Run it with:
#   deploy/vm/run-all.sh --only md-journal-fixtures
# rig-status: manual
# rig-disks: 4x16M 32M 3x16M 16M 3x16M 16M
# rig-host-post: {repo}/deploy/vm/host/collect-journal-fixtures.sh {workdir} {results} "${RIG_FIXTURES_OUT:-{repo}/crates/raid-core/tests/fixtures/mdadm-journal}"
# rig-timeout: 600
. /guest/lib.sh
FIX=$RIG_RESULTS/journal
mkdir -p "$FIX"
rig_debug() {
  tail -n 20 "$FIX/commands.txt" 2>/dev/null
  for d in /dev/md0 /dev/md1 /dev/md2; do [ -e "$d" ] && mdadm --detail "$d" 2>/dev/null; done
  dmesg | grep -iE 'md|raid|journal|r5l|r5c' | tail -n 30
}

cmd() { # record a command in commands.txt, then run it
  echo "$*" >> "$FIX/commands.txt"
  run sh -c "$*" < /dev/null
}
# Little-endian fields of the v1.2 superblock (member byte 4096 + OFF), read with O_DIRECT.
sb_u32() { # DEV OFF
  dd if="$1" bs=4096 skip=1 count=1 iflag=direct status=none | od -An -tu4 -j "$2" -N 4 | tr -d ' '
}
sb_u64() { # DEV OFF
  su_lo=$(sb_u32 "$1" "$2"); su_hi=$(sb_u32 "$1" $(($2 + 4)))
  printf '%u\n' $((su_lo + su_hi * 4294967296)) # unsigned: resync_offset MaxSector is 2^64 - 1
}
data_offset() { sb_u64 "$1" 128; }     # sectors
journal_tail() { sb_u64 "$1" 152; }    # sectors from the journal device's data_offset
sb_fields() { # DEV: the superblock fields the journal touches, one line
  echo "feature_map=$(sb_u32 "$1" 8) data_offset=$(sb_u64 "$1" 128) data_size=$(sb_u64 "$1" 136)" \
    "journal_tail/recovery_offset=$(sb_u64 "$1" 152) dev_number=$(sb_u32 "$1" 160) events=$(sb_u64 "$1" 200)" \
    "resync_offset=$(sb_u64 "$1" 208)"
}
# The devices of the current array: MEMBERS (roles 0..N-1 in order, named m<i>) then JDEV (named j).
devs_named() { # -> "NAME DEV" lines
  dn_i=0
  for dn_dev in $MEMBERS; do echo "m$dn_i $dn_dev"; dn_i=$((dn_i + 1)); done
  echo "j $JDEV"
}
HEAD_BLOCKS=4 # 16 KiB: the superblock at 4096 and the bad-block log at sb + 16 sectors (12288 .. 16384)
area_zero() { # DEV FIRST_BLOCK COUNT: those 4 KiB blocks are all zero
  [ "$(dd if="$1" bs=4096 skip="$2" count="$3" iflag=direct status=none | md5sum | cut -d' ' -f1)" = \
    "$(dd if=/dev/zero bs=4096 count="$3" status=none | md5sum | cut -d' ' -f1)" ]
}
save_heads() { # STATE: each device's first HEAD_BLOCKS 4 KiB blocks -> A-STATE-<name>.head.bin (the
  # rest up to data_offset checked zero); the journal's first LOG_BLOCKS 4 KiB blocks from its
  # data_offset -> A-STATE-j.log.bin; the superblock fields -> superblocks.txt
  devs_named | while read -r sh_name sh_dev; do
    sh_off=$(data_offset "$sh_dev")
    [ $((sh_off % 8)) -eq 0 ] || fail "data_offset $sh_off of $sh_dev is not a multiple of 8 sectors"
    dd if="$sh_dev" of="$FIX/$A-$1-$sh_name.head.bin" bs=4096 count=$HEAD_BLOCKS iflag=direct status=none
    area_zero "$sh_dev" $HEAD_BLOCKS $((sh_off / 8 - HEAD_BLOCKS)) \
      || fail "$sh_dev has non-zero bytes between byte $((HEAD_BLOCKS * 4096)) and its data_offset"
    echo "$A $1 $sh_name $sh_dev $(sb_fields "$sh_dev")" >> "$FIX/superblocks.txt"
  done
  sh_off=$(data_offset "$JDEV")
  dd if="$JDEV" of="$FIX/$A-$1-j.log.bin" bs=4096 skip=$((sh_off / 8)) count=$LOG_BLOCKS iflag=direct status=none
  echo "$A $1 journal_tail=$(journal_tail "$JDEV")" | tee -a "$FIX/journal-tails.txt"
}
save_data() { # STATE: each member's first DATA_BLOCKS 4 KiB blocks from its data_offset -> A-STATE-m<i>.data.bin
  devs_named | while read -r sd_name sd_dev; do
    [ "$sd_name" != j ] || continue
    sd_off=$(data_offset "$sd_dev")
    dd if="$sd_dev" of="$FIX/$A-$1-$sd_name.data.bin" bs=4096 skip=$((sd_off / 8)) count=$DATA_BLOCKS iflag=direct status=none
  done
}
save_examine() { # STATE
  devs_named | while read -r se_name se_dev; do
    mdadm --examine "$se_dev" > "$FIX/$A-$1-$se_name.examine.txt" || fail "mdadm --examine $se_dev"
  done
}
save_state() { # STATE: md's view of the running array
  ss_sys=/sys/block/${MD#/dev/}/md
  mdadm --detail "$MD" > "$FIX/$A-$1.detail.txt"
  {
    for f in level layout chunk_size raid_disks consistency_policy journal_mode array_state resync_start \
             sync_action degraded stripe_cache_size rmw_level; do
      [ -e "$ss_sys/$f" ] && echo "$f: $(cat "$ss_sys/$f")"
    done
    devs_named | while read -r ss_name ss_dev; do
      d=$ss_sys/dev-${ss_dev#/dev/}
      echo "$ss_name ${ss_dev}: slot=$(cat "$d/slot") state=$(cat "$d/state") offset=$(cat "$d/offset")" \
        "size=$(cat "$d/size") recovery_start=$(cat "$d/recovery_start" 2>/dev/null)"
    done
    echo "-- /proc/mdstat"
    cat /proc/mdstat
  } > "$FIX/$A-$1.sysfs.txt"
  cat "$FIX/$A-$1.sysfs.txt"
}
wait_clean() { # wait up to 20 s for array_state clean (md's safemode after writes); never fails
  wc_f=/sys/block/${MD#/dev/}/md/array_state
  wc_n=0
  while [ "$(cat "$wc_f")" != clean ] && [ "$wc_n" -lt 100 ]; do sleep 0.2; wc_n=$((wc_n + 1)); done
  echo "array_state of $MD: $(cat "$wc_f") (after $wc_n x 0.2 s)"
}
dmesg_mark() { # remember where dmesg ends now
  DMESG_AT=$(dmesg | wc -l)
}
dmesg_since() { # STATE: md's kernel lines since dmesg_mark -> A-STATE.dmesg.txt
  dmesg | tail -n +$((DMESG_AT + 1)) | grep -iE 'md|raid|journal|r5l|r5c' > "$FIX/$A-$1.dmesg.txt" || true
  cat "$FIX/$A-$1.dmesg.txt"
}
md_region() { # FILE: the array's first MD_BLOCKS 4 KiB blocks (what the kernel returns), O_DIRECT
  dd if="$MD" of="$1" bs=4096 count=$MD_BLOCKS iflag=direct status=none
}
page_is_zero() { # DEV BLOCK (4 KiB block of the whole device)
  [ "$(dd if="$1" bs=4096 skip="$2" count=1 iflag=direct status=none | md5sum | cut -d' ' -f1)" = "$ZERO_MD5" ]
}
ZERO_MD5=$(dd if=/dev/zero bs=4096 count=1 status=none | md5sum | cut -d' ' -f1)

# One array, start to end. Globals: A (name) MD LEVEL LAYOUT ("" = mdadm's default) CHUNK (KiB)
# MEMBERS JDEV UUID WRITES ("K|OFFSET|LEN" lines: array bytes) GARBAGE ("MEMBER|BLOCK|COUNT|what"
# lines: 4 KiB blocks of the member's data area, each written by the writes) DATA_BLOCKS
# LOG_BLOCKS MD_BLOCKS.
journal_array() {
  n=0; for dev in $MEMBERS; do n=$((n + 1)); done
  devs_named | while read -r name dev; do
    i=$(echo "$RIG_DISKS" | tr ' ' '\n' | grep -n "^$dev\$" | cut -d: -f1)
    echo "$A $name $((i - 1)) $dev" >> "$FIX/manifest.txt"
  done
  layout_opt=""; [ -z "$LAYOUT" ] || layout_opt="--layout=$LAYOUT "

  step "$A: create"
  echo "# $A: members and journal zeroed (fresh sparse images)" >> "$FIX/commands.txt"
  dmesg_mark
  cmd "mdadm --create $MD --metadata=1.2 --run --level=$LEVEL ${layout_opt}--chunk=$CHUNK --raid-devices=$n --write-journal $JDEV --assume-clean --homehost=rig --name=$A --uuid=$UUID $MEMBERS"
  md_wait_idle "$MD"
  expect_eq "$(cat /sys/block/${MD#/dev/}/md/consistency_policy)" journal "consistency_policy"
  save_state created
  save_examine created-running
  save_heads created-running
  dmesg_since created

  step "$A: stop, save created state"
  dmesg_mark
  cmd "mdadm --stop $MD"
  save_examine created
  save_heads created
  dmesg_since created-stop

  step "$A: assemble, save assembled state"
  dmesg_mark
  cmd "mdadm --assemble $MD $MEMBERS $JDEV"
  expect_eq "$(cat /sys/block/${MD#/dev/}/md/degraded)" 0 "degraded members"
  wait_clean
  save_state assembled
  save_examine assembled
  save_heads assembled
  dmesg_since assembled
  tail0=$(journal_tail "$JDEV")

  step "$A: writes (random data, O_DIRECT)"
  {
    echo "# $A: writes to the running $MD, one dd each, in this order (busybox dd, O_DIRECT: one write"
    echo "# request of LEN bytes per dd, at array byte OFFSET); $A-w<K>.bin = LEN bytes of /dev/urandom"
    echo "# (kept as $A-w<K>.data)"
  } >> "$FIX/commands.txt"
  echo "$WRITES" | while IFS='|' read -r k off len; do
    [ -n "$k" ] || continue
    dd if=/dev/urandom of="/tmp/$A-w$k.bin" bs="$len" count=1 iflag=fullblock status=none
    expect_eq "$(wc -c < "/tmp/$A-w$k.bin")" "$len" "size of $A-w$k.bin"
    cp "/tmp/$A-w$k.bin" "$FIX/$A-w$k.data"
    cmd "dd if=$A-w$k.bin of=$MD bs=$len count=1 seek=$off oflag=seek_bytes,direct conv=notrunc status=none  # $A w$k: $len bytes at array byte $off"
  done

  step "$A: save written state (array still running, clean again)"
  # md marks the array active at the first write (events + 1 on every superblock) and clean again
  # 200 ms after the last (events - 1): copy the heads once it is clean, so that they agree.
  cat /sys/block/${MD#/dev/}/md/array_state > "$FIX/$A-written.array_state-after-writes.txt"
  devs_named | while read -r name dev; do echo "$A after-writes $name $dev $(sb_fields "$dev")"; done \
    | tee "$FIX/$A-written.superblocks-after-writes.txt"
  wait_clean
  cat /sys/block/${MD#/dev/}/md/array_state > "$FIX/$A-written.array_state-before-copy.txt"
  save_heads written
  save_data written
  md_region "$FIX/$A-written.md-head.bin"
  cat /sys/block/${MD#/dev/}/md/array_state > "$FIX/$A-written.array_state-after-copy.txt"
  cat "$FIX/$A-written.array_state-after-writes.txt" "$FIX/$A-written.array_state-before-copy.txt" \
    "$FIX/$A-written.array_state-after-copy.txt"
  expect_eq "$(cat "$FIX/$A-written.array_state-before-copy.txt") $(cat "$FIX/$A-written.array_state-after-copy.txt")" \
    "clean clean" "array_state before and after the copy"
  save_examine written
  save_state written
  expect_eq "$(journal_tail "$JDEV")" "$tail0" "journal_tail after the writes and the copy (the log of the writes is all there)"

  step "$A: stop, save stopped state"
  dmesg_mark
  cmd "mdadm --stop $MD"
  save_examine stopped
  save_heads stopped
  dmesg_since stopped

  step "$A: re-assemble, save reassembled state, stop"
  dmesg_mark
  cmd "mdadm --assemble $MD $MEMBERS $JDEV"
  expect_eq "$(cat /sys/block/${MD#/dev/}/md/degraded)" 0 "degraded members"
  wait_clean
  save_state reassembled
  save_examine reassembled
  save_heads reassembled
  md_region /tmp/md-head.bin
  cmp -s /tmp/md-head.bin "$FIX/$A-written.md-head.bin" || fail "$MD reads back differently after the re-assembly"
  dmesg_since reassembled
  cmd "mdadm --stop $MD"

  step "$A: simulated crash: running heads and log back, written pages 0xee, assemble (journal replay)"
  {
    echo "# $A: simulated crash: every device's first $((HEAD_BLOCKS * 4)) KiB set back to its $A-written-<name>.head.bin"
    echo "# (superblocks as they were while the array ran after the writes: journal_tail $tail0), the journal's"
    echo "# first $LOG_BLOCKS 4 KiB blocks from its data_offset set back to $A-written-j.log.bin, then 4 KiB pages"
    echo "# of the members' data areas that the writes wrote overwritten with 0xee bytes (e.bin = 64 KiB of 0xee;"
    echo "# BLOCK = data_offset / 8 + block of the data area)"
  } >> "$FIX/commands.txt"
  devs_named | while read -r name dev; do
    cmd "dd if=$FIX/$A-written-$name.head.bin of=$dev bs=4096 count=$HEAD_BLOCKS oflag=direct conv=notrunc status=none"
  done
  off=$(data_offset "$JDEV")
  cmd "dd if=$FIX/$A-written-j.log.bin of=$JDEV bs=4096 seek=$((off / 8)) count=$LOG_BLOCKS oflag=direct conv=notrunc status=none"
  expect_eq "$(journal_tail "$JDEV")" "$tail0" "journal_tail put back"
  echo "$GARBAGE" | while IFS='|' read -r m b c what; do
    [ -n "$m" ] || continue
    dev=$(echo $MEMBERS | cut -d' ' -f$((m + 1)))
    off=$(data_offset "$dev")
    j=0
    while [ "$j" -lt "$c" ]; do
      ! page_is_zero "$dev" $((off / 8 + b + j)) || fail "$A m$m data block $((b + j)) is zero: not written ($what)"
      j=$((j + 1))
    done
    cmd "dd if=e.bin of=$dev bs=4096 seek=$((off / 8 + b)) count=$c oflag=direct conv=notrunc status=none  # m$m data blocks $b..$((b + c - 1)): $what"
  done
  dmesg_mark
  cmd "mdadm --assemble $MD $MEMBERS $JDEV"
  for f in array_state sync_action resync_start; do
    echo "$f: $(cat /sys/block/${MD#/dev/}/md/$f)"
  done | tee "$FIX/$A-recovered.right-after-assemble.txt"
  expect_eq "$(cat /sys/block/${MD#/dev/}/md/degraded)" 0 "degraded members"
  md_wait_idle "$MD"
  wait_clean
  save_state recovered
  save_examine recovered
  save_heads recovered
  save_data recovered
  dmesg_since recovered
  contains 'recovering' < "$FIX/$A-recovered.dmesg.txt" || fail "no 'recovering ... stripes' line from md"
  {
    i=0
    for dev in $MEMBERS; do
      if cmp -s "$FIX/$A-recovered-m$i.data.bin" "$FIX/$A-written-m$i.data.bin"; then r="the same as"; else r="DIFFERENT from"; fi
      echo "m$i data area (first $DATA_BLOCKS blocks) after the replay: $r after the writes"
      i=$((i + 1))
    done
    md_region /tmp/md-head.bin
    if cmp -s /tmp/md-head.bin "$FIX/$A-written.md-head.bin"; then r="the same as"; else r="DIFFERENT from"; fi
    echo "$MD's first $((MD_BLOCKS * 4)) KiB after the replay: $r after the writes"
    echo "md5 of $MD's first $((MD_BLOCKS * 4)) KiB: after the writes $(md5sum < "$FIX/$A-written.md-head.bin" | cut -d' ' -f1)," \
      "after the replay $(md5sum < /tmp/md-head.bin | cut -d' ' -f1)"
  } | tee "$FIX/$A-recovered.compare.txt"
  cmd "echo check > /sys/block/${MD#/dev/}/md/sync_action"
  md_wait_idle "$MD"
  echo "mismatch_cnt after check: $(cat /sys/block/${MD#/dev/}/md/mismatch_cnt)" | tee "$FIX/$A-recovered.check.txt"
  dmesg_mark
  cmd "mdadm --stop $MD"
  save_examine recovered-stopped
  save_heads recovered-stopped
  dmesg_since recovered-stopped
}

step "versions"
mdadm --version > "$FIX/mdadm-version.txt" 2>&1
uname -r > "$FIX/kernel.txt"
{ busybox 2>&1 || true; } | head -n 1 > "$FIX/busybox-version.txt"
cat "$FIX/mdadm-version.txt" "$FIX/kernel.txt" "$FIX/busybox-version.txt"
: > "$FIX/commands.txt"
: > "$FIX/manifest.txt"
: > "$FIX/superblocks.txt"
: > "$FIX/journal-tails.txt"
RIG_DISKS=""
i=0; while [ "$i" -lt "$RIG_NDISKS" ]; do RIG_DISKS="$RIG_DISKS $(disk $i)"; i=$((i + 1)); done
RIG_DISKS=${RIG_DISKS# }
dd if=/dev/zero bs=4096 count=16 status=none | tr '\000' '\356' > /tmp/e.bin
expect_eq "$(od -An -tx1 -N 1 /tmp/e.bin | tr -d ' ')" ee "first byte of e.bin"

# ---- RAID6, 4 members, left-symmetric (mdadm's default), chunk 64 KiB, 32 MiB journal -------------
# Stripe s (128 KiB of array data, 64 KiB = 16 blocks on each member at data block 16 s):
# P on member 3 - s % 4, Q on (P + 1) % 4, data chunk 0 on (P + 2) % 4, data chunk 1 on (P + 3) % 4.
#   s0: P m3 Q m0 D0 m1 D1 m2   s1: P m2 Q m3 D0 m0 D1 m1   s2: P m1 Q m2 D0 m3 D1 m0
#   s3: P m0 Q m1 D0 m2 D1 m3   s4: P m3 Q m0 D0 m1 D1 m2
A=j6 MD=/dev/md0 LEVEL=6 LAYOUT=left-symmetric CHUNK=64
MEMBERS="$(disk 0) $(disk 1) $(disk 2) $(disk 3)" JDEV=$(disk 4)
UUID=72616964:6e626400:00000000:000000a6
DATA_BLOCKS=80 LOG_BLOCKS=256 MD_BLOCKS=160
# K | array byte offset | length
WRITES="
1|0|4096
2|102400|4096
3|0|4096
4|184320|20480
5|262144|131072
6|425984|12288
7|446464|28672
8|512000|24576
"
# w1, w3: s0 D0 block 0; w2: s0 D1 block 9; w4: s1 D0 blocks 13..15 + D1 0..1 (spans chunks);
# w5: s2 whole stripe; w6: s3 D0 blocks 8..10; w7: s3 D0 13..15 + D1 0..3; w8: s3 D1 13..15 + s4 D0 0..2
GARBAGE="
1|0|1|s0 D0 block 0 (w3, after w1)
3|0|1|s0 P row 0
0|9|1|s0 Q row 9 (w2)
1|16|2|s1 D1 blocks 0..1 (w4)
3|29|3|s1 Q rows 13..15 (w4)
3|32|16|s2 D0 whole chunk (w5)
1|32|16|s2 P whole chunk (w5)
3|48|4|s3 D1 blocks 0..3 (w7)
1|56|3|s3 Q rows 8..10 (w6)
3|64|3|s4 P rows 0..2 (w8)
0|64|3|s4 Q rows 0..2 (w8)
"
journal_array

# ---- RAID5, 3 members, left-symmetric, chunk 32 KiB, 16 MiB journal ------------------------------
# Stripe s (64 KiB of array data, 8 blocks per member at data block 8 s): P on member 2 - s % 3,
# data chunk i on (P + 1 + i) % 3.   s0: P m2 D0 m0 D1 m1   s1: P m1 D0 m2 D1 m0
A=j5 MD=/dev/md1 LEVEL=5 LAYOUT=left-symmetric CHUNK=32
MEMBERS="$(disk 5) $(disk 6) $(disk 7)" JDEV=$(disk 8)
UUID=72616964:6e626400:00000000:000000a5
DATA_BLOCKS=32 LOG_BLOCKS=128 MD_BLOCKS=32
WRITES="
1|0|4096
2|24576|16384
3|65536|65536
4|40960|4096
"
# w1: s0 D0 block 0; w2: s0 D0 6..7 + D1 0..1 (spans chunks); w3: s1 whole stripe; w4: s0 D1 block 2
GARBAGE="
2|0|1|s0 P row 0 (w1)
1|0|2|s0 D1 blocks 0..1 (w2)
2|8|8|s1 D0 whole chunk (w3)
1|8|8|s1 P whole chunk (w3)
"
journal_array

# ---- RAID4, 3 members, chunk 32 KiB, 16 MiB journal ---------------------------------------------
# Parity on member 2 in every stripe, data chunk i on member i (8 blocks per member at data block 8 s).
A=j4 MD=/dev/md2 LEVEL=4 LAYOUT="" CHUNK=32
MEMBERS="$(disk 9) $(disk 10) $(disk 11)" JDEV=$(disk 12)
UUID=72616964:6e626400:00000000:000000a4
DATA_BLOCKS=32 LOG_BLOCKS=128 MD_BLOCKS=32
WRITES="
1|0|4096
2|24576|16384
3|40960|4096
"
# w1: s0 D0 block 0; w2: s0 D0 6..7 + D1 0..1 (spans chunks); w3: s0 D1 block 2 (no full stripe here)
GARBAGE="
2|0|3|s0 P rows 0..2 (w1, w2, w3)
1|0|3|s0 D1 blocks 0..2 (w2, w3)
0|6|2|s0 D0 blocks 6..7 (w2)
"
journal_array

step "summary"
i=0
for dev in $RIG_DISKS; do
  echo "$i $(dd if="$dev" bs=4096 count=1024 iflag=direct status=none | md5sum | cut -d' ' -f1)" >> "$FIX/final-md5.txt"
  i=$((i + 1))
done
dmesg | grep -iE 'md|raid|journal|r5l|r5c' > "$FIX/dmesg-md.txt" || true
cat "$FIX/manifest.txt"
expect_eq "$(wc -l < "$FIX/manifest.txt")" 13 "devices recorded"
ls -l "$FIX" | awk '{s += $5} END {print "results: " s " bytes"}'
