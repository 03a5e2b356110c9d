//! `LatencyHistogram`: a lock-free latency histogram with fixed buckets from 10 µs to 10 s.
//!
//! prometheus-client's `Histogram` takes a mutex per observation; this one is one
//! `partition_point` over 19 bounds and three relaxed atomic adds, so NBD worker threads
//! recording the same export never wait for each other. It encodes as a Prometheus
//! histogram (`_bucket{le}`, `_sum` in seconds, `_count`) through prometheus-client.
//!
//! A scrape reads the buckets one by one while requests complete, so it may miss an
//! observation that lands mid-read; `_count` is the sum of the buckets read, so the
//! output is always self-consistent (`+Inf` bucket == `_count`). The sum is kept in
//! nanoseconds and wraps after 584 years of summed latency (Prometheus sees a counter
//! reset); one observation counts at most an hour.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Upper bounds of the finite buckets, in nanoseconds: 1-2.5-5 steps from 10 µs to 10 s.
pub const BUCKET_BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Longest latency added to the sum (an hour): a stuck clock cannot wrap the sum at once.
const MAX_OBSERVATION_NS: u64 = 3600 * 1_000_000_000;

/// Buckets including the last one (`+Inf`).
const BUCKETS: usize = BUCKET_BOUNDS_NS.len() + 1;

#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).min(MAX_OBSERVATION_NS);
        let bucket = BUCKET_BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The counts now (non-cumulative per bucket, bounds in seconds).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut buckets = [(f64::INFINITY, 0u64); BUCKETS];
        for (i, bucket) in buckets.iter_mut().enumerate() {
            if let Some(&bound_ns) = BUCKET_BOUNDS_NS.get(i) {
                bucket.0 = bound_ns as f64 / 1e9;
            }
            bucket.1 = self.counts[i].load(Ordering::Relaxed);
        }
        let count = buckets.iter().map(|b| b.1).sum();
        HistogramSnapshot { buckets, count, sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9 }
    }
}

/// A histogram's counts at one moment; encodes as a Prometheus histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound in seconds, observations in this bucket alone); the last bound is +Inf.
    pub buckets: [(f64, u64); BUCKETS],
    pub count: u64,
    pub sum_seconds: f64,
}

impl EncodeMetric for HistogramSnapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_nanos(1)); // <= 10 µs
        h.observe(Duration::from_micros(10)); // exactly the bound: le="1e-5"
        h.observe(Duration::from_micros(11)); // <= 25 µs
        h.observe(Duration::from_millis(3)); // <= 5 ms
        h.observe(Duration::from_secs(11)); // +Inf
        h.observe(Duration::MAX); // saturates, +Inf
        let HistogramSnapshot { buckets, count, sum_seconds: sum } = h.snapshot();
        assert_eq!(count, 6);
        assert_eq!(buckets[0], (1e-5, 2));
        assert_eq!(buckets[1], (2.5e-5, 1));
        assert_eq!(buckets[8], (5e-3, 1));
        assert_eq!(buckets[19], (f64::INFINITY, 2));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), count);
        let expected = 1e-9 + 10e-6 + 11e-6 + 3e-3 + 11.0 + 3600.0;
        assert!((sum - expected).abs() < 1e-6, "{sum}");
        assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0), "bounds ascend");
    }
}
