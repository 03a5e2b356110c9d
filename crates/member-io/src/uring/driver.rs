//! The io_uring driver: dedicated ring threads (each owning one ring) fed from async tasks
//! through bounded channels, woken by an eventfd doorbell that the ring itself reads,
//! completing through oneshots. Requests are spread over the ring threads round-robin.
//!
//! ```text
//!  task ── Request{FileRef, Op(owned AlignedBuf), oneshot} ──► tokio mpsc (bounded) ──┐
//!       └─ if ring thread parked: write(eventfd, 1) ─────────────────────────────────┐│
//!                                                                                    ▼▼
//!  ring thread: loop { pull requests → SQEs (batch) ; park ; submit_and_wait(1) ; reap CQEs }
//!               an opcode::Read on the eventfd is always armed (user_data = DOORBELL_TAG),
//!               so a doorbell write completes it and wakes submit_and_wait
//!  task ◄── oneshot Completion{result, buffer} ◄── CQE: in_flight[user_data].take()
//! ```
//!
//! Invariants that make the `unsafe` pushes sound:
//! - every buffer and fd an SQE points at is owned by the `InFlight` entry stored under that
//!   SQE's `user_data` until its CQE is reaped; cancelled tasks only drop their receiver;
//! - the doorbell's 8-byte target is a `Box` field that outlives the ring, and the thread
//!   only exits after the armed doorbell read has completed;
//! - at most `cq_entries - 1` requests are in flight (plus the doorbell read), so the
//!   completion queue can never overflow and the slab never grows.
//!
//! Sharing: one process-wide set of ring threads serves every member ([`UringDriver::shared`]);
//! rings are never created per request or per member. The default is one ring thread per
//! core, at most two: on the 2-core project machines two rings beat one by 1.3-1.5x (both
//! cores submit and reap), while four shared rings or a ring per member measured no better
//! than two (README.md has the numbers). One ring already batches ~7 SQEs per
//! `io_uring_enter` at QD32. [`UringDriver::start`] makes private rings (the benchmark uses it).

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use raid_core::AlignedBuf;
use tokio::sync::{mpsc, oneshot};

use crate::error::{MemberIoError, Result};
use crate::file_ops::engine_gone;
use crate::member_file::FileRef;
use crate::sync_ops::IoVecs;
use crate::uring::registered::{RegisteredPool, memlock_budget_bytes};

const ENGINE: &str = "member-io io_uring thread";
/// `user_data` of the doorbell read; slab indices are far below it.
const DOORBELL_TAG: u64 = u64::MAX;
/// Requests waiting in the channel before senders wait (async backpressure).
const CHANNEL_CAPACITY: usize = 1024;

/// Settings for a set of ring threads.
#[derive(Debug, Clone)]
pub struct UringConfig {
    /// Submission queue entries (power of two); the completion queue is twice that.
    pub ring_entries: u32,
    /// Register a fixed-buffer pool (bounded by RLIMIT_MEMLOCK) for I/O up to 64 KiB.
    pub registered_buffers: bool,
    /// Ring threads (each with its own ring); requests are spread round-robin.
    pub ring_threads: usize,
}

impl Default for UringConfig {
    /// 256-entry rings, no registered buffers (measured no gain, README.md), one ring thread
    /// per core up to two.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self { ring_entries: 256, registered_buffers: false, ring_threads: cores.clamp(1, 2) }
    }
}

/// One member operation, owning whatever memory the kernel will touch.
pub(crate) enum Op {
    Read {
        offset_bytes: u64,
        buf: AlignedBuf,
        range: Range<usize>,
    },
    Write {
        offset_bytes: u64,
        buf: AlignedBuf,
        range: Range<usize>,
    },
    /// A gathering write of shared pieces (which `iovecs` owns).
    WritePieces {
        offset_bytes: u64,
        iovecs: IoVecs,
    },
    Fdatasync,
    Fallocate {
        mode: i32,
        offset_bytes: u64,
        len_bytes: u64,
    },
}

