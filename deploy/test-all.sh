#!/usr/bin/env bash
# The one command that proves raidnbd on a fresh Debian 12 machine:
#   deploy/test-all.sh
# It installs what the tests need (Debian packages), then runs every test of the
# workspace (unit, property, real-client and end-to-end) and the kernel VM rig.
# CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(fio libnbd-bin python3-libnbd nbdkit qemu-utils qemu-system-x86 linux-image-amd64
          nbd-client busybox-static mdadm e2fsprogs fuse3 cpio kmod)

need=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

echo "== cargo test (release profile, whole workspace)"
cargo test --release --workspace --locked -- --test-threads=2
