//! Rate-limited warnings about one member: at most [`LogLimit::LINES`] per
//! [`LogLimit::WINDOW`]; the lines held back are counted (in the member's link statistics,
//! for metrics) and their number is told with the next line let through, so a member that
//! fails a thousand times a second costs a count, not a flood.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct LogLimit {
    window_start: Instant,
    in_window: u32,
    /// Lines held back since the last one let through.
    held: u64,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self { window_start: Instant::now(), in_window: 0, held: 0 }
    }
}

impl LogLimit {
    pub(crate) const LINES: u32 = 5;
    pub(crate) const WINDOW: Duration = Duration::from_secs(10);

    /// Whether a line may be logged now: `Some(lines held back before it)`, or `None` (held
    /// back and counted).
    pub(crate) fn admit(&mut self, now: Instant) -> Option<u64> {
        if now.duration_since(self.window_start) >= Self::WINDOW {
            self.window_start = now;
            self.in_window = 0;
        }
        if self.in_window >= Self::LINES {
            self.held += 1;
            return None;
        }
        self.in_window += 1;
        Some(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_counted_and_the_count_told_with_the_next_line() {
        let mut limit = LogLimit::default();
        let t0 = Instant::now();
        let admitted = (0..1000).filter(|_| limit.admit(t0).is_some()).count();
        assert_eq!(admitted, LogLimit::LINES as usize);
        assert_eq!(limit.admit(t0 + LogLimit::WINDOW), Some(1000 - u64::from(LogLimit::LINES)));
        assert_eq!(limit.admit(t0 + LogLimit::WINDOW), Some(0));
    }
}
