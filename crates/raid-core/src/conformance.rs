//! The member conformance suite (feature `testing`): functions over any `Arc<dyn Member>`
//! that every backend and wrapper must pass — member-io runs it for its engines and
//! decorators, and a member in any other crate (an NBD client member, say) can run it too.
//! Members must be at least [`MIN_MEMBER_BYTES`] and start out zeroed.
//!
//! It needs no particular runtime: concurrency is `join_all` within the calling task, and
//! cancellation drops futures after a few polls (yielding in between) while their I/O is in
//! flight. Call it from a multi-threaded runtime when the member's completions need one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;

use crate::{AlignedBuf, Member};

/// Deterministic bytes for `(seed, len)` (xorshift).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Returns `Pending` once (waking itself), so other futures and the runtime get a turn.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(move |cx: &mut Context<'_>| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Polls `fut` `polls` times (yielding in between), then drops it unfinished if it is.
async fn poll_then_drop<F: Future>(fut: F, polls: u64) {
    let mut fut: Pin<Box<F>> = Box::pin(fut);
    for _ in 0..polls {
        let done = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await;
        if done {
            return;
        }
        yield_now().await;
    }
}

pub const MIN_MEMBER_BYTES: u64 = 8 << 20;

/// How the cancellation check learns about I/O a backend still holds after a future is dropped.
pub enum InFlight {
    /// The member completes every op inside its first poll (MemoryMember and wrappers of it).
    Synchronous,
    /// Ops the kernel or a worker still holds (e.g. `UringMember::in_flight_ops`).
    Counter(Box<dyn Fn() -> usize + Send + Sync>),
}

impl InFlight {
    pub fn counter(f: impl Fn() -> usize + Send + Sync + 'static) -> Self {
        Self::Counter(Box::new(f))
    }
    fn get(&self) -> usize {
        match self {
            Self::Synchronous => 0,
            Self::Counter(f) => f(),
        }
    }
}

/// Runs every conformance check.
pub async fn run_all(m: Arc<dyn Member>, in_flight: InFlight) {
    assert!(m.len_bytes() >= MIN_MEMBER_BYTES, "{}: member too small for the suite", m.name());
    let a = m.alignment();
    assert!(a.is_power_of_two() && a <= 4096, "{}: bad alignment {a}", m.name());
    round_trip_aligned(&*m).await;
    round_trip_unaligned(&*m).await;
    slice_writes(&*m).await;
    shared_writes(&*m).await;
    flush_after_write(&*m).await;
    discard_reads_zero(&*m).await;
    write_zeroes_reads_zero(&*m).await;
    past_end_is_error(&*m).await;
    allocation_is_truthful(&*m).await;
    concurrent_io(&m).await;
    cancellation_safety(&m, &in_flight).await;
}

pub async fn write(m: &dyn Member, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
    let (res, buf) = m.write_at(offset, AlignedBuf::from_slice(data), fua).await;
    assert_eq!(buf.as_slice(), data, "{}: write handed back a different buffer", m.name());
    res
}

pub async fn read(m: &dyn Member, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let (res, buf) = m.read_at(offset, AlignedBuf::zeroed(len)).await;
    assert_eq!(buf.len(), len, "{}: read handed back a buffer of another size", m.name());
    res.map(|()| buf.as_slice().to_vec())
}

/// Writes then reads back patterns at aligned offsets and sizes, with and without FUA.
pub async fn round_trip_aligned(m: &dyn Member) {
    let a = m.alignment().max(512) as u64;
    let cases: [(u64, usize); 6] = [
        (0, a as usize),
        (a, 4096),
        (8192, 64 << 10),
        (1 << 20, (1 << 20) + a as usize),
        (3 << 20, 3 * a as usize),
        (m.len_bytes() - a, a as usize),
    ];
    for (i, &(offset, len)) in cases.iter().enumerate() {
        let data = pattern(100 + i as u64, len);
        write(m, offset, &data, i % 2 == 1).await.unwrap_or_else(|e| panic!("{}: write {offset}+{len}: {e}", m.name()));
        let back = read(m, offset, len).await.unwrap_or_else(|e| panic!("{}: read {offset}+{len}: {e}", m.name()));
        assert!(back == data, "{}: round trip mismatch at {offset}+{len}", m.name());
    }
}

