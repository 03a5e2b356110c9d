//! [`LinkStats`]: what the connection of a member on another host went through — lost
//! connections, reconnects, requests that timed out or were re-sent — and where it stands
//! now, for `ctl status` and metrics. One `LinkStats` is shared by every `NbdMember` opened
//! for the same URI, so the counts survive a re-add.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a member's connection stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    Connected,
    /// Lost; reconnecting until the member timeout.
    Reconnecting,
    /// The member failed because its server went away (not back within the member timeout,
    /// or lost with writes no FLUSH covered). The same member may return with its data: a
    /// candidate for re-add.
    Lost(String),
    /// The server came back as another disk (size or superblock area changed).
    Replaced(String),
}

impl LinkState {
    pub fn name(&self) -> &'static str {
        match self {
            LinkState::Connected => "connected",
            LinkState::Reconnecting => "reconnecting",
            LinkState::Lost(_) => "lost",
            LinkState::Replaced(_) => "replaced",
        }
    }

    /// Why the link is down for good, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            LinkState::Lost(why) | LinkState::Replaced(why) => Some(why),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct LinkStats {
    /// Connections lost.
    pub disconnects: AtomicU64,
    /// Connections replaced by a new one.
    pub reconnects: AtomicU64,
    /// Requests that got no answer within the member timeout.
    pub timeouts: AtomicU64,
    /// Requests re-sent on a new connection.
    pub retries: AtomicU64,
    state: Mutex<LinkState>,
}

impl Default for LinkStats {
    fn default() -> Self {
        Self {
            disconnects: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            state: Mutex::new(LinkState::Lost("never connected".into())),
        }
    }
}

impl LinkStats {
    pub fn state(&self) -> LinkState {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub(crate) fn set_state(&self, state: LinkState) {
        *self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = state;
    }

    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
