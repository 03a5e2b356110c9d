//! `serve --metrics`: a RAID5 is served with the Prometheus endpoint on, a real client
//! (python3-libnbd) does known I/O, and plain HTTP scrapes show the counters moved by
//! exactly that; a member made to fail shows in its error counter and the degraded gauges;
//! a rebuild shows its progress. Every scrape is checked to be well-formed exposition text
//! (Prometheus 0.0.4 and OpenMetrics).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::*;

const CHUNK: u64 = 64 << 10;
/// Data in one stripe of a 4-member RAID5.
const STRIPE: u64 = 3 * CHUNK;

/// Runs NBD requests with libnbd, one connection: `w:OFF:LEN`, `r:OFF:LEN`, `t:OFF:LEN`
/// (trim), `z:OFF:LEN` (write zeroes), `f` (flush).
const CLIENT: &str = r#"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for op in sys.argv[2:]:
    kind, *args = op.split(":")
    off, ln = (int(args[0]), int(args[1])) if args else (0, 0)
    if kind == "w": h.pwrite(bytes([off // 4096 % 251]) * ln, off)
    elif kind == "r": assert len(h.pread(ln, off)) == ln
    elif kind == "t": h.trim(ln, off)
    elif kind == "z": h.zero(ln, off)
    elif kind == "f": h.flush()
    else: raise SystemExit("bad op " + op)
h.shutdown()
"#;

fn client(uri: &str, ops: &[String]) {
    require_libnbd_python();
    run_ok(Command::new(PYTHON).arg("-c").arg(CLIENT).arg(uri).args(ops));
}

fn ctl(dir: &Path, socket: &Path, args: &[&str]) {
    let mut full = vec!["ctl", "--socket", socket.to_str().unwrap()];
    full.extend_from_slice(args);
    assert_ok(&raidnbd(dir, &full));
}

/// `GET /metrics` over a plain TCP connection; returns the body of a 200 answer.
pub(crate) fn scrape(port: u16, openmetrics: bool) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let accept = if openmetrics { "application/openmetrics-text;version=1.0.0" } else { "text/plain" };
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the answer");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head/body split: {raw:?}"));
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let content_type =
        if openmetrics { "application/openmetrics-text; version=1.0.0" } else { "text/plain; version=0.0.4" };
    assert!(head.contains(&format!("Content-Type: {content_type}")), "{head}");
    assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())), "{head}");
    body.to_string()
}

/// Label name to value.
type Labels = BTreeMap<String, String>;

/// One sample line.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Labels,
    value: f64,
}

/// A parsed, validated scrape.
struct Exposition {
    samples: Vec<Sample>,
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses `name{k="v",...} value`, panicking with the line on any deviation.
fn parse_sample(line: &str) -> Sample {
    let bad = |why: &str| -> ! { panic!("malformed sample line ({why}): {line:?}") };
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad("no value"));
    let name = &line[..name_end];
    if !is_name(name) {
        bad("metric name");
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        loop {
            // label name
            let start = chars.peek().map(|&(i, _)| i).unwrap_or_else(|| bad("unterminated labels"));
            let eq = after[start..].find('=').unwrap_or_else(|| bad("label without ="));
            let key = &after[start..start + eq];
            if !is_name(key) || key.contains(':') {
                bad("label name");
            }
            while chars.peek().is_some_and(|&(i, _)| i <= start + eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                bad("label value not quoted");
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        _ => bad("bad escape"),
                    },
                    Some('\n') | None => bad("unterminated label value"),
                    Some(c) => value.push(c),
                }
            }
            if labels.insert(key.to_string(), value).is_some() {
                bad("duplicate label");
            }
            match chars.next() {
                Some((_, ',')) => continue,
                Some((i, '}')) => {
                    rest = &after[i + 1..];
                    break;
                }
                _ => bad("expected , or }"),
            }
        }
    }
    let value = rest.strip_prefix(' ').unwrap_or_else(|| bad("no space before the value"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse::<f64>().unwrap_or_else(|_| bad("value is not a number")),
    };
    Sample { name: name.to_string(), labels, value }
}

