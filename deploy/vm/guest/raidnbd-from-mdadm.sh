#!/bin/sh
# Arrays made by mdadm (linear, 0, 1, 4, 5, 6, 10; several layouts; a bitmap) served by raidnbd, byte for byte.
# For each line of ARRAYS: zero the members; mdadm --create --metadata=1.2 --assume-clean; write
# a random pattern over the whole md device (so a wrong chunk mapping or a wrong reconstruction
# cannot hide in zeroes); on some lines also mkfs.ext4 (-E nodiscard, over the pattern) and
# files; stop md. Then raidnbd serves the same members, nbd-client -C 2 attaches /dev/nbd0: its
# size and whole-device digest must equal md's (ext4 lines: e2fsck -fn clean, same files); for
# redundant levels raidnbd serves again with members left out (the last one; RAID6 and the
# 3-way mirror: the last two) and the digest must still be equal (reconstruction).
# rig-status: enabled
# rig-needs: raidnbd
# rig-disks: 5x8M 12M
# rig-timeout: 900
. /guest/lib.sh
rig_debug() {
  echo "-- raidnbd log:"; tail -n 40 "$RAIDNBD_LOG" 2>/dev/null
  mdadm --examine /dev/vda 2>&1 | head -n 30
}

# name | member disk indexes | mdadm options | members left out degraded | 1 = ext4 + files
ARRAYS="
linear|0 5|--level=linear --raid-devices=2|0|0
raid0-zones|0 1 5|--level=0 --chunk=64 --raid-devices=3|0|0
raid0-zones-alt|0 1 5|--level=0 --layout=alternate --chunk=32 --raid-devices=3|0|0
raid1-3way|0 1 2|--level=1 --raid-devices=3|2|1
raid4|0 1 2 3|--level=4 --chunk=64 --raid-devices=4|1|0
raid5-ls-bitmap|0 1 2 3|--level=5 --layout=left-symmetric --chunk=64 --bitmap=internal --raid-devices=4|1|1
raid5-la|0 1 2|--level=5 --layout=left-asymmetric --chunk=32 --raid-devices=3|1|0
raid5-rs|0 1 2 3 4|--level=5 --layout=right-symmetric --chunk=64 --raid-devices=5|1|0
raid5-ra|0 1 2 3|--level=5 --layout=right-asymmetric --chunk=128 --raid-devices=4|1|0
raid6-ls|0 1 2 3|--level=6 --layout=left-symmetric --chunk=64 --raid-devices=4|2|0
raid6-ra|0 1 2 3 4|--level=6 --layout=right-asymmetric --chunk=32 --raid-devices=5|2|1
raid10-n2|0 1 2 3|--level=10 --layout=n2 --chunk=64 --raid-devices=4|1|0
raid10-n2-odd|0 1 2|--level=10 --layout=n2 --chunk=64 --raid-devices=3|1|0
raid10-f2|0 1 2 3|--level=10 --layout=f2 --chunk=64 --raid-devices=4|1|1
raid10-o2|0 1 2|--level=10 --layout=o2 --chunk=32 --raid-devices=3|1|0
"
PATTERN=/tmp/pattern # random bytes, as big as the biggest array (tmpfs)
pattern_digest() { # BYTES: md5 of the first BYTES of $PATTERN, cached per size
  [ -f "$PATTERN.$1.md5" ] || head -c "$1" "$PATTERN" | md5sum | cut -d' ' -f1 > "$PATTERN.$1.md5"
  cat "$PATTERN.$1.md5"
}

step "random pattern, modprobe nbd"
run dd if=/dev/urandom of=$PATTERN bs=1M count=40 status=none
run modprobe nbd nbds_max=4

while IFS='|' read -r name idx opts left_out ext4; do
  [ -n "$name" ] || continue
  members=""
  for i in $idx; do members="$members $(disk "$i")"; done
  members=${members# }
  kept=$members
  i=0
  while [ "$i" -lt "$left_out" ]; do kept=${kept% *}; i=$((i + 1)); done

  step "$name: mdadm --create, fill$([ "$ext4" = 1 ] && echo ', ext4 + files')"
  for m in $members; do dd if=/dev/zero of="$m" bs=1M count=$(($(size_bytes "$m") / 1048576)) oflag=direct status=none; done
  run sh -c "mdadm --create /dev/md0 --metadata=1.2 --run --assume-clean --homehost=rig --name=$name $opts $members" \
    < /dev/null
  MD_SIZE=$(size_bytes /dev/md0)
  fill_dev /dev/md0 $PATTERN
  if [ "$ext4" = 1 ]; then
    mkfs_ext4 /dev/md0 -E nodiscard
    run mount -t ext4 /dev/md0 /mnt
    fill_tree /mnt 6 256 /tmp/files.md5
    run umount /mnt
    MD_SUM=$(dev_digest /dev/md0)
  else
    # md wrote the pattern: its digest is the pattern's (no need to read md0 back).
    MD_SUM=$(pattern_digest "$MD_SIZE")
  fi
  run mdadm --stop /dev/md0

  step "$name: raidnbd serve, compare through /dev/nbd0"
  raidnbd_serve $members
  nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
  expect_eq "$(size_bytes /dev/nbd0)" "$MD_SIZE" "$name: nbd0 size vs md0"
  expect_eq "$(dev_digest /dev/nbd0)" "$MD_SUM" "$name: digest of nbd0 vs md0"
  if [ "$ext4" = 1 ]; then
    fsck_clean /dev/nbd0
    run mount -t ext4 -o ro /dev/nbd0 /mnt
    verify_tree /mnt /tmp/files.md5
    run umount /mnt
  fi
  nbd_detach /dev/nbd0
  raidnbd_stop

  if [ "$left_out" -gt 0 ]; then
    step "$name: raidnbd serve without the last $left_out member(s)"
    raidnbd_serve $kept
    raidnbd_last_log | contains DEGRADED || fail "raidnbd does not say the array is degraded"
    nbd_attach "$RAIDNBD_PORT" /dev/nbd0 "$RAIDNBD_EXPORT" 2
    expect_eq "$(dev_digest /dev/nbd0)" "$MD_SUM" "$name: digest of degraded nbd0 vs md0"
    nbd_detach /dev/nbd0
    raidnbd_stop
  fi
  for m in $members; do mdadm --zero-superblock "$m"; done
done <<LIST
$ARRAYS
LIST
