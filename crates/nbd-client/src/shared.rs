//! [`Shared`]: the state a connection's requesters and its reader task share: the requests
//! in flight by cookie ([`Waiters`]) and, once it has ended, why ([`Closed`]).
//!
//! Contract: the connection ends once, with the first reason given ([`Shared::close`]); every
//! waiter then in flight fails with it, and a request registered later must check
//! [`Waiters::closed`] under the same lock, so none is left waiting on a dead connection.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::error::ClientError;
use crate::waiter::Waiter;

/// State shared with the reader task.
pub(crate) struct Shared {
    pub(crate) address: String,
    pub(crate) waiters: Mutex<Waiters>,
}

pub(crate) struct Waiters {
    pub(crate) next_cookie: u64,
    pub(crate) by_cookie: HashMap<u64, Waiter>,
    /// Why the connection ended, once it has.
    pub(crate) closed: Option<Closed>,
}

/// Why a connection ended: lost (EOF, an I/O error, given up on), or a protocol violation
/// of the server's (its requests fail with [`ClientError::Protocol`]).
#[derive(Debug, Clone)]
pub(crate) struct Closed {
    pub(crate) why: String,
    violation: bool,
}

impl Closed {
    pub(crate) fn lost(why: impl Into<String>) -> Self {
        Self { why: why.into(), violation: false }
    }

    pub(crate) fn violation(what: impl Into<String>) -> Self {
        Self { why: what.into(), violation: true }
    }

    pub(crate) fn is_violation(&self) -> bool {
        self.violation
    }

    /// The error a request fails with on this connection.
    pub(crate) fn error(&self, address: &str) -> ClientError {
        let address = address.to_string();
        if self.violation {
            ClientError::Protocol { address, what: self.why.clone() }
        } else {
            ClientError::ConnectionLost { address, why: self.why.clone() }
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the connection: every waiter, and every later request, fails with the reason
    /// (the first one given, when several race).
    pub(crate) fn close(&self, closed: Closed) {
        let (closed, waiting): (Closed, Vec<Waiter>) = {
            let mut w = self.lock();
            let closed = w.closed.get_or_insert(closed).clone();
            (closed, w.by_cookie.drain().map(|(_, waiter)| waiter).collect())
        };
        for waiter in waiting {
            waiter.fail(closed.error(&self.address));
        }
    }

    pub(crate) fn new(address: String) -> Self {
        Self { address, waiters: Mutex::new(Waiters { next_cookie: 1, by_cookie: HashMap::new(), closed: None }) }
    }
}
