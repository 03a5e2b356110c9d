#!/usr/bin/env bash
# Benchmark: nbd-server (examples/serve_file.rs, a FileDevice) against nbdkit's file
# plugin, both serving the same file on /dev/shm, driven by fio --ioengine=nbd over
# loopback TCP. The two servers are measured alternately, workload by workload, for
# ROUNDS rounds; the report gives the median of each and the ratio ours/nbdkit, with the
# server's CPU per operation and fio's own CPU per job (near 100 %: the client is the limit).
#
# Usage: crates/nbd-server/bench/vs-nbdkit.sh            (defaults below)
#        ROUNDS=5 RUNTIME=10 SIZE=1G crates/nbd-server/bench/vs-nbdkit.sh
#        ONLY=seq crates/nbd-server/bench/vs-nbdkit.sh     (workloads whose name contains "seq")
#        OURS=raidnbd crates/nbd-server/bench/vs-nbdkit.sh  (the product: `raidnbd serve` of a
#            linear array whose one member is the file; nbdkit serves the member file itself)
#        JOBS=4 crates/nbd-server/bench/vs-nbdkit.sh   (fio numjobs=4: four connections to each server)
#        NULL=1 crates/nbd-server/bench/vs-nbdkit.sh   (also `nbdkit null`, a server that does no I/O:
#            the client's ceiling on this machine; ratio ours/null)
#        TLS=1 OURS=raidnbd crates/nbd-server/bench/vs-nbdkit.sh  (both servers also offer TLS
#            (--tls on, X.509 from tests/make-pki.sh); fio also runs over nbds:// against each:
#            four servers in the rotation, ours-tls and nbdkit-tls beside the plaintext two)
#        OURS=raidnbd LEVEL=0 MEMBERS=4 ROUNDS=3 RUNTIME=6 crates/nbd-server/bench/vs-nbdkit.sh
#            (raidnbd serves an array of MEMBERS member files, each SIZE, on /dev/shm beside IMG
#            (IMG, IMG.1, IMG.2, ...), made with `raidnbd create --level LEVEL --chunk CHUNK`;
#            nbdkit still serves the one file IMG: the baseline cost of serving one volume.
#            LEVEL: linear (default), 0, 1, 4, 5, 6, 10; MEMBERS: default 1; CHUNK: default 64K,
#            ignored for linear and raid1; CREATE_ARGS: more create arguments, e.g.
#            "--consistency-policy resync". fio covers 95 % of one member on both servers.)
#        BUILD=0 OURS=raidnbd crates/nbd-server/bench/vs-nbdkit.sh  (no cargo build: use the binary
#            already in $CARGO_TARGET_DIR/release)
# Besides the IOPS ratios, the report gives the ratio of the servers' CPU per operation
# (cpu/op ours/nbdkit, from the medians over rounds) and, for 1 MiB workloads, per MiB.
# Needs: fio, nbdkit (Debian packages fio, nbdkit), /usr/bin/python3, cargo; gnutls-bin for TLS=1;
# nbdinfo (libnbd-bin) for MEMBERS>1 or LEVEL other than linear.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-8}
SIZE=${SIZE:-1G}
ONLY=${ONLY:-}
OURS=${OURS:-serve_file} # serve_file (the crate's example, a FileDevice) or raidnbd
OURS_ARGS=${OURS_ARGS:-} # extra server arguments, e.g. "--threads 4"
TLS=${TLS:-0}
JOBS=${JOBS:-1}
NULL=${NULL:-0}
NULL_PORT=${NULL_PORT:-10913}
IMG=${IMG:-/dev/shm/nbd-bench.img}
LEVEL=${LEVEL:-linear}   # OURS=raidnbd only: the array's RAID level,
MEMBERS=${MEMBERS:-1}    # its number of members (IMG, IMG.1, IMG.2, ...)
CHUNK=${CHUNK:-64K}      # and its chunk size (not for linear or raid1)
CREATE_ARGS=${CREATE_ARGS:-} # more `raidnbd create` arguments, e.g. "--consistency-policy resync"
BUILD=${BUILD:-1}        # 0: use the binaries already built, no cargo
OURS_PORT=${OURS_PORT:-10911}
NBDKIT_PORT=${NBDKIT_PORT:-10912}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

