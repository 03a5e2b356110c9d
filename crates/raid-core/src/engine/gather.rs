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
//!   comes next on the wire may arrive first). It waits a window at a time: it goes as soon
//!   as it covers whole stripes, after one window when no other write is on the members
//!   (nothing is coming soon: a client at queue depth 1), and after [`BUSY_WINDOWS`] windows
//!   at most while other writes are (the members are busy anyway, and the writes that
//!   complete the stripe come when those finish: md's stripe cache likewise delays stripes
//!   that need pre-reads while the array has other work). A group is bounded by
//!   [`MAX_GROUP_BYTES`]. Only writes next to a recent write (one ended where it
//!   starts, or started where it ends) wait, so random writes never do; and after
//!   [`MISS_LIMIT`] waits in a row that nobody joined (a stream at queue depth 1), only one
//!   in [`PROBE_EVERY`] waits until a wait is joined again.
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

use futures::channel::oneshot;

use crate::error::{RaidError, Result};

/// Sleeps for a duration (the binary gives tokio's).
pub trait Timer: Send + Sync {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// While other writes are on the members, a group waits at most this many windows.
pub const BUSY_WINDOWS: u32 = 32;

/// A group closes at this many bytes even if it ends inside a stripe.
pub const MAX_GROUP_BYTES: usize = 16 << 20;
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
    /// Writes (alone, or a group's combined one) on the members now.
    executing: AtomicU64,
}

/// Counts a write on the members while it lives.
pub(crate) struct Executing<'a>(&'a AtomicU64);

impl Drop for Executing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
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
    pieces: VecDeque<Vec<u8>>,
    bytes: usize,
    fua: bool,
    joiners: Vec<oneshot::Sender<JoinResult>>,
    /// Told when the group covers whole stripes (or reached its size limit).
    full: Option<oneshot::Sender<()>>,
    closed: bool,
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
    full: Option<oneshot::Receiver<()>>,
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
        }
    }

    /// Marks a write as on the members until the guard drops.
    pub fn executing(&self) -> Executing<'_> {
        self.executing.fetch_add(1, Ordering::Relaxed);
        Executing(&self.executing)
    }

    /// Decides for a write of `data` at `[start, end)` sectors; `stripe_sectors` is the data
    /// of one stripe.
    pub fn arrive(&self, start: u64, end: u64, data: &[u8], fua: bool, stripe_sectors: u64) -> Role<'_> {
        let mut inner = lock(&self.inner);
        let sequential = inner.recent.iter().any(|&(s, e)| e == start || s == end);
        if inner.recent.len() == RECENT_WRITES {
            inner.recent.pop_front();
        }
        inner.recent.push_back((start, end));
        let whole = |s: u64, e: u64| s.is_multiple_of(stripe_sectors) && e.is_multiple_of(stripe_sectors);
        let (group, at_end) = match inner.by_end.remove(&start) {
            Some(g) => (Some(g), true),
            None => (inner.by_start.remove(&end), false),
        };
        if let Some(group) = group {
            let mut g = lock(&group.state);
            debug_assert!(!g.closed);
            let (tx, rx) = oneshot::channel();
            if at_end {
                g.pieces.push_back(data.to_vec());
                g.end_sector = end;
            } else {
                g.pieces.push_front(data.to_vec());
                g.start_sector = start;
            }
            g.bytes += data.len();
            g.fua |= fua;
            g.joiners.push(tx);
            let (s, e) = (g.start_sector, g.end_sector);
            if whole(s, e) || g.bytes >= MAX_GROUP_BYTES {
                if let Some(full) = g.full.take() {
                    let _ = full.send(());
                }
                drop(g);
                inner.unlink(&group, s, e);
            } else {
                drop(g);
                if at_end {
                    inner.by_end.insert(e, group);
                } else {
                    inner.by_start.insert(s, group);
                }
            }
            self.joined.fetch_add(1, Ordering::Relaxed);
            self.misses.store(0, Ordering::Relaxed);
            return Role::Joined(rx);
        }
        if !sequential || whole(start, end) || data.len() >= MAX_GROUP_BYTES {
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
                pieces: VecDeque::from([data.to_vec()]),
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
    /// Waits until the group is full or the window passed, then closes it (no more joins)
    /// and returns what to write: the first sector, every part's data in order, and whether
    /// any part asked for FUA.
    pub async fn wait(&mut self) -> (u64, Vec<u8>, bool) {
        let mut full = self.full.take().expect("waited once");
        for _ in 0..BUSY_WINDOWS {
            let sleep = self.gather.timer.sleep(self.gather.window);
            match futures::future::select(full, sleep).await {
                futures::future::Either::Left(_) => break,
                futures::future::Either::Right((_, pending)) => full = pending,
            }
            if self.gather.executing.load(Ordering::Relaxed) == 0 {
                break;
            }
        }
        let joined = self.close();
        if !joined {
            self.gather.misses.fetch_add(1, Ordering::Relaxed);
        }
        let group = self.group.as_ref().expect("not finished");
        let mut g = lock(&group.state);
        let mut data = Vec::with_capacity(g.bytes);
        for piece in std::mem::take(&mut g.pieces) {
            data.extend_from_slice(&piece);
        }
        debug_assert_eq!(data.len() as u64, (g.end_sector - g.start_sector) * crate::SECTOR_BYTES);
        (g.start_sector, data, g.fua)
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

/// The error a joiner reports when the combined write failed.
pub(crate) fn joined_error(kind: crate::error::ErrorKind, message: String) -> RaidError {
    RaidError::new(kind, message)
}
