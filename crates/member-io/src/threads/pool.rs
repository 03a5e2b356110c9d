//! A small blocking thread pool for pread/pwrite/fdatasync/fallocate jobs.
//!
//! Threads are started on demand (when more jobs are queued than threads are idle) up to
//! `max_threads`, then park on a condvar forever. One process-wide pool ([`BlockingPool::global`])
//! serves every thread-pool member, like the shared ring threads serve every io_uring member.
//!
//! Why not `tokio::task::spawn_blocking`: this keeps the backend independent of the caller's
//! runtime (any executor can await the oneshot), bounds the thread count separately from
//! tokio's 512-thread blocking pool, and makes the benchmark's thread count explicit.
//!
//! Jobs own everything they touch (buffer, file handle), so a caller that stops waiting
//! never leaves a worker writing into freed memory.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Default worker limit: enough for QD32 on several members without oversubscribing memory.
pub(crate) const DEFAULT_MAX_THREADS: usize = 64;

pub(crate) struct BlockingPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    job_ready: Condvar,
    max_threads: usize,
}

struct State {
    jobs: VecDeque<Job>,
    threads: usize,
    idle_threads: usize,
}

impl BlockingPool {
    pub(crate) fn new(max_threads: usize) -> Self {
        assert!(max_threads > 0, "a pool needs at least one thread");
        let state = State { jobs: VecDeque::new(), threads: 0, idle_threads: 0 };
        Self { shared: Arc::new(Shared { state: Mutex::new(state), job_ready: Condvar::new(), max_threads }) }
    }

    /// The process-wide pool.
    pub(crate) fn global() -> &'static BlockingPool {
        static GLOBAL: OnceLock<BlockingPool> = OnceLock::new();
        GLOBAL.get_or_init(|| BlockingPool::new(DEFAULT_MAX_THREADS))
    }

    /// Queues `job`; it runs on a pool thread as soon as one is free.
    pub(crate) fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let mut state = self.shared.state.lock().expect("pool lock");
        state.jobs.push_back(Box::new(job));
        let start_thread = state.jobs.len() > state.idle_threads && state.threads < self.shared.max_threads;
        if start_thread {
            state.threads += 1;
            let shared = Arc::clone(&self.shared);
            let spawned = std::thread::Builder::new().name("member-io-pool".into()).spawn(move || worker(&shared));
            if let Err(e) = spawned {
                state.threads -= 1;
                // Existing threads (if any) still drain the queue; with none, the job waits for the next spawn.
                tracing::error!("cannot start a member-io pool thread: {e}");
            }
        } else {
            self.shared.job_ready.notify_one();
        }
    }
}

fn worker(shared: &Shared) {
    let mut state = shared.state.lock().expect("pool lock");
    loop {
        if let Some(job) = state.jobs.pop_front() {
            drop(state);
            // A panicking job must not shrink the pool: the panic is reported and the thread lives on.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                tracing::error!("a member-io pool job panicked");
            }
            state = shared.state.lock().expect("pool lock");
            continue;
        }
        state.idle_threads += 1;
        state = shared.job_ready.wait(state).expect("pool lock");
        state.idle_threads -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    #[test]
    fn runs_every_job_and_bounds_threads() {
        let pool = BlockingPool::new(4);
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for _ in 0..200 {
            let done = Arc::clone(&done);
            let tx = tx.clone();
            pool.spawn(move || {
                done.fetch_add(1, Ordering::SeqCst);
                tx.send(()).unwrap();
            });
        }
        for _ in 0..200 {
            rx.recv_timeout(std::time::Duration::from_secs(10)).expect("job ran");
        }
        assert_eq!(done.load(Ordering::SeqCst), 200);
        assert!(pool.shared.state.lock().unwrap().threads <= 4);
    }
}
