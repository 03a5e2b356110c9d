//! How long to wait before the next attempt to reach a member: exponential with jitter, and
//! kept across reconnects, so a server that accepts and then fails at once is not hammered.
//!
//! The wait starts at [`Backoff::FIRST`] and doubles per attempt up to [`Backoff::MAX`]; each
//! wait is drawn from 50 % to 150 % of that (members of one array that lost the same server
//! do not retry in step). Only a connection that answered a request resets it
//! ([`Backoff::proven`]): a reconnect that "succeeded" and failed again at once keeps climbing.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// Attempts since the last proven connection.
    attempts: u32,
}

impl Backoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(50);
    pub(crate) const MAX: Duration = Duration::from_secs(2);

    /// The wait before the next attempt (and one more attempt counted).
    pub(crate) fn next_wait(&mut self) -> Duration {
        let base = Self::FIRST.saturating_mul(1 << self.attempts.min(16)).min(Self::MAX);
        self.attempts = self.attempts.saturating_add(1);
        base.mul_f64(rand::rng().random_range(0.5..1.5))
    }

    /// A connection answered a request: the next loss is retried at once.
    pub(crate) fn proven(&mut self) {
        self.attempts = 0;
    }

    /// Whether the last connection answered a request since it was made.
    pub(crate) fn is_fresh(&self) -> bool {
        self.attempts == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_with_jitter_to_a_bound_and_reset_only_when_proven() {
        let mut b = Backoff::default();
        assert!(b.is_fresh());
        let waits: Vec<Duration> = (0..12).map(|_| b.next_wait()).collect();
        assert!(waits[0] >= Backoff::FIRST / 2 && waits[0] < Backoff::FIRST * 3 / 2, "{waits:?}");
        assert!(waits[3] >= Backoff::FIRST * 4, "doubling: {waits:?}");
        for w in &waits {
            assert!(*w < Backoff::MAX * 3 / 2, "bounded: {waits:?}");
        }
        assert!(waits[11] >= Backoff::MAX / 2, "reaches the bound: {waits:?}");
        assert!(!b.is_fresh());
        b.proven();
        assert!(b.is_fresh());
        assert!(b.next_wait() < Backoff::FIRST * 3 / 2);
    }
}