impl Op {
    fn into_buf(self) -> Option<AlignedBuf> {
        match self {
            Op::Read { buf, .. } | Op::Write { buf, .. } => Some(buf),
            Op::WritePieces { .. } | Op::Fdatasync | Op::Fallocate { .. } => None,
        }
    }
}

/// The outcome of one op: the CQE result (bytes or errno) and the buffer, if it had one.
pub(crate) struct Completion {
    pub(crate) result: io::Result<u32>,
    pub(crate) buf: Option<AlignedBuf>,
}

struct Request {
    file: FileRef,
    op: Op,
    reply: oneshot::Sender<Completion>,
}

/// The eventfd the ring keeps a read armed on, plus the "ring thread is about to sleep" flag.
struct Doorbell {
    eventfd: OwnedFd,
    parked: AtomicBool,
}

impl Doorbell {
    fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes plain integers and returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a freshly created descriptor nobody else owns.
        Ok(Self { eventfd: unsafe { OwnedFd::from_raw_fd(fd) }, parked: AtomicBool::new(false) })
    }

    /// Wakes the ring thread if it is (about to be) asleep. Pairs with the thread's
    /// `parked = true; fence; check channel` (Dekker-style: one side always sees the other).
    fn ring_if_parked(&self) {
        fence(Ordering::SeqCst);
        // Load first: the swap writes the cache line the ring thread also writes, so only
        // pay for it when the thread is parked.
        if self.parked.load(Ordering::SeqCst) && self.parked.swap(false, Ordering::SeqCst) {
            self.ring();
        }
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an eventfd we own.
        let n = unsafe { libc::write(self.eventfd.as_raw_fd(), (&raw const one).cast(), 8) };
        debug_assert_eq!(n, 8, "eventfd write: {}", io::Error::last_os_error());
    }
}

/// The sending side of one ring thread. Dropping it lets the thread drain and exit.
struct RingHandle {
    tx: Option<mpsc::Sender<Request>>,
    doorbell: Arc<Doorbell>,
}

impl Drop for RingHandle {
    fn drop(&mut self) {
        drop(self.tx.take());
        // Wake the thread so it notices the closed channel.
        self.doorbell.ring();
    }
}

/// Handle to one or more ring threads; requests are spread over them round-robin.
pub struct UringDriver {
    rings: Vec<RingHandle>,
    next_ring: AtomicUsize,
    registered_slots: usize,
}

impl UringDriver {
    /// Starts private ring threads (the factory uses [`UringDriver::shared`]).
    pub fn start(config: &UringConfig) -> Result<Arc<Self>> {
        assert!(config.ring_threads >= 1, "at least one ring thread");
        let mut rings = Vec::with_capacity(config.ring_threads);
        let mut registered_slots = 0;
        for _ in 0..config.ring_threads {
            let (ring, slots) = start_ring_thread(config)?;
            rings.push(ring);
            registered_slots += slots;
        }
        Ok(Arc::new(Self { rings, next_ring: AtomicUsize::new(0), registered_slots }))
    }

    /// The process-wide ring threads every io_uring member shares (started on first use
    /// with [`UringConfig::default`]).
    pub fn shared() -> Result<Arc<Self>> {
        Self::shared_with(&UringConfig::default())
    }

    /// Like [`UringDriver::shared`], but starts the shared rings with `config` if this is
    /// the first use (call it before opening members to tune the rings; later calls return
    /// the running rings unchanged).
    pub fn shared_with(config: &UringConfig) -> Result<Arc<Self>> {
        static SHARED: Mutex<Option<Arc<UringDriver>>> = Mutex::new(None);
        let mut shared = SHARED.lock().expect("shared ring lock");
        if let Some(driver) = shared.as_ref() {
            return Ok(Arc::clone(driver));
        }
        let driver = Self::start(config)?;
        tracing::debug!(
            ring_threads = driver.ring_threads(),
            registered_slots = driver.registered_slots(),
            "io_uring rings started"
        );
        *shared = Some(Arc::clone(&driver));
        Ok(driver)
    }

    /// Number of ring threads behind this handle.
    pub fn ring_threads(&self) -> usize {
        self.rings.len()
    }

