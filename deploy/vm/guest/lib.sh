# Sourced by every guest scenario (busybox ash). Not a scenario itself.
# Gives: strict mode, timed steps ("RIG-STEP done 1.2s NAME" on the console, parsed by the host),
# a clear failure line naming the step, and helpers for disks, NBD, data fill and verification.
set -eu
set -o pipefail 2>/dev/null || true

RIG_RESULTS=${RIG_RESULTS:-/results}
RIG_STEP_NAME=""
RIG_STEP_T=$(cut -d' ' -f1 /proc/uptime)

rig_now() { cut -d' ' -f1 /proc/uptime; }
rig_elapsed() { awk -v a="$1" -v b="$(rig_now)" 'BEGIN{printf "%.1f", b - a}'; }

step() { # NAME: close the running step (prints its duration) and open a new one
  if [ -n "$RIG_STEP_NAME" ]; then echo "RIG-STEP done $(rig_elapsed "$RIG_STEP_T")s $RIG_STEP_NAME"; fi
  RIG_STEP_NAME=$1
  RIG_STEP_T=$(rig_now)
  echo "== step: $1"
}

# Scenarios may define rig_debug() to print state (mdstat, server logs) when they fail.
rig_debug() { :; }
rig_on_exit() {
  rc=$?
  if [ "$rc" -eq 0 ]; then
    [ -z "$RIG_STEP_NAME" ] || echo "RIG-STEP done $(rig_elapsed "$RIG_STEP_T")s $RIG_STEP_NAME"
  else
    echo "RIG-STEP-FAILED rc=$rc step='$RIG_STEP_NAME'"
    set +e
    rig_debug
    echo "-- /proc/mdstat:"; cat /proc/mdstat 2>/dev/null
  fi
  exit "$rc"
}
trap rig_on_exit EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
run() { echo "+ [$(rig_now)] $*"; "$@"; }
expect_eq() { # ACTUAL EXPECTED WHAT
  [ "$1" = "$2" ] || fail "$3: got '$1', expected '$2'"
  echo "ok: [$(rig_now)] $3 = $1"
}

disk() { # INDEX -> /dev/vda, /dev/vdb, ... (the order the host gave, checked by /init)
  awk -v i="$1" 'BEGIN{a="abcdefghijklmnopqrstuvwxyz"; if (i<26) print "/dev/vd" substr(a,i+1,1);
                 else print "/dev/vd" substr(a,int(i/26),1) substr(a,i%26+1,1)}'
}
size_bytes() { blockdev --getsize64 "$1"; }

# TCP on the guest loopback, read from /proc/net/tcp (state 0A = LISTEN, 01 = ESTABLISHED).
port_hex() { printf '%04X' "$1"; }
listening() { awk -v p=":$(port_hex "$1")" '$2 ~ p"$" && $4 == "0A" {f=1} END{exit !f}' /proc/net/tcp; }
wait_listen() { # PORT [SECONDS]
  n=0
  while ! listening "$1"; do
    n=$((n + 1)); [ "$n" -le $(( ${2:-30} * 5 )) ] || fail "nothing listens on 127.0.0.1:$1"
    sleep 0.2
  done
}
established_to() { # PORT -> number of client-side connections to that port
  awk -v p=":$(port_hex "$1")" '$3 ~ p"$" && $4 == "01" {n++} END{print n+0}' /proc/net/tcp
}

nbd_attach() { # PORT DEV EXPORT CONNECTIONS: kernel client via nbd-client, 4 KiB blocks
  run nbd-client 127.0.0.1 "$1" "$2" -N "$3" -b 4096 -C "$4"
  n=0
  while [ "$(cat "/sys/block/${2#/dev/}/size")" = 0 ]; do
    n=$((n + 1)); [ "$n" -le 50 ] || fail "$2 has size 0 after nbd-client"
    sleep 0.2
  done
  expect_eq "$(established_to "$1")" "$4" "connections to 127.0.0.1:$1"
}
nbd_detach() { # DEV
  run nbd-client -d "$1"
}

# Data fill and check. fill_tree writes FILES files of KIB KiB each from /dev/urandom under DIR
# (spread over two sub-directories), syncs, and records "sha256  path" lines in LIST.
fill_tree() { # DIR FILES KIB LIST
  mkdir -p "$1/a" "$1/b/c"
  i=0
  while [ "$i" -lt "$2" ]; do
    case $((i % 3)) in 0) sub=. ;; 1) sub=a ;; *) sub=b/c ;; esac
    dd if=/dev/urandom of="$1/$sub/f$i.bin" bs=1024 count="$3" status=none
    i=$((i + 1))
  done
  sync
  (cd "$1" && find . -type f | sort | xargs sha256sum) > "$4"
  echo "ok: wrote $2 files of $3 KiB under $1 ($(wc -l < "$4") checksums in $4)"
}
verify_tree() { # DIR LIST
  (cd "$1" && sha256sum -c -s "$2") || { (cd "$1" && sha256sum -c "$2" | grep -v ': OK$'); fail "checksums differ under $1"; }
  echo "ok: $(wc -l < "$2") files under $1 match $2"
}
mkfs_ext4() { # DEV: 4 KiB blocks always, so a filesystem made through a 512-byte-sector device
  # (md0, vda) mounts through nbd0 with its 4 KiB logical blocks (nbd-client -b 4096), and back
  run mkfs.ext4 -q -F -b 4096 "$1"
}
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
fsck_clean() { # DEV: e2fsck -fn must report no problem (exit 0)
  run e2fsck -fn "$1" || fail "e2fsck -fn $1 found problems (rc=$?)"
}
dev_sha256() { # DEV [MIB]: sha256 of the whole device, or of its first MIB MiB
  if [ $# -ge 2 ]; then dd if="$1" bs=1M count="$2" iflag=direct status=none | sha256sum | cut -d' ' -f1
  else dd if="$1" bs=1M iflag=direct status=none | sha256sum | cut -d' ' -f1; fi
}
md_wait_idle() { # MDDEV: wait for resync/recovery to finish
  mdadm --wait "$1" || true
  f=/sys/block/${1#/dev/}/md/sync_action
  [ ! -e "$f" ] || expect_eq "$(cat "$f")" idle "sync_action of $1" # linear/raid0 have none
}
