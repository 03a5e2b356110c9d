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
# `producer | grep -q` is a race under pipefail: grep may exit at its match while the producer
# still writes, which then dies of SIGPIPE and fails the pipeline. `contains` reads all input.
contains() { grep -c -- "$1" > /dev/null; } # PATTERN: stdin has a line matching it
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

# Data fill and check. Digests are md5: they detect accidental differences (wrong chunk mapping,
# stale parity), nothing adversarial, and busybox md5sum is 2.5x faster than sha256sum, which
# matters at TCG speed (whole-device digests dominate the scenarios' run time).
# fill_tree writes FILES files of KIB KiB each from /dev/urandom under DIR (spread over two
# sub-directories), syncs, and records "md5  path" lines in LIST.
fill_tree() { # DIR FILES KIB LIST
  mkdir -p "$1/a" "$1/b/c"
  i=0
  while [ "$i" -lt "$2" ]; do
    case $((i % 3)) in 0) sub=. ;; 1) sub=a ;; *) sub=b/c ;; esac
    dd if=/dev/urandom of="$1/$sub/f$i.bin" bs=1024 count="$3" status=none
    i=$((i + 1))
  done
  sync
  (cd "$1" && find . -type f | sort | xargs md5sum) > "$4"
  echo "ok: wrote $2 files of $3 KiB under $1 ($(wc -l < "$4") checksums in $4)"
}
verify_tree() { # DIR LIST
  (cd "$1" && md5sum -c -s "$2") || { (cd "$1" && md5sum -c "$2" | grep -v ': OK$'); fail "checksums differ under $1"; }
  echo "ok: $(wc -l < "$2") files under $1 match $2"
}
mkfs_ext4() { # DEV [MKFS OPTION...]: 4 KiB blocks always, so a filesystem made through a
  # 512-byte-sector device (md0, vda) mounts through nbd0 with its 4 KiB logical blocks
  # (nbd-client -b 4096), and back
  dev=$1; shift
  run mkfs.ext4 -q -F -b 4096 "$@" "$dev"
}
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
fsck_clean() { # DEV: e2fsck -fn must report no problem (exit 0)
  run e2fsck -fn "$1" || fail "e2fsck -fn $1 found problems (rc=$?)"
}
dev_digest() { # DEV [MIB]: md5 of the whole device, or of its first MIB MiB (O_DIRECT reads)
  if [ $# -ge 2 ]; then dd if="$1" bs=1M count="$2" iflag=direct status=none | md5sum | cut -d' ' -f1
  else dd if="$1" bs=1M iflag=direct status=none | md5sum | cut -d' ' -f1; fi
}
in_place_bytes() { # [read|write]: the export's raidnbd_export_{read|write}_in_place_bytes_total
  wget -q -O - "http://${METRICS:-127.0.0.1:9109}/metrics" > /tmp/metrics.txt || fail "cannot fetch http://$METRICS/metrics"
  name="raidnbd_export_${1:-read}_in_place_bytes_total"
  v=$(sed -n "s/^$name{export=\"rig\"} \\([0-9.e+]*\\)\$/\\1/p" /tmp/metrics.txt)
  [ -n "$v" ] || fail "no $name in the metrics"
  awk -v v="$v" 'BEGIN{printf "%.0f\n", v}'
}
expect_grew() { # BEFORE AFTER AT-LEAST WHAT
  [ "$2" -ge $(($1 + $3)) ] || fail "$4: in-place bytes went from $1 to $2 (expected +$3 at least)"
  echo "ok: $4: $(($2 - $1)) bytes in place"
}
fill_dev() { # DEV PATTERN: overwrite all of DEV with the start of PATTERN (a file at least as big)
  fd_bytes=$(size_bytes "$1")
  fd_mib=$((fd_bytes / 1048576)) fd_rest_4k=$(( (fd_bytes % 1048576) / 4096 ))
  run dd if="$2" of="$1" bs=1M count="$fd_mib" oflag=direct conv=notrunc status=none
  [ "$fd_rest_4k" -eq 0 ] || run dd if="$2" of="$1" bs=4096 skip=$((fd_mib * 256)) seek=$((fd_mib * 256)) \
    count="$fd_rest_4k" oflag=direct conv=notrunc status=none
  [ $((fd_bytes % 4096)) -eq 0 ] || fail "$1 is not a multiple of 4 KiB: $fd_bytes bytes"
}
# A background writer: rewrites 40 slot files of 256 KiB under DIR in place (random data,
# fsync, md5 of each slot kept in $W), until writer_stop. A failed write stops it (wait_writes
# then fails naming it).
W=/tmp/writer # writer state: count, err, stop, s<k>.md5
WRITER_PID=""
writer_loop() { # DIR
  trap - EXIT
  i=0
  while [ ! -e $W/stop ]; do
    k=$((i % 40))
    dd if=/dev/urandom of="$1/s$k.bin" bs=64k count=4 conv=notrunc,fsync status=none \
      || { echo "writer: dd of $1/s$k.bin failed at iteration $i" > $W/err; exit 1; }
    md5sum "$1/s$k.bin" > $W/s$k.md5 || { echo "writer: md5sum failed at iteration $i" > $W/err; exit 1; }
    i=$((i + 1))
    echo $i > $W/count.new && mv $W/count.new $W/count # readers never see it empty
  done
}
writer_start() { # DIR
  rm -rf $W; mkdir -p "$1" $W
  writer_loop "$1" &
  WRITER_PID=$!
}
writer_count() { cat $W/count 2>/dev/null || echo 0; }
wait_writes() { # N: until the writer has done N more iterations (fails if it stopped)
  ww_target=$(( $(writer_count) + $1 ))
  ww_n=0
  while [ "$(writer_count)" -lt "$ww_target" ]; do
    [ ! -s $W/err ] || fail "$(cat $W/err)"
    kill -0 "$WRITER_PID" 2>/dev/null || fail "the writer stopped"
    ww_n=$((ww_n + 1)); [ "$ww_n" -le 1500 ] || fail "the writer made no progress in 300 s"
    sleep 0.2
  done
  echo "ok: [$(rig_now)] writer at $(writer_count) writes"
}
writer_stop() {
  touch $W/stop
  wait "$WRITER_PID" || fail "writer: $(cat $W/err 2>/dev/null)"
  WRITER_PID=""
  echo "ok: the writer did $(writer_count) writes"
}
verify_writer() { # every slot file matches the md5 of its last write
  cat $W/s*.md5 > /tmp/writer.md5
  verify_tree / /tmp/writer.md5
}
writer_debug() { # for rig_debug: stop the writer, print its error
  [ -z "$WRITER_PID" ] || { touch $W/stop; kill "$WRITER_PID" 2>/dev/null; }
  cat $W/err 2>/dev/null || true
}
md_wait_idle() { # MDDEV: wait for resync/recovery to finish
  mdadm --wait "$1" || true
  f=/sys/block/${1#/dev/}/md/sync_action
  [ ! -e "$f" ] || expect_eq "$(cat "$f")" idle "sync_action of $1" # linear/raid0 have none
}
md_check_clean() { # MDDEV WHAT: md's own check (sync_action=check) must count no mismatch
  echo check > "/sys/block/${1#/dev/}/md/sync_action"
  md_wait_idle "$1"
  expect_eq "$(cat "/sys/block/${1#/dev/}/md/mismatch_cnt")" 0 "$2"
}

# raidnbd (scenarios with "rig-needs: raidnbd"): one server at a time on 127.0.0.1:$RAIDNBD_PORT,
# export $RAIDNBD_EXPORT, control socket $RAIDNBD_CTL, log appended to $RAIDNBD_LOG (each start
# begins with a "== raidnbd serve ..." line); $RAIDNBD_BIN (default raidnbd) is the binary.
RAIDNBD_PORT=10809
RAIDNBD_EXPORT=rig
RAIDNBD_CTL=/run/raidnbd-rig.sock
RAIDNBD_LOG=/tmp/raidnbd.log
RAIDNBD_PID=""
export NO_COLOR=1 # plain log lines
raidnbd_serve() { # [SERVE OPTION...] MEMBER...: start the server, wait until it listens
  echo "+ [$(rig_now)] raidnbd serve --listen 127.0.0.1:$RAIDNBD_PORT --export $RAIDNBD_EXPORT --control $RAIDNBD_CTL $*"
  echo "== raidnbd serve $*" >> "$RAIDNBD_LOG"
  ${RAIDNBD_BIN:-raidnbd} serve --listen "127.0.0.1:$RAIDNBD_PORT" --export "$RAIDNBD_EXPORT" --control "$RAIDNBD_CTL" "$@" \
    >> "$RAIDNBD_LOG" 2>&1 &
  RAIDNBD_PID=$!
  rs_n=0
  while ! listening "$RAIDNBD_PORT"; do
    kill -0 "$RAIDNBD_PID" 2>/dev/null || { raidnbd_last_log | tail -n 20; fail "raidnbd serve exited before listening"; }
    rs_n=$((rs_n + 1)); [ "$rs_n" -le 150 ] || fail "raidnbd serve does not listen on 127.0.0.1:$RAIDNBD_PORT after 30 s"
    sleep 0.2
  done
  # The line that describes the export (state, DEGRADED, ...) is logged just after the
  # listener opens: wait for it, so checks of the start's log see it.
  rs_n=0
  until raidnbd_last_log | contains 'serving export'; do
    rs_n=$((rs_n + 1)); [ "$rs_n" -le 50 ] || fail "raidnbd serve listens but logged no 'serving export' line after 10 s"
    sleep 0.2
  done
}
raidnbd_stop() { # [SIGNAL]: TERM (default: orderly stop, must exit 0) or KILL (a crash)
  kill "-${1:-TERM}" "$RAIDNBD_PID"
  wait "$RAIDNBD_PID" && rs_rc=0 || rs_rc=$?
  RAIDNBD_PID=""
  [ "${1:-TERM}" != TERM ] || [ "$rs_rc" -eq 0 ] || fail "raidnbd serve exited with rc=$rs_rc after SIGTERM"
  echo "ok: [$(rig_now)] raidnbd serve stopped (SIG${1:-TERM}, rc=$rs_rc)"
}
raidnbd_last_log() { # the log of the last start
  awk '/^== raidnbd serve/ {buf = ""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$RAIDNBD_LOG"
}
raidnbd_ctl() { # ARG...: raidnbd ctl on the running server's control socket
  raidnbd ctl --socket "$RAIDNBD_CTL" "$@"
}
raidnbd_role_state() { # MEMBER: its state in ctl status --json ("" if it has no role)
  raidnbd_ctl status --json | awk -v m="\"$1\"" '$1 == "\"member\":" && $2 == m"," {f=1} f && $1 == "\"state\":" && !done {gsub(/[",]/, "", $2); print $2; done=1}'
}
raidnbd_status_json() { raidnbd_ctl status --json > /tmp/raidnbd-status.json && cat /tmp/raidnbd-status.json; }
raidnbd_wait_idle() { # [SECONDS]: until no rebuild/resync/check runs or is pending (ctl status --json)
  rw_n=0
  while :; do
    raidnbd_ctl status --json > /tmp/raidnbd-status.json || fail "raidnbd ctl status failed"
    if grep -q '"work": null' /tmp/raidnbd-status.json && grep -q '"resync_pending": false' /tmp/raidnbd-status.json; then
      break
    fi
    rw_n=$((rw_n + 1))
    [ $((rw_n % 25)) -ne 0 ] || raidnbd_ctl status
    [ "$rw_n" -le $(( ${1:-300} * 5 )) ] || { raidnbd_ctl status; fail "raidnbd still busy after ${1:-300} s"; }
    sleep 0.2
  done
  echo "ok: [$(rig_now)] raidnbd idle: $(raidnbd_ctl status | sed -n 2p | sed 's/^ *//')"
}
json_number() { # KEY FILE: the first "KEY": NUMBER in FILE
  sed -n "s/.*\"$1\": *\([0-9][0-9]*\).*/\1/p" "$2" | head -n 1
}

head_digest() { # DEV BYTES: md5 of the first BYTES (a multiple of 64 KiB) of DEV, O_DIRECT
  dd if="$1" bs=65536 count=$(($2 / 65536)) iflag=direct status=none | md5sum | cut -d' ' -f1
}

# The size a refusal of `raidnbd ctl grow --raid-devices N` names (its last line ends in
# `--array-size BYTES`).
named_size() { # FILE
  tail -n 1 "$1" | contains '--array-size [0-9][0-9]*$' || fail "the refusal does not end in --array-size <BYTES>"
  sed -n 's/.*--array-size \([0-9][0-9]*\)$/\1/p' "$1" | tail -n 1
}

# `raidnbd ctl grow --raid-devices N` without --array-size on the served array: it must
# refuse (exit 2), name a smaller size and change nothing. Sets SHRINK_OLD (the size now) and
# SHRINK_NEW (the size named).
shrink_refusal() { # PART N
  SHRINK_OLD=$(raidnbd_status_json > /dev/null; json_number size_bytes /tmp/raidnbd-status.json)
  echo "+ [$(rig_now)] raidnbd_ctl grow --raid-devices $2"
  raidnbd_ctl grow --raid-devices "$2" > /tmp/shrink-refusal.txt 2>&1 && rc=0 || rc=$?
  cat /tmp/shrink-refusal.txt
  expect_eq "$rc" 2 "$1: exit code of ctl grow --raid-devices $2 without --array-size"
  SHRINK_NEW=$(named_size /tmp/shrink-refusal.txt)
  echo "ok: the refusal names $SHRINK_NEW bytes (the array has $SHRINK_OLD)"
  [ "$SHRINK_NEW" -lt "$SHRINK_OLD" ] && [ "$SHRINK_NEW" -gt $((SHRINK_OLD / 2)) ] ||
    fail "$1: $SHRINK_NEW is not a $2-member size of a $SHRINK_OLD-byte array"
  raidnbd_status_json | contains '"reshape": null' || fail "$1: the refusal started a reshape"
  expect_eq "$(json_number size_bytes /tmp/raidnbd-status.json)" "$SHRINK_OLD" "$1: size after the refusal"
}

# md's resync/reshape speed for every array: slow, so a stop lands inside a reshape, or fast.
slow_md() { echo 1000 > /proc/sys/dev/raid/speed_limit_min; echo 1000 > /proc/sys/dev/raid/speed_limit_max; }
fast_md() { echo 1000 > /proc/sys/dev/raid/speed_limit_min; echo 200000 > /proc/sys/dev/raid/speed_limit_max; }

# The kernel removes members of MDDEV (already --array-size'd) down to N, and is stopped inside
# that backwards reshape. `mdadm --grow --raid-devices=N` first; where mdadm starts nothing
# (4.2 refuses a raid5 shrink without a backup file), the kernel is driven by sysfs the way
# mdadm's no-backup path would: direction first, new_offset = offset + 1 MiB, raid_disks, reshape.
# Leaves md slow (slow_md) until the caller says otherwise.
md_shrink_stopped_inside() { # PART MDDEV N
  k_md=/sys/block/${2#/dev/}/md
  slow_md
  echo "+ [$(rig_now)] mdadm --grow $2 --raid-devices=$3 (no backup file)"
  mdadm --grow "$2" --raid-devices="$3" < /dev/null > /tmp/shrink-grow.txt 2>&1 && rc=0 || rc=$?
  cat /tmp/shrink-grow.txt
  echo "mdadm --grow --raid-devices=$3 exited with rc=$rc"
  if [ "$(cat $k_md/reshape_position)" = none ]; then
    echo "-- mdadm started no reshape; sysfs: raid_disks=$(cat $k_md/raid_disks) sync_action=$(cat $k_md/sync_action) reshape_direction=$(cat $k_md/reshape_direction)"
    for d in $k_md/dev-*; do echo "   $d: offset=$(cat $d/offset) new_offset=$(cat $d/new_offset) size=$(cat $d/size)"; done
    echo frozen > $k_md/sync_action
    run sh -c "echo backwards > $k_md/reshape_direction"
    for d in $k_md/dev-*; do
      run sh -c "echo $(( $(cat $d/offset) + 2048 )) > $d/new_offset"
    done
    run sh -c "echo $3 > $k_md/raid_disks"
    run sh -c "echo reshape > $k_md/sync_action"
  fi
  cat /proc/mdstat
  k_start=$(cat $k_md/reshape_position)
  echo "reshape_position at the start: $k_start"
  [ "$k_start" != none ] || fail "$1: the kernel runs no reshape"
  k_n=0
  until [ "$(cat $k_md/reshape_position)" != none ] && [ "$(cat $k_md/reshape_position)" -lt "$k_start" ]; do
    k_n=$((k_n + 1)); [ "$k_n" -le 300 ] || fail "$1: md's reshape does not move"
    sleep 0.2
  done
  cat /proc/mdstat
  echo "$1: reshape_position $(cat $k_md/reshape_position)"
  run mdadm --stop "$2"
}
