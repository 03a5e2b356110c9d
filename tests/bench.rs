//! `raidnbd bench --quick` end to end: a real fio against real served arrays (single and
//! raid0 of two members, a few workloads, writethrough and writeback). Checks that every
//! output exists and parses, that measured runs carry non-zero numbers, that raid0 has a
//! ratio to single, and that writeback is either measured or an explicit "skipped: not
//! available" row. Speed is not judged here (that is the bench's own job).

use std::process::Command;

use serde_json::Value;

use crate::util::*;

const WORKLOADS: &str = "dd-write,seq1m-q8t1-read,rnd4k-q32t1-write,seq-fullstripe-write";

/// Splits one CSV line (RFC 4180 quoting).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// Tags open and close in order: the SVG is well-formed enough for any viewer.
fn assert_balanced_tags(svg: &str) {
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find('<') {
        let end = rest[i..].find('>').expect("every tag closes") + i;
        let tag = &rest[i + 1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name), "mismatched </{name}>");
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().expect("tag name"));
        }
    }
    assert!(stack.is_empty(), "unclosed tags {stack:?}");
}

/// `raidnbd bench ARGS... --dir DIR --out OUT`, which must succeed; returns its stderr.
fn run_bench(dir: &std::path::Path, out: &std::path::Path, args: &[&str], more: &[&str]) -> String {
    let output = Command::new(BIN)
        .arg("bench")
        .args(args)
        .args(more)
        .arg("--dir")
        .arg(dir)
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run raidnbd bench");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "bench failed ({:?}):\n{stderr}", output.status);
    stderr
}

#[test]
fn quick_bench_writes_parsable_plausible_results() {
    require_tool("fio", "fio");
    let dir = tempdir();
    let out = dir.path().join("out");
    let stderr = run_bench(
        dir.path(),
        &out,
        &["--quick", "--levels", "single,0", "--members", "2", "--size", "32M", "--runtime", "700ms"],
        &["--ramp", "200ms", "--workloads", WORKLOADS, "--cache", "writethrough,writeback"],
    );
    assert!(stderr.contains("ETA"), "progress lines show an ETA:\n{stderr}");

    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = json["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2 * 2 * 4, "arrays × cache modes × workloads");
    for r in runs {
        let what = format!("{} {} {}", r["array"], r["cache"], r["workload"]);
        match r["status"].as_str() {
            Some("ok") => {
                let mb = r["mb_per_s"].as_f64().unwrap_or(0.0);
                let iops = r["iops"].as_f64().unwrap_or(0.0);
                assert!(mb > 0.1 && mb < 1e6, "{what}: implausible {mb} MB/s");
                assert!(iops > 1.0 && iops < 1e8, "{what}: implausible {iops} IOPS");
                assert!(r["lat_mean_us"].as_f64().is_some_and(|l| l > 0.0), "{what}: no latency");
                assert!(r["ratio_vs_single"].as_f64().is_some_and(|x| x > 0.0), "{what}: no ratio to single");
                let bs = r["block_bytes"].as_u64().unwrap();
                assert!(
                    (mb * 1e6 / iops - bs as f64).abs() < 0.01 * bs as f64,
                    "{what}: MB/s and IOPS disagree with bs"
                );
                // What it cost: the server's CPU from its metrics, fio's own, the copies.
                let cpu = r["server_cpu_us_per_op"].as_f64().unwrap_or(0.0);
                assert!(cpu > 0.0 && cpu < 1e6, "{what}: server CPU per request {cpu} µs");
                assert!(r["server_cpu_us_per_mib"].as_f64().is_some_and(|c| c > 0.0), "{what}: no CPU per MiB");
                assert!(r["client_cpu_us_per_op"].as_f64().is_some_and(|c| c > 0.0), "{what}: no client CPU");
                let copies = r["copies_per_written_byte"].as_f64();
                match r["rw"].as_str().unwrap().contains("write") {
                    true => assert!(copies.is_some_and(|c| (1.0..20.0).contains(&c)), "{what}: copies {copies:?}"),
                    false => assert_eq!(copies, None, "{what}: a read writes nothing"),
                }
            }
            Some("skipped") => {
                assert_eq!(r["cache"], "writeback", "{what}: only writeback may be skipped");
                assert!(r["note"].as_str().unwrap().contains("not available"), "{what}: {}", r["note"]);
            }
            other => panic!("{what}: status {other:?}, note {}", r["note"]),
        }
    }
    let measured = |array: &str| runs.iter().filter(|r| r["array"] == array && r["status"] == "ok").count();
    assert!(measured("single") >= 4 && measured("raid0 2x64K") >= 4, "writethrough runs are all measured");
    // The full-stripe write of a 2 x 64K raid0 uses whole 128K stripes: 8 of them per request.
    let full = runs.iter().find(|r| r["array"] == "raid0 2x64K" && r["workload"] == "seq-fullstripe-write").unwrap();
    assert_eq!(full["block_bytes"], 1 << 20);

    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let header = csv_fields(lines.next().unwrap());
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no {name} column"));
    let rows: Vec<Vec<String>> = lines.map(csv_fields).collect();
    assert_eq!(rows.len(), runs.len());
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
        if row[col("status")] == "ok" {
            assert!(row[col("mb_per_s")].parse::<f64>().unwrap() > 0.0, "{row:?}");
            assert!(row[col("iops")].parse::<f64>().unwrap() > 0.0, "{row:?}");
        }
    }

    let md = std::fs::read_to_string(out.join("results.md")).unwrap();
    for want in ["| Workload | single | raid0 2x64K |", "SEQ1M Q8T1 read", "×", "## writeback", "## Notes"] {
        assert!(md.contains(want), "results.md lacks {want:?}:\n{md}");
    }
    for name in ["results.svg", "results-ratio.svg"] {
        let svg = std::fs::read_to_string(out.join(name)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{name}");
        assert_balanced_tags(&svg);
    }
    // Temporary members are gone (no --keep).
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("out")], "bench left files behind");
}

