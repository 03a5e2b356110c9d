#!/bin/sh
# NOT raidnbd: a test double with raidnbd's command line, used only to check the rig's pending
# raidnbd scenarios themselves before the real binary exists:
#   deploy/vm/run-all.sh --include-pending --raidnbd deploy/vm/selftest/raidnbd-standin.sh
# In the guest (md available) it is mdadm + Debian's nbd-server:
#   create --level L --chunk C MEMBER...   -> mdadm --create (metadata 1.2), resync, stop
#   serve --listen ADDR:PORT --export NAME MEMBER... -> mdadm --assemble --run, nbd-server on
#       ADDR:PORT exporting the md device as NAME, until SIGTERM (then stops both)
# On the host (no md driver) create does nothing and serve is nbdkit's memory plugin with a RAID5's
# capacity: it checks the host-mode plumbing only.
set -eu
cmd=${1:-}; shift || true
LEVEL="" CHUNK="" LISTEN="" EXPORT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --level) LEVEL=$2; shift 2 ;;
    --chunk) CHUNK=$2; shift 2 ;;
    --listen) LISTEN=$2; shift 2 ;;
    --export) EXPORT=$2; shift 2 ;;
    --*) echo "raidnbd-standin: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
MD=/dev/md100
in_guest() { [ -e /proc/mdstat ] && [ -f /etc/rig-kver ]; }

case "$cmd" in
  create)
    in_guest || exit 0
    mdadm --create "$MD" --metadata=1.2 --run --level="$LEVEL" --chunk="$CHUNK" --raid-devices=$# "$@" < /dev/null
    mdadm --wait "$MD" || true
    mdadm --stop "$MD"
    ;;
  serve)
    addr=${LISTEN%:*} port=${LISTEN##*:}
    if ! in_guest; then # the data capacity of a RAID5 over these members, in memory
      exec nbdkit --foreground --ipaddr "$addr" --port "$port" memory $(( ($# - 1) * $(stat -c %s "$1") ))
    fi
    mdadm --assemble --run "$MD" "$@" < /dev/null
    cat > /tmp/standin-nbd.conf <<CFG
[generic]
  listenaddr = $addr
  port = $port
[$EXPORT]
  exportname = $MD
  flush = true
  fua = true
CFG
    stop() {
      kill "$(cat /tmp/standin-nbd.pid)" 2>/dev/null || true
      n=0
      until mdadm --stop "$MD" 2>/dev/null; do n=$((n + 1)); [ $n -lt 50 ] || exit 1; sleep 0.2; done
      exit 0
    }
    trap stop TERM INT
    nbd-server -C /tmp/standin-nbd.conf -p /tmp/standin-nbd.pid
    while :; do sleep 1; done
    ;;
  *) echo "raidnbd-standin: unknown command '$cmd'" >&2; exit 2 ;;
esac
