//! Hostile clients against `raidnbd serve`: 20 that stall (10 never read the replies to their
//! large READs, 5 announce a 32 MiB WRITE and send nothing, 5 stop in the handshake) cannot
//! hold what another client needs, and the server's memory stays bounded.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// Opens the stalled connections, then runs a normal libnbd client for `seconds`: 4 KiB
/// write + read pairs; prints "pairs N max_ms M" and exits. The stalled sockets stay open
/// until it exits.
const CLIENTS: &str = r#"
import socket, struct, sys, time
import nbd
port, seconds = int(sys.argv[1]), float(sys.argv[2])

def handshake(go):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hello = b""
    while len(hello) < 18:
        hello += s.recv(18 - len(hello))
    if not go:
        return s
    s.sendall(struct.pack(">I", 3))
    s.sendall(b"IHAVEOPT" + struct.pack(">II", 1, 0))  # EXPORT_NAME "": size + flags
    reply = b""
    while len(reply) < 10:
        reply += s.recv(10 - len(reply))
    return s

stalled = []
for i in range(10):
    s = handshake(True)
    for k in range(32):
        s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, k, (k % 8) * (8 << 20), 8 << 20))
    stalled.append(s)
for i in range(5):
    s = handshake(True)
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, i, 0, 32 << 20))
    stalled.append(s)
for i in range(5):
    stalled.append(handshake(False))
time.sleep(0.5)

h = nbd.NBD()
h.connect_uri(f"nbd://127.0.0.1:{port}/")
pairs, worst = 0, 0.0
end = time.monotonic() + seconds
while time.monotonic() < end:
    data = bytes([pairs % 251]) * 4096
    offset = (pairs % 256) * 4096 + (80 << 20)
    t0 = time.monotonic()
    h.pwrite(data, offset)
    assert h.pread(4096, offset) == data, f"pair {pairs}: wrong data"
    worst = max(worst, time.monotonic() - t0)
    pairs += 1
    time.sleep(0.02)
print(f"pairs {pairs} max_ms {worst * 1000:.0f}", flush=True)
"#;

/// VmRSS of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[test]
fn stalled_clients_do_not_starve_a_normal_one_and_memory_stays_bounded() {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "48M", "m0", "m1", "m2", "m3"]));
    let served = Served::start(d, "", &["--handshake-timeout", "120"], &["m0", "m1", "m2", "m3"]);
    let pid = served.child.id();
    let mut clients = Command::new(PYTHON)
        .args(["-c", CLIENTS, &served.port.to_string(), "30"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut peak_rss = 0;
    let started = Instant::now();
    while clients.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = clients.kill();
            panic!("the normal client did not finish its 30 s: a request starved behind the stalled clients");
        }
        peak_rss = peak_rss.max(rss_bytes(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = clients.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "clients failed: {text}");
    let fields: Vec<&str> = text.split_whitespace().collect();
    let (pairs, max_ms): (u64, u64) = (fields[1].parse().unwrap(), fields[3].parse().unwrap());
    eprintln!("{pairs} pairs, slowest {max_ms} ms, server peak RSS {} MiB", peak_rss >> 20);
    assert!(pairs > 100, "only {pairs} pairs in 30 s");
    assert!(max_ms < 2000, "a 4 KiB write+read pair took {max_ms} ms while 20 clients stalled");
    // The pool (256 MiB) + 1 MiB per connection + the engine and buffers: far from the
    // 10 x 32 x 8 MiB the stalled READs asked for.
    assert!(peak_rss < 700 << 20, "server RSS reached {} MiB", peak_rss >> 20);
    served.stop();
}