/// A quick round trip for small (>= 1 MiB) members: write, FUA write, flush, discard, read.
pub async fn round_trip_aligned_small(m: &dyn Member) {
    let data = pattern(42, 64 << 10);
    write(m, 0, &data, false).await.unwrap();
    write(m, 512 << 10, &data, true).await.unwrap();
    m.flush().await.unwrap();
    assert!(read(m, 0, 64 << 10).await.unwrap() == data, "{}: small round trip", m.name());
    assert!(read(m, 512 << 10, 64 << 10).await.unwrap() == data, "{}: small FUA round trip", m.name());
    m.discard(0, 64 << 10).await.unwrap();
    assert!(read(m, 0, 64 << 10).await.unwrap().iter().all(|&b| b == 0), "{}: discard reads zero", m.name());
}

/// Unaligned I/O: an O_DIRECT member rejects it with InvalidInput and changes nothing; a
/// member with alignment 1 round-trips it.
pub async fn round_trip_unaligned(m: &dyn Member) {
    let base = 5 << 20;
    let before = pattern(7, 8192);
    write(m, base, &before, false).await.unwrap();
    let a = m.alignment() as u64;
    if a > 1 {
        for (offset, len) in [(base + 100, 4096), (base, 100), (base + a / 2, a as usize)] {
            let err = write(m, offset, &pattern(8, len), false).await.expect_err("unaligned write must fail");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{}: {err}", m.name());
            let err = read(m, offset, len).await.expect_err("unaligned read must fail");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{}: {err}", m.name());
        }
        let err = m.discard(base + 1, a).await.expect_err("unaligned discard must fail");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = m.write_zeroes(base, a + 1).await.expect_err("unaligned write_zeroes must fail");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(read(m, base, 8192).await.unwrap() == before, "{}: rejected I/O changed data", m.name());
    } else {
        for (i, (offset, len)) in [(base + 13, 1usize), (base + 100, 777), (base + 4095, 4097)].into_iter().enumerate()
        {
            let data = pattern(200 + i as u64, len);
            write(m, offset, &data, false).await.unwrap();
            assert!(read(m, offset, len).await.unwrap() == data, "{}: unaligned round trip", m.name());
        }
    }
}

/// `write_slice_at` (borrowed bytes, copy-free on synchronous members): from an aligned and a
/// misaligned address, with FUA, and refused past the end, like `write_at`.
pub async fn slice_writes(m: &dyn Member) {
    let base = 6 << 20;
    let backing = pattern(21, (64 << 10) + 4096);
    let aligned = AlignedBuf::from_slice(&backing[..64 << 10]);
    m.write_slice_at(base, aligned.as_slice(), false).await.unwrap_or_else(|e| panic!("{}: {e}", m.name()));
    assert!(read(m, base, 64 << 10).await.unwrap() == aligned.as_slice(), "{}: slice write", m.name());
    // A slice starting 1 byte into its buffer: no alignment of the address is promised.
    let odd = &backing[1..1 + (32 << 10)];
    m.write_slice_at(base + (64 << 10), odd, true).await.unwrap_or_else(|e| panic!("{}: {e}", m.name()));
    assert!(read(m, base + (64 << 10), 32 << 10).await.unwrap() == odd, "{}: misaligned slice write", m.name());
    let a = m.alignment() as u64;
    let err = m.write_slice_at(m.len_bytes() - a, &backing[..2 * a as usize], false).await.expect_err("past end");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{}: {err}", m.name());
}