/// Parses and validates a whole scrape: HELP then TYPE once per family, samples under
/// their family with the suffixes of its type, no duplicate series, histograms cumulative
/// and ending in `+Inf` == `_count`, `# EOF` last exactly when OpenMetrics.
fn parse(text: &str, openmetrics: bool) -> Exposition {
    assert!(text.ends_with('\n'), "text ends with a newline");
    let mut lines: Vec<&str> = text.lines().collect();
    if openmetrics {
        assert_eq!(lines.pop(), Some("# EOF"), "OpenMetrics ends with # EOF");
    }
    let mut families: HashMap<String, String> = HashMap::new();
    let mut current: Option<(String, String)> = None;
    let mut help_for: Option<String> = None;
    let mut seen = HashSet::new();
    let mut samples = Vec::new();
    for line in lines {
        assert!(!line.is_empty(), "no blank lines");
        if let Some(help) = line.strip_prefix("# HELP ") {
            let (name, text) = help.split_once(' ').unwrap_or_else(|| panic!("HELP without text: {line}"));
            assert!(is_name(name) && !text.is_empty(), "{line}");
            help_for = Some(name.to_string());
        } else if let Some(ty) = line.strip_prefix("# TYPE ") {
            let (name, kind) = ty.split_once(' ').unwrap_or_else(|| panic!("TYPE without type: {line}"));
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            assert_eq!(help_for.take().as_deref(), Some(name), "HELP precedes TYPE: {line}");
            assert!(families.insert(name.to_string(), kind.to_string()).is_none(), "family declared twice: {line}");
            current = Some((name.to_string(), kind.to_string()));
        } else if line.starts_with('#') {
            panic!("unexpected comment line: {line}");
        } else {
            let sample = parse_sample(line);
            let (family, kind) = current.as_ref().unwrap_or_else(|| panic!("sample before any TYPE: {line}"));
            let allowed: Vec<String> = match (kind.as_str(), openmetrics) {
                ("counter", true) => vec![format!("{family}_total")],
                ("counter", false) => {
                    assert!(family.ends_with("_total"), "Prometheus counters are declared with _total: {family}");
                    vec![family.clone()]
                }
                ("gauge", _) => vec![family.clone()],
                _ => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{family}{s}")).collect(),
            };
            assert!(allowed.contains(&sample.name), "sample {line} does not belong to family {family} ({kind})");
            assert!(seen.insert(format!("{}{:?}", sample.name, sample.labels)), "duplicate series: {line}");
            if sample.name.ends_with("_bucket") {
                assert!(sample.labels.contains_key("le"), "bucket without le: {line}");
            }
            samples.push(sample);
        }
    }
    assert!(help_for.is_none(), "HELP without TYPE");
    let exposition = Exposition { samples };
    exposition.check_histograms();
    exposition
}

impl Exposition {
    /// Samples named `name` carrying all of `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The one sample named `name` with `labels`.
    #[track_caller]
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        assert_eq!(found.len(), 1, "exactly one {name}{labels:?} expected, found {found:?}");
        found[0].value
    }

    /// Sum over the samples named `name` with `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    fn check_histograms(&self) {
        let mut series: BTreeMap<(String, Labels), Vec<(f64, f64)>> = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name.ends_with("_bucket")) {
            let mut labels = s.labels.clone();
            let le = labels.remove("le").unwrap();
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().expect("le is a number") };
            series.entry((s.name.trim_end_matches("_bucket").to_string(), labels)).or_default().push((le, s.value));
        }
        for ((name, labels), buckets) in series {
            assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{name}{labels:?}: {buckets:?}");
            let (last_le, last_count) = *buckets.last().unwrap();
            assert_eq!(last_le, f64::INFINITY, "{name}{labels:?} ends with +Inf");
            let count_name = format!("{name}_count");
            let count = self.samples.iter().find(|s| s.name == count_name && s.labels == labels).expect("_count");
            assert_eq!(count.value, last_count, "{name}{labels:?}: +Inf bucket == _count");
            assert!(buckets[0].0 <= 1e-5 && buckets[buckets.len() - 2].0 >= 10.0, "buckets span 10 µs .. 10 s");
        }
    }
}

