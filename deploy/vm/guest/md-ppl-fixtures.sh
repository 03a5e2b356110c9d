#!/bin/sh
# Generator (not a test): md RAID5 Partial Parity Log fixtures for crates/raid-core/tests/fixtures/mdadm-ppl.
# mdadm --create --consistency-policy=ppl (RAID5 4 x 64M ls chunk 64; RAID5 3 x 64M la chunk 32),
# then per member the first 1.25 MiB (superblock at 4096, PPL area at sb+8 sectors, 1 MiB) read with
# O_DIRECT: after create+stop, after assembly, after known partial-stripe writes (array running),
# after the stop, after a re-assembly, and after a simulated crash (written heads put back, parity
# chunks overwritten) and md's PPL recovery; plus the members' first 768 KiB of data. Run it with:
#   deploy/vm/run-all.sh --only md-ppl-fixtures
# rig-status: manual
# rig-disks: 4x64M 3x64M
# rig-host-post: {repo}/deploy/vm/host/collect-ppl-fixtures.sh {workdir} {results} "${RIG_FIXTURES_OUT:-{repo}/crates/raid-core/tests/fixtures/mdadm-ppl}"
# rig-timeout: 600
. /guest/lib.sh
FIX=$RIG_RESULTS/ppl
mkdir -p "$FIX"
rig_debug() { cat "$FIX/commands.txt" 2>/dev/null; mdadm --detail /dev/md0 2>/dev/null; dmesg | grep -i ppl | tail -n 20; }

HEAD_BLOCKS=320 # 320 x 4 KiB = 1.25 MiB = bytes 0 .. 1310720 of each member
DATA_BLOCKS=192 # 192 x 4 KiB = 768 KiB of each member's data area (stripes 0..11 at chunk 64 KiB)

