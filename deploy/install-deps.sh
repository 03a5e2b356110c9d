#!/usr/bin/env bash
# Installs the Debian packages raidnbd's tests need, then checks that every tool is there.
#
#   deploy/install-deps.sh            # as root, or through sudo; deploy/test-all.sh runs it
#   deploy/install-deps.sh --check    # only the check: exit 1 naming each missing package
#
# qemu: qemu-utils and qemu-system-x86 both come from bookworm-backports (qemu 10: extended
# headers in qemu-img, qemu-io and qemu-nbd, and the VM rig's qemu) when that suite is
# reachable; on Debian 12 without a source for it, one is added
# (/etc/apt/sources.list.d/raidnbd-bookworm-backports.sources) and removed again if it cannot
# be fetched. Otherwise both come from Debian 12 (7.2).
#
# Why it is careful: one apt call may remove what an earlier one installed. A machine that comes
# with a newer qemu-utils (bookworm-backports' 10.x) loses it when Debian 12's qemu-system-x86
# is installed (qemu-utils 10 Breaks qemu-system-common << 8.0), so "installed" before apt runs
# says nothing about after. Hence:
#   1. the whole package list goes to ONE apt-get install, so apt resolves versions together;
#   2. the two qemu packages are asked for from one release: `PKG/bookworm-backports` for both,
#      or, without backports, qemu-utils at qemu-system-x86's candidate version when the two
#      differ (--allow-downgrades);
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

# apt's configuration, as variables so that the test can point them elsewhere.
INSTALL_DEPS_SOURCES_LIST=/etc/apt/sources.list
INSTALL_DEPS_SOURCES_DIR=/etc/apt/sources.list.d
INSTALL_DEPS_LISTS=/var/lib/apt/lists
INSTALL_DEPS_OS_RELEASE=/etc/os-release
BACKPORTS=bookworm-backports

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# backports_configured -> true when an apt source names bookworm-backports.
backports_configured() {
  grep -qs -- "$BACKPORTS" "$INSTALL_DEPS_SOURCES_LIST" "$INSTALL_DEPS_SOURCES_DIR"/* 2>/dev/null
}

# our_backports_source -> the file this script adds (and removes when the suite is unreachable).
our_backports_source() { echo "$INSTALL_DEPS_SOURCES_DIR/raidnbd-$BACKPORTS.sources"; }

# add_backports_source: on Debian 12 without a source for bookworm-backports, adds one.
add_backports_source() {
  backports_configured && return 0
  grep -qs '^VERSION_CODENAME=bookworm$' "$INSTALL_DEPS_OS_RELEASE" || return 0
  echo "== adding an apt source for $BACKPORTS (qemu 10)"
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$BACKPORTS" | $SUDO tee "$(our_backports_source)" >/dev/null
}

# backports_fetched -> true when apt has the suite's package list (after apt-get update).
backports_fetched() {
  ls "$INSTALL_DEPS_LISTS"/*"${BACKPORTS}"*Packages* >/dev/null 2>&1
}

# backports_version PKG -> the version bookworm-backports offers, or nothing.
backports_version() {
  apt-cache madison "$1" 2>/dev/null | awk -F'|' -v s=" $BACKPORTS/" 'index($3, s) {gsub(/ /, "", $2); print $2; exit}'
}

# qemu_backports_version -> the version of qemu-utils and qemu-system-x86 in bookworm-backports
# when it offers both at one version, else nothing.
qemu_backports_version() {
  local utils system
  utils=$(backports_version qemu-utils) system=$(backports_version qemu-system-x86)
  [ -n "$utils" ] && [ "$utils" = "$system" ] && echo "$utils"
  return 0
}

# pkg_version PKG -> the installed version, or nothing.
pkg_version() {
  dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null \
    | awk '$1 == "install" && $3 == "installed" {print $4}'
}

# candidate_version PKG -> the version apt would install now (after apt-get update).
candidate_version() {
  apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" {print $2; exit}'
}

# depends_of PKG=VERSION -> its Pre-Depends and Depends, one "NAME [OP VERSION]" a line (the
# first of alternatives).
depends_of() {
  apt-cache show "$1" 2>/dev/null | sed -n 's/^\(Pre-\)\{0,1\}Depends: //p' | tr ',' '\n' \
    | sed 's/|.*//; s/:any//; s/[()]//g' | awk 'NF {print $1, $2, $3}'
}