/// Scrapes in both formats, checks both, and returns the Prometheus-format one.
fn scrape_checked(port: u16) -> Exposition {
    let openmetrics = parse(&scrape(port, true), true);
    let prometheus = parse(&scrape(port, false), false);
    // The same families in both formats (OpenMetrics counters carry _total on samples only).
    assert_eq!(openmetrics.samples.len(), prometheus.samples.len());
    prometheus
}

fn wait_for(port: u16, what: &str, done: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let m = parse(&scrape(port, false), false);
        if done(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn op(kind: &str, offset: u64, len: u64) -> String {
    format!("{kind}:{offset}:{len}")
}

#[test]
fn raid5_metrics_follow_client_io_member_failure_and_rebuild() {
    let dir = tempdir();
    let d = dir.path();
    let members = ["m0", "m1", "m2", "m3"];
    assert_ok(&raidnbd(
        d,
        &[&["create", "--level", "5", "--chunk", "64K", "--size", "32M", "--bitmap", "internal"][..], &members]
            .concat(),
    ));
    std::fs::write(d.join("spare"), vec![0u8; 32 << 20]).unwrap();
    let path = |name: &str| std::fs::canonicalize(d.join(name)).unwrap().to_string_lossy().into_owned();
    let socket = d.join("control.sock");
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let served = Served::start(
        d,
        "a",
        &["--fault-injection", "--control", socket.to_str().unwrap(), "--metrics", &metrics_addr],
        &members,
    );
    let uri = served.uri("a");
    let ex = [("export", "a")];

    let before = scrape_checked(metrics_port);
    assert_eq!(before.get("raidnbd_array_degraded", &ex), 0.0);
    assert_eq!(before.get("raidnbd_array_size_bytes", &ex), (3 * (31u64 << 20)) as f64, "3 data members x (32M - 1M)");
    for (role, m) in members.iter().enumerate() {
        let role = role.to_string();
        assert_eq!(
            before.get("raidnbd_array_role_state", &[("export", "a"), ("role", &role), ("state", "in_sync")]),
            1.0
        );
        // Roles are attached to members by name.
        before.get("raidnbd_member_written_bytes_total", &[("export", "a"), ("member", &path(m)), ("role", &role)]);
    }

    // Known client I/O: three full-stripe writes, two reads over them, a flush, a trim, a zeroing.
    let mut ops: Vec<String> = (0..3).map(|i| op("w", i * STRIPE, STRIPE)).collect();
    ops.extend([op("r", 0, 2 * STRIPE), op("r", 2 * STRIPE, STRIPE), "f".into()]);
    ops.extend([op("t", 16 * STRIPE, 4 * STRIPE), op("z", 24 * STRIPE, 65536)]);
    client(&uri, &ops);
    let after = scrape_checked(metrics_port);
    let delta = |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    let cmd = |c: &'static str| [("export", "a"), ("command", c)];
    for (command, n) in
        [("write", 3.0), ("read", 2.0), ("flush", 1.0), ("trim", 1.0), ("write_zeroes", 1.0), ("cache", 0.0)]
    {
        assert_eq!(delta("raidnbd_export_requests_total", &cmd(command)), n, "{command} requests");
        assert_eq!(delta("raidnbd_export_request_duration_seconds_count", &cmd(command)), n, "{command} latencies");
    }
    assert_eq!(delta("raidnbd_export_request_errors_total", &ex), 0.0);
    assert_eq!(delta("raidnbd_export_written_bytes_total", &ex), (3 * STRIPE) as f64);
    assert_eq!(delta("raidnbd_export_read_bytes_total", &ex), (3 * STRIPE) as f64);
    assert_eq!(delta("raidnbd_export_zeroed_bytes_total", &ex), (4 * STRIPE + 65536) as f64);
    assert_eq!(after.get("raidnbd_export_requests_in_flight", &ex), 0.0);
    assert!(delta("raidnbd_export_request_duration_seconds_sum", &cmd("write")) > 0.0);
    // Every member took part: a chunk of data or parity of each stripe written, data read.
    for m in members {
        let p = path(m);
        let member = [("export", "a"), ("member", p.as_str())];
        let member_op = |op| [("export", "a"), ("member", p.as_str()), ("op", op)];
        assert!(delta("raidnbd_member_ops_total", &member_op("read")) > 0.0, "{m} was read");
        assert!(delta("raidnbd_member_ops_total", &member_op("write")) >= 3.0, "{m}: one write per stripe at least");
        assert!(delta("raidnbd_member_written_bytes_total", &member) >= (3 * CHUNK) as f64, "{m} written bytes");
        assert!(delta("raidnbd_member_read_bytes_total", &member) >= CHUNK as f64, "{m} read bytes");
        assert_eq!(delta("raidnbd_member_errors_total", &member), 0.0, "{m} errors");
    }
    let member_written = delta("raidnbd_member_written_bytes_total", &ex);
    assert!(member_written >= (4 * 3 * CHUNK) as f64, "data and parity reach the members: {member_written}");

    // A member dies: its error counter moves, the array shows degraded, clients see no error.
    ctl(d, &socket, &["fault", &path("m1"), "all"]);
    client(&uri, &[op("w", 0, STRIPE), op("w", STRIPE + 4096, 8192), op("r", 0, 3 * STRIPE), "f".into()]);
    let failed = scrape_checked(metrics_port);
    let m1 = [("export", "a"), ("member", &*path("m1"))];
    assert!(failed.sum("raidnbd_member_errors_total", &m1) - after.sum("raidnbd_member_errors_total", &m1) >= 1.0);
    for m in ["m0", "m2", "m3"] {
        assert_eq!(failed.sum("raidnbd_member_errors_total", &[("member", &path(m))]), 0.0, "{m} has no errors");
    }
    assert_eq!(failed.sum("raidnbd_export_request_errors_total", &ex), 0.0, "RAID5 hides one failure from clients");
    assert_eq!(failed.get("raidnbd_array_degraded", &ex), 1.0);
    assert_eq!(failed.get("raidnbd_array_failed_members", &ex), 1.0);
    assert_eq!(failed.get("raidnbd_array_role_state", &[("export", "a"), ("role", "1"), ("state", "faulty")]), 1.0);
    assert_eq!(failed.get("raidnbd_array_role_state", &[("export", "a"), ("role", "1"), ("state", "in_sync")]), 0.0);
    // Degraded arrays keep their write-intent bits: the writes above left some set.
    assert!(failed.get("raidnbd_array_bitmap_dirty_chunks", &ex) >= 1.0);

    // Data everywhere (a rebuild copies what its sources hold, and leaves holes holes).
    qemu_io(&uri, &[&format!("write -P 0x6b 0 {}", 3 * (31u64 << 20))]);
    // A spare rebuilds slowly: the job and its progress show, then the array is whole again.
    ctl(d, &socket, &["rebuild-speed", "1M", "1M"]);
    ctl(d, &socket, &["add", &path("spare")]);
    let spare = [("export", "a"), ("member", &*path("spare")), ("role", "1")];
    let first = wait_for(metrics_port, "recovery to start", |m| {
        m.get("raidnbd_array_maintenance_running", &[("export", "a"), ("kind", "recovery")]) == 1.0
    });
    assert_eq!(first.get("raidnbd_array_spares", &ex), 0.0, "the spare took role 1");
    assert_eq!(first.get("raidnbd_array_role_state", &[("export", "a"), ("role", "1"), ("state", "recovering")]), 1.0);
    let ratio = first.get("raidnbd_array_maintenance_progress_ratio", &ex);
    assert!((0.0..1.0).contains(&ratio), "{ratio}");
    let moved = wait_for(metrics_port, "recovery progress", |m| {
        m.get("raidnbd_array_maintenance_progress_ratio", &ex) > ratio
            && m.get("raidnbd_array_maintenance_running", &[("export", "a"), ("kind", "recovery")]) == 1.0
    });
    assert!(moved.sum("raidnbd_member_written_bytes_total", &spare) > 0.0, "the rebuild writes the spare");
    ctl(d, &socket, &["rebuild-speed", "1G", "2G"]);
    // The array is whole when the last step lands; the maintenance task notices a moment later.
    let whole = wait_for(metrics_port, "recovery to finish", |m| {
        m.get("raidnbd_array_degraded", &ex) == 0.0 && m.sum("raidnbd_array_maintenance_running", &ex) == 0.0
    });
    assert_eq!(whole.get("raidnbd_array_failed_members", &ex), 0.0);
    assert_eq!(whole.get("raidnbd_array_maintenance_progress_ratio", &ex), 0.0);
    assert!(whole.get("raidnbd_member_written_bytes_total", &spare) >= (31 << 20) as f64, "the whole role was rebuilt");
    // The dead member left its role; its counters stay.
    let gone = whole.sum("raidnbd_member_errors_total", &[("member", &path("m1")), ("role", "none")]);
    assert!(gone >= 1.0, "m1 keeps its errors under role \"none\"");
    served.stop();
}

/// Runs qemu-io commands (`write -P`, `read -P`: the read fails on any wrong byte).
fn qemu_io(uri: &str, commands: &[&str]) {
    qemu_io_opened(&[], uri, commands);
}

/// As [`qemu_io`], the image opened with `options` (e.g. `-r`: read-only).
fn qemu_io_opened(options: &[&str], uri: &str, commands: &[&str]) {
    require_tool("qemu-io", "qemu-utils");
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]).args(options);
    for c in commands {
        cmd.args(["-c", c]);
    }
    run_ok(cmd.arg(uri));
}

