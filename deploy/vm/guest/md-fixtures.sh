#!/bin/sh
# Generator (not a test): md v1.2 superblock fixtures for crates/raid-core/tests/fixtures/mdadm.
# Creates one array per line of ARRAYS below with the guest's mdadm and kernel md, stops it, and
# records per member: mdadm --examine text and the first 8 KiB read with O_DIRECT (the host
# compares that with the same 8 KiB of the image file it copies). Run it with:
#   deploy/vm/run-all.sh --only md-fixtures
# rig-status: manual
# rig-disks: 64M 48M 64M 48M 32M 2x64M 2x32M 19x64M
# rig-host-post: {repo}/deploy/vm/host/collect-md-fixtures.sh {workdir} {results} "${RIG_FIXTURES_OUT:-{repo}/crates/raid-core/tests/fixtures/mdadm}"
# rig-timeout: 400
. /guest/lib.sh
FIX=$RIG_RESULTS/fixtures
mkdir -p "$FIX"
rig_debug() { cat "$FIX/commands.txt" 2>/dev/null; }

# name | first disk index | member count | mdadm options (besides --metadata/--run/--name/...)
ARRAYS="
linear|0|2|--level=linear --raid-devices=2
raid0-zones|2|3|--level=0 --chunk=64 --raid-devices=3 --assume-clean
raid1|5|2|--level=1 --raid-devices=2 --assume-clean
raid1-resync-bitmap|7|2|--level=1 --raid-devices=2 --bitmap=internal
raid5-ls|9|4|--level=5 --layout=left-symmetric --chunk=64 --raid-devices=4 --assume-clean
raid5-ra|13|3|--level=5 --layout=right-asymmetric --chunk=32 --raid-devices=3 --assume-clean
raid6-ls|16|5|--level=6 --layout=left-symmetric --chunk=64 --raid-devices=5 --assume-clean
raid10-n2|21|3|--level=10 --layout=n2 --chunk=64 --raid-devices=3 --assume-clean
raid10-f2|24|4|--level=10 --layout=f2 --chunk=64 --raid-devices=4 --assume-clean
"

step "versions"
mdadm --version > "$FIX/mdadm-version.txt" 2>&1
uname -r > "$FIX/kernel.txt"
cat "$FIX/mdadm-version.txt" "$FIX/kernel.txt"
: > "$FIX/commands.txt"
: > "$FIX/manifest.txt"

n=0
while IFS='|' read -r name first count opts; do
  [ -n "$name" ] || continue
  step "create $name"
  members=""
  i=0
  while [ "$i" -lt "$count" ]; do members="$members $(disk $((first + i)))"; i=$((i + 1)); done
  uuid=$(printf '72616964:6e626400:00000000:%08x' "$((n + 1))")
  cmd="mdadm --create /dev/md$n --metadata=1.2 --run --homehost=rig --name=$name --uuid=$uuid $opts$members"
  echo "$cmd" >> "$FIX/commands.txt"
  run sh -c "$cmd" < /dev/null
  md_wait_idle "/dev/md$n"
  mdadm --detail "/dev/md$n" > "$FIX/$name.detail.txt"
  cat "/sys/block/md$n/md/array_state" "/sys/block/md$n/md/level"
  run mdadm --stop "/dev/md$n"
  i=0
  for dev in $members; do
    mdadm --examine "$dev" > "$FIX/$name-m$i.examine.txt" || fail "mdadm --examine $dev"
    grep -q "Name : rig:$name" "$FIX/$name-m$i.examine.txt" || fail "--examine $dev lacks the array name"
    dd if="$dev" of="$FIX/$name-m$i.guest.bin" bs=4096 count=2 iflag=direct status=none
    case "$opts" in
      *--bitmap=internal*) mdadm --examine-bitmap "$dev" > "$FIX/$name-m$i.examine-bitmap.txt" ;;
    esac
    echo "$name m$i $((first + i)) $dev" >> "$FIX/manifest.txt"
    i=$((i + 1))
  done
  n=$((n + 1))
done <<LIST
$ARRAYS
LIST
step "summary"
cat "$FIX/manifest.txt"
expect_eq "$(wc -l < "$FIX/manifest.txt")" 28 "members recorded"
