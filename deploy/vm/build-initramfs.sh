#!/usr/bin/env bash
# Assemble the guest initramfs of the VM rig (see deploy/vm/README.md).
#
#   deploy/vm/build-initramfs.sh OUT.cpio.gz [--raidnbd PATH] [--with-binary PATH]... [--guest-script PATH]...
#
# Contents, all taken from the host's Debian packages:
#   busybox (busybox-static) with applet symlinks, nbd-client, nbd-server if installed (only the
#   manual stand-in scenarios use it),
#   e2fsprogs tools, mdadm, the shared libraries they need (found with ldd), the kernel modules
#   of $RIG_KVER (virtio, ext4, md personalities, nbd, loop) with a depmod'ed modules.dep,
#   deploy/vm/guest/init as /init, deploy/vm/guest/*.sh (+ each --guest-script) as /guest/*.sh,
#   --raidnbd PATH as /usr/bin/raidnbd and each --with-binary as /usr/bin/<its name>, with the
#   shared libraries they need.
# The result is cached: OUT is rebuilt only when the hash of every input changes (written to
# OUT.inputs); the script prints "cached" or "built" and the path.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# The kernel linux-image-amd64 depends on (so a kernel update in Debian 12 needs no edit here).
KVER=${RIG_KVER:-$(dpkg-query -W -f='${Depends}' linux-image-amd64 2>/dev/null \
  | sed -n 's/^linux-image-\([^ ,]*\).*/\1/p')}
KVER=${KVER:-6.1.0-57-amd64}
MODDIR=/lib/modules/$KVER

die() { echo "build-initramfs: ERROR: $*" >&2; exit 1; }

OUT=""
RAIDNBD=""
EXTRA_BINARIES=()
EXTRA_SCRIPTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --with-binary) EXTRA_BINARIES+=("$(readlink -f "$2")"); shift 2 ;;
    --raidnbd) RAIDNBD=$(readlink -f "$2"); shift 2 ;;
    --guest-script) EXTRA_SCRIPTS+=("$(readlink -f "$2")"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$OUT" ] || die "only one output path"; OUT=$1; shift ;;
  esac
done
[ -n "$OUT" ] || die "usage: $0 OUT.cpio.gz [--raidnbd PATH] [--with-binary PATH]... [--guest-script PATH]..."
for b in $RAIDNBD "${EXTRA_BINARIES[@]}"; do [ -x "$b" ] || die "binary $b missing or not executable"; done
mkdir -p "$(dirname "$OUT")"; OUT=$(realpath -m "$OUT")

# --- what goes in -------------------------------------------------------------------------------
# Tools: name -> Debian package (for the error message when missing).
declare -A TOOL_PACKAGE=(
  [busybox]=busybox-static [nbd-client]=nbd-client [mdadm]=mdadm
  [mke2fs]=e2fsprogs [e2fsck]=e2fsprogs [tune2fs]=e2fsprogs [dumpe2fs]=e2fsprogs
  [debugfs]=e2fsprogs [resize2fs]=e2fsprogs [depmod]=kmod [modprobe]=kmod [cpio]=cpio
)
# Optional: nbd-server, used only by the manual stand-in scenarios (standin-nbd fails naming the
# package when it is missing from the initramfs).
NBD_SERVER=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v nbd-server || true)
# Modules the guest may need; their dependencies are resolved with modprobe --show-depends.
MODULES=(virtio_pci virtio_blk crc32c_intel crc32c_generic ext4 loop nbd tls gcm ctr ghash_generic aesni_intel
         md_mod linear raid0 raid1 raid10 raid456)
# Loaded by /init at boot, in this order (nbd and tls are left to the scenarios: they modprobe them).
BOOT_MODULES=(virtio_pci virtio_blk crc32c_intel crc32c_generic ext4 loop
              md_mod linear raid0 raid1 raid10 raid456)