    /// Number of registered buffer slots over all rings (0 when disabled or refused by RLIMIT_MEMLOCK).
    pub fn registered_slots(&self) -> usize {
        self.registered_slots
    }

    /// Hands `op` to a ring thread and waits for its completion. Dropping the returned
    /// future at any point is safe: the ring thread keeps `op`'s memory until the CQE.
    pub(crate) async fn submit(&self, file: FileRef, op: Op) -> Completion {
        let ring = &self.rings[self.next_ring.fetch_add(1, Ordering::Relaxed) % self.rings.len()];
        let (reply, completion) = oneshot::channel();
        let tx = ring.tx.as_ref().expect("sender present until drop");
        if let Err(mpsc::error::SendError(req)) = tx.send(Request { file, op, reply }).await {
            return Completion { result: Err(engine_gone(ENGINE)), buf: req.op.into_buf() };
        }
        ring.doorbell.ring_if_parked();
        completion.await.unwrap_or_else(|_| Completion { result: Err(engine_gone(ENGINE)), buf: None })
    }
}

/// Starts one ring thread; returns its handle and its registered slot count once the ring exists.
fn start_ring_thread(config: &UringConfig) -> Result<(RingHandle, usize)> {
    let doorbell = Arc::new(Doorbell::new().map_err(|source| MemberIoError::RingSetup { source })?);
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let thread_doorbell = Arc::clone(&doorbell);
    let config = config.clone();
    std::thread::Builder::new()
        .name("member-io-uring".into())
        .spawn(move || match RingThread::new(&config, rx, thread_doorbell) {
            Ok(thread) => {
                let _ = ready_tx.send(Ok(thread.pool.as_ref().map_or(0, RegisteredPool::slots)));
                thread.run();
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|source| MemberIoError::RingSetup { source })?;
    let registered_slots = ready_rx
        .recv()
        .map_err(|_| MemberIoError::RingSetup { source: engine_gone(ENGINE) })?
        .map_err(|source| MemberIoError::RingSetup { source })?;
    Ok((RingHandle { tx: Some(tx), doorbell }, registered_slots))
}

/// A request the kernel is working on, and the registered slot it uses (if any).
struct InFlight {
    req: Request,
    fixed_slot: Option<u16>,
}

/// State owned by the ring thread. Field order matters: `ring` drops before the memory
/// registered with it (`pool`) and before the doorbell target (`doorbell_target`).
struct RingThread {
    ring: IoUring,
    pool: Option<RegisteredPool>,
    doorbell_target: Box<u64>,
    doorbell_armed: bool,
    doorbell: Arc<Doorbell>,
    rx: mpsc::Receiver<Request>,
    closed: bool,
    slab: Vec<Option<InFlight>>,
    free_entries: Vec<usize>,
    /// Reused scratch list of (user_data, result) from one pass over the CQ.
    reaped: Vec<(u64, i32)>,
}

impl RingThread {
    fn new(config: &UringConfig, rx: mpsc::Receiver<Request>, doorbell: Arc<Doorbell>) -> io::Result<Self> {
        let ring = build_ring(config.ring_entries)?;
        let pool = if config.registered_buffers { register_pool(&ring) } else { None };
        // One CQ slot stays free for the doorbell read.
        let max_in_flight = ring.params().cq_entries() as usize - 1;
        assert!(max_in_flight >= 1 && (max_in_flight as u64) < DOORBELL_TAG);
        Ok(Self {
            ring,
            pool,
            doorbell_target: Box::new(0),
            doorbell_armed: false,
            doorbell,
            rx,
            closed: false,
            slab: (0..max_in_flight).map(|_| None).collect(),
            free_entries: (0..max_in_flight).rev().collect(),
            reaped: Vec::with_capacity(max_in_flight + 1),
        })
    }

    /// Requests submitted and not yet completed (every slab entry not on the free list).
    fn in_flight(&self) -> usize {
        self.slab.len() - self.free_entries.len()
    }

    fn run(mut self) {
        loop {
            if !self.doorbell_armed {
                self.arm_doorbell();
            }
            self.pull_requests();
            if self.closed && self.in_flight() == 0 {
                break;
            }
            // Announce sleep, then look again: a sender either sees `parked` or we see its request.
            self.doorbell.parked.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let more_waiting = !self.free_entries.is_empty() && !self.rx.is_empty();
            if more_waiting {
                self.doorbell.parked.store(false, Ordering::SeqCst);
            }
            let submitted = self.ring.submit_and_wait(usize::from(!more_waiting));
            self.doorbell.parked.store(false, Ordering::SeqCst);
            if let Err(e) = submitted
                && !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN))
            {
                tracing::error!("io_uring_enter failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.reap();
        }
        self.disarm_doorbell();
    }

    /// Moves channel requests into the submission queue while there is room in flight.
    fn pull_requests(&mut self) {
        while !self.free_entries.is_empty() {
            if self.ring.submission().is_full() {
                if let Err(e) = self.ring.submit() {
                    tracing::debug!("io_uring submit with full SQ: {e}");
                }
                if self.ring.submission().is_full() {
                    return;
                }
            }
            match self.rx.try_recv() {
                Ok(req) => self.start(req),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    fn start(&mut self, mut req: Request) {
        let index = self.free_entries.pop().expect("caller checked for a free entry");
        let fd = types::Fd(req.file.raw_fd());
        let mut fixed_slot = None;
        let entry = match &mut req.op {
            Op::Read { offset_bytes, buf, range } => {
                debug_assert!(range.end <= buf.len() && range.len() <= u32::MAX as usize);
                let len = range.len() as u32;
                match self.pool.as_mut().and_then(|p| p.take(range.len()).map(|s| (s, p.slot_mut(s).as_mut_ptr()))) {
                    Some((slot, ptr)) => {
                        fixed_slot = Some(slot);
                        opcode::ReadFixed::new(fd, ptr, len, slot).offset(*offset_bytes).build()
                    }
                    None => {
                        // SAFETY: range.start <= buf.len(), so the pointer stays within the allocation.
                        let ptr = unsafe { buf.as_mut_ptr().add(range.start) };
                        opcode::Read::new(fd, ptr, len).offset(*offset_bytes).build()
                    }
                }
            }
            Op::Write { offset_bytes, buf, range } => {
                debug_assert!(range.end <= buf.len() && range.len() <= u32::MAX as usize);
                let len = range.len() as u32;
                let data = &buf.as_slice()[range.clone()];
                match self.pool.as_mut().and_then(|p| p.take(data.len()).map(|s| (s, p))) {
                    Some((slot, pool)) => {
                        fixed_slot = Some(slot);
                        let target = &mut pool.slot_mut(slot)[..data.len()];
                        target.copy_from_slice(data);
                        opcode::WriteFixed::new(fd, target.as_ptr(), len, slot).offset(*offset_bytes).build()
                    }
                    None => opcode::Write::new(fd, data.as_ptr(), len).offset(*offset_bytes).build(),
                }
            }
            Op::WritePieces { offset_bytes, iovecs, .. } => {
                opcode::Writev::new(fd, iovecs.as_ptr(), iovecs.count() as u32).offset(*offset_bytes).build()
            }
            Op::Fdatasync => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Op::Fallocate { mode, offset_bytes, len_bytes } => {
                opcode::Fallocate::new(fd, *len_bytes).offset(*offset_bytes).mode(*mode).build()
            }
        };
        self.slab[index] = Some(InFlight { req, fixed_slot });
        self.push(entry.user_data(index as u64));
    }

    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: the memory and fd the entry refers to are owned by `self.slab` (or are the
        // doorbell target / pool, which outlive the ring) until the matching CQE is reaped.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        pushed.expect("caller ensured SQ space");
    }

    fn arm_doorbell(&mut self) {
        if self.ring.submission().is_full() {
            let _ = self.ring.submit();
        }
        let target: *mut u64 = &mut *self.doorbell_target;
        let entry = opcode::Read::new(types::Fd(self.doorbell.eventfd.as_raw_fd()), target.cast(), 8)
            .build()
            .user_data(DOORBELL_TAG);
        self.push(entry);
        self.doorbell_armed = true;
    }

    fn reap(&mut self) {
        let mut reaped = std::mem::take(&mut self.reaped);
        reaped.extend(self.ring.completion().map(|cqe: cqueue::Entry| (cqe.user_data(), cqe.result())));
        for &(user_data, res) in &reaped {
            if user_data == DOORBELL_TAG {
                self.doorbell_armed = false;
            } else {
                self.complete(user_data as usize, res);
            }
        }
        reaped.clear();
        self.reaped = reaped;
    }

    fn complete(&mut self, index: usize, res: i32) {
        let InFlight { req, fixed_slot } = self.slab[index].take().expect("CQE for an entry in flight");
        self.free_entries.push(index);
        let Request { file, op, reply } = req;
        let result = if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as u32) };
        let buf = match op {
            Op::Read { mut buf, range, .. } => {
                if let (Some(slot), Some(pool)) = (fixed_slot, self.pool.as_mut()) {
                    let n = usize::try_from(res).unwrap_or(0).min(range.len());
                    buf.as_mut_slice()[range.start..range.start + n].copy_from_slice(&pool.slot_mut(slot)[..n]);
                    pool.release(slot);
                }
                Some(buf)
            }
            op @ Op::Write { .. } => {
                if let (Some(slot), Some(pool)) = (fixed_slot, self.pool.as_mut()) {
                    pool.release(slot);
                }
                op.into_buf()
            }
            Op::WritePieces { .. } | Op::Fdatasync | Op::Fallocate { .. } => None,
        };
        // A closed receiver means the task was cancelled; its buffer is dropped right here.
        let _ = reply.send(Completion { result, buf });
        drop(file);
    }

    /// Completes the armed doorbell read before the ring (and its target) go away.
    fn disarm_doorbell(&mut self) {
        while self.doorbell_armed {
            self.doorbell.ring();
            if let Err(e) = self.ring.submit_and_wait(1)
                && !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN))
            {
                // Cannot prove the kernel is done with the target: leak it rather than risk a write into freed memory.
                tracing::error!("io_uring_enter failed while shutting down: {e}");
                std::mem::forget(std::mem::replace(&mut self.doorbell_target, Box::new(0)));
                return;
            }
            self.reap();
        }
    }
}

impl Drop for RingThread {
    /// Runs before the fields (ring, buffers) are dropped. If the thread is unwinding from a
    /// bug while the kernel still owns buffers, freeing them could let a DMA land in memory
    /// that is reused elsewhere: abort instead.
    fn drop(&mut self) {
        if self.in_flight() > 0 && std::thread::panicking() {
            eprintln!("member-io: io_uring thread panicked with {} requests in flight; aborting", self.in_flight());
            std::process::abort();
        }
        debug_assert!(self.in_flight() == 0 || std::thread::panicking());
    }
}

fn build_ring(entries: u32) -> io::Result<IoUring> {
    // Only this thread submits (SINGLE_ISSUER), and completion task work need not interrupt
    // it with an IPI (COOP_TASKRUN): it runs on the thread's next io_uring_enter. Not
    // DEFER_TASKRUN: that would hold completions back whenever we enter without waiting
    // (while more requests are queued), adding latency under load. Older kernels reject
    // the flags with EINVAL; a plain ring works the same, a little less efficiently.
    match IoUring::builder().setup_single_issuer().setup_coop_taskrun().build(entries) {
        Ok(ring) => Ok(ring),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder().build(entries),
        Err(e) => Err(e),
    }
}

fn register_pool(ring: &IoUring) -> Option<RegisteredPool> {
    let budget_bytes = memlock_budget_bytes();
    match RegisteredPool::register(ring, budget_bytes) {
        Ok(pool) => {
            tracing::debug!(slots = pool.slots(), "io_uring registered buffers enabled");
            Some(pool)
        }
        Err(e) => {
            tracing::warn!(
                "io_uring registered buffers unavailable ({e}); using unregistered Read/Write. \
                 Fix: raise RLIMIT_MEMLOCK (systemd LimitMEMLOCK=, ulimit -l)"
            );
            None
        }
    }
}
