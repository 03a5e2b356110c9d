//! `serve --cache writeback` with a real client (python3-libnbd): what a FLUSH acknowledged
//! survives SIGKILL (checked by restarting without the cache), what was written after the
//! last FLUSH may be lost but never damages flushed data, and an orderly stop writes the
//! cache back before marking the array clean.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use raid_core::conformance::pattern;

use crate::util::*;

const SECTOR: usize = 512;
const BLOCK: usize = 4096;
/// The test writes inside the first 32 MiB of the export.
const SPAN: usize = 32 << 20;

/// Writes the plan's "before" writes, FLUSHes, writes the "after" writes, prints "ready"
/// and keeps the connection open until stdin closes; or dumps a range of the export.
const CLIENT: &str = r#"
import json, sys
import nbd
uri, mode = sys.argv[1:3]
h = nbd.NBD()
h.connect_uri(uri)
if mode == "write":
    plan = json.load(open(sys.argv[3]))
    for phase in ("before", "after"):
        data = open(plan[phase]["data"], "rb").read()
        for offset, length, at in plan[phase]["writes"]:
            h.pwrite(data[at:at + length], offset)
        if phase == "before":
            h.flush()
    print("ready", flush=True)
    sys.stdin.read()
elif mode == "dump":
    out, start, length = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    with open(out, "wb") as f:
        for o in range(start, start + length, 4 << 20):
            f.write(h.pread(min(4 << 20, start + length - o), o))
"#;

/// A list of writes and the file holding their bytes back to back.
struct Phase {
    writes: Vec<(usize, Vec<u8>)>,
}

impl Phase {
    fn save(&self, path: &Path) -> Value {
        let mut data = Vec::new();
        let mut list = Vec::new();
        for (offset, bytes) in &self.writes {
            list.push(json!([offset, bytes.len(), data.len()]));
            data.extend_from_slice(bytes);
        }
        std::fs::write(path, &data).unwrap();
        json!({ "data": path, "writes": list })
    }

    fn apply(&self, image: &mut [u8]) {
        for (offset, bytes) in &self.writes {
            image[*offset..offset + bytes.len()].copy_from_slice(bytes);
        }
    }
}

fn create_raid5(d: &Path) -> Vec<&'static str> {
    let members = vec!["m0", "m1", "m2", "m3"];
    let args = [&["create", "--level", "5", "--chunk", "64K", "--size", "64M"][..], &members].concat();
    assert_ok(&raidnbd(d, &args));
    members
}

fn dump(uri: &str, out: &Path, len: usize) -> Vec<u8> {
    run_ok(Command::new(PYTHON).args(["-c", CLIENT, uri, "dump"]).arg(out).args(["0", &len.to_string()]));
    std::fs::read(out).unwrap()
}

