//! Network RAID: members that are NBD exports served by real peers — nbdkit (memory and file
//! plugins, over Unix sockets and TCP) and qemu-nbd — created, served, examined and checked
//! by URI. A member server SIGKILLed during fio with verify fails that member within the
//! member timeout (no I/O error, no wrong byte); restarted with the same data it is re-added
//! from the write-intent bitmap (the copied bytes counted); one down at start counts as
//! absent and is re-added when it returns. Servers that restart within the timeout are
//! reconnected; ones that stay away, come back as another disk or lose unflushed writes fail
//! the member.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::util::*;

/// Peer servers, killed on drop.
pub(crate) struct Peers {
    pub(crate) children: Vec<Child>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Five 48 MiB members: nbdkit memory ×2 (Unix), nbdkit file ×2 (TCP), qemu-nbd of a raw
/// file (Unix). Returns the peers, the member URIs, and the nbdkit file members' files and
/// ports (children 2 and 3), to restart them with the same data.
fn start_peers(d: &Path) -> (Peers, Vec<String>, Vec<(PathBuf, u16)>) {
    require_tool("nbdkit", "nbdkit");
    require_tool("qemu-nbd", "qemu-utils");
    let mut children = Vec::new();
    let mut uris = Vec::new();
    for i in 0..2 {
        let socket = d.join(format!("mem{i}.sock"));
        children.push(nbdkit_memory(&socket, "48M"));
        uris.push(format!("nbd+unix:///?socket={}", socket.display()));
    }
    let mut files = Vec::new();
    for i in 0..2 {
        let (file, port) = new_file(d, &format!("file-member{i}.img"), 48 << 20);
        children.push(nbdkit_file(&file, port));
        uris.push(format!("nbd://127.0.0.1:{port}/"));
        files.push((file, port));
    }
    let image = d.join("qemu-member.img");
    std::fs::File::create(&image).unwrap().set_len(48 << 20).unwrap();
    let socket: PathBuf = d.join("qemu.sock");
    children.push(
        Command::new("qemu-nbd")
            .args(["--persistent", "-f", "raw", "-x", "q", "-k"])
            .arg(&socket)
            .arg(&image)
            .spawn()
            .expect("qemu-nbd"),
    );
    wait_for_socket(&socket);
    uris.push(format!("nbd+unix:///q?socket={}", socket.display()));
    (Peers { children }, uris, files)
}

/// fio over the array (random 4 KiB to 1 MiB writes, QD16, crc32c in every block) at 40 MiB,
/// 16 MiB; `verify_only`: check what an earlier run wrote. `rate`: limit the write phase,
/// so a member server can be killed in the middle of it.
fn fio_verify(d: &Path, uri: &str, verify_only: bool, rate: Option<&str>) -> Command {
    require_tool("fio", "fio");
    let mut fio = Command::new("fio");
    fio.current_dir(d).args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bsrange=4k-1m",
        "--iodepth=16",
        "--offset=40m",
        "--size=16m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--randrepeat=1",
        "--verify_state_save=0",
    ]);
    if verify_only {
        fio.arg("--verify_only");
    }
    if let Some(rate) = rate {
        fio.arg(format!("--rate={rate}"));
    }
    fio
}

/// `ctl status --json` of the only export.
fn ctl_status(d: &Path, control: &Path) -> serde_json::Value {
    let text = assert_ok(&raidnbd(d, &["ctl", "--socket", control.to_str().unwrap(), "status", "--json"]));
    serde_json::from_str::<serde_json::Value>(&text).unwrap()[0].clone()
}