/// `write_shared_at` (shared pieces, written in place where the backend can): one piece and
/// several, from aligned memory and from addresses 1 byte into their buffer, with FUA, and
/// refused past the end, like `write_at`.
pub async fn shared_writes(m: &dyn Member) {
    let base = 7 << 20;
    let data = pattern(31, 128 << 10);
    let aligned = Bytes::from_owner(AlignedBuf::from_slice(&data));
    let cuts = [0, 4096, 68 << 10, 76 << 10, 128 << 10];
    let pieces = |whole: &Bytes| cuts.windows(2).map(|w| whole.slice(w[0]..w[1])).collect::<Vec<_>>();
    let name = m.name().to_owned();
    m.write_shared_at(base, vec![aligned.slice(..64 << 10)], false).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(read(m, base, 64 << 10).await.unwrap() == data[..64 << 10], "{name}: one shared piece");
    m.write_shared_at(base, pieces(&aligned), true).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(read(m, base, 128 << 10).await.unwrap() == data, "{name}: shared pieces");
    // The same bytes 1 byte into their buffer: no alignment of the addresses is promised.
    let mut odd = vec![0u8; 1 + data.len()];
    odd[1..].copy_from_slice(&pattern(32, data.len()));
    let odd = Bytes::from(odd).slice(1..);
    m.write_shared_at(base, pieces(&odd), false).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(read(m, base, 128 << 10).await.unwrap() == odd, "{name}: misaligned shared pieces");
    let a = m.alignment() as u64;
    let past = vec![aligned.slice(..a as usize), aligned.slice(..a as usize)];
    let err = m.write_shared_at(m.len_bytes() - a, past, false).await.expect_err("past end");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{name}: {err}");
}

pub async fn flush_after_write(m: &dyn Member) {
    let data = pattern(9, 64 << 10);
    write(m, 2 << 20, &data, false).await.unwrap();
    m.flush().await.unwrap_or_else(|e| panic!("{}: flush: {e}", m.name()));
    write(m, (2 << 20) + (64 << 10), &data, true).await.unwrap();
    m.flush().await.unwrap();
    assert!(read(m, 2 << 20, 64 << 10).await.unwrap() == data);
    assert!(read(m, (2 << 20) + (64 << 10), 64 << 10).await.unwrap() == data);
}

async fn zeroing_check(m: &dyn Member, discard: bool) {
    let base: u64 = if discard { 6 << 20 } else { 7 << 20 };
    let len = 1 << 20;
    let data = pattern(11, len);
    write(m, base, &data, false).await.unwrap();
    // Zero a block-aligned middle part, a sub-page piece and a large piece.
    let a = m.alignment().max(512) as u64;
    let ranges = [(base + 4096, 4096u64), (base + 65536 + a, a), (base + 131072, 512 << 10)];
    for &(offset, zlen) in &ranges {
        let res = if discard { m.discard(offset, zlen).await } else { m.write_zeroes(offset, zlen).await };
        res.unwrap_or_else(|e| {
            panic!("{}: {} {offset}+{zlen}: {e}", m.name(), if discard { "discard" } else { "write_zeroes" })
        });
    }
    let back = read(m, base, len).await.unwrap();
    for (i, (&got, &orig)) in back.iter().zip(&data).enumerate() {
        let pos = base + i as u64;
        let zeroed = ranges.iter().any(|&(o, l)| pos >= o && pos < o + l);
        let want = if zeroed { 0 } else { orig };
        assert_eq!(
            got,
            want,
            "{}: byte {pos} after {} (zeroed range: {zeroed})",
            m.name(),
            if discard { "discard" } else { "write_zeroes" }
        );
    }
    // Zero-length requests are no-ops.
    if discard { m.discard(base, 0).await.unwrap() } else { m.write_zeroes(base, 0).await.unwrap() }
}

pub async fn discard_reads_zero(m: &dyn Member) {
    zeroing_check(m, true).await;
}

pub async fn write_zeroes_reads_zero(m: &dyn Member) {
    zeroing_check(m, false).await;
}

/// `allocation` answers in order from the offset, covers at least one byte and no more than
/// asked, and every `zero` (holes included) it claims reads as zeros: over data, a discarded
/// range and untouched space. Past the end it fails like I/O.
pub async fn allocation_is_truthful(m: &dyn Member) {
    // Over what the zeroing checks left (data with zeroed and discarded pieces), plus a new
    // write with a discard in it.
    let base: u64 = 6 << 20;
    let len: u64 = 2 << 20;
    write(m, base + (1 << 20), &pattern(17, 512 << 10), false).await.unwrap();
    m.discard(base + (1 << 20) + (128 << 10), 128 << 10).await.unwrap();
    let content = read(m, base, len as usize).await.unwrap();
    let mut at = 0u64;
    while at < len {
        let extents = m.allocation(base + at, len - at).await.unwrap();
        let covered: u64 = extents.iter().map(|e| e.len_bytes).sum();
        assert!(
            covered > 0 && covered <= len - at,
            "{}: allocation covers 1..={} bytes, not {covered}",
            m.name(),
            len - at
        );
        for e in &extents {
            assert!(e.len_bytes > 0, "{}: an empty extent", m.name());
            if e.zero || e.hole {
                let bytes = &content[at as usize..(at + e.len_bytes) as usize];
                assert!(
                    bytes.iter().all(|&b| b == 0),
                    "{}: {} claimed zero at {}+{}",
                    m.name(),
                    if e.hole { "a hole" } else { "zero" },
                    base + at,
                    e.len_bytes
                );
            }
            at += e.len_bytes;
        }
    }
    assert!(m.allocation(m.len_bytes(), 4096).await.is_err(), "{}: allocation past the end", m.name());
}

