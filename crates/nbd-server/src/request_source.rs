//! [`RequestSource`]: the read half of a connection, with a hint about how much to wait for.
//!
//! Why: a large WRITE's payload arrives in many TCP segments. A reader woken for each one
//! receives it in many small pieces, and every wake-up is work for the client too (on
//! loopback the client's kernel thread delivers the segment and wakes the server). The
//! client is the limit for large writes (fio's NBD engine uses a whole core at 1 MiB), so
//! waiting for the whole payload (`SO_RCVLOWAT`: no wake-up until that many bytes are
//! queued) makes the client faster: measured in crates/nbd-server/README.md.
//!
//! The contract the caller keeps: a threshold never exceeds the bytes the client has
//! committed to send (the rest of the current payload), since it may send nothing more
//! until that request is answered. The kernel caps the threshold (half the largest receive
//! buffer) and still wakes the reader when the receive window closes or memory runs short.

use std::io;
use std::os::fd::AsRawFd;

use tokio::io::AsyncRead;
use tokio::net::{tcp, unix};

/// The read half of a connection.
pub trait RequestSource: AsyncRead + Unpin + Send + 'static {
    /// Don't wake the reader until `bytes` are queued (1: any data). A hint: streams without
    /// such a control ignore it.
    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()> {
        let _ = bytes;
        Ok(())
    }
}

impl RequestSource for tcp::OwnedReadHalf {
    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()> {
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX).max(1);
        // SAFETY: the descriptor is open (borrowed from the stream); `value` lives across the
        // call and its size is passed with it.
        let r = unsafe {
            libc::setsockopt(
                self.as_ref().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }
}

/// Linux Unix sockets honour the threshold only in blocking reads, not in readiness: no-op.
impl RequestSource for unix::OwnedReadHalf {}

impl<S: AsyncRead + Send + 'static> RequestSource for tokio::io::ReadHalf<S> {}