for tool in fio nbdkit; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install $tool" >&2; exit 1; }
done

case $OURS in
serve_file)
    if [[ $BUILD != 0 ]]; then
        echo "building serve_file (release)..." >&2
        cargo build --release --quiet -p nbd-server --example serve_file --manifest-path "$ROOT/Cargo.toml"
    fi
    ;;
raidnbd)
    if [[ $BUILD != 0 ]]; then
        echo "building raidnbd (release)..." >&2
        cargo build --release --quiet --bin raidnbd --manifest-path "$ROOT/Cargo.toml"
    fi
    ;;
*) echo "OURS must be serve_file or raidnbd" >&2; exit 1 ;;
esac

# The member files: IMG alone (a linear array of one member, as before), or IMG, IMG.1, ...
MEMBER_FILES=("$IMG")
ARRAY=0 # 1: MEMBERS>1 or LEVEL other than linear
if [[ $MEMBERS != 1 || $LEVEL != linear ]]; then
    [[ $OURS == raidnbd ]] || { echo "LEVEL and MEMBERS need OURS=raidnbd" >&2; exit 1; }
    command -v nbdinfo >/dev/null || { echo "missing nbdinfo: apt-get install libnbd-bin" >&2; exit 1; }
    ARRAY=1
    for i in $(seq 1 $((MEMBERS - 1))); do MEMBER_FILES+=("$IMG.$i"); done
fi

WORK=$(mktemp -d)
cleanup() {
    [[ -n ${OURS_PID:-} ]] && kill "$OURS_PID" 2>/dev/null || true
    [[ -f $WORK/nbdkit.pid ]] && kill "$(cat "$WORK/nbdkit.pid")" 2>/dev/null || true
    [[ -f $WORK/null.pid ]] && kill "$(cat "$WORK/null.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK" "${MEMBER_FILES[@]}"
}
trap cleanup EXIT

for member in "${MEMBER_FILES[@]}"; do
    echo "filling $member ($SIZE) with random data..." >&2
    fio --name=fill --filename="$member" --rw=write --bs=1m --size="$SIZE" --refill_buffers --output=/dev/null
done

OURS_TLS=() NBDKIT_TLS=() SERVERS=(ours nbdkit)
if [[ $TLS == 1 ]]; then
    [[ $OURS == raidnbd ]] || { echo "TLS=1 needs OURS=raidnbd" >&2; exit 1; }
    sh "$ROOT/crates/nbd-server/tests/make-pki.sh" "$WORK/creds"
    OURS_TLS=(--tls on --tls-certificates "$WORK/creds/pki")
    NBDKIT_TLS=(--tls=on "--tls-certificates=$WORK/creds/pki")
    SERVERS=(ours nbdkit ours-tls nbdkit-tls)
    mkdir -p "$WORK/home/.pki"
    cp -r "$WORK/creds/pki" "$WORK/home/.pki/libnbd"
    export HOME=$WORK/home
fi

# The array is smaller than its member (md metadata), so fio covers 95 % of each export.
FIO_SIZE=$SIZE
if [[ $OURS == raidnbd ]]; then
    FIO_SIZE=95%
    CHUNK_ARGS=()
    [[ $LEVEL == linear || $LEVEL == 1 || $LEVEL == raid1 || $LEVEL == mirror ]] || CHUNK_ARGS=(--chunk "$CHUNK")
    # shellcheck disable=SC2086
    "$CARGO_TARGET_DIR/release/raidnbd" create --level "$LEVEL" "${CHUNK_ARGS[@]}" $CREATE_ARGS --force "${MEMBER_FILES[@]}" \
        >"$WORK/create.log" 2>&1 || { cat "$WORK/create.log" >&2; exit 1; }
    mkdir -p "$WORK/state"
    # shellcheck disable=SC2086
    STATE_DIRECTORY=$WORK/state "$CARGO_TARGET_DIR/release/raidnbd" serve "${MEMBER_FILES[@]}" \
        --listen "127.0.0.1:$OURS_PORT" "${OURS_TLS[@]}" $OURS_ARGS >"$WORK/ours.log" 2>&1 &
