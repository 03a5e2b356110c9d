//! Throttle accuracy: a rate limiter test, not a speed test. Each case warms up past the
//! burst, then counts completed bytes/ops over a 2 s window with several requests in
//! flight, and expects the configured rate within ±5%.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use member_io::{DirectMode, Throttle, ThrottleConfig, Throttled, UringMember};
use raid_core::{AlignedBuf, Member, MemoryMember};

use crate::util::{require_uring, scratch_dir, sparse_file};

const WARMUP: Duration = Duration::from_millis(300);
const WINDOW: Duration = Duration::from_secs(2);

/// Runs `depth` reader tasks of `io_bytes` each; returns (bytes/s, ops/s) over the window.
async fn measure(m: Arc<dyn Member>, depth: usize, io_bytes: usize) -> (f64, f64) {
    let bytes = Arc::new(AtomicU64::new(0));
    let ops = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let span = m.len_bytes() / io_bytes as u64;
    let mut tasks = Vec::new();
    for t in 0..depth as u64 {
        let (m, bytes, ops, stop) = (Arc::clone(&m), Arc::clone(&bytes), Arc::clone(&ops), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut buf = AlignedBuf::zeroed(io_bytes);
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let (res, back) = m.read_at((i % span) * io_bytes as u64, buf).await;
                res.unwrap();
                buf = back;
                bytes.fetch_add(io_bytes as u64, Ordering::Relaxed);
                ops.fetch_add(1, Ordering::Relaxed);
                i += depth as u64;
            }
        }));
    }
    tokio::time::sleep(WARMUP).await;
    let (b0, o0, t0) = (bytes.load(Ordering::Relaxed), ops.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (b1, o1, elapsed) = (bytes.load(Ordering::Relaxed), ops.load(Ordering::Relaxed), t0.elapsed().as_secs_f64());
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    ((b1 - b0) as f64 / elapsed, (o1 - o0) as f64 / elapsed)
}

fn assert_within_5_percent(what: &str, measured: f64, configured: f64) {
    let ratio = measured / configured;
    eprintln!("{what}: measured {measured:.0}/s, configured {configured:.0}/s (x{ratio:.4})");
    assert!(
        (0.95..=1.05).contains(&ratio),
        "{what}: measured {measured:.0}/s vs configured {configured:.0}/s (x{ratio:.3})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_20mb_per_s_on_uring_member() {
    require_uring();
    let dir = scratch_dir();
    let inner = UringMember::open(sparse_file(dir.path(), "m", 64 << 20), DirectMode::On, false).unwrap();
    let cfg = ThrottleConfig { bytes_per_sec: Some(20_000_000), ..Default::default() };
    let m = Arc::new(Throttled::new(inner, Throttle::new(&cfg).unwrap()));
    let (bytes_per_s, _) = measure(m, 4, 64 << 10).await;
    assert_within_5_percent("bandwidth", bytes_per_s, 20e6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iops_200_counts_256k_units() {
    let cfg = ThrottleConfig { iops: Some(200), ..Default::default() };
    let m = Arc::new(Throttled::new(MemoryMember::new("m", 16 << 20), Throttle::new(&cfg).unwrap()));
    let (_, ops_per_s) = measure(m, 8, 4096).await;
    assert_within_5_percent("4 KiB IOPS", ops_per_s, 200.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iops_and_bandwidth_combined_like_a_cloud_volume() {
    // 1 MiB reads cost 4 IOPS tokens each: 400 IOPS allow 100 reads/s, but 20 MB/s allow
    // only ~19 reads/s, so bandwidth is the binding limit.
    let cfg = ThrottleConfig { bytes_per_sec: Some(20_000_000), iops: Some(400), ..Default::default() };
    let m = Arc::new(Throttled::new(MemoryMember::new("m", 16 << 20), Throttle::new(&cfg).unwrap()));
    let (bytes_per_s, _) = measure(Arc::clone(&m) as Arc<dyn Member>, 4, 1 << 20).await;
    assert_within_5_percent("bandwidth-bound 1 MiB reads", bytes_per_s, 20e6);
}

#[tokio::test(start_paused = true)]
async fn added_latency_delays_each_op() {
    let cfg = ThrottleConfig { latency: Duration::from_millis(20), ..Default::default() };
    let m = Throttled::new(MemoryMember::new("m", 1 << 20), Throttle::new(&cfg).unwrap());
    let t0 = tokio::time::Instant::now();
    let (res, _) = m.read_at(0, AlignedBuf::zeroed(4096)).await;
    res.unwrap();
    m.flush().await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_millis(40), "two ops, 20 ms each (virtual time)");
    // Concurrent ops overlap their latency.
    let t0 = tokio::time::Instant::now();
    let (a, b) = tokio::join!(m.read_at(0, AlignedBuf::zeroed(4096)), m.read_at(4096, AlignedBuf::zeroed(4096)));
    a.0.unwrap();
    b.0.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_millis(20));
}

#[tokio::test(start_paused = true)]
async fn burst_passes_then_paces() {
    // 100 IOPS with a 100 ms burst: 10 tokens banked (+1 that runs the bucket into debt)
    // pass at once, the rest at 10 ms intervals.
    let cfg = ThrottleConfig { iops: Some(100), burst: Duration::from_millis(100), ..Default::default() };
    let m = Throttled::new(MemoryMember::new("m", 1 << 20), Throttle::new(&cfg).unwrap());
    tokio::time::sleep(Duration::from_secs(1)).await; // idle: bucket full
    let t0 = tokio::time::Instant::now();
    for _ in 0..11 {
        m.read_at(0, AlignedBuf::zeroed(512)).await.0.unwrap();
    }
    assert_eq!(t0.elapsed(), Duration::ZERO, "burst passes immediately");
    for _ in 0..50 {
        m.read_at(0, AlignedBuf::zeroed(512)).await.0.unwrap();
    }
    let paced = t0.elapsed();
    assert!(
        paced >= Duration::from_millis(495) && paced <= Duration::from_millis(510),
        "50 ops at 100/s took {paced:?}"
    );
}
