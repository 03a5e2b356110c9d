//! Full-stripe gathering for raid4/5/6 (what md's stripe cache does for sequential writes):
//! a write that ends inside a stripe, in a stream of writes that follow one another, waits a
//! bounded time for the write that continues it, so that sequential writes of any size
//! reach the members as whole stripes (parity from the new data alone) instead of one
//! read-modify-write per request.
//!
//! Contract:
//! - Nothing is acknowledged before it is on the members: a gathered write completes when
//!   the combined write does, with its result. FUA holds (the combined write is FUA when any
//!   part asked for it); FLUSH covers what was acknowledged before it, as always.
//! - A group grows at both ends (requests are dispatched in parallel, so the write that
//!   comes next on the wire may arrive first), and two groups become one when the write
//!   between them arrives. It waits a window at a time: it goes as soon as it covers whole
//!   stripes and at least [`MERGE_TARGET_BYTES`] (so that small stripes still make large
//!   member writes: a cloud volume counts I/Os); after a window in which no write was on
//!   the members and none finished (nothing is coming soon: a client at queue depth 1); and
//!   after [`BUSY_WINDOWS`] windows at most while writes are busy (the members are busy
//!   anyway, and the writes that complete the stripe come when those finish: md's stripe
//!   cache likewise delays stripes that need pre-reads while the array has other work). A
//!   group that starts inside a stripe goes once it holds a whole stripe, so the next one
//!   starts on a boundary. A group is bounded by [`MAX_GROUP_BYTES`].
//! - Only writes within [`NEAR_LENGTHS`] of their own length from a recent write wait, so
//!   random writes (almost) never do; and after [`MISS_LIMIT`] waits in a row that nobody
//!   joined (a stream at queue depth 1), only one in [`PROBE_EVERY`] waits until a wait is
//!   joined again.
//! - A group is led by its first write, which does the combined write. If the leader's
//!   future is dropped before it finishes, the others do their own writes (a write is
//!   idempotent under its stripe locks).
//!
//! Time comes from an injected [`Timer`] (raid-core has no runtime; a simulator can run
//! it on a virtual clock).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;

use crate::error::{RaidError, Result};
use crate::payload::{Gathered, Payload};

/// Sleeps for a duration (the binary gives tokio's).
pub trait Timer: Send + Sync {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// While other writes are on the members, a group waits at most this many windows.
pub const BUSY_WINDOWS: u32 = 128;

/// A group of whole stripes goes once it holds this much (or one stripe, if larger).
pub const MERGE_TARGET_BYTES: usize = 1 << 20;

/// A group closes at this many bytes even if it ends inside a stripe.
pub const MAX_GROUP_BYTES: usize = 16 << 20;
/// A write this many of its lengths from a recent one counts as part of a stream.
const NEAR_LENGTHS: u64 = 8;
/// This many recent writes are remembered (to tell streams from random writes).
const RECENT_WRITES: usize = 64;
/// After this many unjoined waits in a row, waiting becomes a probe.
const MISS_LIMIT: u64 = 4;
const PROBE_EVERY: u64 = 16;

pub(crate) struct Gather {
    window: Duration,
    timer: Arc<dyn Timer>,
    inner: Mutex<Inner>,
    /// Waits in a row that nobody joined; writes that skipped waiting since.
    misses: AtomicU64,
    skipped: AtomicU64,
    /// Writes that joined a group (for tests and status).
    pub joined: AtomicU64,
    /// Writes (alone, or a group's combined one) on the members now, and finished so far.
    executing: AtomicU64,
    finished: AtomicU64,
}

/// Counts a write on the members while it lives.
pub(crate) struct Executing<'a>(&'a Gather);

