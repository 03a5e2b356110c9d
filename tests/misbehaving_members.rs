//! Members whose server misbehaves instead of dying (tests/hostile_server.rs): stalls at each
//! step (before the handshake, in option haggling, at requests and so after a reconnect,
//! mid-reply), drips bytes, closes after every accept or after one reply, and replies with
//! wrong cookies, wrong lengths, offsets past 2^64, oversized payloads, unknown reply types
//! and error codes, or valid chunks out of order. For each, on a RAID5 whose role 0 is the
//! hostile server: the process never panics and stays within bounded memory; reads of the
//! other members' chunks finish right and within the member timeout; every byte read from
//! the hostile member's chunks is right or the read fails; the member ends faulty with its
//! link saying why (or stays in sync where nothing was wrong with its data); a flood of
//! reconnects does not happen; SIGTERM stops the process within 20 s. And a member stalled
//! before `serve` starts: RAID5 and RAID1 come up degraded within two member timeouts and
//! take the member back when it answers again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::hostile_server::{HostileServer, Misbehaviour};
use crate::util::*;

const MEMBER_TIMEOUT: Duration = Duration::from_secs(2);
const MEMBER_BYTES: usize = 16 << 20;
const CHUNK_BYTES: u64 = 64 << 10;

/// A RAID5 (64K chunks) of the hostile server (role 0) and two member files, served, with
/// a pseudo-random pattern written over the whole array (kept in `expected`).
struct HostileArray {
    dir: tempfile::TempDir,
    hostile: HostileServer,
    served: Served,
    control: PathBuf,
    expected: PathBuf,
    size_bytes: u64,
}

fn member_file(d: &Path, name: &str) -> String {
    let path = d.join(name);
    std::fs::File::create(&path).unwrap().set_len(MEMBER_BYTES as u64).unwrap();
    path.to_string_lossy().into_owned()
}

impl HostileArray {
    fn new(level: &str, extra_create: &[&str]) -> Self {
        require_libnbd_python();
        require_tool("nbdcopy", "libnbd-bin");
        let dir = shm_tempdir();
        let d = dir.path();
        let hostile = HostileServer::start(MEMBER_BYTES);
        let members = [hostile.uri(), member_file(d, "m1.img"), member_file(d, "m2.img")];
        let mut create = vec!["create", "--level", level, "--chunk", "64K"];
        create.extend_from_slice(extra_create);
        create.extend(members.iter().map(String::as_str));
        assert_ok(&raidnbd(d, &create));
        let control = d.join("control.sock");
        let served = serve(d, &control, &members);
        let status = ctl_status(d, &control);
        let size_bytes = status["size_bytes"].as_u64().unwrap();
        let expected = d.join("expected");
        let pattern: Vec<u8> = (0..size_bytes).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(&expected, &pattern).unwrap();
        run_ok(Command::new("nbdcopy").arg(&expected).arg(served.uri("h")).arg("--flush"));
        Self { dir, hostile, served, control, expected, size_bytes }
    }

    /// Array byte ranges of whole chunks held by `role` (RAID5 left-symmetric, 3 members)
    /// or by the others.
    fn chunks(&self, on_role_0: bool, count: usize) -> Vec<(u64, u64)> {
        (0..self.size_bytes / CHUNK_BYTES)
            .filter(|&k| {
                let stripe = k / 2;
                let parity = 2 - stripe % 3;
                let role = (parity + 1 + k % 2) % 3;
                (role == 0) == on_role_0
            })
            .take(count)
            .map(|k| (k * CHUNK_BYTES, CHUNK_BYTES))
            .collect()
    }

