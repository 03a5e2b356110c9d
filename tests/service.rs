//! raidnbd as a long-running service: signals stop it cleanly, logs fit files and the
//! journal, it listens on Unix sockets and through socket activation, tells systemd when it
//! is ready, starts degraded when a member's device is gone, assembles by UUID, runs event
//! commands, and `ctl wait` / `detail --test` work as mdadm's do. The unit files verify.

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::*;

/// Writes `len` bytes of pattern `seed` at `offset` without FLUSH, closes without FLUSH.
const WRITE_NO_FLUSH: &str = r#"
import sys, nbd
uri, offset, length, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
h = nbd.NBD()
h.connect_uri(uri)
block = bytes((seed + i) % 251 for i in range(1 << 20))
for o in range(0, length, 1 << 20):
    h.pwrite(block[:min(1 << 20, length - o)], offset + o)
h.shutdown()
"#;

/// Prints the sha256 of `len` bytes at `offset`.
const DIGEST: &str = r#"
import sys, nbd, hashlib
uri, offset, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
d = hashlib.sha256()
for o in range(0, length, 1 << 20):
    d.update(h.pread(min(1 << 20, length - o), offset + o))
print(d.hexdigest())
"#;

fn expected_digest(len: usize, seed: usize) -> String {
    let out = run_ok(Command::new(PYTHON).args([
        "-c",
        "import sys, hashlib\nn, s = int(sys.argv[1]), int(sys.argv[2])\nb = bytes((s + i) % 251 for i in range(1 << 20))\nd = hashlib.sha256()\nfor o in range(0, n, 1 << 20):\n    d.update(b[:min(1 << 20, n - o)])\nprint(d.hexdigest())",
        &len.to_string(),
        &seed.to_string(),
    ]));
    out.trim().to_string()
}

fn digest(uri: &str, offset: usize, len: usize) -> String {
    run_ok(Command::new(PYTHON).args(["-c", DIGEST, uri, &offset.to_string(), &len.to_string()])).trim().to_string()
}

fn write_no_flush(uri: &str, offset: usize, len: usize, seed: usize) {
    run_ok(Command::new(PYTHON).args([
        "-c",
        WRITE_NO_FLUSH,
        uri,
        &offset.to_string(),
        &len.to_string(),
        &seed.to_string(),
    ]));
}

fn create(d: &Path, level: &str, size: &str, members: &[&str]) {
    let mut args = vec!["create", "--level", level, "--size", size];
    if level != "1" {
        args.extend(["--chunk", "64K"]);
    }
    args.extend_from_slice(members);
    assert_ok(&raidnbd(d, &args));
}

fn examine_state(d: &Path, member: &str) -> String {
    let text = assert_ok(&raidnbd(d, &["examine", "--json", member]));
    let v: Value = serde_json::from_str(&text).expect("examine json");
    let v = if v.is_array() { v[0].clone() } else { v };
    v["state"].as_str().unwrap_or_else(|| panic!("no state in {v:#}")).to_string()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `raidnbd serve` of the RAID1 `m0 m1` in `d` on 127.0.0.1:`port`, stderr to `log`, with the
/// environment variable `env` set (systemd's notify or journal variable).
fn spawn_serve(d: &Path, port: u16, log: &Path, env: (&str, &std::ffi::OsStr)) -> std::process::Child {
    Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--control"])
        .arg(d.join("c.sock"))
        .args(["m0", "m1"])
        .current_dir(d)
        .env(env.0, env.1)
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("raidnbd serve")
}

fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "raidnbd did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT each stop the server with exit 0: the write-back cache
/// is written to the members (throttled, so writing it back takes seconds and is still going
/// on when the signal comes), the superblocks say clean, the control socket is gone. The
/// log, written to a file, holds no ANSI escape.
#[test]
fn each_signal_stops_gracefully_and_drains_the_write_back_cache() {
    require_libnbd_python();
    const LEN: usize = 6 << 20;
    let expected = expected_digest(LEN, 7);
    for (sig, name) in
        [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP"), (libc::SIGQUIT, "SIGQUIT")]
    {
        let dir = tempdir();
        let d = dir.path();
        create(d, "1", "32M", &["m0", "m1"]);
        let socket = d.join("control.sock");
        let mut served = Served::start(
            d,
            "data",
            &["--cache", "writeback", "--member-bw", "2M", "--control", socket.to_str().unwrap()],
            &["m0", "m1"],
        );
        assert!(socket.exists(), "control socket made");
        write_no_flush(&served.uri("data"), 0, LEN, 7);
        signal(&served.child, sig);
        let status = wait_exit(&mut served.child, Duration::from_secs(60));
        let log = served.log_text();
        assert_eq!(status.code(), Some(0), "{name}: exit status; log:\n{log}");
        assert!(log.contains(&format!("{name} received")), "{name} logged:\n{log}");
        assert!(!log.as_bytes().contains(&0x1b), "{name}: an ESC byte in a log written to a file:\n{log}");
        assert!(!socket.exists(), "{name}: control socket removed");
        for m in ["m0", "m1"] {
            assert_eq!(examine_state(d, m), "clean", "{name}: {m} marked clean");
        }
        drop(served);
        let again = Served::start(d, "data", &[], &["m0", "m1"]);
        assert_eq!(digest(&again.uri("data"), 0, LEN), expected, "{name}: cached writes reached the members");
        again.stop();
    }
}

/// Connects, asks for the default export, sends READs whose replies it never reads, prints
/// "sent" and sleeps: a client that holds the drain (the server cannot finish its replies).
const STALLED_READER: &str = r#"
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
hello = b""
while len(hello) < 18:
    hello += s.recv(18 - len(hello))
s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
s.sendall(b"IHAVEOPT" + struct.pack(">II", 1, 0))  # NBD_OPT_EXPORT_NAME ""
reply = b""
while len(reply) < 10:
    reply += s.recv(10 - len(reply))
for handle in range(16):
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, handle, 0, 8 << 20))
print("sent", flush=True)
time.sleep(120)
"#;