impl Drop for Executing<'_> {
    fn drop(&mut self) {
        self.0.executing.fetch_sub(1, Ordering::Relaxed);
        self.0.finished.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Inner {
    /// Open groups by the sector they end at and by the one they start at.
    by_end: HashMap<u64, Arc<Group>>,
    by_start: HashMap<u64, Arc<Group>>,
    /// `[start, end)` sectors of recent writes.
    recent: VecDeque<(u64, u64)>,
}

impl Inner {
    fn unlink(&mut self, group: &Arc<Group>, start: u64, end: u64) {
        if self.by_end.get(&end).is_some_and(|g| Arc::ptr_eq(g, group)) {
            self.by_end.remove(&end);
        }
        if self.by_start.get(&start).is_some_and(|g| Arc::ptr_eq(g, group)) {
            self.by_start.remove(&start);
        }
    }
}

struct Group {
    state: Mutex<GroupState>,
}

type JoinResult = std::result::Result<(), (crate::error::ErrorKind, String)>;

struct GroupState {
    start_sector: u64,
    end_sector: u64,
    /// Every part's data, in sector order (contiguous).
    pieces: VecDeque<Bytes>,
    bytes: usize,
    fua: bool,
    joiners: Vec<oneshot::Sender<JoinResult>>,
    /// Tells the leader to go (the group is full) or that its group was merged into the one
    /// before it.
    full: Option<oneshot::Sender<Signal>>,
    closed: bool,
}

enum Signal {
    Full,
    /// Merged into another group: wait for its leader's result, like a joiner.
    Merged(oneshot::Receiver<JoinResult>),
}

/// What a leader does after waiting.
pub(crate) enum Outcome {
    /// Write `data` at sector `first` (FUA if any part asked), then [`Leader::finish`].
    Go { first: u64, data: Payload<'static>, fua: bool },
    /// Its group was merged into another: the result comes from that group's leader.
    Merged(oneshot::Receiver<JoinResult>),
}

/// What a write should do.
pub(crate) enum Role<'a> {
    /// Write on its own, now.
    Alone,
    /// It joined a group: wait for the leader's result (`Err(Canceled)`: do it yourself).
    Joined(oneshot::Receiver<JoinResult>),
    /// Lead a new group: [`Leader::wait`], write, [`Leader::finish`].
    Lead(Leader<'a>),
}

/// The leader's hold on its group. Dropped before `finish` (the leader's future went
/// away), it closes the group and lets the joiners go: each writes its own data.
pub(crate) struct Leader<'a> {
    gather: &'a Gather,
    group: Option<Arc<Group>>,
    full: Option<oneshot::Receiver<Signal>>,
}

/// Moves `right` (which starts where `left` ends) into `left`; `right`'s leader becomes a
/// joiner of `left`. The caller holds the `inner` lock.
fn merge(inner: &mut Inner, left: &Arc<Group>, right: &Arc<Group>) {
    let mut l = lock(&left.state);
    let mut r = lock(&right.state);
    debug_assert_eq!(l.end_sector, r.start_sector);
    let (l_end, r_start, r_end) = (l.end_sector, r.start_sector, r.end_sector);
    l.pieces.extend(std::mem::take(&mut r.pieces));
    l.end_sector = r_end;
    l.bytes += std::mem::take(&mut r.bytes);
    l.fua |= r.fua;
    l.joiners.append(&mut r.joiners);
    let (tx, rx) = oneshot::channel();
    l.joiners.push(tx);
    r.closed = true;
    if let Some(full) = r.full.take() {
        let _ = full.send(Signal::Merged(rx));
    }
    drop((l, r));
    inner.unlink(right, r_start, r_end);
    if inner.by_end.get(&l_end).is_some_and(|g| Arc::ptr_eq(g, left)) {
        inner.by_end.remove(&l_end);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gather {
    pub fn new(window: Duration, timer: Arc<dyn Timer>) -> Self {
        Self {
            window,
            timer,
            inner: Mutex::default(),
            misses: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            executing: AtomicU64::new(0),
            finished: AtomicU64::new(0),
        }
    }

    /// Marks a write as on the members until the guard drops.
    pub fn executing(&self) -> Executing<'_> {
        self.executing.fetch_add(1, Ordering::Relaxed);
        Executing(self)
    }

    /// Decides for a write of `data` at `[start, end)` sectors; `stripe_sectors` is the data
    /// of one stripe.
    pub fn arrive(&self, start: u64, end: u64, data: &Payload<'_>, fua: bool, stripe_sectors: u64) -> Role<'_> {
        let mut inner = lock(&self.inner);
        // Near a recent write (within a few of its own lengths: requests dispatched in
        // parallel arrive a little out of order).
        let reach = (end - start) * NEAR_LENGTHS;
        let sequential = inner.recent.iter().any(|&(s, e)| e + reach >= start && end + reach >= s);
        if inner.recent.len() == RECENT_WRITES {
            inner.recent.pop_front();
        }
        inner.recent.push_back((start, end));
        let whole = |s: u64, e: u64| s.is_multiple_of(stripe_sectors) && e.is_multiple_of(stripe_sectors);
        let target = MERGE_TARGET_BYTES.max((stripe_sectors * crate::SECTOR_BYTES) as usize).min(MAX_GROUP_BYTES);
        // A group that starts inside a stripe (its head went on alone) goes once it also holds
        // a whole stripe: the next group then starts on a stripe boundary again.
        let realigns = |s: u64, e: u64| e.is_multiple_of(stripe_sectors) && s.next_multiple_of(stripe_sectors) < e;
        let full = |s: u64, e: u64, bytes: usize| {
            (whole(s, e) && bytes >= target) || (!whole(s, e) && realigns(s, e)) || bytes >= MAX_GROUP_BYTES
        };
        let (group, at_end) = match inner.by_end.remove(&start) {
            Some(g) => (Some(g), true),
            None => (inner.by_start.remove(&end), false),
        };
        if let Some(group) = group {
            let (tx, rx) = oneshot::channel();
            // Any copy is made before the group's lock is taken.
            let piece = keep(data);
            {
                let mut g = lock(&group.state);
                debug_assert!(!g.closed);
                if at_end {
                    g.pieces.push_back(piece);
                    g.end_sector = end;
                } else {
                    g.pieces.push_front(piece);
                    g.start_sector = start;
                }
                g.bytes += data.len();
                g.fua |= fua;
                g.joiners.push(tx);
            }
            // The write may have closed the gap to the next (or previous) group: one group.
            let (left, right) = if at_end {
                let end = lock(&group.state).end_sector;
                (Some(group.clone()), inner.by_start.get(&end).filter(|g| !Arc::ptr_eq(g, &group)).cloned())
            } else {
                let start = lock(&group.state).start_sector;
                (inner.by_end.get(&start).filter(|g| !Arc::ptr_eq(g, &group)).cloned(), Some(group.clone()))
            };
            let group = match (left, right) {
                (Some(left), Some(right)) => {
                    merge(&mut inner, &left, &right);
                    left
                }
                (Some(g), None) | (None, Some(g)) => g,
                (None, None) => unreachable!("the joined group is one side"),
            };
            let mut g = lock(&group.state);
            let (s, e) = (g.start_sector, g.end_sector);
            if full(s, e, g.bytes) {
                if let Some(full) = g.full.take() {
                    let _ = full.send(Signal::Full);
                }
                drop(g);
                inner.unlink(&group, s, e);
            } else {
                drop(g);
                inner.by_end.insert(e, group.clone());
                inner.by_start.insert(s, group);
            }
            self.joined.fetch_add(1, Ordering::Relaxed);
            self.misses.store(0, Ordering::Relaxed);
            return Role::Joined(rx);
        }
        if !sequential || full(start, end, data.len()) {
            return Role::Alone;
        }
        if self.misses.load(Ordering::Relaxed) >= MISS_LIMIT
            && !self.skipped.fetch_add(1, Ordering::Relaxed).is_multiple_of(PROBE_EVERY)
        {
            return Role::Alone;
        }
        let (full_tx, full_rx) = oneshot::channel();
        let group = Arc::new(Group {
            state: Mutex::new(GroupState {
                start_sector: start,
                end_sector: end,
                pieces: VecDeque::from([keep(data)]),
                bytes: data.len(),
                fua,
                joiners: Vec::new(),
                full: Some(full_tx),
                closed: false,
            }),
        });
        inner.by_end.insert(end, group.clone());
        inner.by_start.insert(start, group.clone());
        Role::Lead(Leader { gather: self, group: Some(group), full: Some(full_rx) })
    }
}

impl Leader<'_> {
    /// Waits until the group is full or done waiting, then closes it (no more joins) and
    /// says what to do: write every part's data from the first sector (FUA if any part
    /// asked), or, if the group was merged into the one before it, wait for that one.
    pub async fn wait(&mut self) -> Outcome {
        let mut full = self.full.take().expect("waited once");
        let mut finished = self.gather.finished.load(Ordering::Relaxed);
        for _ in 0..BUSY_WINDOWS {
            let sleep = self.gather.timer.sleep(self.gather.window);
            match futures::future::select(&mut full, sleep).await {
                futures::future::Either::Left((Ok(Signal::Merged(result)), _)) => {
                    self.group = None; // its parts and joiners are the other group's now
                    return Outcome::Merged(result);
                }
                futures::future::Either::Left(_) => break,
                futures::future::Either::Right(_) => {}
            }
            // Busy: writes on the members, or some finished (their clients send the next).
            let now = self.gather.finished.load(Ordering::Relaxed);
            let busy = self.gather.executing.load(Ordering::Relaxed) > 0 || now != finished;
            finished = now;
            if !busy {
                break;
            }
        }
        let joined = self.close();
        // Closed now (under the lock merges take): if a merge came first, its signal is here.
        if let Ok(Some(Signal::Merged(result))) = full.try_recv() {
            self.group = None; // its parts and joiners are the other group's now
            return Outcome::Merged(result);
        }
        if !joined {
            self.gather.misses.fetch_add(1, Ordering::Relaxed);
        }
        let group = self.group.as_ref().expect("not finished");
        let mut g = lock(&group.state);
        // The pieces are written as one payload, not joined.
        let data = Gathered::payload(std::mem::take(&mut g.pieces).into());
        debug_assert_eq!(data.len() as u64, (g.end_sector - g.start_sector) * crate::SECTOR_BYTES);
        Outcome::Go { first: g.start_sector, data, fua: g.fua }
    }

    /// Closes the group; returns whether anyone joined.
    fn close(&self) -> bool {
        let Some(group) = &self.group else { return false };
        let mut inner = lock(&self.gather.inner);
        let mut g = lock(&group.state);
        if !g.closed {
            g.closed = true;
            let (s, e) = (g.start_sector, g.end_sector);
            inner.unlink(group, s, e);
        }
        !g.joiners.is_empty()
    }

    /// Tells every joiner the combined write's result.
    pub fn finish(mut self, result: &Result<()>) {
        let Some(group) = self.group.take() else { return };
        let joiners = std::mem::take(&mut lock(&group.state).joiners);
        for j in joiners {
            let _ = j.send(result.as_ref().map(|_| ()).map_err(|e| (e.kind, e.message.clone())));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if self.group.is_some() {
            self.close();
            // The senders drop: every joiner does its own write.
            if let Some(group) = &self.group {
                lock(&group.state).joiners.clear();
            }
        }
    }
}

/// What the leader a write joined (or was merged into) reports; `None` if it went away
/// before writing, and the write must be done by its own caller.
pub(crate) async fn leaders_result(result: oneshot::Receiver<JoinResult>) -> Option<Result<()>> {
    let reported = result.await.ok()?;
    Some(reported.map_err(|(kind, message)| RaidError::new(kind, message)))
}

/// A write's bytes kept by its group until the leader writes them: shared bytes by reference,
/// borrowed ones copied (the writer's future may be dropped while the group waits).
fn keep(data: &Payload<'_>) -> Bytes {
    match data {
        Payload::Shared(bytes) => bytes.clone(),
        other => {
            crate::copy_count::copied(other.len());
            let mut copy = vec![0; other.len()];
            other.copy_to(&mut copy);
            Bytes::from(copy)
        }
    }
}