    /// Reads `ranges` one after another with libnbd: (milliseconds, "right" / "wrong" /
    /// "error: ...") each.
    fn timed_reads(&self, ranges: &[(u64, u64)]) -> Vec<(f64, String)> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/timed_reads.py");
        let mut cmd = Command::new(PYTHON);
        cmd.arg(script).arg(self.served.uri("h")).arg(&self.expected);
        cmd.args(ranges.iter().map(|(o, l)| format!("{o}:{l}")));
        let out = output_within(&mut cmd, Duration::from_secs(120));
        assert!(out.status.success(), "timed_reads: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["ms"].as_f64().unwrap(), v["result"].as_str().unwrap().to_string())
            })
            .collect()
    }

    fn status(&self) -> serde_json::Value {
        ctl_status(self.dir.path(), &self.control)
    }

    /// The hostile member's role state and link, once `done` holds (within 30 s).
    fn wait_for(&self, what: &str, done: impl Fn(&str, &serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status();
            let (state, link) = hostile_state(&status, &self.hostile.uri());
            if done(&state, &link) {
                return status;
            }
            assert!(Instant::now() < deadline, "{what}: not reached: {status:#}\n{}", self.served.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's peak resident memory.
    fn peak_rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.served.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    /// SIGTERM; the process must be gone within 20 s, without a panic. Returns its log.
    fn stop_within_20s(mut self) -> String {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.served.child.id() as i32, libc::SIGTERM) };
        let sent = Instant::now();
        loop {
            if let Some(status) = self.served.child.try_wait().unwrap() {
                let log = self.served.log_text();
                assert!(!log.contains("panicked"), "a panic:\n{log}");
                assert!(status.code().is_some(), "killed by a signal? {status:?}\n{log}");
                return log;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(20),
                "still running 20 s after SIGTERM:\n{}",
                self.served.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn serve(d: &Path, control: &Path, members: &[String]) -> Served {
    let timeout = format!("{}s", MEMBER_TIMEOUT.as_secs());
    let extra = ["--member-timeout", &timeout, "--control", control.to_str().unwrap()];
    let members: Vec<&str> = members.iter().map(String::as_str).collect();
    Served::start(d, "h", &extra, &members)
}

fn ctl_status(d: &Path, control: &Path) -> serde_json::Value {
    let text = assert_ok(&raidnbd(d, &["ctl", "--socket", control.to_str().unwrap(), "status", "--json"]));
    serde_json::from_str::<serde_json::Value>(&text).unwrap()[0].clone()
}

/// Role 0's state and the hostile member's link.
fn hostile_state(status: &serde_json::Value, uri: &str) -> (String, serde_json::Value) {
    let roles = status["roles"].as_array().unwrap();
    let state = roles.iter().find(|r| r["role"] == 0).map_or("none".into(), |r| r["state"].as_str().unwrap().into());
    let link = status["links"].as_array().unwrap().iter().find(|l| l["member"] == uri).cloned().unwrap_or_default();
    (state, link)
}

/// What the hostile member must end as under a misbehaviour.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    /// Faulty, its link in this state, its last error of one of these kinds (the first is
    /// the misbehaviour's own, and its count must be above 0; a reconnect to a server that
    /// closes at once can also end in a timeout on a loaded machine, which is as true).
    Faulty(&'static str, &'static [&'static str]),
    /// Still in sync and connected: nothing was wrong with its data.
    Kept,
}

fn misbehave(mode: Misbehaviour, outcome: Outcome) {
    let array = HostileArray::new("5", &[]);
    let accepts_before = array.hostile.accepts();
    array.hostile.arm(mode);
    let armed = Instant::now();

    // The other members' chunks: right, each within the member timeout.
    let healthy = array.chunks(false, 24);
    for (i, (ms, result)) in array.timed_reads(&healthy).into_iter().enumerate() {
        assert_eq!(result, "right", "{mode:?}: healthy chunk {:?}", healthy[i]);
        assert!(
            ms < MEMBER_TIMEOUT.as_millis() as f64 + 500.0,
            "{mode:?}: healthy chunk {:?} took {ms} ms",
            healthy[i]
        );
    }
    // The hostile member's chunks: right (rebuilt from parity) or an error, never wrong.
    let on_hostile = array.chunks(true, 12);
    let results = array.timed_reads(&on_hostile);
    assert!(results.iter().all(|(_, r)| r == "right" || r.starts_with("error")), "{mode:?}: {results:?}");
    let right = results.iter().filter(|(_, r)| r == "right").count();
    assert_eq!(right, results.len(), "{mode:?}: the array has parity to rebuild them: {results:?}");

    let status = match outcome {
        Outcome::Faulty(link_state, error_kinds) => {
            let status =
                array.wait_for("the member faulty", |state, link| state == "faulty" && link["state"] != "connected");
            let (_, link) = hostile_state(&status, &array.hostile.uri());
            assert_eq!(link["state"], link_state, "{mode:?}: {status:#}");
            let last = link["last_error"]["kind"].as_str().unwrap_or_default();
            assert!(error_kinds.contains(&last), "{mode:?}: last error {last:?}: {status:#}");
            assert!(
                link["errors"][error_kinds[0]].as_u64() > Some(0),
                "{mode:?}: no {} errors: {status:#}",
                error_kinds[0]
            );
            assert!(armed.elapsed() < MEMBER_TIMEOUT * 8, "{mode:?}: faulty only after {:?}", armed.elapsed());
            status
        }
        Outcome::Kept => {
            let status = array.status();
            let (state, link) = hostile_state(&status, &array.hostile.uri());
            assert_eq!(
                (state.as_str(), link["state"].as_str()),
                ("in_sync", Some("connected")),
                "{mode:?}: {status:#}"
            );
            status
        }
    };
    // Whole-array read after it all: still every byte right.
    let all = array.timed_reads(&[(0, array.size_bytes)]);
    assert_eq!(all[0].1, "right", "{mode:?}: whole array");
    // No flood: the member timeout window and the re-add attempts every 2 s (backing off)
    // make a handful of connections, not thousands.
    let accepts = array.hostile.accepts() - accepts_before;
    let seconds = armed.elapsed().as_secs_f64();
    assert!(accepts as f64 <= 10.0 + 4.0 * seconds, "{mode:?}: {accepts} connections in {seconds:.1} s: {status:#}");
    let rss = array.peak_rss_bytes();
    assert!(rss < 768 << 20, "{mode:?}: peak RSS {rss} bytes");
    let log = array.stop_within_20s();
    assert!(!log.contains("panicked"), "{mode:?}: {log}");
}

#[test]
fn a_member_that_stalls_at_any_step_is_failed_within_the_timeout_and_never_hangs_the_array() {
    for mode in [
        Misbehaviour::StallRequests,
        Misbehaviour::StallBeforeHandshake,
        Misbehaviour::StallInOptions,
        Misbehaviour::StallMidReply,
        Misbehaviour::Drip,
    ] {
        misbehave(mode, Outcome::Faulty("lost", &["timeout"]));
    }
}

#[test]
fn a_member_that_closes_at_once_is_failed_without_a_flood_of_reconnects() {
    misbehave(Misbehaviour::CloseAfterAccept, Outcome::Faulty("lost", &["connection", "timeout"]));
    misbehave(Misbehaviour::CloseAfterFirstReply, Outcome::Faulty("lost", &["connection", "timeout"]));
}

#[test]
fn a_member_that_breaks_the_protocol_is_failed_and_never_serves_a_wrong_byte() {
    for mode in [
        Misbehaviour::WrongCookie,
        Misbehaviour::WrongLength,
        Misbehaviour::OverflowingOffset,
        Misbehaviour::OversizedPayload,
        Misbehaviour::UnknownReplyType,
    ] {
        misbehave(mode, Outcome::Faulty("misbehaved", &["protocol"]));
    }
    misbehave(Misbehaviour::UnknownErrorCode, Outcome::Faulty("failed", &["io"]));
    misbehave(Misbehaviour::ChunksOutOfOrder, Outcome::Kept);
}

/// A member whose server stalls before `serve` starts (accepts, then says nothing): RAID5
/// (partial parity log, no bitmap) and RAID1 come up degraded within two member timeouts,
/// serve right bytes, and take the member back when it answers again, copying only what was
/// written meanwhile (the away record, for arrays without a bitmap).
#[test]
fn a_member_stalled_before_serve_leaves_the_array_degraded_then_comes_back() {
    require_libnbd_python();
    require_tool("nbdcopy", "libnbd-bin");
    for level in ["5", "1"] {
        let dir = shm_tempdir();
        let d = dir.path();
        let hostile = HostileServer::start(MEMBER_BYTES);
        let members = [hostile.uri(), member_file(d, "m1.img"), member_file(d, "m2.img")];
        let members = if level == "1" { members[..2].to_vec() } else { members.to_vec() };
        let mut create = vec!["create", "--level", level];
        if level == "5" {
            create.extend(["--chunk", "64K"]);
        }
        create.extend(members.iter().map(String::as_str));
        assert_ok(&raidnbd(d, &create));
        let names: Vec<&str> = members.iter().map(String::as_str).collect();
        let detail = assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &names].concat()));
        let detail: serde_json::Value = serde_json::from_str(&detail).unwrap();
        let policy = if level == "5" { "ppl" } else { "resync" };
        assert_eq!(detail["consistency_policy"], policy, "level {level}: no bitmap: {detail}");

        hostile.arm(Misbehaviour::StallBeforeHandshake);
        let control = d.join("control.sock");
        let started = Instant::now();
        let served = serve(d, &control, &members);
        let up = started.elapsed();
        assert!(up < MEMBER_TIMEOUT * 2 + Duration::from_secs(1), "level {level}: serving after {up:?}");
        let status = ctl_status(d, &control);
        assert!(status["state"].as_str().unwrap().contains("degraded"), "level {level}: {status:#}");
        let log = served.log_text();
        assert!(log.contains("absent") && log.contains(&hostile.uri()), "level {level}: {log}");
        assert!(log.contains("away record: begun"), "level {level}: {log}");

        // Written while it is away: the first 1 MiB.
        let written: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
        std::fs::write(d.join("written"), &written).unwrap();
        run_ok(Command::new("nbdcopy").arg(d.join("written")).arg(served.uri("h")).arg("--flush"));
        hostile.arm(Misbehaviour::Honest);
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            let s = ctl_status(d, &control);
            let whole = s["roles"].as_array().unwrap().iter().all(|r| r["state"] == "in_sync");
            if whole && s["last_recovery"].is_object() {
                break s;
            }
            assert!(Instant::now() < deadline, "level {level}: not whole again: {s:#}\n{}", served.log_text());
            std::thread::sleep(Duration::from_millis(100));
        };
        let tally = &status["last_recovery"];
        assert_eq!(tally["from_bitmap"], true, "level {level}: {status:#}");
        let copied = tally["copied_bytes"].as_u64().unwrap();
        assert!(
            copied > 0 && copied <= 4 << 20,
            "level {level}: copied {copied} bytes of a {MEMBER_BYTES}-byte member"
        );
        assert_eq!(status["away"], serde_json::Value::Null, "level {level}: the record ended: {status:#}");
        run_ok(Command::new("nbdcopy").arg(served.uri("h")).arg(d.join("back")));
        let back = std::fs::read(d.join("back")).unwrap();
        assert!(back[..written.len()] == written[..], "level {level}: the data written while away");
        assert!(back[written.len()..].iter().all(|&b| b == 0), "level {level}: zeros elsewhere");
        let ctl = |args: &[&str]| {
            assert_ok(&raidnbd(d, &[&["ctl", "--socket", control.to_str().unwrap()][..], args].concat()))
        };
        ctl(&["check"]);
        ctl(&["wait", "--timeout", "120"]);
        let status = ctl_status(d, &control);
        assert_eq!(status["last_check"]["mismatch_cnt"], 0, "level {level}: {status:#}");
        served.stop();
    }
}