/// Polls `ctl status` until `done` holds, for at most `limit`; returns that status.
fn wait_status(
    d: &Path,
    control: &Path,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let status = ctl_status(d, control);
        if done(&status) {
            return status;
        }
        if Instant::now() >= deadline {
            // The server's log says why (the newest serve-PORT.log Served writes).
            let newest = std::fs::read_dir(d)
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("serve-"))
                .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
            let log = newest.map(|e| std::fs::read_to_string(e.path()).unwrap_or_default()).unwrap_or_default();
            panic!("not reached within {limit:?}: {status:#}\nserver log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls until a recovery finished and every role is in sync again (within 60 s).
fn wait_re_added(d: &Path, control: &Path) -> serde_json::Value {
    wait_status(d, control, Duration::from_secs(60), |s| {
        s["last_recovery"].is_object() && s["roles"].as_array().unwrap().iter().all(|r| r["state"] == "in_sync")
    })
}

fn role_state(status: &serde_json::Value, member: &str) -> String {
    let roles = status["roles"].as_array().unwrap();
    roles.iter().find(|r| r["member"] == member).map_or("none".into(), |r| r["state"].as_str().unwrap().to_string())
}

const MEMBER_TIMEOUT_SECS: u64 = 3;
const BITMAP_CHUNK_BYTES: u64 = 1 << 20;

fn remote_array(level: &str) {
    require_tool("nbdcopy", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let (mut peers, uris, files) = start_peers(d);
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    let mut create = vec!["create", "--level", level, "--chunk", "64K", "--bitmap", "internal", "--bitmap-chunk", "1M"];
    create.extend_from_slice(&members);
    assert_ok(&raidnbd(d, &create));

    let control = d.join("control.sock");
    let timeout = MEMBER_TIMEOUT_SECS.to_string();
    let extra = ["--member-timeout", &timeout, "--control", control.to_str().unwrap()];
    let served = Served::start(d, "net", &extra, &members);
    // The member client negotiates what each peer has: extended headers with qemu-nbd 8.2+
    // (qemu 10 here), structured replies with nbdkit (1.32, Debian 12's).
    let status = ctl_status(d, &control);
    let framing = |uri: &str| {
        let links = status["links"].as_array().unwrap();
        links.iter().find(|l| l["member"] == uri).map_or(serde_json::Value::Null, |l| l["framing"].clone())
    };
    let qemu = if crate::serve_clients::qemu_version() >= (8, 2) { "extended" } else { "structured" };
    assert_eq!(framing(members[4]), qemu, "{level}: the qemu-nbd member: {status:#}");
    assert_eq!(framing(members[0]), "structured", "{level}: an nbdkit member: {status:#}");
    let payload: Vec<u8> = (0..24u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 9) as u8).collect();
    std::fs::write(d.join("payload"), &payload).unwrap();
    run_ok(Command::new("nbdcopy").arg(d.join("payload")).arg(served.uri("net")).arg("--flush"));
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x3c 30M 1M", &served.uri("net")]));

    // fio with verify; a member server (nbdkit file over TCP) is SIGKILLed in its write phase:
    // no I/O error, no wrong byte, the member faulty within the member timeout.
    let victim = 2;
    let fio =
        fio_verify(d, &served.uri("net"), false, Some("6m")).stdout(std::process::Stdio::piped()).spawn().expect("fio");
    std::thread::sleep(Duration::from_millis(800));
    let _ = peers.children[victim].kill();
    let _ = peers.children[victim].wait();
    let killed = Instant::now();
    let limit = Duration::from_secs(MEMBER_TIMEOUT_SECS + 2);
    let status = wait_status(d, &control, limit, |s| role_state(s, members[victim]) == "faulty");
    assert!(killed.elapsed() <= limit, "faulty after {:?}", killed.elapsed());
    assert!(status["state"].as_str().unwrap().contains("degraded"), "{status:#}");
    let output = fio.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && report.contains("err= 0"), "fio verify across the kill: {report}");
    let links = status["links"].as_array().unwrap();
    let link = links.iter().find(|l| l["member"] == members[victim]).expect("the victim's link");
    assert_eq!(link["state"], "lost", "{status:#}");
    assert!(link["disconnects"].as_u64() >= Some(1), "{status:#}");

    // Restarted with the same file: re-added automatically; only dirty chunks are copied.
    let (file, port) = &files[victim - 2];
    peers.children[victim] = nbdkit_file(file, *port);
    let status = wait_re_added(d, &control);
    let tally = &status["last_recovery"];
    let (dirty, copied) = (tally["dirty_chunks"].as_u64().unwrap(), tally["copied_bytes"].as_u64().unwrap());
    eprintln!("{level}: re-add copied {copied} bytes for {dirty} dirty bitmap chunks of {BITMAP_CHUNK_BYTES}");
    assert_eq!(tally["from_bitmap"], true, "{status:#}");
    assert!(dirty >= 1 && copied > 0 && copied <= dirty * BITMAP_CHUNK_BYTES, "{status:#}");
    assert!(copied < 24 << 20, "re-add copied most of a 48 MiB member: {status:#}");
    let log = served.log_text();
    assert!(log.contains("member is back: re-added"), "{log}");
    // The data, with the re-added member serving its share of reads.
    let fio = run_ok(&mut fio_verify(d, &served.uri("net"), true, None));
    assert!(fio.contains("err= 0"), "fio verify after the re-add: {fio}");
    run_ok(Command::new("nbdcopy").arg(served.uri("net")).arg(d.join("back")));
    let back = std::fs::read(d.join("back")).unwrap();
    assert!(back[..payload.len()] == payload[..], "{level}: the data read back over remote members");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x3c 30M 1M", &served.uri("net")]));
    let ctl =
        |args: &[&str]| assert_ok(&raidnbd(d, &[&["ctl", "--socket", control.to_str().unwrap()][..], args].concat()));
    ctl(&["check"]);
    ctl(&["wait", "--timeout", "120"]);
    let status = ctl_status(d, &control);
    assert_eq!(status["last_check"]["mismatch_cnt"], 0, "{status:#}");
    served.stop();
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!((detail["clean"].clone(), detail["degraded"].clone()), (true.into(), false.into()), "{detail}");

    // Assembled again by superblock from the URIs in another order, with one member server
    // down: it is absent, the array starts degraded, and it is re-added when its server
    // comes back.
    let _ = peers.children[victim].kill();
    let _ = peers.children[victim].wait();
    let reversed: Vec<&str> = members.iter().rev().copied().collect();
    let served = Served::start(d, "net", &extra, &reversed);
    let log = served.log_text();
    assert!(log.contains("absent") && log.contains("DEGRADED"), "{log}");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x77 31M 1M", &served.uri("net")]));
    peers.children[victim] = nbdkit_file(file, *port);
    wait_status(d, &control, Duration::from_secs(60), |s| {
        s["roles"].as_array().unwrap().iter().filter(|r| r["state"] == "in_sync").count() == members.len()
    });
    run_ok(Command::new("nbdcopy").arg(served.uri("net")).arg(d.join("back2")));
    let back = std::fs::read(d.join("back2")).unwrap();
    assert!(back[..payload.len()] == payload[..], "{level}: right bytes after the absent member's return");
    run_ok(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x3c 30M 1M",
        "-c",
        "read -P 0x77 31M 1M",
        &served.uri("net"),
    ]));
    served.stop();
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "{check}");

    // md interop: a remote member's export copied to a file examines the same, and mdadm
    // reads the same superblock from the copy.
    require_tool("mdadm", "mdadm");
    for (i, uri) in [(0, members[0]), (4, members[4])] {
        let copy = d.join(format!("copy{i}.img"));
        run_ok(Command::new("nbdcopy").arg(uri).arg(&copy));
        let examine = |m: &str| {
            let text = assert_ok(&raidnbd(d, &["examine", "--json", m]));
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v[0].as_object_mut().unwrap().remove("path");
            v
        };
        let remote = examine(uri);
        assert_eq!(remote, examine(copy.to_str().unwrap()), "{level}: member {i}");
        let mdadm = run_ok(Command::new("mdadm").arg("--examine").arg(&copy));
        for (field, want) in [
            ("Array UUID", remote[0]["array_uuid"].as_str().unwrap().to_string()),
            ("Events", remote[0]["events"].to_string()),
            ("Device Role", remote[0]["device_role"].as_str().unwrap().to_string()),
            ("Raid Level", remote[0]["raid_level"].as_str().unwrap().to_string()),
            ("Internal Bitmap", "8 sectors from superblock".to_string()),
            (
                "Bad Block Log",
                format!(
                    "{} entries available at offset {} sectors",
                    remote[0]["bad_block_log"]["entries"], remote[0]["bad_block_log"]["offset_sectors"]
                ),
            ),
        ] {
            assert!(
                mdadm.lines().any(|l| l.trim_start().starts_with(field) && l.trim_end().ends_with(&want)),
                "{level}: mdadm --examine {field} should be {want}: {mdadm}"
            );
        }
        assert!(mdadm.contains("- correct"), "{mdadm}");
    }
}