/// A client that never reads its replies holds the drain after the first signal; a second
/// signal drops it at once, and the arrays are still flushed and marked clean, exit 0.
#[test]
fn a_second_signal_cuts_the_drain_short_but_writes_the_metadata() {
    use std::io::BufRead;
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "64M", &["m0", "m1"]);
    let mut served = Served::start(d, "data", &[], &["m0", "m1"]);
    let mut client = Command::new(PYTHON)
        .args(["-c", STALLED_READER, &served.port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(client.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "sent");
    std::thread::sleep(Duration::from_millis(300));
    signal(&served.child, libc::SIGTERM);
    std::thread::sleep(Duration::from_secs(2));
    assert!(served.child.try_wait().unwrap().is_none(), "the first signal waits for the connection's replies");
    let second = Instant::now();
    signal(&served.child, libc::SIGTERM);
    let status = wait_exit(&mut served.child, Duration::from_secs(20));
    let log = served.log_text();
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(second.elapsed() < Duration::from_secs(10), "the second signal cut the drain short");
    assert!(log.contains("received again"), "{log}");
    let _ = client.kill();
    let _ = client.wait();
    for m in ["m0", "m1"] {
        assert_eq!(examine_state(d, m), "clean", "{m} marked clean after a cut-short drain");
    }
}

/// `--listen unix:PATH` next to a TCP address: libnbd reaches both, the socket file is gone
/// after the stop.
#[test]
fn listens_on_a_unix_socket_and_tcp_at_once() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let sock = d.join("nbd.sock");
    let listen_unix = format!("unix:{}", sock.display());
    let served = Served::run(d, |tcp| {
        strings(&["serve", "--listen", &listen_unix, "--listen", tcp, "--export", "data", "m0", "m1"])
    });
    let size_tcp = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("data")]));
    let unix_uri = format!("nbd+unix:///data?socket={}", sock.display());
    let size_unix = run_ok(Command::new("nbdinfo").args(["--size", &unix_uri]));
    assert_eq!(size_tcp.trim(), size_unix.trim());
    assert!(size_tcp.trim().parse::<u64>().unwrap() > 30 << 20);
    served.stop();
    assert!(!sock.exists(), "unix socket removed at stop");
    // A regular file where the socket should go is an error, and is left alone.
    let regular = d.join("regular");
    std::fs::write(&regular, b"keep me").unwrap();
    let out = raidnbd(d, &["serve", "--listen", &format!("unix:{}", regular.display()), "m0", "m1"]);
    assert_user_error(&out, "is not a socket");
    assert_eq!(std::fs::read(&regular).unwrap(), b"keep me");
}