/// A RAID1 whose members are files in /dev/shm answers large reads straight from the member
/// files (sent from their mappings), writable or read-only: the bytes are right, the
/// in-place counter shows it, and a failed member, a member being rebuilt and the
/// write-back cache never let stale bytes through.
#[test]
fn raid1_in_memory_sends_reads_from_member_files_and_never_stale_ones() {
    let dir = shm_tempdir();
    let d = dir.path();
    let members = ["m0", "m1"];
    assert_ok(&raidnbd(d, &[&["create", "--level", "1", "--size", "32M"][..], &members].concat()));
    std::fs::write(d.join("spare"), vec![0u8; 32 << 20]).unwrap();
    let path = |name: &str| std::fs::canonicalize(d.join(name)).unwrap().to_string_lossy().into_owned();
    let socket = d.join("control.sock");
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let extra = ["--control", socket.to_str().unwrap(), "--metrics", &metrics_addr];
    let served = Served::start(d, "a", &extra, &members);
    let uri = served.uri("a");
    let ex = [("export", "a")];
    let in_place = || scrape_checked(metrics_port).get("raidnbd_export_read_in_place_bytes_total", &ex);

    qemu_io(&uri, &["write -P 0x11 0 16M", "read -P 0x11 0 16M", "read -P 0x11 1M 64K"]);
    assert_eq!(in_place(), (16 << 20) as f64, "the 16 MiB read in place, the 64 KiB one copied");

    // m0 fails; new data goes to m1 only, so m0's file is stale from here on.
    ctl(d, &socket, &["fail", &path("m0")]);
    qemu_io(&uri, &["write -P 0x22 0 16M", "read -P 0x22 0 16M"]);
    assert_eq!(in_place(), (32 << 20) as f64);

    // A spare rebuilds slowly: reads during recovery come from the in-sync copy where the
    // spare has no data yet (its file still holds zeros there).
    ctl(d, &socket, &["rebuild-speed", "1M", "1M"]);
    ctl(d, &socket, &["remove", &path("m0")]);
    ctl(d, &socket, &["add", &path("spare")]);
    wait_for(metrics_port, "recovery to start", |m| {
        m.get("raidnbd_array_maintenance_running", &[("export", "a"), ("kind", "recovery")]) == 1.0
    });
    qemu_io(&uri, &["read -P 0x22 0 16M", "read -P 0x22 8M 4M"]);
    assert_eq!(in_place(), (52 << 20) as f64);
    served.stop();

    // Behind a write-back cache, data not yet on the members is read from the cache.
    let served = Served::start(d, "a", &[&extra[..], &["--cache", "writeback"]].concat(), &["m1", "spare"]);
    let before = in_place();
    qemu_io(&served.uri("a"), &["write -P 0x33 0 16M", "read -P 0x33 0 16M"]);
    assert_eq!(in_place(), before, "no in-place reads behind the cache");
    served.stop();

    // Read-only, the member files are mapped read-only and reads still go out in place.
    let served = Served::start(d, "a", &[&extra[..], &["--read-only"]].concat(), &["m1", "spare"]);
    qemu_io_opened(&["-r"], &served.uri("a"), &["read -P 0x33 0 16M"]);
    assert_eq!(in_place(), (16 << 20) as f64, "read in place from a read-only export");
    let log = served.stop();
    assert!(!log.contains("cannot map a file"), "the read-only member files were mapped:\n{log}");
}