# backports_closure PKG... -> the packages and, recursively, each dependency of their
# bookworm-backports version that must come from bookworm-backports too: one whose candidate
# does not satisfy the version asked while bookworm-backports' does. apt does not pick those
# itself when only PKG/bookworm-backports is asked for ("you have held broken packages": seen
# with qemu-system-x86 10, which needs qemu-system-common, qemu-system-data and seabios of it).
backports_closure() {
  local -A seen=()
  local queue=("$@") p v name op want cand bpo
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]} queue=("${queue[@]:1}")
    [ -z "${seen[$p]:-}" ] || continue
    seen[$p]=1
    echo "$p"
    v=$(backports_version "$p")
    [ -n "$v" ] || continue
    while read -r name op want; do
      [ -n "$want" ] || continue
      cand=$(candidate_version "$name")
      if [ -n "$cand" ] && dpkg --compare-versions "$cand" "$op" "$want"; then continue; fi
      bpo=$(backports_version "$name")
      if [ -n "$bpo" ] && dpkg --compare-versions "$bpo" "$op" "$want"; then queue+=("$name"); fi
    done < <(depends_of "$p=$v")
  done
}

# install_requests -> the package arguments of the one apt-get install call, one per line:
# the list as it is, with both qemu packages (and the dependencies only bookworm-backports
# satisfies: backports_closure) from bookworm-backports when it offers them, else qemu-utils
# pinned to qemu-system-x86's candidate when they differ.
install_requests() {
  local p want have backports
  backports=$(qemu_backports_version)
  want=$(candidate_version qemu-system-x86)
  have=$(candidate_version qemu-utils)
  for p in "${PACKAGES[@]}"; do
    if [ -n "$backports" ] && { [ "$p" = qemu-utils ] || [ "$p" = qemu-system-x86 ]; }; then
      echo "$p/$BACKPORTS"
    elif [ "$p" = qemu-utils ] && [ -n "$want" ] && [ "$want" != "$have" ]; then
      echo "qemu-utils=$want"
    else
      echo "$p"
    fi
  done
  if [ -n "$backports" ]; then
    backports_closure qemu-utils qemu-system-x86 | grep -vx 'qemu-utils\|qemu-system-x86' \
      | sed "s|\$|/$BACKPORTS|" || true
  fi
}

# packages_settled -> true when every package is installed, qemu-utils is of the same version
# as qemu-system-x86, and, where bookworm-backports is configured, its list was fetched and the
# qemu packages are its version (so no apt call is needed).
packages_settled() {
  local p
  for p in "${PACKAGES[@]}"; do
    [ -n "$(pkg_version "$p")" ] || return 1
  done
  [ "$(pkg_version qemu-utils)" = "$(pkg_version qemu-system-x86)" ] || return 1
  if backports_configured; then
    backports_fetched || return 1
    local backports
    backports=$(qemu_backports_version)
    [ -z "$backports" ] || [ "$(pkg_version qemu-utils)" = "$backports" ] || return 1
  fi
  return 0
}

# update_package_lists: apt-get update; when the bookworm-backports source this script added
# cannot be fetched, it is removed and Debian 12's qemu is used.
update_package_lists() {
  local ours rc=0
  ours=$(our_backports_source)
  $SUDO apt-get update -qq || rc=$?
  if [ -e "$ours" ] && { [ "$rc" -ne 0 ] || ! backports_fetched; }; then
    echo "== $BACKPORTS is unreachable: removing its source, using Debian 12's qemu"
    $SUDO rm -f "$ours"
    rc=0
    $SUDO apt-get update -qq || rc=$?
  fi
  return "$rc"
}

install_packages() {
  add_backports_source
  if packages_settled; then
    echo "== Debian packages: all installed (qemu $(pkg_version qemu-utils))"
    return 0
  fi
  echo "== installing Debian packages (one apt call)"
  update_package_lists
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
