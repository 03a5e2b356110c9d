//! `Throttled<M>`: makes any member behave like a small cloud volume — bandwidth (bytes/s),
//! IOPS and added latency, each a token bucket with a burst allowance. A [`Throttle`] is a
//! member decoration (raid-core's `decorator`): it only decides how long each operation waits.
//!
//! Costs (AWS gp2/gp3-style accounting):
//! - `read_at` / `write_at` of `len` bytes cost `len` bandwidth tokens and
//!   `max(1, ceil(len / 256 KiB))` IOPS tokens (cloud volumes count one I/O per 256 KiB).
//! - `discard` / `write_zeroes` cost one IOPS token and no bandwidth (metadata operations).
//! - `flush` costs nothing (only the added latency applies).
//!
//! Scheduling is by virtual time (GCRA): each bucket keeps `ready_at`, the instant its
//! debt is paid. A request reserves its cost in every bucket under a short lock and then
//! sleeps (tokio time) until the latest of the buckets' release instants; since deadlines
//! are absolute, timer granularity never accumulates into rate error. The bucket never
//! holds more than `burst` worth of tokens, so after an idle period at most
//! `rate * burst` passes immediately. A request larger than the burst still passes once
//! the bucket is full (it runs the bucket into debt) — no request can wait forever.
//! Tokens reserved by a request that is cancelled while waiting are not refunded.

use std::sync::Mutex;
use std::time::Duration;

use raid_core::decorator::{Decorated, Decoration, Gate, MemberOp, OpKind};
use tokio::time::Instant;

use crate::error::{MemberIoError, Result};

/// One IOPS token covers this many bytes of a read or write.
pub const IOPS_UNIT_BYTES: u64 = 256 * 1024;

/// Default burst allowance: 100 ms worth of tokens.
pub const DEFAULT_BURST: Duration = Duration::from_millis(100);

/// Limits for one member; `None` means unlimited.
#[derive(Debug, Clone, PartialEq)]
pub struct ThrottleConfig {
    pub bytes_per_sec: Option<u64>,
    pub iops: Option<u64>,
    /// Added to every operation (does not limit throughput: concurrent ops overlap).
    pub latency: Duration,
    /// How much idle time can be banked as tokens, per bucket.
    pub burst: Duration,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        Self { bytes_per_sec: None, iops: None, latency: Duration::ZERO, burst: DEFAULT_BURST }
    }
}

impl ThrottleConfig {
    /// Whether this configuration throttles at all.
    pub fn is_active(&self) -> bool {
        self.bytes_per_sec.is_some() || self.iops.is_some() || !self.latency.is_zero()
    }
}

/// A token bucket in virtual time.
#[derive(Debug)]
struct Bucket {
    tokens_per_sec: f64,
    burst: Duration,
    /// When all reserved tokens are paid for; `None` = full bucket.
    ready_at: Option<Instant>,
}

impl Bucket {
    fn new(tokens_per_sec: u64, burst: Duration) -> Self {
        debug_assert!(tokens_per_sec > 0);
        Self { tokens_per_sec: tokens_per_sec as f64, burst, ready_at: None }
    }

    /// Reserves `cost` tokens at `now`; returns when the request may start.
    fn reserve(&mut self, now: Instant, cost: f64) -> Instant {
        let full_since = now.checked_sub(self.burst).unwrap_or(now);
        let base = self.ready_at.map_or(full_since, |ready| ready.max(full_since));
        self.ready_at = Some(base + Duration::from_secs_f64(cost / self.tokens_per_sec));
        base.max(now)
    }
}

/// Bandwidth/IOPS/latency limits for one member.
pub struct Throttle {
    bandwidth: Option<Mutex<Bucket>>,
    iops: Option<Mutex<Bucket>>,
    latency: Duration,
}

/// A member wrapped in bandwidth/IOPS/latency limits.
pub type Throttled<M> = Decorated<M, Throttle>;

impl Throttle {
    /// Rejects zero rates (they would block forever).
    pub fn new(config: &ThrottleConfig) -> Result<Self> {
        if config.bytes_per_sec == Some(0) || config.iops == Some(0) {
            return Err(MemberIoError::InvalidOption("throttle rates must be positive (omit to disable)".into()));
        }
        Ok(Self {
            bandwidth: config.bytes_per_sec.map(|r| Mutex::new(Bucket::new(r, config.burst))),
            iops: config.iops.map(|r| Mutex::new(Bucket::new(r, config.burst))),
            latency: config.latency,
        })
    }

    /// Reserves `bytes` of bandwidth and `ios` IOPS tokens; returns when the request may
    /// start (the latency included).
    fn reserve(&self, bytes: u64, ios: u64) -> Instant {
        let now = Instant::now();
        let mut start = now;
        if let Some(bucket) = &self.bandwidth
            && bytes > 0
        {
            start = start.max(bucket.lock().expect("throttle lock").reserve(now, bytes as f64));
        }
        if let Some(bucket) = &self.iops
            && ios > 0
        {
            start = start.max(bucket.lock().expect("throttle lock").reserve(now, ios as f64));
        }
        start + self.latency
    }
}

/// IOPS tokens for a transfer of `len_bytes`.
pub fn io_cost(len_bytes: u64) -> u64 {
    len_bytes.div_ceil(IOPS_UNIT_BYTES).max(1)
}

impl Decoration for Throttle {
    fn gate(&self, op: MemberOp) -> Gate<'_> {
        let (bytes, ios) = match op.kind {
            OpKind::Read | OpKind::Write => (op.len_bytes, io_cost(op.len_bytes)),
            OpKind::Flush => (0, 0),
            OpKind::Discard | OpKind::WriteZeroes => (0, 1),
        };
        let start = self.reserve(bytes, ios);
        if start <= Instant::now() {
            return Gate::Pass;
        }
        Gate::Wait(Box::pin(async move {
            tokio::time::sleep_until(start).await;
            Ok(())
        }))
    }
}

/// One [`Throttle`] shared by several members (all of an export's members behind one
/// host link).
#[derive(Clone)]
pub struct SharedThrottle(pub std::sync::Arc<Throttle>);

impl Decoration for SharedThrottle {
    fn gate(&self, op: MemberOp) -> Gate<'_> {
        self.0.gate(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_cost_counts_256k_units() {
        assert_eq!(io_cost(0), 1);
        assert_eq!(io_cost(4096), 1);
        assert_eq!(io_cost(256 * 1024), 1);
        assert_eq!(io_cost(256 * 1024 + 1), 2);
        assert_eq!(io_cost(1 << 20), 4);
    }

    #[test]
    fn bucket_allows_burst_then_paces() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = Bucket::new(1000, Duration::from_millis(100)); // 100 tokens of burst
        // The burst (100 tokens) plus the request that empties it pass at once; the next waits.
        for _ in 0..101 {
            assert_eq!(b.reserve(t0, 1.0), t0);
        }
        let next = b.reserve(t0, 1.0);
        assert!(next > t0 && next <= t0 + Duration::from_millis(1), "{:?}", next - t0);
        // Steady state: 1000 more tokens take ~1 s.
        let mut last = next;
        for _ in 0..1000 {
            last = b.reserve(t0, 1.0);
        }
        let took = last - t0;
        assert!(took > Duration::from_millis(990) && took < Duration::from_millis(1010), "{took:?}");
    }

    #[test]
    fn zero_rate_rejected() {
        assert!(Throttle::new(&ThrottleConfig { bytes_per_sec: Some(0), ..Default::default() }).is_err());
        assert!(Throttle::new(&ThrottleConfig { iops: Some(0), ..Default::default() }).is_err());
    }
}