#[test]
fn flushed_writes_survive_sigkill_and_later_writes_never_damage_them() {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    let members = create_raid5(d);

    // Before the FLUSH: scattered 4 KiB writes, a 1 MiB write, and two full stripes of
    // sequential 4 KiB writes (3 data members x 64 KiB chunk = 192 KiB per stripe).
    let mut before = Phase { writes: Vec::new() };
    for i in 0..384usize {
        before.writes.push(((i * 7919 % 2048) * BLOCK, pattern(i as u64 + 1, BLOCK)));
    }
    before.writes.push((8 << 20, pattern(1000, 1 << 20)));
    for i in 0..96usize {
        before.writes.push(((16 << 20) + i * BLOCK, pattern(2000 + i as u64, BLOCK)));
    }
    // After it: some of the same blocks again, new blocks, part of the 1 MiB range.
    let mut after = Phase { writes: Vec::new() };
    for i in 0..128usize {
        let block = if i % 2 == 0 { i * 7919 % 2048 } else { 4096 + i * 13 };
        after.writes.push((block * BLOCK, pattern(5000 + i as u64, BLOCK)));
    }
    after.writes.push(((8 << 20) + (512 << 10), pattern(6000, 256 << 10)));
    let plan = json!({ "before": before.save(&d.join("before.bin")), "after": after.save(&d.join("after.bin")) });
    std::fs::write(d.join("plan.json"), plan.to_string()).unwrap();

    let served = Served::start(d, "r5", &["--cache", "writeback", "--cache-size", "64M"], &members);
    let log = served.log_text();
    assert!(
        log.contains("cache writeback (64 MiB; writes not yet flushed are LOST if raidnbd dies)"),
        "startup line states the risk:\n{log}"
    );
    let mut client = Command::new(PYTHON)
        .args(["-c", CLIENT, &served.uri("r5"), "write"])
        .arg(d.join("plan.json"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python client");
    let mut line = String::new();
    BufReader::new(client.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "client did not finish its writes");
    // SIGKILL right after the unflushed writes were acknowledged: no shutdown flush runs.
    let mut served = served;
    served.child.kill().expect("SIGKILL the server");
    served.child.wait().unwrap();
    drop(client.stdin.take());
    client.wait().unwrap();

    // Restart without the cache: only what the members hold counts.
    let restarted = Served::start(d, "r5", &[], &members);
    assert!(restarted.log_text().contains("cache writethrough"), "{}", restarted.log_text());
    let got = dump(&restarted.uri("r5"), &d.join("dump.bin"), SPAN);
    let mut flushed = vec![0u8; SPAN];
    before.apply(&mut flushed);
    let mut later = flushed.clone();
    after.apply(&mut later);
    let touched_after: Vec<bool> = {
        let mut t = vec![false; SPAN / SECTOR];
        for (offset, b) in &after.writes {
            t[offset / SECTOR..(offset + b.len()) / SECTOR].fill(true);
        }
        t
    };
    let (mut kept_old, mut landed_new) = (0, 0);
    for (s, &touched) in touched_after.iter().enumerate() {
        let r = s * SECTOR..(s + 1) * SECTOR;
        if got[r.clone()] == flushed[r.clone()] {
            kept_old += usize::from(touched && flushed[r.clone()] != later[r.clone()]);
            continue;
        }
        assert!(touched, "sector {s} (byte {}) lost flushed data", s * SECTOR);
        assert!(got[r.clone()] == later[r], "sector {s} holds neither the flushed nor the later bytes");
        landed_new += 1;
    }
    println!("after SIGKILL: {landed_new} sectors written after the flush reached the members, {kept_old} were lost");
    restarted.stop();
}

#[test]
fn random_crashes_with_the_cache_keep_every_flushed_block() {
    require_libnbd_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/crash_writer.py");
    let dir = tempdir();
    let d = dir.path();
    let members = create_raid5(d);
    let log = d.join("durable.log");
    for seed in 0..4u64 {
        let served = Served::start(d, "a", &["--cache", "writeback", "--cache-size", "16M"], &members);
        let mut writer = Command::new(PYTHON)
            .arg(&script)
            .arg(served.uri("a"))
            .arg(&log)
            .arg((100 + seed).to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("writer");
        std::thread::sleep(Duration::from_millis(400 + seed * 300));
        let mut served = served;
        served.child.kill().expect("SIGKILL the server");
        served.child.wait().unwrap();
        writer.wait().unwrap();
        // Without the cache: every block whose FLUSH or FUA write was acknowledged is there.
        let plain = Served::start(d, "a", &[], &members);
        let out = run_ok(Command::new(PYTHON).arg(&script).arg(plain.uri("a")).arg(&log).arg("verify"));
        assert!(out.contains(", 0 lost"), "{out}");
        plain.stop();
    }
}

#[test]
fn orderly_stop_writes_the_cache_back_before_marking_the_array_clean() {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    let members = create_raid5(d);
    let served = Served::start(d, "r5", &["--cache", "writeback"], &members);
    assert!(served.log_text().contains("cache writeback (256 MiB;"), "default size: {}", served.log_text());
    let data = pattern(77, 3 << 20);
    std::fs::write(d.join("data.bin"), &data).unwrap();
    // The client never sends FLUSH: only the stop can write the cache back.
    let script = "import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\n\
                  h.pwrite(open(sys.argv[2], 'rb').read(), 1 << 20)\nh.shutdown()\n";
    run_ok(Command::new(PYTHON).args(["-c", script, &served.uri("r5")]).arg(d.join("data.bin")));
    let log = served.stop();
    assert!(log.contains("shutting down"), "{log}");
    let detail: Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["detail", "--json"][..], &members].concat()))).unwrap();
    assert_eq!(detail["clean"], true, "orderly stop marks the array clean");
    let plain = Served::start(d, "r5", &[], &members);
    let got = dump(&plain.uri("r5"), &d.join("dump.bin"), 4 << 20);
    assert!(got[1 << 20..(1 << 20) + data.len()] == data[..], "the cached writes reached the members at stop");
    plain.stop();
}
