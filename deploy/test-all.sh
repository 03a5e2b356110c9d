#!/usr/bin/env bash
# The one command that proves raidnbd on a fresh Debian 12 machine:
#
#   deploy/test-all.sh
#
# 1. installs the Debian packages the tests need (deploy/install-deps.sh: as root, or through
#    sudo) and checks that every tool they run is there;
# 2. builds and runs every test of the workspace (unit, property, real NBD clients,
#    end-to-end) in the `ci` profile (optimised, debug assertions on), and checks that the
#    API docs build without warnings;
# 3. runs the kernel VM rig: Debian's kernel under qemu with nbd.ko, md, ext4 and mdadm.
#
# CI (.ci/run) calls exactly this. Set SKIP_VM=1 to leave out step 3 while iterating.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs every Debian package in one apt call, then fails naming the package of any tool
# that is missing afterwards (see the script for why).
deploy/install-deps.sh

start=$(date +%s)
echo "== install script against fake apt (deploy/tests/install-deps-test.sh)"
deploy/tests/install-deps-test.sh

echo "== cargo test --profile ci (whole workspace)"
cargo test --profile ci --workspace --locked -- --test-threads=2
echo "== tests took $(( $(date +%s) - start ))s"

echo "== cargo doc (a broken or private intra-doc link fails)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked --quiet

if [ "${SKIP_VM:-0}" != 1 ]; then
  echo "== kernel VM rig"
  # The binary the end-to-end tests just ran (`cargo build --bin` alone would rebuild the
  # workspace with other features).
  [ -x target/ci/raidnbd ] || cargo build --profile ci --locked --bin raidnbd
  deploy/vm/run-all.sh --raidnbd target/ci/raidnbd
fi
echo "== all tests passed in $(( $(date +%s) - start ))s"