/// Anything beyond the end fails (and offset overflow does not wrap).
pub async fn past_end_is_error(m: &dyn Member) {
    let len = m.len_bytes();
    let a = m.alignment().max(512) as u64;
    let last = len - a;
    read(m, last, 2 * a as usize).await.expect_err("read across the end must fail");
    read(m, len, a as usize).await.expect_err("read at the end must fail");
    write(m, len, &vec![1; a as usize], false).await.expect_err("write past the end must fail");
    m.discard(last, 2 * a).await.expect_err("discard past the end must fail");
    m.write_zeroes(len, a).await.expect_err("write_zeroes past the end must fail");
    let huge = u64::MAX - (a - 1);
    read(m, huge, a as usize).await.expect_err("overflowing offset must fail");
    // The member still works afterwards.
    assert!(read(m, last, a as usize).await.is_ok());
}

/// 64 concurrent 4 KiB writes to distinct blocks, then 64 concurrent reads (batching path).
pub async fn concurrent_io(m: &Arc<dyn Member>) {
    let base = 4u64 << 20;
    let data: Vec<Vec<u8>> = (0..64u64).map(|i| pattern(1000 + i, 4096)).collect();
    let writes = join_all(data.iter().enumerate().map(|(i, d)| write(&**m, base + i as u64 * 4096, d, false))).await;
    for (i, w) in writes.into_iter().enumerate() {
        w.unwrap_or_else(|e| panic!("{}: concurrent write {i}: {e}", m.name()));
    }
    let reads = join_all((0..64u64).map(|i| read(&**m, base + i * 4096, 4096))).await;
    for (i, r) in reads.into_iter().enumerate() {
        assert!(r.unwrap() == data[i], "{}: concurrent block {i}", m.name());
    }
}

// ---- cancellation ----------------------------------------------------------------------

const SECTOR: usize = 512;
const SLOT_BYTES: usize = 64 << 10;
const SLOTS: u64 = 64;
const MAGIC: u64 = 0x6d65_6d62_6572_696f; // "memberio"

/// A self-describing sector: header (magic, iteration, absolute sector) + pattern body.
fn stamped(iteration: u64, sector_index: u64) -> Vec<u8> {
    let mut s = pattern(iteration.wrapping_mul(1_000_003) ^ sector_index, SECTOR);
    s[..8].copy_from_slice(&MAGIC.to_le_bytes());
    s[8..16].copy_from_slice(&iteration.to_le_bytes());
    s[16..24].copy_from_slice(&sector_index.to_le_bytes());
    s
}

/// A sector is fine if it is all zero (never written) or a complete stamp for its position.
fn check_sector(m: &str, sector_index: u64, data: &[u8]) {
    if data.iter().all(|&b| b == 0) {
        return;
    }
    let magic = u64::from_le_bytes(data[..8].try_into().unwrap());
    let iteration = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let at = u64::from_le_bytes(data[16..24].try_into().unwrap());
    assert!(
        magic == MAGIC && at == sector_index,
        "{m}: sector {sector_index} holds foreign data (magic {magic:#x}, says {at})"
    );
    assert!(
        data == stamped(iteration, sector_index).as_slice(),
        "{m}: sector {sector_index} torn or corrupted (iteration {iteration})"
    );
}

fn stamped_region(iteration: u64, offset: u64, len: usize) -> Vec<u8> {
    let first = offset / SECTOR as u64;
    (0..(len / SECTOR) as u64).flat_map(|i| stamped(iteration, first + i)).collect()
}