/// Socket activation: systemd-socket-activate passes a listening TCP socket; nbdinfo's
/// `[ CMD ]` form starts the server with a Unix socket the same way.
#[test]
fn serves_through_socket_activation() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("systemd-socket-activate", "systemd");
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let port = free_port();
    let log = std::fs::File::create(d.join("activate.log")).unwrap();
    let mut activator = Command::new("systemd-socket-activate")
        .args(["-l", &format!("127.0.0.1:{port}"), BIN, "serve", "--control"])
        .arg(d.join("c1.sock"))
        .args(["m0", "m1"])
        .current_dir(d)
        .stderr(log)
        .spawn()
        .expect("systemd-socket-activate");
    // The activator listens at once; raidnbd starts on the first connection.
    let mut size = String::new();
    wait_until("socket-activated raidnbd to answer", Duration::from_secs(20), || {
        let out = Command::new("nbdinfo").args(["--size", &format!("nbd://127.0.0.1:{port}/")]).output().unwrap();
        size = String::from_utf8_lossy(&out.stdout).trim().to_string();
        out.status.success()
    });
    signal(&activator, libc::SIGTERM);
    let _ = activator.wait();
    let log = std::fs::read_to_string(d.join("activate.log")).unwrap();
    assert!(log.contains("(socket activation)"), "raidnbd used the passed socket:\n{log}");
    assert!(size.parse::<u64>().unwrap() > 30 << 20, "size {size}");

    let out = run_ok(
        Command::new("nbdinfo")
            .args(["--size", "--", "[", BIN, "serve", "--control"])
            .arg(d.join("c2.sock"))
            .args(["m0", "m1", "]"])
            .current_dir(d),
    );
    assert_eq!(out.trim(), size, "nbdinfo [ raidnbd serve ... ]");
}

/// READY=1 arrives on the test's own NOTIFY_SOCKET once the server listens (a client
/// connecting right then is served at the first try), STATUS= says the arrays' state,
/// and STOPPING=1 comes with the stop.
#[test]
fn notifies_systemd_when_ready_and_when_stopping() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let notify_path = d.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let port = free_port();
    let mut child = spawn_serve(d, port, &d.join("serve.log"), ("NOTIFY_SOCKET", notify_path.as_os_str()));
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = notify.recv(&mut buf).expect("a notification within 20 s");
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        messages.push(text.clone());
        if text.lines().any(|l| l == "READY=1") {
            break;
        }
    }
    // Ready means listening: the first connection attempt is served.
    let out = Command::new("nbdinfo").args(["--size", &format!("nbd://127.0.0.1:{port}/")]).output().unwrap();
    assert!(out.status.success(), "served right after READY=1: {}", String::from_utf8_lossy(&out.stderr));
    notify.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wait_until("STATUS with the array state", Duration::from_secs(10), || {
        if let Ok(n) = notify.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        messages.iter().any(|m| m.contains("STATUS=") && m.contains("raid1 clean"))
    });
    signal(&child, libc::SIGTERM);
    wait_until("STOPPING=1", Duration::from_secs(10), || {
        if let Ok(n) = notify.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        messages.iter().any(|m| m.lines().any(|l| l == "STOPPING=1"))
    });
    assert_eq!(wait_exit(&mut child, Duration::from_secs(30)).code(), Some(0));
}

/// A member file that is gone (a dead disk whose device node vanished) counts as absent: the
/// RAID5 starts degraded with a warning naming it and serves the same bytes;
/// `--require-all` refuses to start, naming it.
#[test]
fn a_missing_member_starts_the_array_degraded_with_intact_data() {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    create(d, "5", "32M", &["m0", "m1", "m2", "m3"]);
    let served = Served::start(d, "data", &[], &["m0", "m1", "m2", "m3"]);
    write_no_flush(&served.uri("data"), 1 << 20, 8 << 20, 3);
    let before = digest(&served.uri("data"), 0, 16 << 20);
    served.stop();
    std::fs::remove_file(d.join("m2")).unwrap();

    let out = raidnbd(
        d,
        &["serve", "--require-all", "--listen", &format!("127.0.0.1:{}", free_port()), "m0", "m1", "m2", "m3"],
    );
    assert_user_error(&out, "m2");

    // Something there that cannot be a member (a directory) is an error, not an absent disk.
    std::fs::create_dir(d.join("m2")).unwrap();
    let out = raidnbd(d, &["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "m0", "m1", "m2", "m3"]);
    assert_user_error(&out, "m2");
    std::fs::remove_dir(d.join("m2")).unwrap();

    let served = Served::start(d, "data", &[], &["m0", "m1", "m2", "m3"]);
    assert_eq!(digest(&served.uri("data"), 0, 16 << 20), before, "degraded array serves the same bytes");
    let log = served.stop();
    assert!(log.contains("member m2 is absent"), "warning names the member:\n{log}");
    assert!(log.contains("DEGRADED"), "{log}");
}

/// `serve --uuid UUID --scan GLOB` picks the members of that array among others.
#[test]
fn scan_assembles_the_members_that_carry_the_uuid() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["a0.img", "a1.img"]);
    create(d, "1", "48M", &["b0.img", "b1.img"]);
    std::fs::write(d.join("junk.img"), vec![7u8; 1 << 20]).unwrap();
    let text = assert_ok(&raidnbd(d, &["detail", "--json", "b0.img", "b1.img"]));
    let uuid = serde_json::from_str::<Value>(&text).unwrap()["uuid"].as_str().expect("uuid").to_string();
    let pattern = format!("{}/*.img", d.display());
    let served = Served::run(d, |listen| strings(&["serve", "--listen", listen, "--uuid", &uuid, "--scan", &pattern]));
    let size: u64 = run_ok(Command::new("nbdinfo").args(["--size", &served.uri("")])).trim().parse().unwrap();
    let log = served.stop();
    assert!(size > 40 << 20, "the 48M array was assembled, not the 32M one: {size}");
    assert!(log.contains("b0.img") && log.contains("b1.img") && !log.contains("a0.img"), "{log}");
}