/// A RAID0 whose members are files in /dev/shm receives large writes straight into the
/// member files: the bytes read back right (also after a restart), the in-place counter and
/// the members' written bytes show it, the superblocks say "active" once data has landed,
/// and behind the write-back cache nothing is written in place.
#[test]
fn raid0_in_memory_receives_large_writes_into_member_files() {
    let dir = shm_tempdir();
    let d = dir.path();
    let members = ["m0", "m1"];
    assert_ok(&raidnbd(d, &[&["create", "--level", "0", "--size", "32M"][..], &members].concat()));
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let extra = ["--metrics", &metrics_addr];
    let ex = [("export", "a")];
    let in_place = || scrape_checked(metrics_port).get("raidnbd_export_write_in_place_bytes_total", &ex);
    let state = |name: &str| {
        let out = raidnbd(d, &["examine", name]);
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).lines().find(|l| l.trim_start().starts_with("State :")).unwrap().to_owned()
    };
    let written = [
        "read -P 0x11 0 1M",
        "read -P 0x22 1M 64K",
        "read -P 0x11 1088K 7104K",
        "read -P 0x33 8M 1M",
        "read -P 0x11 9M 7M",
    ];

    let served = Served::start(d, "a", &extra, &members);
    let uri = served.uri("a");
    qemu_io(&uri, &["write -P 0x11 0 16M"]);
    assert_eq!(in_place(), (16 << 20) as f64);
    assert!(state("m0").contains("active"), "marked dirty before data landed: {}", state("m0"));
    qemu_io(&uri, &["write -P 0x22 1M 64K", "write -f -P 0x33 8M 1M"]);
    qemu_io(&uri, &written);
    assert_eq!(in_place(), (17 << 20) as f64, "the 16 MiB and the FUA 1 MiB write in place, the 64 KiB one copied");
    let to_members = scrape_checked(metrics_port).sum("raidnbd_member_written_bytes_total", &ex);
    assert!(to_members >= (17 << 20) as f64 + 65536.0, "members count in-place bytes as written: {to_members}");
    served.stop();
    assert!(state("m0").contains("clean"), "{}", state("m0"));

    // The bytes are in the member files: a new server reads them back.
    let served = Served::start(d, "a", &extra, &members);
    qemu_io(&served.uri("a"), &written);
    served.stop();

    // Behind a write-back cache, writes go to the cache.
    let served = Served::start(d, "a", &[&extra[..], &["--cache", "writeback"]].concat(), &members);
    qemu_io(&served.uri("a"), &["write -P 0x44 0 16M", "read -P 0x44 0 16M"]);
    assert_eq!(in_place(), 0.0, "no in-place writes behind the cache");
    served.stop();
}

