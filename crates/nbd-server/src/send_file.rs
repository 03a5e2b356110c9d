//! The socket side of [`ReadChunk::File`](crate::device::ReadChunk::File): writing a
//! reply's header bytes and then a file range.
//!
//! On TCP and Unix sockets a range whose device holds a mapping of the file
//! ([`FileRange::mapping`]) goes out with `sendmsg` from the mapped pages: one copy, by the
//! kernel, into socket buffers. Other ranges go out with `sendfile(2)`, which moves page
//! cache pages to the socket uncopied, or through a buffer (`pread` + `write`, two copies),
//! by [`SendFilePolicy`]. The header bytes before a range are sent with `MSG_MORE`, so they
//! leave in the same segment as the data. Any other stream
//! ([`GenericStream`](crate::GenericStream)) gets the bytes through a buffer.
//!
//! Why the mapping first: on a Firecracker guest (2 vCPUs, 2026-12-02) 1 MiB reads over
//! loopback were 1.45x `nbdkit file` sent from the mapping, 0.67x with `sendfile` and 1.09x
//! through a buffer on one connection, 1.46x / 0.96x / 1.29x on four (crate README): there
//! `sendfile`'s 64 KiB pushes cost the server the most CPU per read (543 µs against 388 from
//! the mapping) and the client three times the context switches, while one large `sendmsg`
//! fills whole segments at the pace of its copy. The server never touches mapped memory
//! itself: a page past the end of a file truncated under the mapping makes `sendmsg` fail
//! with `EFAULT` (not a `SIGBUS`), and the rest of the range then goes out with `sendfile`,
//! which finds the file short and ends the connection.
//!
//! A file shorter than the range is an `UnexpectedEof` error: the reply header already
//! promised the bytes, so the caller must end the connection rather than pad the data.
//! (`sendfile` on a closed socket would raise SIGPIPE; Rust programs ignore it by default,
//! so it is an `EPIPE` error here like any failed write.)

use std::future::Future;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::{AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream, tcp, unix};

use crate::device::FileRange;
use crate::file_mapping::FileMapping;

/// Largest piece of a file copied at once when it does not go out with `sendfile`: a 1 MiB
/// read is one `write` (in 256 KiB pieces, four connections on two CPUs reached 0.87x of
/// `nbdkit file`; whole, 1.03-1.18x).
const COPY_PIECE_BYTES: usize = 4 << 20;

/// The write half of a connection: any `AsyncWrite`, plus a way to send file ranges.
pub trait ReplySink: AsyncWrite + Unpin + Send + 'static {
    /// Writes all of `prefix`, then the `range.len` bytes of `range`. The default copies
    /// the range through a buffer.
    fn write_then_send_file(
        &mut self,
        prefix: &mut [IoSlice<'_>],
        range: &FileRange,
    ) -> impl Future<Output = io::Result<()>> + Send {
        write_then_copy_file(self, prefix, range)
    }
}

/// Writes all of `prefix`, then `range` read through a buffer (`pread` + `write`), a pooled
/// one that is not zeroed first (`file_device::pread_exact`).
pub(crate) async fn write_then_copy_file<W: AsyncWrite + Unpin + Send + ?Sized>(
    writer: &mut W,
    prefix: &mut [IoSlice<'_>],
    range: &FileRange,
) -> io::Result<()> {
    write_all_vectored(writer, prefix).await?;
    let mut done = 0usize;
    while done < range.len as usize {
        let n = (range.len as usize - done).min(COPY_PIECE_BYTES);
        let piece = crate::file_device::pread_exact(&range.file, range.offset + done as u64, n)?;
        writer.write_all(&piece).await?;
        done += n;
    }
    Ok(())
}

/// When file ranges without a mapping go out with `sendfile` rather than through a buffer: while the server
/// has no more connections open than CPUs. `sendfile` spares the server a copy but leaves
/// the receiver more work per byte (it copies out of page-cache pages the sender spliced);
/// with a CPU per client that wins (1 MiB reads, one or two connections, loopback: 5.6-7.5
/// GB/s against 3.8-5.5 through a buffer), but with more clients than CPUs the receivers are
/// the bottleneck and the buffer wins (four connections on two CPUs: 5.0 against 3.4-3.5
/// GB/s; `nbdkit file` 4.7-5.3).
#[derive(Clone)]
pub(crate) struct SendFilePolicy {
    connection_slots: std::sync::Arc<tokio::sync::Semaphore>,
    max_connections: usize,
    cpus: usize,
}

impl SendFilePolicy {
    pub(crate) fn new(connection_slots: std::sync::Arc<tokio::sync::Semaphore>, max_connections: usize) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self { connection_slots, max_connections, cpus }
    }

    pub(crate) fn use_sendfile(&self) -> bool {
        let open = self.max_connections.saturating_sub(self.connection_slots.available_permits());
        open <= self.cpus
    }
}