else
    # shellcheck disable=SC2086
    "$CARGO_TARGET_DIR/release/examples/serve_file" --file "$IMG" --listen "127.0.0.1:$OURS_PORT" $OURS_ARGS \
        >"$WORK/ours.log" 2>&1 &
fi
OURS_PID=$!
nbdkit -f -P "$WORK/nbdkit.pid" -i 127.0.0.1 -p "$NBDKIT_PORT" "${NBDKIT_TLS[@]}" file "$IMG" \
    >"$WORK/nbdkit.log" 2>&1 &
if [[ $NULL == 1 ]]; then
    nbdkit -f -P "$WORK/null.pid" -i 127.0.0.1 -p "$NULL_PORT" null "$SIZE" >"$WORK/null.log" 2>&1 &
    SERVERS+=(null)
fi
for _ in $(seq 50); do
    grep -qE "listening|serving export" "$WORK/ours.log" && [[ -s $WORK/nbdkit.pid ]] \
        && { [[ $NULL == 0 ]] || [[ -s $WORK/null.pid ]]; } && break
    sleep 0.1
done

if [[ $ARRAY == 1 ]]; then
    # The array differs in size from nbdkit's one file: both cover the same span, 95 % of the
    # smaller export (of one member, but for arrays smaller than it), in whole MiB.
    member_bytes=$(stat -c %s "$IMG")
    array_bytes=$(nbdinfo --size "nbd://127.0.0.1:$OURS_PORT/")
    smaller=$((array_bytes < member_bytes ? array_bytes : member_bytes))
    FIO_SIZE=$((smaller * 95 / 100 / 1048576))m
    echo "level $LEVEL x $MEMBERS members: array $array_bytes bytes, member $member_bytes; fio covers $FIO_SIZE" >&2
fi

# name  fio-arguments
WORKLOADS=(
    "randread-4k-qd32 --rw=randread --bs=4k --iodepth=32"
    "randwrite-4k-qd32 --rw=randwrite --bs=4k --iodepth=32"
    "seqread-1m-qd8 --rw=read --bs=1m --iodepth=8"
    "seqwrite-1m-qd8 --rw=write --bs=1m --iodepth=8"
)

cpu_ticks() { # utime + stime of a process, in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat"
}

uri_of() { # server -> the URI fio uses
    case $1 in
    ours) echo "nbd://127.0.0.1:$OURS_PORT/" ;;
    nbdkit) echo "nbd://127.0.0.1:$NBDKIT_PORT/" ;;
    null) echo "nbd://127.0.0.1:$NULL_PORT/" ;;
    # fio's NBD engine refuses URIs that name local files; libnbd then reads the CA from
    # $HOME/.pki/libnbd (set up below).
    ours-tls) echo "nbds://localhost:$OURS_PORT/" ;;
    nbdkit-tls) echo "nbds://localhost:$NBDKIT_PORT/" ;;
    esac
}

run_fio() { # uri workload-args... ; prints "iops bw_bytes_per_s fio_cpu_percent"
    local uri=$1
    shift
    fio --name=bench --ioengine=nbd --uri="$uri" --size="$FIO_SIZE" \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --numjobs="$JOBS" --group_reporting \
        --output-format=json "$@" |
        /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()  # fio prints "fio: connected to NBD server" before the JSON
job = json.loads(text[text.index("{"):])["jobs"][0]
side = job["read"] if job["read"]["io_bytes"] > 0 else job["write"]
# The client CPU (usr + sys, % of one CPU; with group_reporting fio gives the mean per job):
# near 100, the client is the limit.
print(side["iops"], side["bw_bytes"], job["usr_cpu"] + job["sys_cpu"])'
}

