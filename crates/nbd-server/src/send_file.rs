//! The socket side of [`ReadChunk::File`](crate::device::ReadChunk::File): writing a
//! reply's header bytes and then a file range.
//!
//! On TCP and Unix sockets the range goes out with `sendfile(2)`: the kernel moves page
//! cache pages to the socket, so the server never copies the data (`pread` + `write` copy
//! it twice; on loopback TCP the receiver's `recv` is then the only copy). The header
//! bytes before it are sent with `MSG_MORE`, so they leave in the same segment as the
//! data. Any other stream ([`GenericStream`](crate::GenericStream), e.g. a future TLS
//! layer) gets the bytes through a buffer.
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

/// When file ranges go out with `sendfile` rather than through a buffer: while the server
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
    let end = range.offset + u64::from(range.len);
    let mut at = libc::off_t::try_from(range.offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
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
        let range = FileRange { file, offset: 4097, len: (3 << 20) - 5000 };
        let mut expected = b"header".to_vec();
        expected.extend_from_slice(&data[4097..4097 + range.len as usize]);

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_keep, write_half) = server.into_split();
        assert_eq!(round_trip(write_half, client, b"header", &range).await.unwrap(), expected, "tcp");

        let (a, b) = UnixStream::pair().unwrap();
        let (_keep, write_half) = a.into_split();
        assert_eq!(round_trip(write_half, b, b"header", &range).await.unwrap(), expected, "unix");

        let (a, b) = tokio::io::duplex(64 * 1024);
        let (_keep, write_half) = tokio::io::split(a);
        assert_eq!(round_trip(write_half, b, b"header", &range).await.unwrap(), expected, "generic");
    }

    #[tokio::test]
    async fn a_file_shorter_than_the_range_is_an_error_not_padding() {
        let file = file_with(&pattern(8192));
        let range = FileRange { file, offset: 4096, len: 8192 };
        let (a, b) = UnixStream::pair().unwrap();
        let (_keep, write_half) = a.into_split();
        let err = round_trip(write_half, b, b"header", &range).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (_keep, write_half) = tokio::io::split(a);
        let err = round_trip(write_half, b, b"header", &range).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