#[test]
fn raid5_over_nbdkit_and_qemu_nbd_exports() {
    remote_array("5");
}

#[test]
fn raid10_over_nbdkit_and_qemu_nbd_exports() {
    remote_array("10");
}

/// `nbdkit memory SIZE` on the Unix socket `socket`.
fn nbdkit_memory(socket: &Path, size: &str) -> Child {
    let child = Command::new("nbdkit").args(["-f", "-U"]).arg(socket).args(["memory", size]).spawn().expect("nbdkit");
    wait_for_socket(socket);
    child
}

/// `nbdkit file FILE` on 127.0.0.1:`port`.
pub(crate) fn nbdkit_file(file: &Path, port: u16) -> Child {
    nbdkit_file_with(file, port, &[], &[])
}

/// `nbdkit FILTERS... file FILE PARAMS...` on 127.0.0.1:`port`.
fn nbdkit_file_with(file: &Path, port: u16, filters: &[&str], params: &[&str]) -> Child {
    let child = Command::new("nbdkit")
        .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string()])
        .args(filters)
        .arg("file")
        .arg(file)
        .args(params)
        .spawn()
        .expect("nbdkit file");
    wait_for_port(port);
    child
}

/// A new sparse file of `bytes` in `d`, and a free port to serve it on.
pub(crate) fn new_file(d: &Path, name: &str, bytes: u64) -> (PathBuf, u16) {
    let file = d.join(name);
    std::fs::File::create(&file).unwrap().set_len(bytes).unwrap();
    (file, free_port())
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// RAID1 of a local file and an nbdkit file export; python3-libnbd writes through it.
fn python(uri: &str, code: &str) {
    require_libnbd_python();
    let script = format!("import nbd\nh = nbd.NBD()\nh.connect_uri({uri:?})\n{code}\nh.shutdown()\n");
    run_ok(Command::new(PYTHON).args(["-c", &script]));
}

/// A member server that restarts (same file, same port) or stalls for less than the member
/// timeout: reconnected (both of its connections), nothing fails, nothing resyncs.
#[test]
fn a_member_server_that_restarts_within_the_member_timeout_is_reconnected() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    let (remote_file, port) = new_file(d, "remote.img", 32 << 20);
    let mut server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    // Two connections (nbdkit file offers CAN_MULTI_CONN): both are replaced together.
    let uri = format!("nbd://127.0.0.1:{port}/?connections=2");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "local.img", &uri]));
    let metrics_port = free_port().to_string();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let served = Served::start(d, "m", &["--member-timeout", "10", "--metrics", &metrics], &["local.img", &uri]);
    let array = served.uri("m");
    python(&array, "h.pwrite(b'\\x21' * (1 << 20), 0)\nh.flush()");
    // The member's server dies and comes back (same file, same port) within the timeout.
    let _ = server.children[0].kill();
    let _ = server.children[0].wait();
    std::thread::sleep(Duration::from_millis(500));
    server.children[0] = nbdkit_file(&remote_file, port);
    python(
        &array,
        "h.pwrite(b'\\x22' * (1 << 20), 1 << 20)\nh.flush()\nassert h.pread(2 << 20, 0) == b'\\x21' * (1 << 20) + b'\\x22' * (1 << 20)",
    );
    // A stall shorter than the timeout (SIGSTOP for 1 s) fails nothing either.
    signal(&server.children[0], libc::SIGSTOP);
    let resume = server.children[0].id() as i32;
    let waker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: kill(2) on the child's pid.
        unsafe { libc::kill(resume, libc::SIGCONT) };
    });
    python(&array, "h.pwrite(b'\\x23' * 65536, 3 << 20)\nh.flush()");
    waker.join().unwrap();
    // The reconnects are counted in the metrics.
    let text = scrape_metrics(&metrics);
    let reconnects = metric_value(&text, "raidnbd_member_link_reconnects_total", &uri);
    assert!(reconnects >= 1.0, "{text}");
    assert!(metric_value(&text, "raidnbd_member_link_disconnects_total", &uri) >= reconnects, "{text}");
    assert_eq!(metric_value(&text, "raidnbd_member_link_up", &uri), 1.0, "{text}");
    let log = served.stop();
    assert!(log.contains("reconnected"), "{log}");
    assert!(!log.contains("the member fails"), "{log}");
    assert!(!log.contains("re-added") && !log.contains("recovery starts"), "no resync: {log}");
    assert!(!log.contains("CAN_MULTI_CONN"), "two connections were used: {log}");
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "local.img", &uri]))).unwrap();
    assert_eq!((detail["clean"].clone(), detail["degraded"].clone()), (true.into(), false.into()), "{detail}");
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "local.img", &uri]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "both copies agree: {check}");
}

