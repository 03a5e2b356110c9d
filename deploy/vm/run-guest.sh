#!/usr/bin/env bash
# Boot the rig's guest once for one scenario and report PASS/FAIL (see deploy/vm/README.md).
#
#   deploy/vm/run-guest.sh [options] SCENARIO       (a name in deploy/vm/guest/ or a path to NAME.sh)
#     --initrd PATH    initramfs to boot (default: build or reuse $RIG_WORK/initramfs.cpio.gz)
#     --raidnbd PATH   raidnbd binary: put in the initramfs and substituted for {raidnbd}
#     --workdir DIR    images, console log and results (default: $RIG_WORK/run/SCENARIO)
#     --timeout SEC    host-side limit (default: the scenario's rig-timeout, else 600)
#     --keep           keep the disk images after a PASS (they are always kept after a FAIL)
#     --verbose        also stream the guest console to stdout while it runs
#
# The scenario's header lines (# rig-KEY: VALUE) say what it needs:
#   rig-disks: 4x64M 96M      fresh sparse images, attached as virtio disks vda, vdb, ... in order
#   rig-host-images: 4x64M    sparse images h0.img, h1.img, ... on the host only (for host servers)
#   rig-host-pre: CMD         run on the host before boot (may repeat)
#   rig-host-server: CMD      run on the host in the background during the boot (one)
#   rig-nbd-drive: URI        attached after the disks through qemu's own NBD client (may repeat)
#                             (drive options may follow the URI: URI,file.reconnect-delay=60)
#   rig-host-post: CMD        run on the host after a PASSing guest (may repeat)
#   rig-timeout: SEC          guest scenario limit; the host adds boot margin
#   rig-needs: raidnbd        the scenario needs --raidnbd
# Placeholders in commands/URIs: {port} (a free 127.0.0.1 port), {workdir}, {results} (the
# unpacked results disk), {repo}, {raidnbd}.
# Exit code: 0 on PASS; 1 on FAIL (the guest's log tail is printed); 2 on usage errors.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# The kernel linux-image-amd64 depends on (so a kernel update in Debian 12 needs no edit here).
KVER=${RIG_KVER:-$(dpkg-query -W -f='${Depends}' linux-image-amd64 2>/dev/null \
  | sed -n 's/^linux-image-\([^ ,]*\).*/\1/p')}
KVER=${KVER:-6.1.0-57-amd64}
RIG_WORK=${RIG_WORK:-/var/tmp/raidnbd-vm-rig}
BOOT_MARGIN_S=90 # host timeout = scenario limit + this (boot, module load, results)

usage() { awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 2; }
die() { echo "run-guest: ERROR: $*" >&2; exit 2; }

INITRD="" RAIDNBD="" WORKDIR="" TIMEOUT="" KEEP=0 VERBOSE=0 SCENARIO=""
while [ $# -gt 0 ]; do
  case "$1" in
    --initrd) INITRD=$(readlink -f "$2"); shift 2 ;;
    --raidnbd) RAIDNBD=$(readlink -f "$2"); shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --verbose) VERBOSE=1; shift ;;
    -h|--help) usage ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$SCENARIO" ] || die "one scenario per boot"; SCENARIO=$1; shift ;;
  esac
done
[ -n "$SCENARIO" ] || usage
case "$SCENARIO" in
  */*|*.sh) SCRIPT=$(readlink -f "$SCENARIO") ;;
  *) SCRIPT=$HERE/guest/$SCENARIO.sh ;;
esac
[ -f "$SCRIPT" ] || die "no scenario script $SCRIPT"
NAME=$(basename "$SCRIPT" .sh)

header() { sed -n "s/^# rig-$1: *//p" "$SCRIPT"; } # all values of one header key
for tool in qemu-system-x86_64:qemu-system-x86 truncate:coreutils tar:tar; do
  command -v "${tool%%:*}" >/dev/null || die "${tool%%:*} not found: apt-get install ${tool#*:}"
