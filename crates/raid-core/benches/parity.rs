//! Parity throughput, every available implementation side by side in one run, so ratios
//! (SIMD / scalar) are measured under the same machine conditions.
//!
//! Groups (throughput = bytes of data read, per call, one core):
//! - `xor_into`: `dst ^= src` (bytes of src).
//! - `p_gen_{m}d`: RAID5 P of m data blocks (`compute_parity` without Q).
//! - `pq_gen_{m}d`: RAID6 P+Q of m data blocks in md slot order.
//! - `recover_2data_{m}d`: two lost data blocks of an m-data RAID6 stripe rebuilt (counted
//!   as the m blocks of data the stripe carries).
//!
//! Blocks are page-aligned [`AlignedBuf`]s, as the engine's member I/O buffers are.
//!
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time: the
//! project's machines are shared, and wall time would also count the time the thread spends
//! descheduled. Throughputs are therefore per core while running.
//!
//! Run: `cargo bench -p raid-core --bench parity -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use raid_core::AlignedBuf;
use raid_core::parity::{BlockKind, ParityImpl};

/// Criterion measurement: CPU time consumed by the calling thread.
struct ThreadCpuTime;

fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu_time()
    }
    fn end(&self, started: Duration) -> Duration {
        thread_cpu_time().saturating_sub(started)
    }
    fn add(&self, v1: &Duration, v2: &Duration) -> Duration {
        *v1 + *v2
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Durations in nanoseconds, formatted like wall time.
        static WALL_TIME: WallTime = WallTime;
        WALL_TIME.formatter()
    }
}

type Bench = Criterion<ThreadCpuTime>;

const BLOCK_SIZES: [(usize, &str); 3] = [(4 << 10, "4KiB"), (64 << 10, "64KiB"), (1 << 20, "1MiB")];
const DATA_COUNTS: [usize; 2] = [4, 8];

/// A page-aligned block of pseudo-random bytes, like the engine's member I/O buffers.
fn random_block(len: usize, seed: u64) -> AlignedBuf {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    AlignedBuf::from_slice(&bytes)
}

/// m data blocks (exponents 0..m) followed by P and, if `with_q`, Q.
fn stripe(data_count: usize, block_len: usize, with_q: bool) -> (Vec<AlignedBuf>, Vec<BlockKind>) {
    let mut blocks: Vec<AlignedBuf> = (0..data_count).map(|i| random_block(block_len, i as u64 + 1)).collect();
    let mut kinds: Vec<BlockKind> = (0..data_count).map(|i| BlockKind::Data { exponent: i as u8 }).collect();
    blocks.push(AlignedBuf::zeroed(block_len));
    kinds.push(BlockKind::P);
    if with_q {
        blocks.push(AlignedBuf::zeroed(block_len));
        kinds.push(BlockKind::Q);
    }
    (blocks, kinds)
}

fn bench_xor(c: &mut Bench) {
    let mut group = c.benchmark_group("xor_into");
    for (block_len, size_name) in BLOCK_SIZES {
        let src = random_block(block_len, 1);
        let mut dst = random_block(block_len, 2);
        group.throughput(Throughput::Bytes(block_len as u64));
        for imp in ParityImpl::available() {
            group.bench_function(BenchmarkId::new(imp.name(), size_name), |b| {
                b.iter(|| imp.xor_into(black_box(dst.as_mut_slice()), black_box(src.as_slice())))
            });
        }
    }
    group.finish();
}

fn bench_generation(c: &mut Bench, with_q: bool) {
    for data_count in DATA_COUNTS {
        let name = if with_q { format!("pq_gen_{data_count}d") } else { format!("p_gen_{data_count}d") };
        let mut group = c.benchmark_group(name);
        for (block_len, size_name) in BLOCK_SIZES {
            let (mut blocks, kinds) = stripe(data_count, block_len, with_q);
            group.throughput(Throughput::Bytes((data_count * block_len) as u64));
            for imp in ParityImpl::available() {
                group.bench_function(BenchmarkId::new(imp.name(), size_name), |b| {
                    b.iter(|| {
                        let mut refs: Vec<&mut [u8]> = blocks.iter_mut().map(AlignedBuf::as_mut_slice).collect();
                        imp.compute_parity(black_box(&mut refs), &kinds)
                    })
                });
            }
        }
        group.finish();
    }
}

fn bench_recovery(c: &mut Bench) {
    for data_count in DATA_COUNTS {
        let mut group = c.benchmark_group(format!("recover_2data_{data_count}d"));
        for (block_len, size_name) in BLOCK_SIZES {
            let (mut blocks, kinds) = stripe(data_count, block_len, true);
            {
                let mut refs: Vec<&mut [u8]> = blocks.iter_mut().map(AlignedBuf::as_mut_slice).collect();
                ParityImpl::Scalar.compute_parity(&mut refs, &kinds);
            }
            let expected = blocks.clone();
            let missing = [1, data_count - 1];
            group.throughput(Throughput::Bytes((data_count * block_len) as u64));
            for imp in ParityImpl::available() {
                group.bench_function(BenchmarkId::new(imp.name(), size_name), |b| {
                    b.iter(|| {
                        let mut refs: Vec<&mut [u8]> = blocks.iter_mut().map(AlignedBuf::as_mut_slice).collect();
                        assert!(imp.reconstruct(black_box(&mut refs), &kinds, &missing));
                    })
                });
                assert!(blocks == expected, "{} rebuilt wrong bytes", imp.name());
            }
        }
        group.finish();
    }
}

fn parity(c: &mut Bench) {
    bench_xor(c);
    bench_generation(c, false);
    bench_generation(c, true);
    bench_recovery(c);
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = parity
}
criterion_main!(benches);