#[test]
fn a_member_server_that_stays_away_or_comes_back_different_fails_the_member() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    // 1. Stopped (SIGSTOP) for longer than --member-timeout 2: the member fails, writes go on.
    let (remote_file, port) = new_file(d, "remote.img", 32 << 20);
    let server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    let uri = format!("nbd://127.0.0.1:{port}/");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "a.img", &uri]));
    let control = d.join("control.sock");
    let served =
        Served::start(d, "m", &["--member-timeout", "2", "--control", control.to_str().unwrap()], &["a.img", &uri]);
    python(&served.uri("m"), "h.pwrite(b'\\x31' * 65536, 0)\nh.flush()");
    signal(&server.children[0], libc::SIGSTOP);
    let started = Instant::now();
    python(
        &served.uri("m"),
        "h.pwrite(b'\\x32' * 65536, 65536)\nh.flush()\nassert h.pread(131072, 0) == b'\\x31' * 65536 + b'\\x32' * 65536",
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(30), "failed after {waited:?}");
    let status = ctl_status(d, &control);
    assert_eq!(role_state(&status, &uri), "faulty", "{status:#}");
    let link = &status["links"][0];
    assert_eq!((link["member"].as_str(), link["state"].as_str()), (Some(uri.as_str()), Some("lost")), "{status:#}");
    assert!(link["timeouts"].as_u64() >= Some(1), "the stalled request timed out: {status:#}");
    let text = assert_ok(&raidnbd(d, &["ctl", "--socket", control.to_str().unwrap(), "status"]));
    assert!(text.contains(&format!("link {uri}: lost")), "{text}");
    let log = served.stop();
    assert!(log.contains("not back within") && log.contains("the member fails"), "{log}");
    signal(&server.children[0], libc::SIGCONT);
    drop(server);

    // 2. A server that comes back empty (nbdkit memory restarted) is another disk: the member
    //    fails instead of serving zeros.
    let socket = d.join("mem.sock");
    let mut server = Peers { children: vec![nbdkit_memory(&socket, "32M")] };
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "b.img", &uri]));
    let served = Served::start(d, "m", &["--member-timeout", "10"], &["b.img", &uri]);
    python(&served.uri("m"), "h.pwrite(b'\\x41' * 65536, 0)\nh.flush()");
    let _ = server.children[0].kill();
    let _ = server.children[0].wait();
    let _ = std::fs::remove_file(&socket);
    server.children[0] = nbdkit_memory(&socket, "32M");
    python(
        &served.uri("m"),
        "h.pwrite(b'\\x42' * 65536, 65536)\nh.flush()\nassert h.pread(131072, 0) == b'\\x41' * 65536 + b'\\x42' * 65536",
    );
    let log = served.stop();
    assert!(log.contains("came back with other contents"), "{log}");
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "b.img"]))).unwrap();
    assert_eq!(detail["degraded"], true, "{detail}");
    drop(server);

    // 3. Lost with writes it acknowledged but no FLUSH covered: a new connection cannot vouch
    //    for them, so the member fails at once (its server restarting with the same file).
    let (remote_file, port) = new_file(d, "remote3.img", 32 << 20);
    let mut server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    let uri = format!("nbd://127.0.0.1:{port}/");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "c.img", &uri]));
    let served = Served::start(d, "m", &["--member-timeout", "10"], &["c.img", &uri]);
    let restart = format!(
        "import subprocess, time\nh.pwrite(b'\\x51' * 65536, 0)\n\
         subprocess.run(['kill', '-KILL', '{pid}'])\ntime.sleep(0.5)\n",
        pid = server.children[0].id()
    );
    python(&served.uri("m"), &restart);
    let _ = server.children[0].wait();
    server.children[0] = nbdkit_file(&remote_file, port);
    python(
        &served.uri("m"),
        "h.pwrite(b'\x52' * 65536, 65536)
h.flush()
assert h.pread(65536, 0) == b'\x51' * 65536",
    );
    let log = served.stop();
    assert!(log.contains("not yet flushed") && log.contains("the member fails"), "{log}");
}