/// A RAID1 `m0 m1` in a temporary directory, with a 32 MiB `spare` file, served as "data"
/// with `--on-event` appending each event's arguments to `events.txt`.
struct EventRig {
    dir: tempfile::TempDir,
    socket: PathBuf,
    served: Served,
}

impl EventRig {
    fn start() -> Self {
        let dir = tempdir();
        let d = dir.path();
        create(d, "1", "32M", &["m0", "m1"]);
        std::fs::write(d.join("spare"), vec![0u8; 32 << 20]).unwrap();
        let script = d.join("on-event.sh");
        let events = d.join("events.txt");
        std::fs::write(&script, format!("#!/bin/sh\necho \"$@\" >> {}\n", events.display())).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let socket = d.join("c.sock");
        let served = Served::start(
            d,
            "data",
            &["--on-event", script.to_str().unwrap(), "--control", socket.to_str().unwrap()],
            &["m0", "m1"],
        );
        EventRig { dir, socket, served }
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        let mut full = vec!["ctl", "--socket", self.socket.to_str().unwrap()];
        full.extend_from_slice(args);
        raidnbd(self.dir.path(), &full)
    }

    fn events(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("events.txt")).unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name).canonicalize().unwrap()
    }
}

/// `--on-event CMD` runs CMD with mdadm --program's events: a `ctl fail` gives
/// `Fail EXPORT MEMBER`; a spare added gives RebuildStarted, then SpareActive and
/// RebuildFinished. `ctl wait` blocks until the rebuild has ended (`--timeout` gives up
/// with exit 1 while it runs).
#[test]
fn on_event_and_ctl_wait_follow_a_failure_and_a_rebuild() {
    let rig = EventRig::start();
    let ctl = |args: &[&str]| rig.ctl(args);
    let m1 = rig.path("m1");
    assert_ok(&ctl(&["fail", "m1"]));
    let read_events = || rig.events();
    wait_until("the Fail event", Duration::from_secs(10), || read_events().contains("Fail"));
    assert!(read_events().lines().any(|l| l == format!("Fail data {}", m1.display())), "{}", read_events());
    assert_ok(&ctl(&["remove", "m1"]));
    // 16 MiB of data (a rebuild copies only what its sources hold) at 4 MB/s: the rebuild
    // runs for about 4 s.
    require_tool("qemu-io", "qemu-utils");
    run_ok(Command::new("qemu-io").args(["-f", "raw", &rig.served.uri("data"), "-c", "write -P 0x6b 0 16M"]));
    assert_ok(&ctl(&["rebuild-speed", "1M", "4M"]));
    assert_ok(&ctl(&["add", "spare"]));
    let whole =
        |s: &Value| s["work"].is_null() && s["roles"].as_array().unwrap().iter().all(|r| r["state"] == "in_sync");
    let status_now =
        || -> Value { serde_json::from_str::<Value>(&assert_ok(&ctl(&["status", "--json"]))).unwrap()[0].clone() };
    // Right after `add`, `wait --timeout 0` says busy (exit 1) unless the rebuild is already
    // over; it must never say idle while the array is not whole.
    let busy = ctl(&["wait", "--timeout", "0"]);
    match busy.status.code() {
        Some(1) => {}
        Some(0) => assert!(whole(&status_now()), "wait said idle before the rebuild: {:#}", status_now()),
        other => panic!("wait --timeout 0: {other:?} {busy:?}"),
    }
    assert_ok(&ctl(&["wait"]));
    let s = status_now();
    assert!(whole(&s), "wait returned before the rebuild ended: {s:#}");
    let spare = rig.path("spare");
    // The monitor may tell the end of the work and the role in sync one poll apart.
    let wants = [
        format!("RebuildStarted data {}", spare.display()),
        format!("SpareActive data {}", spare.display()),
        format!("RebuildFinished data {}", spare.display()),
    ];
    let all_told = || wants.iter().all(|want| read_events().lines().any(|l| l == want));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_told() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = read_events();
    for want in &wants {
        assert!(text.lines().any(|l| l == want), "missing {want:?} in:\n{text}");
    }
    rig.served.stop();
}