/// `--remote-members`: every member is an nbdkit file export reached over NBD; with an IOPS
/// cap (delay filter) the RAID0 of two does about twice the random reads of one.
#[test]
fn remote_members_bench_builds_arrays_over_nbdkit_exports() {
    require_tool("fio", "fio");
    require_tool("nbdkit", "nbdkit");
    let dir = tempdir();
    let out = dir.path().join("out");
    run_bench(
        dir.path(),
        &out,
        &["--quick", "--remote-members", "--remote-iops", "400", "--levels", "single,0", "--members", "2"],
        &["--size", "16M", "--runtime", "2s", "--ramp", "300ms", "--workloads", "rnd4k-q32t1-read"],
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert!(json["settings"]["member_location"].as_str().unwrap().contains("nbdkit"), "{}", json["settings"]);
    let runs = json["runs"].as_array().expect("runs");
    let single = runs.iter().find(|r| r["array"] == "single").unwrap();
    let raid0 = runs.iter().find(|r| r["array"] == "raid0 2x64K").unwrap();
    let iops = single["iops"].as_f64().unwrap();
    // 4 threads x 10 ms = at most 400 requests/s per member.
    assert!(iops > 200.0 && iops < 440.0, "one capped member: {iops} IOPS");
    let ratio = raid0["ratio_vs_single"].as_f64().unwrap();
    assert!(ratio > 1.6, "two capped members: {ratio}x one");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("out")], "bench left files or servers behind");
}

/// `--remote-server raidnbd`: every member is a `raidnbd serve` export throttled by token
/// buckets; the RAID0 of two does twice the random reads of one at QD32 (a budget, not a
/// number of request threads, limits each member).
#[test]
fn remote_members_served_by_raidnbd_are_throttled_like_cloud_volumes() {
    require_tool("fio", "fio");
    let dir = tempdir();
    let out = dir.path().join("out");
    run_bench(
        dir.path(),
        &out,
        &["--quick", "--remote-members", "--remote-server", "raidnbd", "--remote-iops", "400", "--size", "16M"],
        &[
            "--levels",
            "single,0",
            "--members",
            "2",
            "--runtime",
            "2s",
            "--ramp",
            "500ms",
            "--workloads",
            "rnd4k-q32t1-read",
        ],
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let location = json["settings"]["member_location"].as_str().unwrap();
    assert!(location.contains("raidnbd serve") && location.contains("token bucket"), "{location}");
    let runs = json["runs"].as_array().expect("runs");
    let single = runs.iter().find(|r| r["array"] == "single").unwrap();
    let raid0 = runs.iter().find(|r| r["array"] == "raid0 2x64K").unwrap();
    let iops = single["iops"].as_f64().unwrap();
    assert!(iops > 300.0 && iops < 480.0, "one member throttled to 400 IOPS: {iops}");
    let ratio = raid0["ratio_vs_single"].as_f64().unwrap();
    assert!(ratio > 1.8, "two throttled members: {ratio}x one");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("out")], "bench left files or servers behind");
}

#[test]
fn bench_refuses_bad_requests() {
    let dir = tempdir();
    let d = dir.path();
    assert_user_error(&raidnbd(d, &["bench", "--levels", "7"]), "unknown level '7'");
    assert_user_error(&raidnbd(d, &["bench", "--levels", "6", "--members", "3"]), "needs at least 4 members");
    assert_user_error(&raidnbd(d, &["bench", "--workloads", "nonsense"]), "unknown workload 'nonsense'");
    assert_user_error(&raidnbd(d, &["bench", "--devices", "/dev/null"]), "add --force");
    assert_usage_error(&raidnbd(d, &["bench", "--runtime", "10x"]), "unknown unit");
    let delayed = ["bench", "--remote-members", "--remote-server", "raidnbd", "--remote-delay", "2ms"];
    assert_user_error(&raidnbd(d, &delayed), "--remote-delay needs --remote-server nbdkit");
}