/// `ctl` and the config file take member URIs: a RAID1 of two files loses one (`ctl fail`,
/// `ctl remove`), an nbdkit memory export is added with `ctl add URI` and rebuilt; the array,
/// served again from a config file naming the URI, checks clean.
#[test]
fn ctl_add_and_the_config_file_take_member_uris() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    let socket = d.join("spare.sock");
    let _server = Peers { children: vec![nbdkit_memory(&socket, "48M")] };
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "48M", "m0", "m1"]));
    let control = d.join("control.sock");
    let control_arg = control.to_str().unwrap();
    let served = Served::start(d, "a", &["--control", control_arg], &["m0", "m1"]);
    python(&served.uri("a"), "h.pwrite(b'\\x61' * (4 << 20), 1 << 20)\nh.flush()");
    let ctl = |args: &[&str]| assert_ok(&raidnbd(d, &[&["ctl", "--socket", control_arg][..], args].concat()));
    let m1 = d.join("m1").canonicalize().unwrap();
    ctl(&["fail", m1.to_str().unwrap()]);
    ctl(&["remove", m1.to_str().unwrap()]);
    ctl(&["add", &uri]);
    ctl(&["wait", "--timeout", "120"]);
    let status: serde_json::Value = serde_json::from_str(&ctl(&["status", "--json"])).unwrap();
    let roles = status[0]["roles"].as_array().unwrap().clone();
    assert!(roles.iter().all(|r| r["state"] == "in_sync"), "{status:#}");
    assert!(roles.iter().any(|r| r["member"] == uri.as_str()), "the URI member has a role: {status:#}");
    served.stop();
    let config = format!("[[export]]\nname = \"a\"\nmembers = [\"m0\", {uri:?}]\n");
    std::fs::write(d.join("raidnbd.toml"), config).unwrap();
    let served =
        Served::run(d, |listen| ["serve", "--listen", listen, "--config", "raidnbd.toml"].map(String::from).to_vec());
    python(&served.uri("a"), "assert h.pread(4 << 20, 1 << 20) == b'\\x61' * (4 << 20)");
    served.stop();
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "m0", &uri]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "the rebuilt remote copy matches: {check}");
}

fn scrape_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics port");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the metrics");
    raw
}

/// The value of the sample `name` whose labels name `member`.
fn metric_value(text: &str, name: &str, member: &str) -> f64 {
    let label = format!("member=\"{member}\"");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .unwrap_or_else(|| panic!("no {name} for {member}: {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// RAID1 of a local file and a distant one (reads delayed 5 ms): marked write-mostly, the
/// distant copy is never read; unmarked, reads still go to the local copy by measured
/// latency (but for rare probes). Both copies get every write.
#[test]
fn mirror_reads_avoid_a_write_mostly_or_distant_copy() {
    require_tool("nbdkit", "nbdkit");
    for write_mostly in [true, false] {
        let dir = tempdir();
        let d = dir.path();
        let (remote_file, port) = new_file(d, "remote.img", 32 << 20);
        // A distant member: every read 5 ms late (nbdkit's delay filter).
        let _server =
            Peers { children: vec![nbdkit_file_with(&remote_file, port, &["--filter=delay"], &["rdelay=5ms"])] };
        let uri = format!("nbd://127.0.0.1:{port}/");
        let mut create = vec!["create", "--level", "1", "--size", "32M"];
        if write_mostly {
            create.extend(["--write-mostly", &uri]);
        }
        create.extend(["local.img", &uri]);
        assert_ok(&raidnbd(d, &create));
        let examine: serde_json::Value =
            serde_json::from_str(&assert_ok(&raidnbd(d, &["examine", "--json", &uri]))).unwrap();
        assert_eq!(examine[0]["write_mostly"], write_mostly, "{examine}");
        let metrics = format!("127.0.0.1:{}", free_port());
        let control = d.join("control.sock");
        let served = Served::start(
            d,
            "m",
            &["--metrics", &metrics, "--control", control.to_str().unwrap()],
            &["local.img", &uri],
        );
        python(
            &served.uri("m"),
            "import os\ndata = os.urandom(8 << 20)\nh.pwrite(data, 0)\nh.flush()\n\
             for i in range(400):\n    off = (i * 1048573 * 512) % ((8 << 20) - 65536) // 512 * 512\n    \
             assert h.pread(65536, off) == data[off:off + 65536]",
        );
        let status = ctl_status(d, &control);
        assert_eq!(status["roles"][1]["write_mostly"], write_mostly, "{status:#}");
        let text = scrape_metrics(&metrics);
        let remote_reads = metric_value(&text, "raidnbd_member_read_bytes_total", &uri);
        let local = d.join("local.img").canonicalize().unwrap();
        let local_reads = metric_value(&text, "raidnbd_member_read_bytes_total", local.to_str().unwrap());
        let written = metric_value(&text, "raidnbd_member_written_bytes_total", &uri);
        assert!(written >= (8 << 20) as f64, "the distant copy is written: {text}");
        if write_mostly {
            // The only reads of the write-mostly copy: its superblock area at start.
            assert!(remote_reads <= 8192.0, "write-mostly copy read {remote_reads} bytes");
        } else {
            assert!(remote_reads <= local_reads / 20.0, "distant copy read {remote_reads} vs local {local_reads}");
        }
        assert!(local_reads >= (400 * 65536) as f64 * 0.9, "{local_reads}");
        served.stop();
        let check: serde_json::Value =
            serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "local.img", &uri]))).unwrap();
        assert_eq!(check["mismatch_cnt"], 0, "{check}");
    }
}