impl<S: tokio::io::AsyncRead + AsyncWrite + Send + 'static> ReplySink for tokio::io::WriteHalf<S> {}

/// Writes every byte of `slices`, with as few calls as the stream allows.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    let mut remaining = slices;
    while !remaining.is_empty() {
        let n = writer.write_vectored(remaining).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut remaining, n);
    }
    Ok(())
}

/// A registered socket whose file descriptor we may write to directly.
trait ReadySocket: AsRawFd + Sync {
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn try_write_io<R>(&self, op: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

macro_rules! socket_sink {
    ($stream:ty, $half:ty) => {
        impl ReadySocket for $stream {
            fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$stream>::writable(self)
            }
            fn try_write_io<R>(&self, op: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
                self.try_io(Interest::WRITABLE, op)
            }
        }

        impl ReplySink for $half {
            async fn write_then_send_file(&mut self, prefix: &mut [IoSlice<'_>], range: &FileRange) -> io::Result<()> {
                send_file(self.as_ref(), prefix, range).await
            }
        }
    };
}

socket_sink!(TcpStream, tcp::OwnedWriteHalf);
socket_sink!(UnixStream, unix::OwnedWriteHalf);

/// Runs one non-blocking socket call, waiting for writability as often as it would block.
async fn when_writable<S: ReadySocket, R>(socket: &S, mut op: impl FnMut(RawFd) -> io::Result<R>) -> io::Result<R> {
    loop {
        socket.writable().await?;
        match socket.try_write_io(|| op(socket.as_raw_fd())) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

fn cvt(r: isize) -> io::Result<usize> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r as usize) }
}

async fn send_file<S: ReadySocket>(socket: &S, prefix: &mut [IoSlice<'_>], range: &FileRange) -> io::Result<()> {
    let mut prefix = prefix;
    while !prefix.is_empty() {
        let n = when_writable(socket, |fd| {
            // SAFETY: `msghdr` is plain data; zeroed is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            // IoSlice is ABI-compatible with iovec on Unix; the kernel only reads the slices.
            msg.msg_iov = prefix.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = prefix.len().min(libc::UIO_MAXIOV as usize) as _;
            // SAFETY: `msg` points at `msg_iovlen` live iovecs for the duration of the call.
            cvt(unsafe { libc::sendmsg(fd, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL) })
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut prefix, n);
    }
    // The header bytes go first on their own: one `sendmsg` of header and mapped pages
    // together measured 0.75-0.95x as fast (1 MiB reads, 2026-12-02; the data then no
    // longer page-aligned in the socket buffers, likely why).
    let sent = match &range.mapping {
        Some(mapping) => send_mapped(socket, mapping, range).await?,
        None => 0,
    };
    let end = range.offset + u64::from(range.len);
    let mut at =
        libc::off_t::try_from(range.offset + sent as u64).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let file_fd = range.file.as_raw_fd();
    while (at as u64) < end {
        let count = (end - at as u64) as usize;
        // SAFETY: both descriptors are open for the call (the socket is borrowed, the file is
        // held by `range`); `at` is a valid off_t the kernel advances by the bytes sent.
        let n = when_writable(socket, |fd| cvt(unsafe { libc::sendfile(fd, file_fd, &mut at, count) })).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file is shorter than the range being sent"));
        }
    }
    Ok(())
}

/// Sends what it can of `range` from `mapping` with `sendmsg`; returns the bytes sent, which
/// fall short of the range only if the mapping does not cover it or the kernel met a page it
/// could not read (`EFAULT`: the file was truncated under the mapping).
async fn send_mapped<S: ReadySocket>(socket: &S, mapping: &FileMapping, range: &FileRange) -> io::Result<usize> {
    let len = range.len as usize;
    let mut sent = 0usize;
    while sent < len {
        let Some(iov) = mapping.send_iovec(range.offset + sent as u64, len - sent) else { break };
        // The address as an integer, so the future stays `Send`.
        let (base, iov_len) = (iov.iov_base as usize, iov.iov_len);
        let result = when_writable(socket, |fd| {
            let mut iov = libc::iovec { iov_base: base as *mut libc::c_void, iov_len };
            // SAFETY: `msghdr` is plain data; zeroed is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            // SAFETY: the iovec lies inside the live mapping (`FileMapping::send_iovec` checked the
            // bounds, and `mapping` is borrowed for the call); the kernel only reads it, and
            // reports a page it cannot read as EFAULT.
            cvt(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) })
        })
        .await;
        match result {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;

    use super::*;

    fn file_with(bytes: &[u8]) -> Arc<std::fs::File> {
        let file = tempfile::tempfile().unwrap();
        file.write_all_at(bytes, 0).unwrap();
        Arc::new(file)
    }

    /// Sends `prefix` + `range` through `sink`, returns what `reader` received.
    async fn round_trip<W: ReplySink, R: tokio::io::AsyncRead + Unpin + Send + 'static>(
        mut sink: W,
        mut reader: R,
        prefix: &[u8],
        range: &FileRange,
    ) -> io::Result<Vec<u8>> {
        let expected_len = prefix.len() + range.len as usize;
        let received = tokio::spawn(async move {
            let mut got = Vec::new();
            let _ = (&mut reader).take(expected_len as u64).read_to_end(&mut got).await;
            got
        });
        let mut slices = [IoSlice::new(&prefix[..3]), IoSlice::new(&prefix[3..])];
        if let Err(e) = sink.write_then_send_file(&mut slices, range).await {
            received.abort();
            return Err(e);
        }
        Ok(received.await.unwrap())
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    #[tokio::test]
    async fn tcp_unix_and_generic_sinks_send_the_same_bytes() {
        let data = pattern(3 << 20);
        let file = file_with(&data);
        // Larger than any socket buffer, so the sends must wait for writability.
        let unmapped = FileRange { file: file.clone(), offset: 4097, len: (3 << 20) - 5000, mapping: None };
        let mapped = FileRange { mapping: Some(Arc::new(FileMapping::new(file.clone()).unwrap())), ..unmapped.clone() };
        // The same file open read-only: mapped read-only, sent the same way.
        let read_only_file = Arc::new(std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap());
        let read_only_mapping = FileMapping::new(read_only_file.clone()).unwrap();
        assert!(read_only_mapping.receive_iovec(0, 4096).is_none(), "a read-only mapping offers no receive");
        let read_only =
            FileRange { file: read_only_file, mapping: Some(Arc::new(read_only_mapping)), ..unmapped.clone() };
        let mut expected = b"header".to_vec();
        expected.extend_from_slice(&data[4097..4097 + unmapped.len as usize]);

        for (range, how) in [(&unmapped, "sendfile"), (&mapped, "mapped"), (&read_only, "mapped read-only")] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let (_keep, write_half) = server.into_split();
            assert_eq!(round_trip(write_half, client, b"header", range).await.unwrap(), expected, "tcp, {how}");

            let (a, b) = UnixStream::pair().unwrap();
            let (_keep, write_half) = a.into_split();
            assert_eq!(round_trip(write_half, b, b"header", range).await.unwrap(), expected, "unix, {how}");
        }
        let range = unmapped;

        let (a, b) = tokio::io::duplex(64 * 1024);
        let (_keep, write_half) = tokio::io::split(a);
        assert_eq!(round_trip(write_half, b, b"header", &range).await.unwrap(), expected, "generic");
    }

    #[tokio::test]
    async fn a_file_shorter_than_the_range_is_an_error_not_padding() {
        let file = file_with(&pattern(8192));
        let range = FileRange { file, offset: 4096, len: 8192, mapping: None };
        let (a, b) = UnixStream::pair().unwrap();
        let (_keep, write_half) = a.into_split();
        let err = round_trip(write_half, b, b"header", &range).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (_keep, write_half) = tokio::io::split(a);
        let err = round_trip(write_half, b, b"header", &range).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    /// A file truncated under its mapping: the kernel cannot read the pages past the new end
    /// (EFAULT, no SIGBUS), and the range ends the connection as a short file does.
    #[tokio::test]
    async fn a_mapped_range_of_a_truncated_file_is_an_error_not_a_crash() {
        let file = file_with(&pattern(3 << 20));
        let mapping = Arc::new(FileMapping::new(file.clone()).unwrap());
        file.set_len(1 << 20).unwrap();
        let range = FileRange { file, offset: 4096, len: 2 << 20, mapping: Some(mapping) };
        let (a, b) = UnixStream::pair().unwrap();
        let (_keep, write_half) = a.into_split();
        let err = round_trip(write_half, b, b"header", &range).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