done
KERNEL=/boot/vmlinuz-$KVER
[ -r "$KERNEL" ] || die "$KERNEL missing: apt-get install linux-image-amd64"
if header needs | grep -qw raidnbd; then
  [ -n "$RAIDNBD" ] || die "scenario $NAME needs the raidnbd binary: pass --raidnbd PATH (cargo build --release)"
  [ -x "$RAIDNBD" ] || die "raidnbd binary $RAIDNBD is not executable"
fi
GUEST_TIMEOUT=$(header timeout | head -n1); GUEST_TIMEOUT=${GUEST_TIMEOUT:-600}
HOST_TIMEOUT=${TIMEOUT:-$((GUEST_TIMEOUT + BOOT_MARGIN_S))}
[ -n "$TIMEOUT" ] && GUEST_TIMEOUT=$((TIMEOUT > BOOT_MARGIN_S + 10 ? TIMEOUT - BOOT_MARGIN_S : TIMEOUT / 2))

# --- initramfs ----------------------------------------------------------------------------------
# The initramfs carries deploy/vm/guest/; a scenario from elsewhere is added with --guest-script.
EXTERNAL=0
[ "$SCRIPT" = "$HERE/guest/$NAME.sh" ] || EXTERNAL=1
[ "$EXTERNAL" = 0 ] || [ ! -e "$HERE/guest/$NAME.sh" ] || die "$NAME.sh exists in $HERE/guest/ too"
if [ -z "$INITRD" ]; then
  INITRD=$RIG_WORK/initramfs.cpio.gz
  args=(); [ -z "$RAIDNBD" ] || args+=(--raidnbd "$RAIDNBD")
  if [ "$EXTERNAL" = 1 ]; then INITRD=$RIG_WORK/initramfs-$NAME.cpio.gz; args+=(--guest-script "$SCRIPT"); fi
  "$HERE/build-initramfs.sh" "$INITRD" "${args[@]}"
elif [ "$EXTERNAL" = 1 ]; then
  die "scenario $SCRIPT is outside $HERE/guest/: let run-guest.sh build the initramfs (no --initrd)"
fi
[ -r "$INITRD" ] || die "initramfs $INITRD missing"

# --- work directory -----------------------------------------------------------------------------
WORKDIR=$(mkdir -p "${WORKDIR:-$RIG_WORK/run/$NAME}" && cd "${WORKDIR:-$RIG_WORK/run/$NAME}" && pwd)
rm -rf "$WORKDIR"/{*.img,results,console.log,qemu.stderr,host-server.log}
mkdir -p "$WORKDIR/results"
LOG=$WORKDIR/console.log

