//! [`Waiter`]: one request in flight, waiting for its reply, and what it has received so far.
//!
//! Contract: a waiter is answered at most once, by [`finish`](Waiter::finish) (the reply is
//! complete) or [`fail`](Waiter::fail) (the connection ended), which take it by value; one
//! dropped unanswered reads as a lost connection to its caller. Its byte permit is released
//! with it. [`cover`](Waiter::cover) accepts a READ's chunk only inside the request and
//! without overlap, and [`check_complete`](Waiter::check_complete) only a READ covered
//! exactly (unless the server sent an error), so a READ never returns a byte the server did
//! not send for that offset. A broken rule is a [`Violation`], which ends the connection.

use std::any::Any;
use std::fmt;

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::error::{ClientError, Result};

/// Memory a READ's data is received into, lent by the caller ([`Client::read_into`]) so that
/// the data lands where it is used: no zero-filled buffer first, no copy after. Whatever it
/// holds before is overwritten completely before it is handed back; on an error it is
/// dropped.
///
/// [`Client::read_into`]: crate::Client::read_into
pub trait ReadBuffer: Send + 'static {
    /// The bytes to fill: exactly the READ's length.
    fn bytes_mut(&mut self) -> &mut [u8];
    fn bytes(&self) -> &[u8];
    /// For handing the caller's own type back.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl ReadBuffer for Vec<u8> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
    fn bytes(&self) -> &[u8] {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A READ's data so far, and the ranges of it received (relative to the request).
pub(crate) type ReadSoFar = (Box<dyn ReadBuffer>, Vec<(u32, u32)>);

/// What a request's waiter receives.
pub(crate) type ReplyResult = Result<Answer>;

/// A successful reply: a READ's data, a BLOCK_STATUS's extents, or just "done".
pub(crate) enum Answer {
    Done,
    Data(Box<dyn ReadBuffer>),
    /// (length, NBD_STATE_* flags) from the request's offset on.
    Status(Vec<(u32, u32)>),
}

impl PartialEq for Answer {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Answer::Done, Answer::Done) => true,
            (Answer::Data(a), Answer::Data(b)) => a.bytes() == b.bytes(),
            (Answer::Status(a), Answer::Status(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Debug for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Done => write!(f, "Done"),
            Answer::Data(data) => write!(f, "Data({} bytes)", data.bytes().len()),
            Answer::Status(extents) => write!(f, "Status({extents:?})"),
        }
    }
}

/// What a request expects besides "done".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    Nothing,
    Data,
    /// One BLOCK_STATUS chunk for this meta context id.
    Status(u32),
}

/// A BLOCK_STATUS's answer so far: its context id and the extents once received.
pub(crate) type StatusSoFar = (u32, Option<Vec<(u32, u32)>>);

/// A request waiting for its reply.
pub(crate) struct Waiter {
    pub(crate) command: &'static str,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    /// A READ's data so far; `None` for other commands.
    pub(crate) read: Option<ReadSoFar>,
    /// A BLOCK_STATUS's extents; `None` for other commands.
    pub(crate) status: Option<StatusSoFar>,
    /// The first error the server sent for it (errno, message).
    pub(crate) error: Option<(u32, String)>,
    tx: oneshot::Sender<ReplyResult>,
    _permit: Option<OwnedSemaphorePermit>,
}

/// Why a reply cannot be used: the connection ends with this.
pub(crate) type Violation = String;

impl Waiter {
    pub(crate) fn new(
        command: &'static str,
        offset: u64,
        len: u32,
        expect: Expect,
        tx: oneshot::Sender<ReplyResult>,
        permit: Option<OwnedSemaphorePermit>,
        read_into: Option<Box<dyn ReadBuffer>>,
    ) -> Self {
        // A READ receives into the caller's buffer, else a zero-filled one of its own.
        let read = (expect == Expect::Data).then(|| {
            let buf = read_into.unwrap_or_else(|| Box::new(vec![0u8; len as usize]));
            assert_eq!(buf.bytes().len(), len as usize, "a READ's buffer is its length");
            (buf, Vec::new())
        });
        let status = match expect {
            Expect::Status(context) => Some((context, None)),
            _ => None,
        };
        Self { command, offset, len, read, status, error: None, tx, _permit: permit }
    }

    pub(crate) fn fail(self, e: ClientError) {
        let _ = self.tx.send(Err(e));
    }

    /// `offset..offset + n` (absolute) as a range of this READ, which it must lie in without
    /// overlapping what was received before; recorded as received.
    pub(crate) fn cover(&mut self, offset: u64, n: u32) -> std::result::Result<std::ops::Range<usize>, Violation> {
        let outside =
            || format!("a chunk at {offset}+{n} outside the {} at {}+{}", self.command, self.offset, self.len);
        let Some((_, ranges)) = &mut self.read else { return Err(format!("data for a {}", self.command)) };
        let at = offset.checked_sub(self.offset).ok_or_else(outside)?;
        let end = at.checked_add(u64::from(n)).filter(|&e| e <= u64::from(self.len)).ok_or_else(outside)?;
        let (at, end) = (at as u32, end as u32); // both <= self.len, a u32
        if ranges.iter().any(|&(a, b)| at < b && a < end) {
            return Err(format!("overlapping data at {offset}+{n}"));
        }
        ranges.push((at, end));
        Ok(at as usize..end as usize)
    }

    /// A violation if the reply is complete but a READ is not covered exactly.
    pub(crate) fn check_complete(&self) -> std::result::Result<(), Violation> {
        if let Some((_, None)) = &self.status
            && self.error.is_none()
        {
            return Err(format!("BLOCK_STATUS at {}+{} answered without extents", self.offset, self.len));
        }
        let Some((_, ranges)) = &self.read else { return Ok(()) };
        let covered: u64 = ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
        if self.error.is_none() && covered != u64::from(self.len) {
            return Err(format!("READ at {}+{} answered with {covered} bytes", self.offset, self.len));
        }
        Ok(())
    }

    /// Answers the request (after [`check_complete`](Self::check_complete)).
    pub(crate) fn finish(self, address: &str) {
        let result = match (self.error, self.read, self.status) {
            (Some((errno, message)), _, _) => Err(ClientError::Errno {
                address: address.to_string(),
                command: self.command,
                offset: self.offset,
                len: u64::from(self.len),
                errno,
                message,
            }),
            (None, Some((data, _)), _) => Ok(Answer::Data(data)),
            (None, None, Some((_, Some(extents)))) => Ok(Answer::Status(extents)),
            (None, None, _) => Ok(Answer::Done),
        };
        let _ = self.tx.send(result);
    }
}
