#!/usr/bin/env bash
# Host half of the raidnbd-host-vm scenario (its rig-host-post command, run after the guest passed
# and the host raidnbd server stopped):
#
#   deploy/vm/host/raidnbd-host-verify.sh RAIDNBD RESULTS_DIR MEMBER...
#
#  1. `raidnbd check --json MEMBER...` (offline scrub) exits 0 with mismatch_cnt 0;
#  2. `raidnbd serve --read-only` of the members on a free 127.0.0.1 port; qemu-img (qemu-utils)
#     copies the export to a raw file: its md5 equals RESULTS_DIR/vda.md5 (what the guest read
#     through qemu's NBD client) and `e2fsck -fn` on it is clean (e2fsprogs).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 RAIDNBD RESULTS_DIR MEMBER..." >&2; exit 2; }
RAIDNBD=$1 RESULTS=$2; shift 2
die() { echo "raidnbd-host-verify: FAIL: $*" >&2; exit 1; }
for t in qemu-img:qemu-utils e2fsck:e2fsprogs md5sum:coreutils; do
  command -v "${t%%:*}" >/dev/null || die "${t%%:*} not found: apt-get install ${t#*:}"
done
[ -s "$RESULTS/vda.md5" ] || die "the guest left no $RESULTS/vda.md5"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/raidnbd-host-verify.XXXXXX")
SERVER=""
cleanup() { [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

"$RAIDNBD" check --json "$@" > "$TMP/check.json" || die "raidnbd check exited $? ($(cat "$TMP/check.json"))"
mismatch=$(sed -n 's/.*"mismatch_cnt": *\([0-9]*\).*/\1/p' "$TMP/check.json")
[ "$mismatch" = 0 ] || die "raidnbd check: mismatch_cnt '$mismatch'"
echo "raidnbd-host-verify: raidnbd check: mismatch_cnt 0"

port=""
for _ in $(seq 50); do
  p=$((20000 + RANDOM % 20000))
  awk -v p=":$(printf '%04X' "$p")" '$2 ~ p"$" {f=1} END{exit f}' /proc/net/tcp /proc/net/tcp6 && { port=$p; break; }
done
[ -n "$port" ] || die "no free port"
"$RAIDNBD" serve --read-only --listen "127.0.0.1:$port" --export vm --control "$TMP/control.sock" "$@" \
  > "$TMP/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do
  awk -v p=":$(printf '%04X' "$port")" '$2 ~ p"$" && $4 == "0A" {f=1} END{exit !f}' /proc/net/tcp && break
  kill -0 "$SERVER" 2>/dev/null || die "raidnbd serve --read-only exited: $(tail -n 5 "$TMP/serve.log")"
  sleep 0.1
done
qemu-img convert -f raw -O raw "nbd://127.0.0.1:$port/vm" "$TMP/export.raw" || die "qemu-img could not read the export"
kill "$SERVER"; wait "$SERVER" || die "raidnbd serve --read-only exited $? on SIGTERM: $(tail -n 5 "$TMP/serve.log")"
SERVER=""
got=$(md5sum < "$TMP/export.raw" | cut -d' ' -f1)
[ "$got" = "$(cat "$RESULTS/vda.md5")" ] || die "export digest $got differs from the guest's $(cat "$RESULTS/vda.md5")"
echo "raidnbd-host-verify: export digest $got = the guest's /dev/vda"
e2fsck -fn "$TMP/export.raw" || die "e2fsck -fn of the export found problems (rc=$?)"
echo "raidnbd-host-verify: OK"
