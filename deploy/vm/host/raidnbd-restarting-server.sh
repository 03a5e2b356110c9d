#!/usr/bin/env bash
# Host server of the raidnbd-host-restart scenario (its rig-host-server command): serves the
# members as export "vm" on 127.0.0.1:PORT and restarts raidnbd under the guest's writes.
#
#   deploy/vm/host/raidnbd-restarting-server.sh RAIDNBD WORKDIR PORT MEMBER...
#
# When the export has taken 16 MiB of writes since the server started (past what mkfs.ext4
# writes, so the guest's writer runs; the counter raidnbd_export_written_bytes_total of
# --metrics), then 8 MiB since the next start, raidnbd is stopped (SIGTERM, must exit 0;
# the second time SIGKILL, a crash) and started again after a 2 s gap: twice. Every step is
# logged as "restarting-server: ..."; WORKDIR/restarts counts the restarts done (the scenario's
# host-post checks it). Then it serves until it is stopped (SIGTERM is passed on; raidnbd runs in
# a session of its own, so a signal to this script's process group reaches it once).
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 RAIDNBD WORKDIR PORT MEMBER..." >&2; exit 2; }
RAIDNBD=$1 WORKDIR=$2 PORT=$3; shift 3
log() { echo "restarting-server: [$(date +%T.%N | cut -c1-12)] $*"; }
free_port() {
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 20000))
    [ "$p" != "$PORT" ] || continue
    awk -v p=":$(printf '%04X' "$p")" '$2 ~ p"$" {f=1} END{exit f}' /proc/net/tcp /proc/net/tcp6 && { echo "$p"; return; }
  done
  echo "restarting-server: no free port" >&2; exit 1
}
METRICS_PORT=$(free_port)
listening() { awk -v p=":$(printf '%04X' "$1")" '$2 ~ p"$" && $4 == "0A" {f=1} END{exit !f}' /proc/net/tcp; }
PID=""
serve() {
  setsid "$RAIDNBD" serve --listen "127.0.0.1:$PORT" --export vm --control "$WORKDIR/control.sock" \
    --metrics "127.0.0.1:$METRICS_PORT" "$@" &
  PID=$!
  for _ in $(seq 300); do
    listening "$PORT" && listening "$METRICS_PORT" && { log "serving (pid $PID)"; return; }
    kill -0 "$PID" 2>/dev/null || { log "raidnbd serve exited before listening"; exit 1; }
    sleep 0.1
  done
  log "raidnbd serve does not listen after 30 s"; exit 1
}
written_bytes() { # the export's written bytes since this server started
  exec 3<>"/dev/tcp/127.0.0.1/$METRICS_PORT"
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  v=$(sed -n 's/^raidnbd_export_written_bytes_total{export="vm"} \([0-9.e+]*\)\r*$/\1/p' <&3)
  exec 3>&-
  awk -v v="${v:-0}" 'BEGIN{printf "%.0f\n", v}'
}
trap '[ -z "$PID" ] || kill -TERM "$PID" 2>/dev/null; wait; exit 0' TERM INT
echo 0 > "$WORKDIR/restarts"
serve "$@"
for restart in 1 2; do
  threshold_bytes=$(( (restart == 1 ? 16 : 8) * 1024 * 1024 ))
  until [ "$(written_bytes)" -ge "$threshold_bytes" ]; do
    kill -0 "$PID" 2>/dev/null || { log "raidnbd serve died"; exit 1; }
    sleep 0.2
  done
  if [ "$restart" = 1 ]; then
    log "restart $restart: $(written_bytes) bytes written: SIGTERM"
    kill -TERM "$PID"; rc=0; wait "$PID" || rc=$?
    [ "$rc" = 0 ] || { log "raidnbd serve exited $rc after SIGTERM"; exit 1; }
  else
    log "restart $restart: $(written_bytes) bytes written: SIGKILL (a crash)"
    kill -KILL "$PID"; wait "$PID" || true
  fi
  PID=""
  sleep 2
  serve "$@"
  echo "$restart" > "$WORKDIR/restarts"
done
log "both restarts done; serving until stopped"
wait "$PID"