/// Members over TLS (`nbds://`, `nbds+unix://`): nbdkit requiring TLS with X.509 and a
/// verified client certificate, nbdkit with PSK on a Unix socket, qemu-nbd with
/// tls-creds-x509, and another raidnbd serving one export over TLS. A RAID5 of them is
/// created, served and checked; wrong credentials are refused with a TLS error.
#[test]
fn members_over_tls() {
    require_tool("nbdkit", "nbdkit");
    require_tool("qemu-nbd", "qemu-utils");
    require_tool("certtool", "gnutls-bin");
    require_tool("psktool", "gnutls-bin");
    require_tool("nbdcopy", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    let creds = d.join("creds");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/nbd-server/tests/make-pki.sh");
    run_ok(Command::new(script).arg(&creds));
    let pki = creds.join("pki");
    let psk = creds.join("keys.psk");
    let mut peers = Peers { children: Vec::new() };
    let mut uris = Vec::new();
    // nbdkit, X.509, client certificate verified.
    let port = free_port();
    peers.children.push(
        Command::new("nbdkit")
            .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "--tls=require", "--tls-verify-peer"])
            .arg(format!("--tls-certificates={}", pki.display()))
            .args(["memory", "48M"])
            .spawn()
            .expect("nbdkit"),
    );
    wait_for_port(port);
    uris.push(format!("nbds://localhost:{port}/?tls-certificates={}", pki.display()));
    // nbdkit, PSK, Unix socket.
    let socket = d.join("psk.sock");
    peers.children.push(
        Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&socket)
            .args(["--tls=require"])
            .arg(format!("--tls-psk={}", psk.display()))
            .args(["memory", "48M"])
            .spawn()
            .expect("nbdkit"),
    );
    wait_for_socket(&socket);
    uris.push(format!("nbds+unix:///?socket={}&tls-psk-file={}&tls-username=alice", socket.display(), psk.display()));
    // qemu-nbd, X.509.
    let (image, port) = new_file(d, "q.img", 48 << 20);
    peers.children.push(
        Command::new("qemu-nbd")
            .args(["--persistent", "-f", "raw", "-x", "q", "-b", "127.0.0.1", "-p", &port.to_string()])
            .arg("--object")
            .arg(format!("tls-creds-x509,id=tls0,dir={},endpoint=server", pki.display()))
            .args(["--tls-creds", "tls0"])
            .arg(&image)
            .spawn()
            .expect("qemu-nbd"),
    );
    wait_for_port(port);
    uris.push(format!("nbds://localhost:{port}/q?tls-certificates={}", pki.display()));
    // Another raidnbd, serving a RAID1 of two files over TLS only.
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "48M", "inner0", "inner1"]));
    let pki_arg = pki.to_str().unwrap();
    let inner = Served::start(d, "inner", &["--tls", "require", "--tls-certificates", pki_arg], &["inner0", "inner1"]);
    uris.push(format!("nbds://localhost:{}/inner?tls-certificates={}", inner.port, pki.display()));

    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    let mut create = vec!["create", "--level", "5", "--chunk", "64K"];
    create.extend_from_slice(&members);
    assert_ok(&raidnbd(d, &create));
    let served = Served::start(d, "tls", &[], &members);
    let payload: Vec<u8> = (0..16u32 << 20).map(|i| (i.wrapping_mul(2246822519) >> 11) as u8).collect();
    std::fs::write(d.join("payload"), &payload).unwrap();
    run_ok(Command::new("nbdcopy").arg(d.join("payload")).arg(served.uri("tls")).arg("--flush"));
    run_ok(Command::new("nbdcopy").arg(served.uri("tls")).arg(d.join("back")));
    assert!(std::fs::read(d.join("back")).unwrap()[..payload.len()] == payload[..], "bytes over TLS members");
    let log = served.stop();
    // Every member connection says how its TLS runs: in the kernel where the probe found
    // kernel TLS (the X.509 members on TCP; PSK runs in OpenSSL), else in user space.
    let connected: Vec<&str> = log.lines().filter(|l| l.contains("NBD member connected")).collect();
    assert!(connected.len() >= 4, "{log}");
    let (kernel, user) = (r#"tls="kernel""#, r#"tls="user space""#);
    assert!(connected.iter().all(|l| l.contains(kernel) || l.contains(user)), "{log}");
    if log.contains("kernel TLS unavailable") {
        assert!(!log.contains(kernel), "{log}");
    }
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "{check}");
    let examine = assert_ok(&raidnbd(d, &["examine", members[1]]));
    assert!(examine.contains("raid5"), "{examine}");

    // Wrong credentials: a wrong PSK, a CA that did not sign the server, no credentials.
    let wrong = creds.join("wrong.psk");
    let bad = [
        format!("nbds+unix:///?socket={}&tls-psk-file={}&tls-username=alice", socket.display(), wrong.display()),
        format!("nbds://localhost:{}/inner?tls-certificates={}", inner.port, creds.join("foreign-ca").display()),
        format!("nbd://localhost:{}/inner", inner.port),
    ];
    for uri in &bad {
        let out = raidnbd(d, &["examine", uri]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{uri} must be refused: {text}");
        assert!(text.contains("TLS") || text.contains("refused"), "{uri}: {text}");
    }
    inner.stop();
}

