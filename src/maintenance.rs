//! The background worker of one array: drives `Maintenance::step` (rebuild,
//! replace, resync, check/repair), paced between a minimum and a maximum speed like md's
//! `speed_limit_min/max` (defaults 1 MB/s and 200 MB/s): at full speed while clients are
//! quiet, at the minimum while they are busy. Starts a check every `--scrub-interval` (the
//! first one interval after the start). Logs progress at info level.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raid_core::Member;
use raid_core::engine::{Array, MaintenanceWork, Step};
use tokio::sync::Notify;

use crate::duration::format_duration;
use crate::size::human_bytes;

/// md's defaults, in bytes/s.
pub const DEFAULT_MIN_SPEED: u64 = 1_000_000;
pub const DEFAULT_MAX_SPEED: u64 = 200_000_000;

/// md's bitmap daemon_sleep: idle bitmap chunks are cleared this often.
const BITMAP_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Bytes per maintenance step (one lock-and-copy unit batch).
const STEP_BYTES: u64 = 1 << 20;

/// Speed limits, changeable while running (`raidnbd ctl rebuild-speed`).
pub struct SpeedLimits {
    pub min_bytes_per_sec: AtomicU64,
    pub max_bytes_per_sec: AtomicU64,
}

impl SpeedLimits {
    /// Limits of `min` and `max` bytes/s; refused unless 0 < min <= max.
    pub fn new(min: u64, max: u64) -> anyhow::Result<Self> {
        let limits = Self { min_bytes_per_sec: AtomicU64::new(0), max_bytes_per_sec: AtomicU64::new(0) };
        limits.set(min, max)?;
        Ok(limits)
    }

    /// Changes both limits; refused unless 0 < min <= max.
    pub fn set(&self, min: u64, max: u64) -> anyhow::Result<()> {
        if min == 0 || min > max {
            anyhow::bail!("need 0 < min ({min}) <= max ({max})");
        }
        self.min_bytes_per_sec.store(min, Ordering::Relaxed);
        self.max_bytes_per_sec.store(max, Ordering::Relaxed);
        Ok(())
    }
}

impl Clone for SpeedLimits {
    /// Limits of their own, at these limits' values now.
    fn clone(&self) -> Self {
        let load = |v: &AtomicU64| AtomicU64::new(v.load(Ordering::Relaxed));
        Self { min_bytes_per_sec: load(&self.min_bytes_per_sec), max_bytes_per_sec: load(&self.max_bytes_per_sec) }
    }
}

/// Progress of the running job, for `ctl status`.
#[derive(Default)]
pub struct Progress {
    /// Bytes per second over the last few seconds.
    pub speed_bytes_per_sec: AtomicU64,
}

pub struct Worker {
    pub limits: Arc<SpeedLimits>,
    pub progress: Arc<Progress>,
    pub wake: Arc<Notify>,
}

/// Starts the worker task for `array` (runs until the process exits), at `limits`.
pub fn spawn(
    array: Arc<Array<dyn Member>>,
    name: String,
    scrub_interval: Option<Duration>,
    limits: SpeedLimits,
) -> Worker {
    let limits = Arc::new(limits);
    let progress = Arc::new(Progress::default());
    let wake = Arc::new(Notify::new());
    let notify = wake.clone();
    array.maintenance().set_waker(Arc::new(move || notify.notify_one()));
    let worker = Worker { limits: limits.clone(), progress: progress.clone(), wake: wake.clone() };
    tokio::spawn(async move { run(array, name, limits, progress, wake, scrub_interval).await });
    worker
}

async fn run(
    array: Arc<Array<dyn Member>>,
    name: String,
    limits: Arc<SpeedLimits>,
    progress: Arc<Progress>,
    wake: Arc<Notify>,
    scrub_interval: Option<Duration>,
) {
    let mut last_scrub = Instant::now();
    let mut window_start = Instant::now();
    let mut window_bytes = 0u64;
    let mut last_client_io = array.maintenance().client_io_bytes();
    let mut last_log = Instant::now();
    let mut started: Option<(MaintenanceWork, Instant)> = None;
    let mut last_sweep = Instant::now();
    loop {
        if last_sweep.elapsed() >= BITMAP_SWEEP_INTERVAL {
            last_sweep = Instant::now();
            match array.maintenance().intent_sweep().await {
                Ok(n) if n > 0 => tracing::debug!(export = %name, chunks = n, "bitmap chunks cleared"),
                Ok(_) => {}
                Err(e) => tracing::warn!(export = %name, error = %e, "bitmap sweep failed"),
            }
        }
        let step = match array.maintenance().step(STEP_BYTES).await {
            Ok(step) => step,
            Err(e) => {
                tracing::error!(export = %name, error = %e, "background work failed; retrying in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
                continue;
            }
        };
        match step {
            Step::Idle => {
                if let Some(interval) = scrub_interval
                    && last_scrub.elapsed() >= interval
                {
                    last_scrub = Instant::now();
                    match array.maintenance().start_scrub(false) {
                        Ok(()) => {
                            tracing::info!(export = %name, "scheduled check (every {})", format_duration(interval));
                            continue;
                        }
                        Err(e) => tracing::warn!(export = %name, "scheduled check skipped: {e}"),
                    }
                }
                progress.speed_bytes_per_sec.store(0, Ordering::Relaxed);
                let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
                window_start = Instant::now();
                window_bytes = 0;
            }
            Step::Finished(work) => {
                let took = started.take().map_or(Duration::ZERO, |(_, t)| t.elapsed());
                tracing::info!(export = %name, "{} finished in {:.1}s", work.name(), took.as_secs_f64());
            }
            Step::Worked { work, bytes } => {
                if started.is_none_or(|(w, _)| w != work) {
                    tracing::info!(export = %name, "{} started", work.name());
                    started = Some((work, Instant::now()));
                }
                window_bytes += bytes;
                let client_io = array.maintenance().client_io_bytes();
                let busy = client_io != last_client_io;
                last_client_io = client_io;
                let limit = if busy { &limits.min_bytes_per_sec } else { &limits.max_bytes_per_sec };
                let speed = limit.load(Ordering::Relaxed).max(1);
                // Sleep until the window's average is at most `speed`.
                let due = Duration::from_secs_f64(window_bytes as f64 / speed as f64);
                let elapsed = window_start.elapsed();
                if due > elapsed {
                    tokio::time::sleep(due - elapsed).await;
                }
                let elapsed = window_start.elapsed().as_secs_f64().max(1e-3);
                progress.speed_bytes_per_sec.store((window_bytes as f64 / elapsed) as u64, Ordering::Relaxed);
                if elapsed > 5.0 {
                    window_start = Instant::now();
                    window_bytes = 0;
                }
                if last_log.elapsed() > Duration::from_secs(10) {
                    let status = array.maintenance().status();
                    let pct = if status.total > 0 { status.done as f64 * 100.0 / status.total as f64 } else { 0.0 };
                    tracing::info!(
                        export = %name,
                        "{} {pct:.1}% at {}/s",
                        work.name(),
                        human_bytes(progress.speed_bytes_per_sec.load(Ordering::Relaxed))
                    );
                    last_log = Instant::now();
                }
            }
        }
    }
}