/// Drops reads and writes mid-flight in many ways, then checks the member still works and
/// every sector holds either nothing or one complete write (no freed memory reached disk,
/// no read landed in memory someone else owns).
pub async fn cancellation_safety(m: &Arc<dyn Member>, in_flight: &InFlight) {
    let mut rng = 0x1234_5678_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    m.write_zeroes(0, SLOTS * SLOT_BYTES as u64).await.unwrap_or_else(|e| panic!("{}: clearing: {e}", m.name()));
    // 400 drops, and more (up to 4000) until at least 5 landed mid-flight: on a loaded
    // machine the backend's thread may not run between a poll and the drop for a while.
    let counted = matches!(in_flight, InFlight::Counter(_));
    let mut iterations = 0u64;
    let mut dropped_mid_flight = 0;
    for it in 1..=4000u64 {
        if it > 400 && (!counted || dropped_mid_flight >= 5) {
            break;
        }
        iterations = it;
        let r = next();
        // Mostly one 64 KiB slot; sometimes 1 MiB (16 slots) for long flights.
        let (offset, len) = if r % 8 == 0 {
            ((r >> 8) % 4 * (1 << 20), 1 << 20)
        } else {
            ((r >> 8) % SLOTS * SLOT_BYTES as u64, SLOT_BYTES)
        };
        let is_write = (r >> 3) % 2 == 0;
        let how = (r >> 4) % 3;
        let fut = {
            let m = Arc::clone(m);
            async move {
                if is_write && (r >> 5) % 2 == 0 {
                    // Shared pieces the backend must keep alive while the kernel reads them.
                    let whole = Bytes::from_owner(AlignedBuf::from_slice(&stamped_region(it, offset, len)));
                    let half = len / 2;
                    m.write_shared_at(offset, vec![whole.slice(..half), whole.slice(half..)], false).await
                } else if is_write {
                    let (res, _) =
                        m.write_at(offset, AlignedBuf::from_slice(&stamped_region(it, offset, len)), false).await;
                    res.map(drop)
                } else {
                    // Not checked here: a read may overlap a cancelled write still in flight.
                    // A read landing in freed memory would corrupt a later write's buffer (caught
                    // by the final check) or the allocator (a crash).
                    m.read_at(offset, AlignedBuf::zeroed(len)).await.0
                }
            }
        };
        // Dropped after 0-5 polls: at once, mid-submission, or while the kernel or a worker
        // holds the buffer.
        let polls = match how {
            0 => 0,
            1 => 1 + next() % 2,
            _ => 3 + next() % 3,
        };
        poll_then_drop(fut, polls).await;
        if in_flight.get() > 0 {
            dropped_mid_flight += 1;
        }
        // Allocate and drop buffers in between: freed memory gets reused quickly.
        let scratch = AlignedBuf::from_slice(&vec![0xEE; SLOT_BYTES]);
        drop(scratch);
    }
    eprintln!("{}: {dropped_mid_flight} of {iterations} futures dropped mid-flight", m.name());
    if let InFlight::Counter(_) = in_flight {
        // Proof that the check exercised what it claims: futures really were dropped while
        // the kernel or a worker still held their buffers. (Page-cache I/O on ramfs completes
        // almost inline, so only a few percent of drops land mid-flight there; disks: most.)
        assert!(
            dropped_mid_flight >= 5,
            "{}: only {dropped_mid_flight} of {iterations} drops were mid-flight",
            m.name()
        );
    }
    let waited = std::time::Instant::now();
    while in_flight.get() > 0 {
        assert!(waited.elapsed() < Duration::from_secs(60), "{}: cancelled I/O never completed", m.name());
        // Completions arrive on the backend's own threads; a short blocking nap is enough.
        std::thread::sleep(Duration::from_millis(2));
        yield_now().await;
    }
    let region = read(&**m, 0, SLOTS as usize * SLOT_BYTES)
        .await
        .unwrap_or_else(|e| panic!("{}: read after cancellations: {e}", m.name()));
    for (i, s) in region.chunks(SECTOR).enumerate() {
        check_sector(m.name(), i as u64, s);
    }
    // And the engine still serves ordinary I/O.
    round_trip_aligned(&**m).await;
}
