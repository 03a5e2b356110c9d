//! [`RequestSource`]: the read half of a connection, with a hint about how much to wait for
//! and, on TCP, a way to receive a payload straight into mapped file pages.
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
//!
//! Receiving into a [`FileMapping`](crate::FileMapping) (`recvmsg` with iovecs into the
//! mapping) saves the server a copy per WRITE; see `file_mapping.rs` for why that is sound.

use std::io;
use std::os::fd::AsRawFd;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, Interest};
use tokio::net::{TcpStream, tcp, unix};

/// The read half of a connection.
pub trait RequestSource: AsyncRead + Unpin + Send + 'static {
    /// Don't wake the reader until `bytes` are queued (1: any data). A hint: streams without
    /// such a control ignore it.
    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()> {
        let _ = bytes;
        Ok(())
    }

    /// Whether [`poll_receive_into`](Self::poll_receive_into) works on this stream.
    fn receives_in_place(&self) -> bool {
        false
    }

    /// Receives queued bytes straight into `regions` (at most `UIO_MAXIOV` of them per call),
    /// in order, up to their total length; `Ok(0)` at the end of the stream. After a short
    /// read the stream forgets its readiness (as tokio's own reads do), so the next call
    /// waits for the wake threshold; the caller then sets the threshold again (even if
    /// unchanged), which makes the kernel re-check what is queued: a read that stopped
    /// short at a fault, with bytes still queued, is not left waiting. Only called when
    /// [`receives_in_place`](Self::receives_in_place); the default fails.
    ///
    /// # Safety
    /// Every iovec must describe memory the kernel may write for the whole call (mapped file
    /// pages held alive by the caller) that no Rust reference points into.
    unsafe fn poll_receive_into(&self, cx: &mut Context<'_>, regions: &[libc::iovec]) -> Poll<io::Result<usize>> {
        let _ = (cx, regions);
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }
}

/// Sets `SO_RCVLOWAT` of the socket `fd` (at least 1). The caller keeps `fd` open.
pub(crate) fn set_receive_low_water(fd: std::os::fd::RawFd, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX).max(1);
    // SAFETY: the descriptor is open (the caller's contract); `value` lives across the call
    // and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

impl RequestSource for tcp::OwnedReadHalf {
    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()> {
        set_receive_low_water(self.as_ref().as_raw_fd(), bytes)
    }

    fn receives_in_place(&self) -> bool {
        true
    }

    unsafe fn poll_receive_into(&self, cx: &mut Context<'_>, regions: &[libc::iovec]) -> Poll<io::Result<usize>> {
        let stream: &TcpStream = self.as_ref();
        let regions = &regions[..regions.len().min(libc::UIO_MAXIOV as usize)];
        let wanted: usize = regions.iter().map(|r| r.iov_len).sum();
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let mut short = 0;
            let received = stream.try_io(Interest::READABLE, || {
                // SAFETY: `msghdr` is plain data; zeroed is a valid empty header.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                // The kernel only reads the iovec array itself.
                msg.msg_iov = regions.as_ptr().cast_mut();
                msg.msg_iovlen = regions.len() as _;
                // SAFETY: the descriptor is open; the iovecs point at writable memory no Rust
                // reference covers (this function's contract).
                let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, 0) };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                // A short read: report "would block" so tokio forgets the readiness, as its own
                // reads do, and the next poll waits for the wake threshold instead of taking
                // each segment as it lands.
                if n > 0 && (n as usize) < wanted {
                    short = n as usize;
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n as usize)
            });
            match received {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && short > 0 => return Poll::Ready(Ok(short)),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
                result => return Poll::Ready(result),
            }
        }
    }
}

/// Linux Unix sockets honour the threshold only in blocking reads, not in readiness: no-op.
impl RequestSource for unix::OwnedReadHalf {}

impl<S: AsyncRead + Send + 'static> RequestSource for tokio::io::ReadHalf<S> {}