tool_path() { # NAME -> absolute path of the host tool
  local p
  p=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v "$1" || true)
  [ -n "$p" ] || die "host tool '$1' not found: apt-get install ${TOOL_PACKAGE[$1]:-?}"
  readlink -f "$p"
}
[ -d "$MODDIR/kernel" ] || die "$MODDIR missing: apt-get install linux-image-amd64 (kernel $KVER)"
[ -f "/boot/vmlinuz-$KVER" ] || die "/boot/vmlinuz-$KVER missing: apt-get install linux-image-amd64"
for t in "${!TOOL_PACKAGE[@]}"; do tool_path "$t" >/dev/null; done
file_is_static() { ! ldd "$1" >/dev/null 2>&1; }
file_is_static "$(tool_path busybox)" || die "busybox is not static: apt-get install busybox-static"

# Module files in load order (uncompressed names are resolved later).
module_files() { # MODULE... -> unique paths relative to $MODDIR, dependency order
  local m
  for m in "$@"; do
    modprobe -C /dev/null --show-depends -S "$KVER" "$m" 2>/dev/null \
      | awk '$1=="insmod"{print $2}' | grep . \
      || { echo "MISSING:$m"; }
  done | awk '!seen[$0]++' | sed "s#^$MODDIR/##"
}
ALL_MODULE_FILES=$(module_files "${MODULES[@]}")
if grep -q '^MISSING:' <<<"$ALL_MODULE_FILES"; then
  die "kernel modules not found for $KVER: $(grep '^MISSING:' <<<"$ALL_MODULE_FILES" | tr '\n' ' ')"
fi
BOOT_MODULE_FILES=$(module_files "${BOOT_MODULES[@]}")