/// Pipelined 4 KiB writes to members written with O_DIRECT are received straight into
/// aligned buffers (the header after a WRITE is read alone): no copy after the receive, on a
/// RAID1 whose two legs share the one buffer. Members live on a disk filesystem (/var/tmp),
/// where O_DIRECT works; the member log must say so.
#[test]
fn small_writes_to_direct_members_are_not_copied() {
    require_tool("fio", "fio");
    let dir = tempfile::Builder::new().prefix("raidnbd-e2e").tempdir_in("/var/tmp").expect("a directory in /var/tmp");
    let d = dir.path();
    let members = ["m0", "m1"];
    assert_ok(&raidnbd(d, &[&["create", "--level", "1", "--size", "64M"][..], &members].concat()));
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let served = Served::start(d, "a", &["--metrics", &metrics_addr], &members);
    let log = served.log_text();
    assert!(
        log.lines().filter(|l| l.contains("member opened") && !l.contains("alignment=1 ")).count() == 2,
        "the members are not opened with O_DIRECT in /var/tmp (this test needs a disk filesystem there): {log}"
    );
    run_ok(Command::new("fio").args([
        "--name=small",
        "--ioengine=nbd",
        &format!("--uri={}", served.uri("a")),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--size=32M",
        "--io_size=32M",
        "--output=/dev/null",
    ]));
    let m = scrape_checked(metrics_port);
    let written = m.get("raidnbd_export_written_bytes_total", &[("export", "a")]);
    let copied = m.get("raidnbd_data_copied_bytes_total", &[]);
    assert_eq!(written, (32 << 20) as f64);
    // Only what the first read of the connection brought ahead of its headers is copied.
    assert!(copied / written < 0.01, "copies per byte written {:.3}", 1.0 + copied / written);
    served.stop();
}