# Sizes "4x64M 96M" -> one size per line.
expand_sizes() { local s; for s in $1; do case "$s" in *x*) for _ in $(seq "${s%%x*}"); do echo "${s#*x}"; done ;; *) echo "$s" ;; esac; done; }
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 20000))
    awk -v p=":$(printf '%04X' "$p")" '$2 ~ p"$" {f=1} END{exit f}' /proc/net/tcp /proc/net/tcp6 && { echo "$p"; return; }
  done
  die "no free port"
}
PORT=$(free_port)
subst() { # text with placeholders -> text
  local s=$1
  s=${s//\{port\}/$PORT}; s=${s//\{workdir\}/$WORKDIR}; s=${s//\{results\}/$WORKDIR/results}
  s=${s//\{repo\}/$REPO}; s=${s//\{raidnbd\}/${RAIDNBD:-raidnbd}}
  printf '%s' "$s"
}

QEMU_PID="" SERVER_PID=""
cleanup() {
  [ -z "$QEMU_PID" ] || kill "$QEMU_PID" 2>/dev/null || true
  if [ -n "$SERVER_PID" ]; then kill -- "-$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null || true; fi
  return 0
}
trap cleanup EXIT
fail() { # REASON: print the evidence and exit 1
  echo "FAIL $NAME: $1"
  echo "---- guest console (last 60 lines of $LOG):"
  tail -n 60 "$LOG" 2>/dev/null | tr -d '\r' || true
  if [ -s "$WORKDIR/qemu.stderr" ]; then echo "---- qemu stderr:"; tail -n 20 "$WORKDIR/qemu.stderr"; fi
  if [ -s "$WORKDIR/host-server.log" ]; then echo "---- host server log:"; tail -n 20 "$WORKDIR/host-server.log"; fi
  echo "---- (images and logs kept in $WORKDIR)"
  exit 1
}

DRIVE_ARGS=()
i=0
while read -r size; do
  [ -n "$size" ] || continue
  truncate -s "$size" "$WORKDIR/d$i.img"
  DRIVE_ARGS+=(-drive "file=$WORKDIR/d$i.img,format=raw,if=none,id=d$i,discard=unmap,cache=writeback"
               -device "virtio-blk-pci,drive=d$i,serial=rig-d$i")
  i=$((i + 1))
done < <(expand_sizes "$(header disks | tr '\n' ' ')")
NDISKS=$i
i=0
while read -r size; do
  [ -n "$size" ] || continue
  truncate -s "$size" "$WORKDIR/h$i.img"; i=$((i + 1))
done < <(expand_sizes "$(header host-images | tr '\n' ' ')")
i=0
while read -r uri; do
  [ -n "$uri" ] || continue
  DRIVE_ARGS+=(-drive "file=$(subst "$uri"),format=raw,if=none,id=n$i,cache=writeback"
               -device "virtio-blk-pci,drive=n$i,serial=rig-n$i")
  i=$((i + 1))
done < <(header nbd-drive)
NNBD=$i
truncate -s 64M "$WORKDIR/results.img"
DRIVE_ARGS+=(-drive "file=$WORKDIR/results.img,format=raw,if=none,id=results"
             -device "virtio-blk-pci,drive=results,serial=rig-results")
# One PCI slot per disk on the pc machine: 32 slots, 2 taken by the host bridge and PIIX.
[ $((NDISKS + NNBD + 1)) -le 29 ] || die "$NAME wants $((NDISKS + NNBD + 1)) virtio disks; at most 29 fit"

# --- host side ----------------------------------------------------------------------------------
while read -r cmd; do
  [ -n "$cmd" ] || continue
  echo "run-guest: host-pre: $(subst "$cmd")"
  bash -c "$(subst "$cmd")" || fail "host-pre command failed: $(subst "$cmd")"
done < <(header host-pre)
SERVER_CMD=$(header host-server | head -n1)
if [ -n "$SERVER_CMD" ]; then
  echo "run-guest: host-server: $(subst "$SERVER_CMD")"
  setsid bash -c "exec $(subst "$SERVER_CMD")" > "$WORKDIR/host-server.log" 2>&1 &
  SERVER_PID=$!
  hexport=$(printf '%04X' "$PORT")
  for _ in $(seq 100); do
    awk -v p=":$hexport" '$2 ~ p"$" && $4 == "0A" {f=1} END{exit !f}' /proc/net/tcp /proc/net/tcp6 && break
    kill -0 "$SERVER_PID" 2>/dev/null || fail "host server exited before listening on port $PORT"
    sleep 0.1
  done
  awk -v p=":$hexport" '$2 ~ p"$" && $4 == "0A" {f=1} END{exit !f}' /proc/net/tcp /proc/net/tcp6 \
    || fail "host server does not listen on 127.0.0.1:$PORT after 10 s"
fi

# --- boot ---------------------------------------------------------------------------------------
APPEND="console=ttyS0 quiet panic=-1 rig.scenario=$NAME rig.disks=$NDISKS rig.nbd=$NNBD rig.timeout=$GUEST_TIMEOUT"
QEMU=(qemu-system-x86_64 -machine pc -accel tcg -cpu max -smp 2 -m "${RIG_MEM:-1G}"
      -nodefaults -nic none -vga none -display none -monitor none -no-reboot
      -serial "file:$LOG" -rtc base=utc
      -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" "${DRIVE_ARGS[@]}")
echo "run-guest: $NAME: booting ($NDISKS disks, $NNBD nbd drives, limit ${HOST_TIMEOUT}s)"
: > "$LOG"
T0=$(date +%s.%N)
"${QEMU[@]}" < /dev/null > "$WORKDIR/qemu.stderr" 2>&1 &
QEMU_PID=$!
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}'; }
[ "$VERBOSE" = 0 ] || { tail -n +1 -f "$LOG" --pid="$QEMU_PID" | tr -d '\r' & }
BOOT_S="" TIMED_OUT=0
while kill -0 "$QEMU_PID" 2>/dev/null; do
  [ -n "$BOOT_S" ] || ! grep -q 'RIG-BOOTED' "$LOG" || BOOT_S=$(elapsed)
  if awk -v e="$(elapsed)" -v l="$HOST_TIMEOUT" 'BEGIN{exit !(e > l)}'; then TIMED_OUT=1; break; fi
  sleep 0.5
done
if [ "$TIMED_OUT" = 1 ]; then
  kill "$QEMU_PID" 2>/dev/null || true
  sleep 1; kill -9 "$QEMU_PID" 2>/dev/null || true
fi
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=""
TOTAL_S=$(elapsed)
[ -n "$BOOT_S" ] || ! grep -q 'RIG-BOOTED' "$LOG" || BOOT_S=$TOTAL_S
[ "$TIMED_OUT" = 0 ] || fail "timeout after ${HOST_TIMEOUT}s (qemu killed)"

# --- verdict ------------------------------------------------------------------------------------
CLEAN_LOG=$(tr -d '\r' < "$LOG")
grep -q '^RIG-BOOTED' <<<"$CLEAN_LOG" || fail "the guest never reached /init (no RIG-BOOTED)"
grep -q '^RIG-END' <<<"$CLEAN_LOG" || fail "the guest stopped before reporting (no RIG-END)"
RESULT_LINE=$(grep "^RIG-RESULT scenario=$NAME " <<<"$CLEAN_LOG" | tail -n1)
GUEST_RC=$(sed -n 's/.* rc=\([0-9]*\).*/\1/p' <<<"$RESULT_LINE")
tar -xf "$WORKDIR/results.img" -C "$WORKDIR/results" 2>/dev/null || fail "cannot unpack the results disk"
[ "$(cat "$WORKDIR/results/rc" 2>/dev/null)" = "$GUEST_RC" ] || fail "results disk rc differs from the console marker"
grep -q "^RIG-PASS $NAME\$" <<<"$CLEAN_LOG" && [ "$GUEST_RC" = 0 ] || fail "guest scenario failed (rc=$GUEST_RC)"

SERVER_RC=0
if [ -n "$SERVER_PID" ]; then
  kill -0 "$SERVER_PID" 2>/dev/null || { wait "$SERVER_PID" || SERVER_RC=$?; }
  [ "$SERVER_RC" = 0 ] || fail "host server died during the run (rc=$SERVER_RC)"
  kill -- "-$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
fi
while read -r cmd; do
  [ -n "$cmd" ] || continue
  echo "run-guest: host-post: $(subst "$cmd")"
  bash -c "$(subst "$cmd")" || fail "host-post command failed: $(subst "$cmd")"
done < <(header host-post)

echo "run-guest: steps of $NAME:"
grep '^RIG-STEP done' <<<"$CLEAN_LOG" | sed 's/^RIG-STEP done /  /'
[ "$KEEP" = 1 ] || rm -f "$WORKDIR"/*.img
echo "PASS $NAME boot=${BOOT_S:-?}s total=${TOTAL_S}s"
