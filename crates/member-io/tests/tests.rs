//! member-io integration tests (one binary to save link time):
//! - `backends`: raid-core's member conformance suite (`raid_core::conformance`) for every
//!   backend and wrapper
//! - `errors`: deleted/truncated members, past-end reads, ENOSPC, read-only
//! - `fallback`: io_uring blocked by seccomp, RAIDNBD_IO, `IoEngine::Threads`
//! - `throttle`: rate-limiter accuracy, latency, burst
//! - `fault`: fault-injection rules

mod backends;
mod errors;
mod fallback;
mod fault;
mod throttle;
mod util;
