//! member-io benchmark: io_uring vs the thread pool, run alternately in one process.
//!
//! Workloads (each engine gets the same file, the same queue depth, the same duration;
//! rounds alternate engines so drift in the machine affects all equally):
//! - `rand4k`: 4 KiB random reads at QD32 (O_DIRECT on ext4; whatever /dev/shm allows)
//! - `seqread` / `seqwrite`: 1 MiB sequential reads/writes at QD4
//! - `rings`: 4 KiB random reads at QD32 spread over 4 members, one shared ring vs a ring per member
//!
//! Engines: `uring (1 ring)`, `uring (2 rings)` (requests spread round-robin),
//! `uring (1 ring, registered bufs)`, `threads` (pread/pwrite pool). Each uring variant has
//! its own private ring threads, so they do not disturb each other.
//!
//! Run: `cargo bench -p member-io --bench member_bench -- [--secs S] [--rounds N] [--dir DIR] [--only W]`
//! (default: 1 s per run, 9 rounds, median reported, DIR = the target dir's tmp, ext4 here).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use member_io::{DirectMode, ThreadPoolMember, UringConfig, UringDriver, UringMember, create_sparse_file};
use raid_core::{AlignedBuf, Member};

const FILE_BYTES: u64 = 512 << 20;

struct Args {
    secs: f64,
    rounds: usize,
    dir: PathBuf,
    only: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args { secs: 1.0, rounds: 9, dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")), only: None };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--secs" => args.secs = it.next().and_then(|v| v.parse().ok()).expect("--secs SECONDS"),
            "--rounds" => args.rounds = it.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--dir" => args.dir = PathBuf::from(it.next().expect("--dir DIR")),
            "--only" => args.only = Some(it.next().expect("--only rand4k|seqread|seqwrite|rings")),
            "--bench" => {} // passed by `cargo bench`
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

#[derive(Clone, Copy)]
enum Workload {
    Rand4kRead,
    SeqRead,
    SeqWrite,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::Rand4kRead => "4 KiB random read QD32",
            Self::SeqRead => "1 MiB sequential read QD4",
            Self::SeqWrite => "1 MiB sequential write QD4",
        }
    }
    fn io_bytes(self) -> usize {
        match self {
            Self::Rand4kRead => 4096,
            Self::SeqRead | Self::SeqWrite => 1 << 20,
        }
    }
    fn depth(self) -> usize {
        match self {
            Self::Rand4kRead => 32,
            Self::SeqRead | Self::SeqWrite => 4,
        }
    }
}