/// The `.away` files in the state directory `Served` gives raidnbd.
fn away_files(d: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(d.join("state"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension() == Some("away".as_ref())).collect()
        })
        .unwrap_or_default()
}

/// A RAID5 created with the defaults (partial parity log: md allows no bitmap beside it)
/// over three nbdkit file exports. A member server is killed under fio writes and started
/// again with the same file: the member is re-added by itself, copying only the chunks
/// written while it was away (the away record), and `check` finds 0 mismatches. Then the
/// same with raidnbd stopped and started again while the member is away: the record is
/// saved in the state directory and resumed.
#[test]
fn a_raid5_with_a_parity_log_takes_a_returning_member_back_copying_only_what_was_written() {
    require_tool("nbdkit", "nbdkit");
    require_tool("nbdcopy", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let mut peers = Peers { children: Vec::new() };
    let mut files = Vec::new();
    let mut uris = Vec::new();
    for i in 0..3 {
        let (file, port) = new_file(d, &format!("member{i}.img"), 48 << 20);
        peers.children.push(nbdkit_file(&file, port));
        uris.push(format!("nbd://127.0.0.1:{port}/"));
        files.push((file, port));
    }
    let members: Vec<&str> = uris.iter().map(String::as_str).collect();
    assert_ok(&raidnbd(d, &[&["create", "--level", "5", "--chunk", "64K"][..], &members].concat()));
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(detail["consistency_policy"], "ppl", "{detail}");

    let control = d.join("control.sock");
    let timeout = MEMBER_TIMEOUT_SECS.to_string();
    let extra = ["--member-timeout", &timeout, "--control", control.to_str().unwrap()];
    let served = Served::start(d, "net", &extra, &members);
    let payload: Vec<u8> = (0..24u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 9) as u8).collect();
    std::fs::write(d.join("payload"), &payload).unwrap();
    run_ok(Command::new("nbdcopy").arg(d.join("payload")).arg(served.uri("net")).arg("--flush"));
    assert!(ctl_status(d, &control)["away"].is_null(), "no record while whole");

    // Killed under fio's writes: faulty, fio sees no error, the record counts what is written.
    let victim = 1;
    let fio =
        fio_verify(d, &served.uri("net"), false, Some("6m")).stdout(std::process::Stdio::piped()).spawn().expect("fio");
    std::thread::sleep(Duration::from_millis(800));
    let _ = peers.children[victim].kill();
    let _ = peers.children[victim].wait();
    wait_status(d, &control, Duration::from_secs(MEMBER_TIMEOUT_SECS + 5), |s| {
        role_state(s, members[victim]) == "faulty"
    });
    let output = fio.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && report.contains("err= 0"), "fio verify across the kill: {report}");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x3c 30M 1M", &served.uri("net")]));
    let status = ctl_status(d, &control);
    let away = &status["away"];
    assert!(away["chunks_written"].as_u64() >= Some(16), "fio's 16 MiB and 1 MiB more: {status:#}");
    assert_eq!(away["persisted"], true, "{status:#}");
    assert_eq!(away_files(d).len(), 1, "the record is in the state directory");

    // Back with the same file: re-added, only what was written copied.
    let (file, port) = &files[victim];
    peers.children[victim] = nbdkit_file(file, *port);
    let status = wait_re_added(d, &control);
    let tally = &status["last_recovery"];
    let (dirty, copied) = (tally["dirty_chunks"].as_u64().unwrap(), tally["copied_bytes"].as_u64().unwrap());
    eprintln!("raid5 ppl: re-add copied {copied} bytes for {dirty} chunks written while away");
    assert_eq!(tally["from_bitmap"], true, "{status:#}");
    assert!(dirty >= 1 && copied > 0 && copied <= dirty * (64 << 10), "{status:#}");
    assert!(copied < 24 << 20, "re-add copied most of a 48 MiB member: {status:#}");
    assert!(status["away"].is_null(), "the record ended: {status:#}");
    assert!(away_files(d).is_empty(), "and its file is gone");
    assert!(served.log_text().contains("member is back: re-added"), "{}", served.log_text());
    let fio = run_ok(&mut fio_verify(d, &served.uri("net"), true, None));
    assert!(fio.contains("err= 0"), "fio verify after the re-add: {fio}");
    let ctl =
        |args: &[&str]| assert_ok(&raidnbd(d, &[&["ctl", "--socket", control.to_str().unwrap()][..], args].concat()));
    ctl(&["check"]);
    ctl(&["wait", "--timeout", "120"]);
    assert_eq!(ctl_status(d, &control)["last_check"]["mismatch_cnt"], 0);

    // Away across a restart of raidnbd: killed, written to, raidnbd stopped and started
    // again (the member still away), written to again, then the member returns.
    let _ = peers.children[victim].kill();
    let _ = peers.children[victim].wait();
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x77 31M 1M", &served.uri("net")]));
    wait_status(d, &control, Duration::from_secs(MEMBER_TIMEOUT_SECS + 5), |s| {
        role_state(s, members[victim]) == "faulty"
    });
    served.stop();
    assert_eq!(away_files(d).len(), 1, "the record outlives the process");
    let served = Served::start(d, "net", &extra, &members);
    let log = served.log_text();
    assert!(log.contains("away record: resumed"), "{log}");
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x78 33M 1M", &served.uri("net")]));
    peers.children[victim] = nbdkit_file(file, *port);
    let status = wait_re_added(d, &control);
    let tally = &status["last_recovery"];
    let copied = tally["copied_bytes"].as_u64().unwrap();
    eprintln!("raid5 ppl, across a restart: re-add copied {copied} bytes");
    assert!(tally["from_bitmap"] == true && copied > 0 && copied <= 4 << 20, "two 1 MiB writes: {status:#}");
    run_ok(Command::new("nbdcopy").arg(served.uri("net")).arg(d.join("back")));
    let back = std::fs::read(d.join("back")).unwrap();
    assert!(back[..payload.len()] == payload[..], "the data before the failures");
    run_ok(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x3c 30M 1M",
        "-c",
        "read -P 0x77 31M 1M",
        "-c",
        "read -P 0x78 33M 1M",
        &served.uri("net"),
    ]));
    let fio = run_ok(&mut fio_verify(d, &served.uri("net"), true, None));
    assert!(fio.contains("err= 0"), "fio verify after the second re-add: {fio}");
    served.stop();
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "{check}");
    assert!(away_files(d).is_empty());
}

