//! Progress on stderr while the bench runs (it takes minutes): one line per run saying
//! what runs, the time left for the whole bench, and — when the run ends — its result.
//!
//! The estimate is (runs left × mean run time so far) + (fills left × their size over
//! the fill rate measured so far, per data disk). Before anything finished it uses
//! ramp + runtime + 0.5 s per run and the member bandwidth limit for fills.

use std::io::Write;
use std::time::Duration;

use crate::duration::format_eta;

pub struct Progress {
    /// Cache modes the server refused (every later array will refuse them too).
    unavailable: Vec<String>,
    total_runs: usize,
    done_runs: usize,
    run_seconds_sum: f64,
    first_guess_run_seconds: f64,
    /// (bytes, data disks) of each fill still to come.
    fills_left: Vec<(u64, usize)>,
    /// Fill bytes per second per data disk (measured once a fill has run).
    fill_rate_per_disk: f64,
}

impl Progress {
    pub fn new(
        total_runs: usize,
        guess_run: Duration,
        fills: Vec<(u64, usize)>,
        guess_fill_rate_per_disk: f64,
    ) -> Self {
        Self {
            unavailable: Vec::new(),
            total_runs,
            done_runs: 0,
            run_seconds_sum: 0.0,
            first_guess_run_seconds: guess_run.as_secs_f64(),
            fills_left: fills,
            fill_rate_per_disk: guess_fill_rate_per_disk.max(1.0),
        }
    }

    /// Time left, counting the run about to start.
    pub fn eta(&self) -> Duration {
        let per_run = if self.done_runs == 0 {
            self.first_guess_run_seconds
        } else {
            self.run_seconds_sum / self.done_runs as f64
        };
        let runs = (self.total_runs - self.done_runs) as f64 * per_run;
        let fills: f64 =
            self.fills_left.iter().map(|&(bytes, disks)| bytes as f64 / (self.fill_rate_per_disk * disks as f64)).sum();
        Duration::from_secs_f64((runs + fills).max(0.0))
    }

    fn counter(&self) -> String {
        let width = self.total_runs.to_string().len();
        format!("[{:>width$}/{}]", self.done_runs + 1, self.total_runs)
    }

    /// Announces a run (the line is finished by [`Progress::run_done`]).
    pub fn run_started(&self, what: &str) {
        eprint!("{} {what} … (ETA {}) ", self.counter(), format_eta(self.eta()));
        let _ = std::io::stderr().flush();
    }

    pub fn run_done(&mut self, took: Duration, result: &str) {
        self.done_runs += 1;
        self.run_seconds_sum += took.as_secs_f64();
        eprintln!("{result}");
    }

    /// Announces filling an array before its reads.
    pub fn fill_started(&self, what: &str, bytes: u64) {
        eprint!("{:>w$} filling {what}: {} MB sequentially … ", "", bytes / 1_000_000, w = self.counter().len());
        let _ = std::io::stderr().flush();
    }

    /// A fill finished (fills are consumed in the order they were planned).
    pub fn fill_done(&mut self, bytes: u64, data_disks: usize, took: Duration, result: &str) {
        if !self.fills_left.is_empty() {
            self.fills_left.remove(0);
        }
        if took.as_secs_f64() > 0.1 {
            self.fill_rate_per_disk = bytes as f64 / took.as_secs_f64() / data_disks.max(1) as f64;
        }
        eprintln!("{result}");
    }

    /// Forgets fills that will not happen (an array whose server was unavailable).
    pub fn fill_skipped(&mut self) {
        if !self.fills_left.is_empty() {
            self.fills_left.remove(0);
        }
    }

    /// A cache mode was refused: drops its `runs_left` (this array's and every later one's)
    /// from the estimate, once.
    pub fn cache_unavailable(&mut self, cache: &str, runs_left: usize) {
        if !self.unavailable.iter().any(|c| c == cache) {
            self.unavailable.push(cache.to_string());
            self.runs_skipped(runs_left);
        }
    }

    /// Counts runs that will not happen (skipped) without timing them.
    pub fn runs_skipped(&mut self, n: usize) {
        self.total_runs -= n.min(self.total_runs - self.done_runs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_learns_from_finished_runs() {
        let mut p = Progress::new(4, Duration::from_secs(12), vec![(100_000_000, 4)], 25_000_000.0);
        // 4 runs × 12 s + 100 MB / (25 MB/s × 4 disks) = 49 s.
        assert_eq!(p.eta().as_secs(), 49);
        p.run_done(Duration::from_secs(20), "x");
        assert_eq!(p.eta().as_secs(), 3 * 20 + 1);
        p.fill_done(100_000_000, 4, Duration::from_secs(2), "x");
        assert_eq!(p.eta().as_secs(), 60);
        p.runs_skipped(3);
        assert_eq!(p.eta().as_secs(), 0);
    }
}