cmd() { # record a command in commands.txt, then run it
  echo "$*" >> "$FIX/commands.txt"
  run sh -c "$*" < /dev/null
}
save_heads() { # NAME STATE MEMBER...: first 1.25 MiB of each member (O_DIRECT) -> NAME-STATE-m<i>.bin
  sh_name=$1 sh_state=$2; shift 2
  sh_i=0
  for sh_dev in "$@"; do
    dd if="$sh_dev" of="$FIX/$sh_name-$sh_state-m$sh_i.bin" bs=4096 count=$HEAD_BLOCKS iflag=direct status=none
    sh_i=$((sh_i + 1))
  done
  echo "ok: [$(rig_now)] saved $sh_name-$sh_state-m0..m$((sh_i - 1)).bin"
}
save_examine() { # NAME STATE MEMBER...
  se_name=$1 se_state=$2; shift 2
  se_i=0
  for se_dev in "$@"; do
    mdadm --examine "$se_dev" > "$FIX/$se_name-$se_state-m$se_i.examine.txt" || fail "mdadm --examine $se_dev"
    se_i=$((se_i + 1))
  done
}
save_state() { # MD NAME STATE MEMBER...: md's view of a running array
  ss_md=$1 ss_name=$2 ss_state=$3; shift 3
  ss_sys=/sys/block/${ss_md#/dev/}/md
  mdadm --detail "$ss_md" > "$FIX/$ss_name-$ss_state.detail.txt"
  {
    for f in level layout chunk_size raid_disks consistency_policy array_state resync_start \
             sync_action degraded ppl_write_hint; do
      [ -e "$ss_sys/$f" ] && echo "$f: $(cat "$ss_sys/$f")"
    done
    ss_i=0
    for ss_dev in "$@"; do
      d=$ss_sys/dev-${ss_dev#/dev/}
      echo "m$ss_i ${ss_dev}: slot=$(cat "$d/slot") state=$(cat "$d/state") offset=$(cat "$d/offset")" \
        "size=$(cat "$d/size") ppl_sector=$(cat "$d/ppl_sector" 2>/dev/null) ppl_size=$(cat "$d/ppl_size" 2>/dev/null)"
      ss_i=$((ss_i + 1))
    done
    echo "-- /proc/mdstat"
    cat /proc/mdstat
  } > "$FIX/$ss_name-$ss_state.sysfs.txt"
  cat "$FIX/$ss_name-$ss_state.sysfs.txt"
}
feature_maps() { # MEMBER...: feature_map (LE32 at superblock byte 8, i.e. member byte 4104)
  for fm_dev in "$@"; do
    printf '%s feature_map=%s\n' "$fm_dev" \
      "$(dd if="$fm_dev" bs=4096 skip=1 count=1 iflag=direct status=none | od -An -tu4 -j 8 -N 4 | tr -d ' ')"
  done
}
wait_clean() { # MD: wait up to 20 s for array_state clean (md's safemode after writes); never fails
  wc_f=/sys/block/${1#/dev/}/md/array_state
  wc_n=0
  while [ "$(cat "$wc_f")" != clean ] && [ "$wc_n" -lt 100 ]; do sleep 0.2; wc_n=$((wc_n + 1)); done
  echo "array_state of $1: $(cat "$wc_f") (after $wc_n x 0.2 s)"
}
# Deterministic write content: LEN/32 lines of 32 bytes, "ppl5 w<K> a=<array byte offset, 10 digits>"
# padded with spaces to 31 characters, then "\n"; line j holds the offset of its own first byte.
PATTERN_AWK='BEGIN{for(i=0;i<n;i++) printf "%-31s\n", sprintf("ppl5 w%d a=%010d", k, o+i*32)}'
pattern() { # K OFFSET LEN FILE
  awk -v k="$1" -v o="$2" -v n=$(($3 / 32)) "$PATTERN_AWK" > "$4"
  expect_eq "$(wc -c < "$4")" "$3" "size of pattern w$1"
}

step "versions"
mdadm --version > "$FIX/mdadm-version.txt" 2>&1
uname -r > "$FIX/kernel.txt"
{ busybox 2>&1 || true; } | head -n 1 > "$FIX/busybox-version.txt"
cat "$FIX/mdadm-version.txt" "$FIX/kernel.txt" "$FIX/busybox-version.txt"
: > "$FIX/commands.txt"
: > "$FIX/manifest.txt"
: > "$FIX/feature-maps.txt"

# ---- RAID5, 4 members, left-symmetric, chunk 64 KiB ---------------------------------------------
A=ppl5
M="$(disk 0) $(disk 1) $(disk 2) $(disk 3)"
i=0; for dev in $M; do echo "$A m$i $i $dev" >> "$FIX/manifest.txt"; i=$((i + 1)); done

step "$A: create"
echo "# $A: members zeroed (fresh sparse images)" >> "$FIX/commands.txt"
cmd "mdadm --create /dev/md0 --metadata=1.2 --run --level=5 --layout=left-symmetric --chunk=64 --raid-devices=4 --consistency-policy=ppl --assume-clean --homehost=rig --name=$A --uuid=72616964:6e626400:00000000:000000f1 $M"
md_wait_idle /dev/md0
expect_eq "$(cat /sys/block/md0/md/consistency_policy)" ppl "consistency_policy"
save_state /dev/md0 $A created $M
save_examine $A created-running $M

step "$A: stop, save created state"
cmd "mdadm --stop /dev/md0"
save_examine $A created $M
save_heads $A created $M
{ echo "# $A after create + stop"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"

step "$A: assemble, save assembled state"
cmd "mdadm --assemble /dev/md0 $M"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "degraded members"
wait_clean /dev/md0
save_state /dev/md0 $A assembled $M
save_heads $A assembled $M
{ echo "# $A assembled (running, before any write)"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"

step "$A: partial-stripe writes"
{
  echo "# writes to the running /dev/md0, one dd each, in this order (busybox dd, O_DIRECT: one write"
  echo "# request of LEN bytes per dd); w<K>.bin is made by:"
  echo "#   awk -v k=K -v o=OFFSET -v n=\$((LEN / 32)) '$PATTERN_AWK' > wK.bin"
} >> "$FIX/commands.txt"
# K | array byte offset | length: stripe = offset / 192 KiB (3 data chunks of 64 KiB)
WRITES="
1|0|4096
2|204800|8192
3|1048576|65536
4|1966080|196608
5|2035712|4096
6|65536|4096
7|2088960|12288
"
while IFS='|' read -r k off len; do
  [ -n "$k" ] || continue
  pattern "$k" "$off" "$len" "/tmp/w$k.bin"
  cp "/tmp/w$k.bin" "$FIX/$A-w$k.data"
  cmd "dd if=w$k.bin of=/dev/md0 bs=$len seek=$((off / len)) count=1 oflag=direct conv=notrunc status=none  # w$k: $len bytes at array byte $off"
done <<LIST
$WRITES
LIST
echo "# (the dd commands ran in /tmp, where the w<K>.bin files were)" >> "$FIX/commands.txt"

step "$A: save written state (array still running)"
cat /sys/block/md0/md/array_state > "$FIX/$A-written.array_state-before-copy.txt"
save_heads $A written $M
cat /sys/block/md0/md/array_state > "$FIX/$A-written.array_state-after-copy.txt"
cat "$FIX/$A-written.array_state-before-copy.txt" "$FIX/$A-written.array_state-after-copy.txt"
{ echo "# $A written (running, right after the writes)"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"
i=0
for dev in $M; do
  off=$(cat /sys/block/md0/md/dev-${dev#/dev/}/offset)
  expect_eq "$off" 4096 "data_offset of $dev (sectors; the steps below use 4 KiB block 512)"
  dd if="$dev" of="$FIX/$A-written-m$i.data.bin" bs=4096 skip=$((off / 8)) count=$DATA_BLOCKS iflag=direct status=none
  echo "$A m$i data_offset_sectors=$off" >> "$FIX/data-offsets.txt"
  i=$((i + 1))
done
# the array's own view of the written ranges (what the kernel returns)
dd if=/dev/md0 of="$FIX/$A-written.md0-head.bin" bs=4096 count=$((DATA_BLOCKS * 3)) iflag=direct status=none
wait_clean /dev/md0
save_state /dev/md0 $A written $M

step "$A: stop, save stopped state"
cmd "mdadm --stop /dev/md0"
save_examine $A stopped $M
save_heads $A stopped $M
{ echo "# $A after the stop"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"

step "$A: re-assemble (clean, non-empty logs), save reassembled state, stop"
cmd "mdadm --assemble /dev/md0 $M"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "degraded members"
wait_clean /dev/md0
save_state /dev/md0 $A reassembled $M
save_heads $A reassembled $M
{ echo "# $A re-assembled after the stop (running, no write)"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"
cmd "mdadm --stop /dev/md0"

step "$A: simulated crash: written heads back, torn parity, assemble (PPL recovery)"
{
  echo "# simulated crash: each member's first 1.25 MiB set back to its ppl5-written-m<i>.bin (dirty superblock,"
  echo "# resync_offset 0, and the logs of the writes), then parity chunks overwritten with 0xee bytes"
  echo "# (e.bin = 64 KiB of 0xee); member data areas start at data_offset 4096 sectors = 4 KiB block 512"
} >> "$FIX/commands.txt"
dd if=/dev/zero bs=4096 count=16 status=none | tr '\000' '\356' > /tmp/e.bin
expect_eq "$(od -An -tx1 -N 1 /tmp/e.bin | tr -d ' ')" ee "first byte of e.bin"
i=0
for dev in $M; do
  cmd "dd if=$FIX/ppl5-written-m$i.bin of=$dev bs=4096 count=$HEAD_BLOCKS oflag=direct conv=notrunc status=none"
  i=$((i + 1))
done
# stripe S's parity chunk is on member 3 - S % 4, at member data block 512 + 16 S
cmd "dd if=e.bin of=$(disk 3) bs=4096 seek=$((512 + 16 * 0)) count=16 oflag=direct conv=notrunc status=none  # stripe 0 parity (w1, w6; latest log of m3: w6)"
cmd "dd if=e.bin of=$(disk 2) bs=4096 seek=$((512 + 16 * 1)) count=16 oflag=direct conv=notrunc status=none  # stripe 1 parity (w2; not the latest log of m2)"
cmd "dd if=e.bin of=$(disk 2) bs=4096 seek=$((512 + 16 * 5)) count=16 oflag=direct conv=notrunc status=none  # stripe 5 parity (w3; latest log of m2: its second half)"
cmd "dd if=e.bin of=$(disk 1) bs=4096 seek=$((512 + 16 * 10)) count=16 oflag=direct conv=notrunc status=none  # stripe 10 parity (w4, w5, w7; latest log of m1: w7)"
cmd "mdadm --assemble /dev/md0 $M"
expect_eq "$(cat /sys/block/md0/md/degraded)" 0 "degraded members"
md_wait_idle /dev/md0
wait_clean /dev/md0
save_state /dev/md0 $A recovered $M
save_heads $A recovered $M
{ echo "# $A assembled after the simulated crash (running, no write)"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"
i=0
for dev in $M; do
  dd if="$dev" of="$FIX/$A-recovered-m$i.data.bin" bs=4096 skip=512 count=$DATA_BLOCKS iflag=direct status=none
  i=$((i + 1))
done
dd if=/dev/md0 of=/tmp/md0-head.bin bs=4096 count=$((DATA_BLOCKS * 3)) iflag=direct status=none
if cmp -s /tmp/md0-head.bin "$FIX/$A-written.md0-head.bin"; then r="the same as"; else r="DIFFERENT from"; fi
echo "md0's first $((DATA_BLOCKS * 12)) KiB after recovery: $r after the writes" | tee "$FIX/$A-recovered.md0-data.txt"
cmd "echo check > /sys/block/md0/md/sync_action"
md_wait_idle /dev/md0
echo "mismatch_cnt after check: $(cat /sys/block/md0/md/mismatch_cnt)" | tee "$FIX/$A-recovered.check.txt"
cmd "mdadm --stop /dev/md0"
save_examine $A recovered-stopped $M
{ echo "# $A after the last stop"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"

# ---- RAID5, 3 members, left-asymmetric, chunk 32 KiB ---------------------------------------------
B=ppl5-la3
M="$(disk 4) $(disk 5) $(disk 6)"
i=0; for dev in $M; do echo "$B m$i $((4 + i)) $dev" >> "$FIX/manifest.txt"; i=$((i + 1)); done
step "$B: create, stop, save created state"
echo "# $B: members zeroed (fresh sparse images)" >> "$FIX/commands.txt"
cmd "mdadm --create /dev/md1 --metadata=1.2 --run --level=5 --layout=left-asymmetric --chunk=32 --raid-devices=3 --consistency-policy=ppl --assume-clean --homehost=rig --name=$B --uuid=72616964:6e626400:00000000:000000f2 $M"
md_wait_idle /dev/md1
expect_eq "$(cat /sys/block/md1/md/consistency_policy)" ppl "consistency_policy"
save_state /dev/md1 $B created $M
cmd "mdadm --stop /dev/md1"
save_examine $B created $M
save_heads $B created $M
{ echo "# $B after create + stop"; feature_maps $M; } | tee -a "$FIX/feature-maps.txt"

step "summary"
i=0
for dev in $(disk 0) $(disk 1) $(disk 2) $(disk 3) $(disk 4) $(disk 5) $(disk 6); do
  echo "$i $(dd if="$dev" bs=4096 count=$((512 + DATA_BLOCKS)) iflag=direct status=none | md5sum | cut -d' ' -f1)" >> "$FIX/final-md5.txt"
  i=$((i + 1))
done
dmesg | grep -iE 'md/raid|md0|md1|ppl' > "$FIX/dmesg-md.txt" || true
cat "$FIX/manifest.txt"
expect_eq "$(wc -l < "$FIX/manifest.txt")" 7 "members recorded"
ls -l "$FIX" | awk '{s += $5} END {print "results: " s " bytes"}'