/// CPU time (user + system, all threads) this process has used, in seconds.
fn cpu_secs() -> f64 {
    // SAFETY: rusage is plain data; zeroed is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a valid pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// One run's result.
#[derive(Clone, Copy)]
struct Sample {
    ops_per_sec: f64,
    /// Process CPU time per operation (µs): an efficiency figure that machine load distorts less.
    cpu_us_per_op: f64,
}

/// Runs `workload` on `members` (tasks spread round-robin) for `secs`.
async fn run(members: &[Arc<dyn Member>], workload: Workload, secs: f64) -> Sample {
    let io_bytes = workload.io_bytes();
    let ops = Arc::new(AtomicU64::new(0));
    let cursor = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let cpu_start = cpu_secs();
    let mut tasks = Vec::new();
    for t in 0..workload.depth() {
        let m = Arc::clone(&members[t % members.len()]);
        let (ops, cursor) = (Arc::clone(&ops), Arc::clone(&cursor));
        tasks.push(tokio::spawn(async move {
            let blocks = m.len_bytes() / io_bytes as u64;
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let mut buf = AlignedBuf::zeroed(io_bytes);
            buf.fill(0x5A);
            while Instant::now() < deadline {
                let block = match workload {
                    Workload::Rand4kRead => {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng % blocks
                    }
                    Workload::SeqRead | Workload::SeqWrite => cursor.fetch_add(1, Ordering::Relaxed) % blocks,
                };
                let offset = block * io_bytes as u64;
                let (res, back) = match workload {
                    Workload::SeqWrite => m.write_at(offset, buf, false).await,
                    _ => m.read_at(offset, buf).await,
                };
                res.expect("bench I/O");
                buf = back;
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = ops.load(Ordering::Relaxed) as f64;
    Sample { ops_per_sec: n / start.elapsed().as_secs_f64(), cpu_us_per_op: (cpu_secs() - cpu_start) * 1e6 / n }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Creates and fills a data file (reads of holes would not touch the disk).
async fn prepare_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    create_sparse_file(&path, FILE_BYTES).expect("create bench file");
    let m = ThreadPoolMember::open(&path, DirectMode::Auto, false).expect("open bench file");
    let mut buf = AlignedBuf::zeroed(4 << 20);
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    for chunk in 0..FILE_BYTES / (4 << 20) {
        let (res, back) = m.write_at(chunk * (4 << 20), buf, false).await;
        res.expect("fill bench file");
        buf = back;
    }
    m.flush().await.expect("flush bench file");
    path
}

struct Engine {
    name: &'static str,
    member: Arc<dyn Member>,
}

fn private_uring(path: &Path, direct: DirectMode, config: UringConfig) -> Arc<dyn Member> {
    let driver = UringDriver::start(&config).unwrap();
    if config.registered_buffers {
        assert!(driver.registered_slots() > 0, "registered buffers were refused (RLIMIT_MEMLOCK?)");
    }
    Arc::new(UringMember::open_on(path, direct, false, driver).unwrap())
}

/// The engines compared; the thread pool comes last (the ratio column divides by it).
fn open_engines(path: &Path, direct: DirectMode, variants: bool) -> Vec<Engine> {
    let one = UringConfig { ring_threads: 1, registered_buffers: false, ..UringConfig::default() };
    let two = UringConfig { ring_threads: 2, ..one.clone() };
    let mut engines = vec![Engine { name: "uring (2 rings, default here)", member: private_uring(path, direct, two) }];
    if variants {
        engines.push(Engine { name: "uring (1 ring)", member: private_uring(path, direct, one.clone()) });
        let reg = UringConfig { registered_buffers: true, ..one };
        engines.push(Engine { name: "uring (1 ring, registered bufs)", member: private_uring(path, direct, reg) });
    }
    engines.push(Engine { name: "threads", member: Arc::new(ThreadPoolMember::open(path, direct, false).unwrap()) });
    engines
}

async fn compare(label: &str, engines: &[Engine], workload: Workload, args: &Args) {
    let mut results: Vec<Vec<Sample>> = vec![Vec::new(); engines.len()];
    for round in 0..args.rounds {
        // Alternate the order every round so no engine always runs first or last.
        let order: Vec<usize> =
            if round % 2 == 0 { (0..engines.len()).collect() } else { (0..engines.len()).rev().collect() };
        for i in order {
            results[i].push(run(std::slice::from_ref(&engines[i].member), workload, args.secs).await);
        }
    }
    let medians: Vec<(f64, f64)> = results
        .iter()
        .map(|r| {
            let mut ops: Vec<f64> = r.iter().map(|s| s.ops_per_sec).collect();
            let mut cpu: Vec<f64> = r.iter().map(|s| s.cpu_us_per_op).collect();
            (median(&mut ops), median(&mut cpu))
        })
        .collect();
    let threads = medians[engines.len() - 1].0;
    for (e, ((ops, cpu), all)) in engines.iter().zip(medians.iter().zip(&results)) {
        let mib_s = ops * workload.io_bytes() as f64 / (1 << 20) as f64;
        let runs: Vec<String> = all.iter().map(|s| format!("{:.0}", s.ops_per_sec)).collect();
        println!(
            "| {label} | {} | {} | {ops:.0} | {mib_s:.0} | x{:.2} | {cpu:.1} | {} |",
            workload.name(),
            e.name,
            ops / threads,
            runs.join(" / ")
        );
    }
}

async fn compare_ring_sharing(path: &Path, args: &Args) {
    let members_on = |driver: Option<Arc<UringDriver>>| -> Vec<Arc<dyn Member>> {
        (0..4)
            .map(|_| {
                let driver = driver.clone().unwrap_or_else(|| {
                    UringDriver::start(&UringConfig { ring_threads: 1, ..UringConfig::default() }).unwrap()
                });
                Arc::new(UringMember::open_on(path, DirectMode::On, false, driver).unwrap()) as Arc<dyn Member>
            })
            .collect()
    };
    let setups = [
        (
            "one shared ring thread",
            members_on(Some(UringDriver::start(&UringConfig { ring_threads: 1, ..UringConfig::default() }).unwrap())),
        ),
        ("two shared ring threads (default)", members_on(Some(UringDriver::start(&UringConfig::default()).unwrap()))),
        (
            "four shared ring threads",
            members_on(Some(UringDriver::start(&UringConfig { ring_threads: 4, ..UringConfig::default() }).unwrap())),
        ),
        ("one ring thread per member", members_on(None)),
    ];
    let mut results: Vec<Vec<Sample>> = vec![Vec::new(); setups.len()];
    for round in 0..args.rounds {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..setups.len()).collect() } else { (0..setups.len()).rev().collect() };
        for i in order {
            results[i].push(run(&setups[i].1, Workload::Rand4kRead, args.secs).await);
        }
    }
    let base = median(&mut results[0].iter().map(|s| s.ops_per_sec).collect::<Vec<_>>());
    for ((name, _), r) in setups.iter().zip(&results) {
        let ops = median(&mut r.iter().map(|s| s.ops_per_sec).collect::<Vec<_>>());
        let cpu = median(&mut r.iter().map(|s| s.cpu_us_per_op).collect::<Vec<_>>());
        let runs: Vec<String> = r.iter().map(|s| format!("{:.0}", s.ops_per_sec)).collect();
        println!(
            "| ext4 O_DIRECT | 4 members, 4 KiB random read QD32 total | {name} | {ops:.0} | {:.0} | x{:.2} vs one ring | {cpu:.1} | {} |",
            ops * 4096.0 / (1 << 20) as f64,
            ops / base,
            runs.join(" / ")
        );
    }
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let wants = |w: &str| args.only.as_deref().is_none_or(|o| o == w);
        let ext4_dir = tempfile::Builder::new().prefix("member-bench-").tempdir_in(&args.dir).expect("bench dir");
        let shm_dir = tempfile::Builder::new().prefix("member-bench-").tempdir_in("/dev/shm").expect("/dev/shm");
        println!("member-io bench: {} s per run, {} rounds, median reported; ratio vs threads", args.secs, args.rounds);
        println!("| fs | workload | engine | ops/s | MiB/s | vs threads | CPU µs/op | runs (ops/s) |");
        println!("|---|---|---|---|---|---|---|---|");
        for (fs, dir, direct) in
            [("ext4", ext4_dir.path(), DirectMode::On), ("/dev/shm", shm_dir.path(), DirectMode::Auto)]
        {
            let path = prepare_file(dir, "bench.img").await;
            let label = if UringMember::open(&path, direct, false).unwrap().is_direct() {
                format!("{fs} O_DIRECT")
            } else {
                format!("{fs} buffered")
            };
            if wants("rand4k") {
                compare(&label, &open_engines(&path, direct, true), Workload::Rand4kRead, &args).await;
            }
            if wants("seqread") {
                compare(&label, &open_engines(&path, direct, false), Workload::SeqRead, &args).await;
            }
            if wants("seqwrite") {
                compare(&label, &open_engines(&path, direct, false), Workload::SeqWrite, &args).await;
            }
            if fs == "ext4" && wants("rings") {
                compare_ring_sharing(&path, &args).await;
            }
            std::fs::remove_file(&path).ok();
        }
    });
}
