# Sourced by the bench scripts here: a scratch directory removed on exit, after the servers
# started for it are stopped: SERVER (the one running now, if any), every pid in PIDS, and the
# pid files nbdkit -P wrote into it.
#
#   . "$(dirname "$0")/lib.sh"; work_dir raidnbd-something [PARENT]   # sets WORK (PARENT: /dev/shm)

SERVER=
PIDS=()

work_dir() { # PREFIX [PARENT]
    WORK=$(mktemp -d "${2:-/dev/shm}/$1.XXXXXX")
    trap stop_servers_and_clean EXIT
}

stop_servers_and_clean() {
    local pid pidfile
    for pid in $SERVER "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pidfile in "$WORK"/*.pid; do
        [[ -f $pidfile ]] && { kill "$(cat "$pidfile")" 2>/dev/null || true; }
    done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