# --- cache key ----------------------------------------------------------------------------------
inputs_digest() {
  {
    echo "kver=$KVER"
    echo "raidnbd=${RAIDNBD:+$(sha256sum < "$RAIDNBD")}"
    for f in "$0" "$HERE"/guest/init "$HERE"/guest/*.sh "${EXTRA_SCRIPTS[@]}" "${EXTRA_BINARIES[@]}"; do
      echo "$(basename "$f") $(sha256sum < "$f")"
    done
    for t in "${!TOOL_PACKAGE[@]}"; do echo "$t $(stat -c '%s %Y' "$(tool_path "$t")")"; done | sort
    echo "nbd-server ${NBD_SERVER:+$(stat -c '%s %Y' "$(readlink -f "$NBD_SERVER")")}"
    dpkg-query -W busybox-static nbd-client nbd-server mdadm e2fsprogs "linux-image-$KVER" 2>/dev/null || true
    while read -r f; do echo "$f $(stat -c '%s %Y' "$MODDIR/$f")"; done <<<"$ALL_MODULE_FILES"
  } | sha256sum | cut -d' ' -f1
}
DIGEST=$(inputs_digest)
if [ -f "$OUT" ] && [ "$(cat "$OUT.inputs" 2>/dev/null)" = "$DIGEST" ]; then
  echo "build-initramfs: cached $OUT"
  exit 0
fi

# --- staging tree -------------------------------------------------------------------------------
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/rig-initramfs.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
cd "$STAGE"
mkdir -p usr/bin usr/sbin usr/lib/x86_64-linux-gnu usr/lib64 etc proc sys dev run tmp mnt guest results \
         var/tmp root
ln -s usr/bin bin; ln -s usr/sbin sbin; ln -s usr/lib lib; ln -s usr/lib64 lib64
mknod -m 600 dev/console c 5 1 2>/dev/null || true
mknod -m 666 dev/null c 1 3 2>/dev/null || true

copy_with_libs() { # SRC DEST_IN_STAGE: copy a binary and every library ldd names for it
  local src=$1 dest=$2 lib
  install -D -m 755 "$src" "$STAGE/$dest"
  if ! file_is_static "$src"; then
    ldd "$src" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | while read -r lib; do
      [ -e "$STAGE$lib" ] || install -D -m 755 "$(readlink -f "$lib")" "$STAGE$lib"
    done
    ldd "$src" | grep -q 'not found' && die "ldd: unresolved library for $src: $(ldd "$src" | grep 'not found')"
  fi
  return 0
}

# Real tools first; busybox applets only fill the gaps.
copy_with_libs "$(tool_path nbd-client)" usr/sbin/nbd-client
[ -z "$NBD_SERVER" ] || copy_with_libs "$(readlink -f "$NBD_SERVER")" usr/bin/nbd-server
copy_with_libs "$(tool_path mdadm)" usr/sbin/mdadm
for t in mke2fs e2fsck tune2fs dumpe2fs debugfs resize2fs; do copy_with_libs "$(tool_path "$t")" "usr/sbin/$t"; done
for l in mkfs.ext2 mkfs.ext3 mkfs.ext4; do ln -s mke2fs "usr/sbin/$l"; done
for l in fsck.ext2 fsck.ext3 fsck.ext4; do ln -s e2fsck "usr/sbin/$l"; done
for b in "${EXTRA_BINARIES[@]}"; do copy_with_libs "$b" "usr/bin/$(basename "$b")"; done
if [ -n "$RAIDNBD" ]; then
  copy_with_libs "$RAIDNBD" usr/bin/raidnbd
  # A release build carries debug info (tens of MB): drop it, the guest only runs the binary.
  if command -v strip >/dev/null; then strip --strip-debug usr/bin/raidnbd; fi
fi
install -m 755 "$(tool_path busybox)" usr/bin/busybox
for applet in $(usr/bin/busybox --list-full); do
  [ -e "$applet" ] || [ -L "$applet" ] || ln -s /usr/bin/busybox "$applet"
done
# The applets list puts some in /sbin or /bin (symlinks here), so every name lands in usr/*.

# Configuration the tools read.
cp /etc/mke2fs.conf etc/mke2fs.conf
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > etc/passwd
printf 'root:x:0:\nnogroup:x:65534:\n' > etc/group
printf 'passwd: files\ngroup: files\nhosts: files\n' > etc/nsswitch.conf
printf '127.0.0.1 localhost\n' > etc/hosts
mkdir -p etc/mdadm etc/nbd-server
printf 'DEVICE partitions\nHOMEHOST rig\n' > etc/mdadm/mdadm.conf

# Kernel modules (decompressed if the kernel ships them compressed) + depmod.
while read -r f; do
  dst=$STAGE/lib/modules/$KVER/${f%.xz}; dst=${dst%.zst}; dst=${dst%.gz}
  mkdir -p "$(dirname "$dst")"
  case "$f" in
    *.ko.xz) xz -dc "$MODDIR/$f" > "$dst" ;;
    *.ko.zst) zstd -qdc "$MODDIR/$f" > "$dst" ;;
    *.ko.gz) gzip -dc "$MODDIR/$f" > "$dst" ;;
    *) cp "$MODDIR/$f" "$dst" ;;
  esac
done <<<"$ALL_MODULE_FILES"
cp "$MODDIR"/modules.builtin "$MODDIR"/modules.builtin.modinfo "$MODDIR"/modules.order "lib/modules/$KVER/"
depmod -b "$STAGE" "$KVER"
for m in "${MODULES[@]}"; do
  modprobe -d "$STAGE" -C /dev/null --show-depends -S "$KVER" "$m" >/dev/null \
    || die "depmod'ed staging tree cannot resolve module $m"
done
sed -e 's#\.ko\.\(xz\|zst\|gz\)$#.ko#' <<<"$BOOT_MODULE_FILES" > etc/rig-boot-modules
echo "$KVER" > etc/rig-kver

# Init and guest scenarios.
install -m 755 "$HERE/guest/init" init
for s in "$HERE"/guest/*.sh "${EXTRA_SCRIPTS[@]}"; do install -m 755 "$s" "guest/$(basename "$s")"; done

# --- pack ---------------------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1 > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$DIGEST" > "$OUT.inputs"
echo "build-initramfs: built $OUT ($(du -h "$OUT" | cut -f1), $(wc -l < etc/rig-boot-modules) boot modules)"