RESULTS=$WORK/results.txt
for round in $(seq "$ROUNDS"); do
    for workload in "${WORKLOADS[@]}"; do
        read -r name args <<<"$workload"
        [[ $name == *"$ONLY"* ]] || continue
        # Alternate the order of the servers to cancel drift.
        order=("${SERVERS[@]}")
        (( round % 2 )) || mapfile -t order < <(printf '%s\n' "${SERVERS[@]}" | tac)
        for server in "${order[@]}"; do
            pid=$OURS_PID
            [[ $server == nbdkit* ]] && pid=$(cat "$WORK/nbdkit.pid")
            [[ $server == null ]] && pid=$(cat "$WORK/null.pid")
            before=$(cpu_ticks "$pid")
            # shellcheck disable=SC2086
            result=$(run_fio "$(uri_of "$server")" $args)
            after=$(cpu_ticks "$pid")
            # Server CPU seconds used during the run (includes the 1 s ramp).
            cpu=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN {print t / hz}')
            echo "$round $name $server $result $cpu" | tee -a "$RESULTS" >&2
        done
    done
done

/usr/bin/python3 - "$RESULTS" "$RUNTIME" "$JOBS" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
names = list(dict.fromkeys(r[1] for r in rows))
servers = list(dict.fromkeys(r[2] for r in rows))
runtime = float(sys.argv[2]) + 1  # fio ramp time is 1 s
print(f"{'workload':<20} {'server':<11} {'IOPS':>9} {'MB/s':>7} {'CPU us/op':>10} {'CPU us/MiB':>11} {'fio CPU %/job':>14}")
ratios = []
for name in names:
    med = {}
    for server in servers:
        sel = [r for r in rows if r[1] == name and r[2] == server]
        iops = statistics.median(float(r[3]) for r in sel)
        bw = statistics.median(float(r[4]) for r in sel)
        # CPU per operation: server CPU seconds over the operations of the whole run.
        cpu = statistics.median(float(r[6]) / (float(r[3]) * runtime) * 1e6 for r in sel)
        # CPU per MiB moved: the same over the bytes of the whole run.
        cpu_mib = statistics.median(float(r[6]) / (float(r[4]) * runtime / 2**20) * 1e6 for r in sel)
        client_cpu = statistics.median(float(r[5]) for r in sel)
        med[server] = (iops, bw, cpu, cpu_mib)
        print(f"{name:<20} {server:<11} {iops:>9.0f} {bw / 1e6:>7.0f} {cpu:>10.1f} {cpu_mib:>11.1f} {client_cpu:>14.0f}")
    pairs = [("ours", "nbdkit")]
    if "null" in med:
        pairs.append(("ours", "null"))
    if "ours-tls" in med:
        pairs += [("ours-tls", "nbdkit-tls"), ("ours-tls", "ours")]
    ratios.append(f"{name:<20} " + "  ".join(f"{a}/{b} {med[a][0] / med[b][0]:.2f}" for a, b in pairs))
    # Server CPU, ours over nbdkit's (null does no I/O: no CPU ratio with it).
    cpu_pairs = [p for p in pairs if "null" not in p]
    line = "  ".join(f"cpu/op {a}/{b} {med[a][2] / med[b][2]:.2f}" for a, b in cpu_pairs)
    if "-1m-" in name:
        line += "  " + "  ".join(f"cpu/MiB {a}/{b} {med[a][3] / med[b][3]:.2f}" for a, b in cpu_pairs)
    ratios.append(f"{'':<20} {line}")
    # Each round's ours/nbdkit, to see the spread.
    per_round = []
    for rnd in sorted({r[0] for r in rows}, key=int):
        by = {r[2]: float(r[3]) for r in rows if r[0] == rnd and r[1] == name}
        if "ours" in by and "nbdkit" in by:
            per_round.append(f"{by['ours'] / by['nbdkit']:.2f}")
    ratios.append(f"{'':<20} ours/nbdkit by round: {' '.join(per_round)}")
print()
print("\n".join(ratios))
rounds = len(rows) // (len(servers) * len(names))
jobs = sys.argv[3]
print(f"ratios of IOPS and of server CPU (medians of {rounds} alternated rounds; {jobs} connection(s) per server)")
EOF
