#!/usr/bin/env bash
# The one command that proves raidnbd on a fresh Debian 12 machine:
#
#   deploy/test-all.sh
#
# 1. installs the Debian packages the tests need (as root, or through sudo);
# 2. builds and runs every test of the workspace (unit, property, real NBD clients,
#    end-to-end) in the `ci` profile (optimised, debug assertions on);
# 3. runs the kernel VM rig: Debian's kernel under qemu with nbd.ko, md, ext4 and mdadm.
#
# CI (.ci/run) calls exactly this. Set SKIP_VM=1 to leave out step 3 while iterating.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(fio libnbd-bin python3-libnbd nbdkit nbd-client nbd-server qemu-utils qemu-system-x86
          linux-image-amd64 busybox-static mdadm e2fsprogs fuse3 cpio kmod util-linux mount)

need=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # policy-rc.d keeps package scripts from starting services (nbd-server) on this machine.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
  $SUDO rm -f /usr/sbin/policy-rc.d
fi

start=$(date +%s)
echo "== cargo test --profile ci (whole workspace)"
cargo test --profile ci --workspace --locked -- --test-threads=2
echo "== tests took $(( $(date +%s) - start ))s"

if [ "${SKIP_VM:-0}" != 1 ]; then
  echo "== kernel VM rig"
  # The binary the end-to-end tests just ran (`cargo build --bin` alone would rebuild the
  # workspace with other features).
  [ -x target/ci/raidnbd ] || cargo build --profile ci --locked --bin raidnbd
  deploy/vm/run-all.sh --raidnbd target/ci/raidnbd
fi
echo "== all tests passed in $(( $(date +%s) - start ))s"