/// A member export that grew (its file extended, its server restarted on the way): the
/// reconnect takes it back as the same disk, and `ctl grow --size max` takes the room of the
/// local and the remote member alike; the new space is resynced and both copies agree.
#[test]
fn a_member_export_that_grew_is_reconnected_and_its_room_taken() {
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let d = dir.path();
    let (remote_file, port) = new_file(d, "remote.img", 32 << 20);
    let mut server = Peers { children: vec![nbdkit_file(&remote_file, port)] };
    let uri = format!("nbd://127.0.0.1:{port}/?connections=2");
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "32M", "local.img", &uri]));
    let control = d.join("control.sock");
    let served = Served::start(
        d,
        "m",
        &["--member-timeout", "10", "--control", control.to_str().unwrap()],
        &["local.img", &uri],
    );
    let array = served.uri("m");
    python(&array, "h.pwrite(b'\\x51' * (1 << 20), 0)\nh.flush()");
    let old_size = ctl_status(d, &control)["size_bytes"].as_u64().unwrap();
    // Both volumes grow; the remote one's server restarts on the way.
    for file in [d.join("local.img"), remote_file.clone()] {
        std::fs::OpenOptions::new().write(true).open(file).unwrap().set_len(64 << 20).unwrap();
    }
    let _ = server.children[0].kill();
    let _ = server.children[0].wait();
    server.children[0] = nbdkit_file(&remote_file, port);
    python(&array, "h.pwrite(b'\\x52' * 65536, 1 << 20)\nh.flush()");
    let status = ctl_status(d, &control);
    assert_eq!(role_state(&status, &uri), "in_sync", "a grown export is the same disk: {status:#}");
    let out = assert_ok(&raidnbd(d, &["ctl", "--socket", control.to_str().unwrap(), "grow", "--size", "max"]));
    assert!(out.contains("grew"), "{out}");
    let new_size = ctl_status(d, &control)["size_bytes"].as_u64().unwrap();
    assert!(new_size >= old_size + (31 << 20), "{old_size} -> {new_size}");
    // A new connection sees it and writes the new space.
    python(
        &array,
        &format!(
            "assert h.get_size() == {new_size}\nh.pwrite(b'\\x53' * 65536, {at})\nh.flush()\n\
             assert h.pread(65536, {at}) == b'\\x53' * 65536\nassert h.pread(65536, 0) == b'\\x51' * 65536",
            at = new_size - 65536
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while ctl_status(d, &control)["resync_pending"] == true {
        assert!(Instant::now() < deadline, "the resync of the new space did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = served.stop();
    assert!(log.contains("NBD member grew"), "{log}");
    assert!(!log.contains("the member fails"), "{log}");
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["check", "--json", "local.img", &uri]))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "both copies agree in the new space: {check}");
    let detail: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &["detail", "--json", "local.img", &uri]))).unwrap();
    assert_eq!(detail["array_size_bytes"], new_size, "{detail}");
}