/// `detail --test` exits as `mdadm --detail --test`: 0 healthy, 1 degraded, 2 unusable,
/// 4 error.
#[test]
fn detail_test_exit_status_tells_the_health() {
    let dir = tempdir();
    let d = dir.path();
    create(d, "5", "16M", &["m0", "m1", "m2", "m3"]);
    std::fs::write(d.join("plain"), vec![0u8; 1 << 20]).unwrap();
    let code = |members: &[&str]| {
        let mut args = vec!["detail", "--test"];
        args.extend_from_slice(members);
        raidnbd(d, &args).status.code()
    };
    assert_eq!(code(&["m0", "m1", "m2", "m3"]), Some(0));
    assert_eq!(code(&["m0", "m1", "m3"]), Some(1));
    assert_eq!(code(&["m0", "m1"]), Some(2));
    assert_eq!(code(&["m0", "plain"]), Some(4));
    assert_eq!(code(&["m0", "nonexistent"]), Some(4));
}

/// `--log-format json` gives one JSON object per line; `-q` leaves out info lines.
#[test]
fn log_formats_and_levels() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let served = Served::start(d, "data", &["--log-format", "json"], &["m0", "m1"]);
    let log = served.stop();
    let lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() >= 3, "{log}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{line}");
    }
    let served = Served::start(d, "data", &["-q"], &["m0", "m1"]);
    let log = served.stop();
    assert!(!log.contains("INFO"), "-q leaves out info lines:\n{log}");
}

/// With JOURNAL_STREAM naming stderr (as systemd sets it), lines carry no timestamp of their
/// own (journald stamps them); a JOURNAL_STREAM inherited for another stream changes nothing.
#[test]
fn no_timestamps_when_stderr_is_the_journal() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let run = |journal_stream: &str| {
        let log_path = d.join(format!("journal-{}.log", journal_stream.replace(':', "-")));
        // The log file exists before the server starts, so its device and inode are known.
        std::fs::File::create(&log_path).unwrap();
        let meta = std::fs::metadata(&log_path).unwrap();
        let value = if journal_stream == "self" {
            format!("{}:{}", meta.dev(), meta.ino())
        } else {
            journal_stream.to_string()
        };
        let mut child = spawn_serve(d, free_port(), &log_path, ("JOURNAL_STREAM", value.as_ref()));
        wait_until("the listening line", Duration::from_secs(20), || {
            std::fs::read_to_string(&log_path).unwrap().contains("control socket")
        });
        signal(&child, libc::SIGTERM);
        assert_eq!(wait_exit(&mut child, Duration::from_secs(30)).code(), Some(0));
        std::fs::read_to_string(&log_path).unwrap()
    };
    let journal = run("self");
    assert!(
        journal.lines().all(|l| l.trim_start().starts_with("INFO") || l.trim_start().starts_with("WARN")),
        "no timestamps:\n{journal}"
    );
    let other = run("1:2");
    assert!(other.lines().all(|l| l.starts_with("20")), "timestamps when JOURNAL_STREAM is another stream:\n{other}");
}