#[test]
fn metrics_address_in_use_is_a_startup_error() {
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "8M", "m0", "m1"]));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = raidnbd(d, &["serve", "--listen", "127.0.0.1:0", "--metrics", &addr, "m0", "m1"]);
    assert_user_error(&out, "cannot listen for metrics");
    let out = raidnbd(d, &["serve", "--metrics", "localhost", "m0", "m1"]);
    assert_usage_error(&out, "--metrics");
}

#[test]
fn the_exposition_checker_rejects_malformed_text() {
    let good = "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"1\"} 2\n\
                # HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1e-05\"} 1\nh_bucket{le=\"10\"} 2\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
    assert_eq!(parse(good, false).get("x_total", &[("a", "1")]), 2.0);
    let bad = [
        ("no TYPE", "x 1\n".to_string()),
        ("declared twice", format!("{good}# HELP x_total X.\n# TYPE x_total counter\n")),
        ("unquoted label", good.replace("a=\"1\"", "a=1")),
        ("unterminated labels", good.replace("{a=\"1\"}", "{a=\"1\"")),
        ("no value", good.replace("x_total{a=\"1\"} 2", "x_total{a=\"1\"}")),
        ("not a number", good.replace("} 2\n", "} two\n")),
        ("wrong family", good.replace("h_sum", "g_sum")),
        ("not cumulative", good.replace("le=\"10\"} 2", "le=\"10\"} 0")),
        ("+Inf != count", good.replace("h_count 2", "h_count 3")),
        ("duplicate series", format!("{good}h_count 2\n")),
        ("OpenMetrics without EOF", good.replace("x_total{", "x_total_total{")),
    ];
    for (why, text) in bad {
        let openmetrics = why.starts_with("OpenMetrics");
        let result = std::panic::catch_unwind(|| parse(&text, openmetrics));
        assert!(result.is_err(), "accepted text with {why}:\n{text}");
    }
}
