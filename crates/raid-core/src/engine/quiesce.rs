//! Quiescing for shutdown: the clean mark may only be written when no write is in flight —
//! a client write still landing on the members (a request task that outlived its
//! connection, a write-back, a rebuild step) after the superblocks say clean would leave
//! stale parity that no resync repairs. Every write and maintenance step holds a
//! [`WriteGuard`]; `Array::shutdown` first sets `stopping` (new writes are refused from
//! then on), then waits for the guards to drop.
//!
//! Ordering: a writer counts itself in, then checks `stopping`; shutdown sets `stopping`,
//! then waits for the count to reach zero (both sequentially consistent), so either the
//! writer sees `stopping` and backs out, or shutdown sees the writer and waits for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use event_listener::Event;

#[derive(Default)]
pub(crate) struct Quiesce {
    stopping: AtomicBool,
    in_flight: AtomicUsize,
    drained: Event,
}

/// One write (or maintenance step) in flight.
pub(crate) struct WriteGuard<'a> {
    quiesce: &'a Quiesce,
}

impl Quiesce {
    /// Counts a write in, unless the array is stopping (`None`).
    pub(crate) fn enter(&self) -> Option<WriteGuard<'_>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = WriteGuard { quiesce: self };
        if self.stopping.load(Ordering::SeqCst) {
            return None; // the guard's drop counts it out again
        }
        Some(guard)
    }

    /// Refuses new writes from now on and waits for those in flight.
    pub(crate) async fn stop_and_drain(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        loop {
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            let listener = self.drained.listen();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            listener.await;
        }
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        if self.quiesce.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.quiesce.drained.notify(usize::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use futures::executor::block_on;

    use super::*;

    #[test]
    fn stop_waits_for_writes_in_flight_and_refuses_new_ones() {
        let q = Quiesce::default();
        let guard = q.enter().expect("not stopping yet");
        let mut stop = Box::pin(q.stop_and_drain());
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(stop.as_mut().poll(&mut cx).is_pending(), "a write is in flight");
        assert!(q.enter().is_none(), "no new writes while stopping");
        drop(guard);
        assert!(stop.as_mut().poll(&mut cx).is_ready(), "drained once the write is done");
        block_on(q.stop_and_drain());
    }
}
