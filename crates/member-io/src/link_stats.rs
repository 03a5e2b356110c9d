//! [`LinkStats`]: what the connection of a member on another host went through — lost
//! connections, reconnects, requests that timed out or were re-sent, protocol violations,
//! log lines held back — where it stands now, and the last thing that went wrong, for
//! `ctl status`, `detail` and metrics. One `LinkStats` is shared by every `NbdMember`
//! opened for the same URI, so the counts survive a re-add.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// Where a member's connection stands. Only [`LinkState::Lost`] makes the member a
/// candidate for an automatic re-add: the server went away and may come back as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    Connected,
    /// Lost; reconnecting until the member timeout.
    Reconnecting,
    /// The member failed because its server went away (not back within the member timeout,
    /// or lost with writes no FLUSH covered), or it never answered. The same member may
    /// return with its data: a candidate for re-add.
    Lost(String),
    /// The server came back as another disk (size or superblock area changed).
    Replaced(String),
    /// The server broke the protocol again and again: nothing it sends is trusted.
    Misbehaved(String),
    /// The array failed the member (I/O errors it answered, or an administrator), and the
    /// connections were closed.
    Failed(String),
}

impl LinkState {
    pub fn name(&self) -> &'static str {
        match self {
            LinkState::Connected => "connected",
            LinkState::Reconnecting => "reconnecting",
            LinkState::Lost(_) => "lost",
            LinkState::Replaced(_) => "replaced",
            LinkState::Misbehaved(_) => "misbehaved",
            LinkState::Failed(_) => "failed",
        }
    }

    /// Why the link is down for good, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            LinkState::Lost(why) | LinkState::Replaced(why) | LinkState::Misbehaved(why) | LinkState::Failed(why) => {
                Some(why)
            }
            LinkState::Connected | LinkState::Reconnecting => None,
        }
    }

    /// Whether the link is still in use (connected, or trying to be).
    pub fn is_up(&self) -> bool {
        matches!(self, LinkState::Connected | LinkState::Reconnecting)
    }
}

/// What kind of thing went wrong with a member's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkErrorKind {
    /// No answer (or no connection, no handshake) within the member timeout.
    Timeout,
    /// The server broke the NBD protocol (a reply that does not fit its request, ...).
    ProtocolViolation,
    /// The server answered a request with an error (its disk failed).
    IoError,
    /// The connection ended or could not be made (refused, reset, closed).
    ConnectionLost,
    /// The server came back with other contents (its size or superblock area changed).
    IdentityChanged,
    /// The server refused the export or TLS (its configuration).
    Refused,
}

impl LinkErrorKind {
    pub const ALL: [LinkErrorKind; 6] = [
        LinkErrorKind::Timeout,
        LinkErrorKind::ProtocolViolation,
        LinkErrorKind::IoError,
        LinkErrorKind::ConnectionLost,
        LinkErrorKind::IdentityChanged,
        LinkErrorKind::Refused,
    ];

    /// A short name for labels (`timeout`, `protocol`, `io`, `connection`, `identity`, `refused`).
    pub fn label(self) -> &'static str {
        match self {
            LinkErrorKind::Timeout => "timeout",
            LinkErrorKind::ProtocolViolation => "protocol",
            LinkErrorKind::IoError => "io",
            LinkErrorKind::ConnectionLost => "connection",
            LinkErrorKind::IdentityChanged => "identity",
            LinkErrorKind::Refused => "refused",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LinkErrorKind::Timeout => "timeout",
            LinkErrorKind::ProtocolViolation => "protocol violation",
            LinkErrorKind::IoError => "I/O error from the member",
            LinkErrorKind::ConnectionLost => "connection lost",
            LinkErrorKind::IdentityChanged => "identity changed",
            LinkErrorKind::Refused => "refused",
        }
    }
}

/// The last thing that went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkError {
    pub kind: LinkErrorKind,
    pub what: String,
    pub at: SystemTime,
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
    /// Errors by kind (indexed like [`LinkErrorKind::ALL`]).
    errors: [AtomicU64; 6],
    /// Log lines about this member held back by the rate limit.
    pub log_lines_suppressed: AtomicU64,
    state: Mutex<LinkState>,
    last_error: Mutex<Option<LinkError>>,
    /// How the last connection frames requests and replies ("simple", "structured",
    /// "extended"), once one was made.
    framing: Mutex<Option<&'static str>>,
}

impl Default for LinkStats {
    fn default() -> Self {
        Self {
            disconnects: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            errors: Default::default(),
            log_lines_suppressed: AtomicU64::new(0),
            state: Mutex::new(LinkState::Lost("never connected".into())),
            last_error: Mutex::new(None),
            framing: Mutex::new(None),
        }
    }
}

impl LinkStats {
    pub fn state(&self) -> LinkState {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// How the last connection frames requests and replies, once one was made.
    pub fn framing(&self) -> Option<&'static str> {
        *self.framing.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn set_framing(&self, framing: &'static str) {
        *self.framing.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(framing);
    }

    pub(crate) fn set_state(&self, state: LinkState) {
        *self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = state;
    }

    /// Sets the state unless the link is already down for good (a later, lesser reason
    /// never hides the first).
    pub(crate) fn set_state_if_up(&self, state: LinkState) {
        let mut current = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.is_up() {
            *current = state;
        }
    }

    pub fn last_error(&self) -> Option<LinkError> {
        self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Errors of `kind` so far.
    pub fn errors(&self, kind: LinkErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn record_error(&self, kind: LinkErrorKind, what: impl Into<String>) {
        Self::count(&self.errors[kind as usize]);
        let error = LinkError { kind, what: what.into(), at: SystemTime::now() };
        *self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
    }

    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
