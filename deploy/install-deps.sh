#!/usr/bin/env bash
# Installs the Debian packages raidnbd's tests need, then checks that every tool is there.
#
#   deploy/install-deps.sh            # as root, or through sudo; deploy/test-all.sh runs it
#   deploy/install-deps.sh --check    # only the check: exit 1 naming each missing package
#
# Why it is careful: one apt call may remove what an earlier one installed. A machine that comes
# with a newer qemu-utils (bookworm-backports' 10.x) loses it when Debian 12's qemu-system-x86
# is installed (qemu-utils 10 Breaks qemu-system-common << 8.0), so "installed" before apt runs
# says nothing about after. Hence:
#   1. the whole package list goes to ONE apt-get install, so apt resolves versions together;
#   2. qemu-utils is asked for at qemu-system-x86's candidate version when the two differ
#      (--allow-downgrades): the qemu packages then come from one release;
#   3. after apt, every command the tests run is looked up, and a missing one fails the script
#      naming the package that provides it.
# Sourcing this file (as deploy/tests/install-deps-test.sh does) defines the functions only.
set -euo pipefail

PACKAGES=(fio libnbd-bin python3-libnbd nbdkit nbd-client nbd-server qemu-utils qemu-system-x86
          linux-image-amd64 busybox-static mdadm e2fsprogs fuse3 cpio kmod util-linux mount
          coreutils tar gzip procps iproute2 systemd gnutls-bin openssl libssl-dev pkg-config)

# What the tests run -> the package that provides it, looked up on PATH and in the sbin
# directories (where Debian puts mdadm and nbd-server).
REQUIRED_TOOLS=(
  fio:fio nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdfuse:libnbd-bin nbdsh:libnbd-bin
  nbdkit:nbdkit nbd-client:nbd-client nbd-server:nbd-server
  qemu-img:qemu-utils qemu-io:qemu-utils qemu-nbd:qemu-utils
  qemu-system-x86_64:qemu-system-x86
  busybox:busybox-static mdadm:mdadm
  mkfs.ext4:e2fsprogs e2fsck:e2fsprogs mke2fs:e2fsprogs tune2fs:e2fsprogs dumpe2fs:e2fsprogs
  debugfs:e2fsprogs resize2fs:e2fsprogs
  fusermount3:fuse3 cpio:cpio depmod:kmod modprobe:kmod losetup:mount mount:mount umount:mount
  truncate:coreutils tar:tar gzip:gzip pkill:procps ip:iproute2
  systemd-analyze:systemd systemd-socket-activate:systemd
  certtool:gnutls-bin psktool:gnutls-bin openssl:openssl pkg-config:pkg-config
)
# Debian's python (python3 on PATH may be another) with libnbd's module, and a kernel for the
# VM rig; variables so that the test can point them elsewhere.
INSTALL_DEPS_PYTHON=/usr/bin/python3
INSTALL_DEPS_BOOT=/boot

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# pkg_version PKG -> the installed version, or nothing.
pkg_version() {
  dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null \
    | awk '$1 == "install" && $3 == "installed" {print $4}'
}

# candidate_version PKG -> the version apt would install now (after apt-get update).
candidate_version() {
  apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" {print $2; exit}'
}

# install_requests -> the package arguments of the one apt-get install call, one per line:
# the list as it is, but qemu-utils pinned to qemu-system-x86's candidate when they differ.
install_requests() {
  local p want have
  want=$(candidate_version qemu-system-x86)
  have=$(candidate_version qemu-utils)
  for p in "${PACKAGES[@]}"; do
    if [ "$p" = qemu-utils ] && [ -n "$want" ] && [ "$want" != "$have" ]; then
      echo "qemu-utils=$want"
    else
      echo "$p"
    fi
  done
}

# packages_settled -> true when every package is installed and qemu-utils is of the same
# version as qemu-system-x86 (so no apt call is needed).
packages_settled() {
  local p
  for p in "${PACKAGES[@]}"; do
    [ -n "$(pkg_version "$p")" ] || return 1
  done
  [ "$(pkg_version qemu-utils)" = "$(pkg_version qemu-system-x86)" ]
}

install_packages() {
  if packages_settled; then
    echo "== Debian packages: all installed"
    return 0
  fi
  echo "== installing Debian packages (one apt call)"
  $SUDO apt-get update -qq
  local requests
  mapfile -t requests < <(install_requests)
  echo "   ${requests[*]}"
  # policy-rc.d keeps package scripts from starting services (nbd-server) on this machine.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  local rc=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    --allow-downgrades "${requests[@]}" || rc=$?
  $SUDO rm -f /usr/sbin/policy-rc.d
  [ "$rc" -eq 0 ] || { echo "install-deps: apt-get install failed (exit $rc)" >&2; return "$rc"; }
}

# check_tools -> prints "missing TOOL: apt-get install PACKAGE" for each missing tool; exit 1
# if any is missing. python3-libnbd is checked by importing its module with Debian's python.
check_tools() {
  local entry tool pkg missing=0
  for entry in "${REQUIRED_TOOLS[@]}"; do
    tool=${entry%%:*} pkg=${entry#*:}
    PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 && continue
    echo "install-deps: missing $tool: apt-get install $pkg" >&2
    missing=1
  done
  if ! "$INSTALL_DEPS_PYTHON" -c 'import nbd' 2>/dev/null; then
    echo "install-deps: missing python module nbd for $INSTALL_DEPS_PYTHON: apt-get install python3-libnbd" >&2
    missing=1
  fi
  # The build links OpenSSL (TLS with pre-shared keys).
  if ! pkg-config --exists openssl 2>/dev/null; then
    echo "install-deps: missing OpenSSL's headers for the build: apt-get install libssl-dev" >&2
    missing=1
  fi
  if ! ls "$INSTALL_DEPS_BOOT"/vmlinuz-* >/dev/null 2>&1; then
    echo "install-deps: missing /boot/vmlinuz-*: apt-get install linux-image-amd64" >&2
    missing=1
  fi
  return "$missing"
}

main() {
  case "${1:-}" in
    --check) check_tools ;;
    "") install_packages && check_tools && echo "== every tool the tests need is installed" ;;
    *) echo "usage: $0 [--check]" >&2; return 2 ;;
  esac
}

# Run only when executed, not when sourced.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