/// Flags override the config file: `--listen` wins over the file's `listen`, and an export's
/// keys come from the file.
#[test]
fn command_line_flags_override_the_config_file() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let file_port = free_port();
    let config = d.join("raidnbd.toml");
    let mut f = std::fs::File::create(&config).unwrap();
    writeln!(
        f,
        "listen = \"127.0.0.1:{file_port}\"\nread_only = true\n[[export]]\nname = \"data\"\nmembers = [\"{0}/m0\", \"{0}/m1\"]",
        d.display()
    )
    .unwrap();
    drop(f);
    let served = Served::run(d, |listen| strings(&["serve", "--config", config.to_str().unwrap(), "--listen", listen]));
    assert!(std::net::TcpStream::connect(("127.0.0.1", file_port)).is_err(), "the file's listen is overridden");
    let out = Command::new("nbdinfo").args(["--is", "read-only", &served.uri("data")]).output().unwrap();
    assert!(out.status.success(), "read_only from the file applies");
    served.stop();
    for flag in ["--idle-timeout", "--handshake-timeout"] {
        let out = raidnbd(d, &["serve", flag, "0", "--config", config.to_str().unwrap()]);
        assert_user_error(&out, "at least 100ms");
    }
}

/// Completions and man pages come from the CLI definition.
#[test]
fn completions_and_man_pages_are_generated() {
    let dir = tempdir();
    let d = dir.path();
    let bash = assert_ok(&raidnbd(d, &["completions", "bash"]));
    assert!(
        bash.contains("_raidnbd") && bash.contains("--require-all") && bash.contains("quickstart"),
        "bash completion"
    );
    let zsh = assert_ok(&raidnbd(d, &["completions", "zsh"]));
    assert!(zsh.contains("#compdef raidnbd"), "zsh completion");
    assert_ok(&raidnbd(d, &["man", "--out-dir", "man"]));
    let serve = std::fs::read_to_string(d.join("man/raidnbd-serve.1")).expect("raidnbd-serve.1");
    assert!(serve.contains(".TH") && serve.contains("require\\-all"), "{serve}");
    for page in ["raidnbd.1", "raidnbd-create.1", "raidnbd-ctl.1", "raidnbd-detail.1"] {
        assert!(d.join("man").join(page).exists(), "{page}");
    }
}

/// Every unit in deploy/systemd passes `systemd-analyze verify` (with raidnbd at the path
/// of the binary under test, as verify checks that ExecStart= exists).
#[test]
fn systemd_units_verify() {
    require_tool("systemd-analyze", "systemd");
    let dir = tempdir();
    let d = dir.path();
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd");
    let mut names: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap().replace("/usr/local/bin/raidnbd", BIN);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::write(d.join(&name), text).unwrap();
        // A template is verified as an instance (systemd finds the template beside it).
        names.push(d.join(name.replace("@.", "@nbd0.")));
    }
    assert!(names.len() >= 3, "service, socket and attach units: {names:?}");
    let out = Command::new("systemd-analyze").arg("verify").arg("--man=no").args(&names).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify: {stderr}");
}

/// `ctl wait` returns for a read-only array, which runs no background work even when its
/// superblocks say a resync is due (it used to wait forever).
#[test]
fn ctl_wait_returns_for_a_read_only_array() {
    let dir = tempdir();
    let d = dir.path();
    create(d, "1", "32M", &["m0", "m1"]);
    let mut served = Served::start(d, "data", &[], &["m0", "m1"]);
    run_ok(Command::new("qemu-io").args(["-f", "raw", &served.uri("data"), "-c", "write -P 0x11 0 1M"]));
    served.child.kill().unwrap(); // dirty: a resync is due
    served.child.wait().unwrap();
    drop(served);
    assert_eq!(examine_state(d, "m0"), "active");
    let socket = d.join("c.sock");
    let served = Served::start(d, "data", &["--read-only", "--control", socket.to_str().unwrap()], &["m0", "m1"]);
    let out = raidnbd(d, &["ctl", "--socket", socket.to_str().unwrap(), "wait", "--timeout", "10"]);
    assert_eq!(out.status.code(), Some(0), "wait on a read-only array: {out:?}");
    served.stop();
}

/// With a hot spare the failed role is given to the spare at once, between two polls of the
/// monitor; `Fail` is still reported (the engine counts failures), with the failed member.
#[test]
fn on_event_reports_a_fail_even_when_a_hot_spare_takes_over() {
    let rig = EventRig::start();
    for args in [&["add", "spare"][..], &["fail", "m1"], &["wait"]] {
        assert_ok(&rig.ctl(args));
    }
    let m1 = rig.path("m1");
    let read_events = || rig.events();
    wait_until("the Fail event", Duration::from_secs(10), || read_events().contains("Fail"));
    assert!(read_events().lines().any(|l| l == format!("Fail data {}", m1.display())), "{}", read_events());
    rig.served.stop();
}
