//! Async range locks keyed by `u64` (stripe numbers, mirror lock units), FIFO-fair and
//! cancellation-safe, with no runtime dependency.
//!
//! Why not one lock: concurrent writes to different stripes must proceed in parallel;
//! only writes (and reconstructing reads) that touch the *same* stripe are serialised,
//! because a parity update is a read-compute-write cycle over the whole stripe.
//!
//! The table holds an entry only while a key is locked or awaited, so memory is bounded
//! by the number of requests in flight. Callers that need several keys acquire them in
//! ascending order (asserted), which rules out deadlock between them.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

const SHARDS: usize = 64;

#[derive(Default)]
struct Entry {
    /// Waiters in arrival order: (ticket, waker).
    waiters: VecDeque<(u64, Waker)>,
    /// Ticket the lock was handed to on release but which has not polled yet.
    granted: Option<u64>,
}

#[derive(Default)]
struct Shard {
    /// Present = locked (by a guard or a granted ticket).
    entries: HashMap<u64, Entry>,
    next_ticket: u64,
}

/// A table of independent async locks, one per key.
pub struct LockTable {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for LockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl LockTable {
    pub fn new() -> Self {
        Self { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect() }
    }

    fn shard(&self, key: u64) -> &Mutex<Shard> {
        // Fibonacci hashing spreads consecutive stripes over shards.
        let idx = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        &self.shards[idx]
    }

    /// Waits for exclusive ownership of `key`.
    pub fn lock(&self, key: u64) -> LockFuture<'_> {
        LockFuture { table: self, key, ticket: None }
    }

    /// Locks every key of `keys` (strictly ascending), one after the other.
    pub async fn lock_all(&self, keys: impl IntoIterator<Item = u64>) -> Vec<LockGuard<'_>> {
        let mut guards: Vec<LockGuard<'_>> = Vec::new();
        for key in keys {
            if let Some(last) = guards.last() {
                assert!(last.key < key, "locks must be taken in ascending key order");
            }
            guards.push(self.lock(key).await);
        }
        guards
    }

    /// Number of keys currently locked or awaited (for tests and metrics).
    /// Whether someone holds `key` (for invariant checks: the caller should be the holder).
    pub fn is_locked(&self, key: u64) -> bool {
        self.shard(key).lock().expect("lock table shard").entries.contains_key(&key)
    }

    pub fn active_keys(&self) -> usize {
        self.shards.iter().map(|s| s.lock().expect("lock table shard").entries.len()).sum()
    }

    /// Hands the lock on `key` to the next waiter, or frees the key.
    fn release(&self, key: u64) {
        let mut shard = self.shard(key).lock().expect("lock table shard");
        let entry = shard.entries.get_mut(&key).expect("released key is locked");
        debug_assert!(entry.granted.is_none());
        match entry.waiters.pop_front() {
            Some((ticket, waker)) => {
                entry.granted = Some(ticket);
                waker.wake();
            }
            None => {
                shard.entries.remove(&key);
            }
        }
    }
}

/// Future returned by [`LockTable::lock`].
pub struct LockFuture<'a> {
    table: &'a LockTable,
    key: u64,
    /// Set once queued behind another holder.
    ticket: Option<u64>,
}

impl<'a> Future for LockFuture<'a> {
    type Output = LockGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LockGuard<'a>> {
        let table = self.table;
        let key = self.key;
        let mut shard = table.shard(key).lock().expect("lock table shard");
        let shard = &mut *shard;
        match self.ticket {
            None => {
                if let std::collections::hash_map::Entry::Vacant(slot) = shard.entries.entry(key) {
                    slot.insert(Entry::default());
                    return Poll::Ready(LockGuard { table, key });
                }
                let ticket = shard.next_ticket;
                shard.next_ticket += 1;
                let entry = shard.entries.get_mut(&key).expect("entry exists");
                entry.waiters.push_back((ticket, cx.waker().clone()));
                self.ticket = Some(ticket);
                Poll::Pending
            }
            Some(ticket) => {
                let entry = shard.entries.get_mut(&key).expect("awaited key has an entry");
                if entry.granted == Some(ticket) {
                    entry.granted = None;
                    self.ticket = None;
                    return Poll::Ready(LockGuard { table, key });
                }
                if let Some(w) = entry.waiters.iter_mut().find(|(t, _)| *t == ticket) {
                    w.1.clone_from(cx.waker());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for LockFuture<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else { return };
        let granted = {
            let mut shard = self.table.shard(self.key).lock().expect("lock table shard");
            let entry = shard.entries.get_mut(&self.key).expect("awaited key has an entry");
            if entry.granted == Some(ticket) {
                entry.granted = None;
                true
            } else {
                entry.waiters.retain(|(t, _)| *t != ticket);
                false
            }
        };
        // Cancelled after being handed the lock: pass it on.
        if granted {
            self.table.release(self.key);
        }
    }
}

/// Exclusive ownership of one key; released on drop.
pub struct LockGuard<'a> {
    table: &'a LockTable,
    key: u64,
}

impl LockGuard<'_> {
    pub fn key(&self) -> u64 {
        self.key
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.table.release(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use futures::executor::block_on;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn exclusive_and_fifo() {
        let table = LockTable::new();
        let g = table.lock(7).now_or_never().expect("free key locks at once");
        let mut second = Box::pin(table.lock(7));
        let mut third = Box::pin(table.lock(7));
        assert!((&mut second).now_or_never().is_none());
        assert!((&mut third).now_or_never().is_none());
        // Other keys are independent.
        assert!(table.lock(8).now_or_never().is_some());
        drop(g);
        assert!((&mut third).now_or_never().is_none(), "FIFO: third must wait for second");
        let g2 = (&mut second).now_or_never().expect("second gets the lock");
        drop(g2);
        let g3 = (&mut third).now_or_never().expect("third gets the lock");
        drop(g3);
        assert_eq!(table.active_keys(), 0);
    }

    #[test]
    fn cancelled_waiter_passes_lock_on() {
        let table = LockTable::new();
        let g = table.lock(1).now_or_never().unwrap();
        let mut a = Box::pin(table.lock(1));
        let mut b = Box::pin(table.lock(1));
        assert!((&mut a).now_or_never().is_none());
        assert!((&mut b).now_or_never().is_none());
        drop(g); // granted to a
        drop(a); // a cancelled after the grant: b must get it
        assert!((&mut b).now_or_never().is_some());
        drop(b);
        assert_eq!(table.active_keys(), 0);
    }

    #[test]
    fn threads_never_overlap() {
        let table = Arc::new(LockTable::new());
        let inside: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (table, inside) = (table.clone(), inside.clone());
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        block_on(async {
                            let key = i % 3;
                            let _g = table.lock(key).await;
                            let slot = &inside[key as usize];
                            assert_eq!(slot.fetch_add(1, Ordering::SeqCst), 0, "two holders of one key");
                            std::thread::yield_now();
                            slot.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(table.active_keys(), 0);
    }
}
