#!/usr/bin/env bash
# Entry point of the VM rig for the test command: build (or reuse) the initramfs, boot the guest
# once per selected scenario, print a summary and exit non-zero if any scenario failed.
#
#   deploy/vm/run-all.sh [--only NAME[,NAME...]] [--include-pending] [--raidnbd PATH] [--list]
#                        [--keep] [--verbose]
#
# Selection (scenario = deploy/vm/guest/NAME.sh with a "# rig-status:" line):
#   rig-status: enabled   run by default
#   rig-status: pending   listed as NOT RUN unless --include-pending (reproductions of known
#                         raidnbd bugs: flipped to enabled once fixed)
#   rig-status: manual    generators (md-fixtures) and rig self-checks (standin-*: the rig with
#                         Debian's own NBD tools and md, no raidnbd); run only with --only
#   --only runs exactly the named scenarios, whatever their status.
# raidnbd binary: --raidnbd PATH, else $RAIDNBD_BIN, else target/release/raidnbd if it exists. A
# selected scenario that needs it fails (never skips) when it is missing.
# Last line: "N passed, N failed".
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
RIG_WORK=${RIG_WORK:-/var/tmp/raidnbd-vm-rig}
export RIG_WORK

ONLY="" INCLUDE_PENDING=0 LIST=0 PASS_ARGS=()
RAIDNBD=${RAIDNBD_BIN:-}
[ -n "$RAIDNBD" ] || [ ! -x "$REPO/target/release/raidnbd" ] || RAIDNBD=$REPO/target/release/raidnbd
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=$2; shift 2 ;;
    --include-pending) INCLUDE_PENDING=1; shift ;;
    --raidnbd) RAIDNBD=$(readlink -f "$2"); shift 2 ;;
    --list) LIST=1; shift ;;
    --keep|--verbose) PASS_ARGS+=("$1"); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "run-all: unknown argument $1" >&2; exit 2 ;;
  esac
done

status_of() { sed -n 's/^# rig-status: *//p' "$1" | head -n1; }
needs_of() { sed -n 's/^# rig-needs: *//p' "$1" | tr '\n' ' '; }

SELECTED=() NOT_RUN=()
for f in "$HERE"/guest/*.sh; do
  name=$(basename "$f" .sh)
  st=$(status_of "$f")
  [ -n "$st" ] || continue # lib.sh and other helpers
  if [ -n "$ONLY" ]; then
    if [[ ",$ONLY," == *",$name,"* ]]; then SELECTED+=("$name"); else NOT_RUN+=("$name ($st, not in --only)"); fi
  elif [ "$st" = enabled ] || { [ "$st" = pending ] && [ "$INCLUDE_PENDING" = 1 ]; }; then
    SELECTED+=("$name")
  else
    NOT_RUN+=("$name ($st)")
  fi
done
if [ -n "$ONLY" ]; then
  for n in ${ONLY//,/ }; do
    [ -f "$HERE/guest/$n.sh" ] && [ -n "$(status_of "$HERE/guest/$n.sh")" ] \
      || { echo "run-all: no scenario $n in $HERE/guest" >&2; exit 2; }
  done
fi

if [ "$LIST" = 1 ]; then
  for f in "$HERE"/guest/*.sh; do
    st=$(status_of "$f"); [ -n "$st" ] || continue
    printf '%-22s %-8s %s\n' "$(basename "$f" .sh)" "$st" "$(sed -n '2s/^# *//p' "$f")"
  done
  exit 0
fi
[ ${#SELECTED[@]} -gt 0 ] || { echo "run-all: no scenario selected" >&2; exit 2; }

echo "== VM rig: scenarios: ${SELECTED[*]}"
[ ${#NOT_RUN[@]} -eq 0 ] || echo "== VM rig: NOT RUN: ${NOT_RUN[*]}"
INITRD=$RIG_WORK/initramfs.cpio.gz
build_args=("$INITRD")
if [ -n "$RAIDNBD" ]; then
  [ -x "$RAIDNBD" ] || { echo "run-all: raidnbd binary $RAIDNBD is not executable" >&2; exit 2; }
  build_args+=(--raidnbd "$RAIDNBD"); PASS_ARGS+=(--raidnbd "$RAIDNBD")
  echo "== VM rig: raidnbd binary: $RAIDNBD"
fi
"$HERE/build-initramfs.sh" "${build_args[@]}"

PASSED=0 FAILED=0 SUMMARY=()
T_ALL=$(date +%s)
for name in "${SELECTED[@]}"; do
  echo "== VM rig: $name"
  t0=$(date +%s)
  out=$RIG_WORK/run-all-$name.out
  rc=0
  "$HERE/run-guest.sh" --initrd "$INITRD" "${PASS_ARGS[@]}" "$name" 2>&1 | tee "$out" || rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then PASSED=$((PASSED + 1)); verdict=PASS; else FAILED=$((FAILED + 1)); verdict=FAIL; fi
  SUMMARY+=("$(printf '%-4s %-22s %4ss  %s' "$verdict" "$name" "$(( $(date +%s) - t0 ))" \
    "$(grep -o 'boot=[0-9.]*s total=[0-9.]*s' "$out" | tail -n1)")")
done

echo "== VM rig summary ($(( $(date +%s) - T_ALL ))s):"
printf '  %s\n' "${SUMMARY[@]}"
[ ${#NOT_RUN[@]} -eq 0 ] || printf '  NOT RUN %s\n' "${NOT_RUN[@]}"
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
