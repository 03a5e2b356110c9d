//! [`NbdStream`]: a byte stream an NBD connection runs on, and how it splits into the
//! request reader and the reply writer. TCP and Unix sockets split into their own halves;
//! [`GenericStream`] wraps any other stream (split with `tokio::io::split`).
//!
//! Contract: the halves are independent (one task reads requests while another writes
//! replies); [`into_tcp`](NbdStream::into_tcp) gives the socket back only for plain TCP, for
//! the kernel to take over a TLS session.

use std::io;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::request_source::RequestSource;
use crate::send_file::ReplySink;

/// A byte stream an NBD connection can run on, splittable into independent halves so
/// that one task reads requests while another writes replies.
pub trait NbdStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type ReadHalf: RequestSource;
    type WriteHalf: ReplySink;
    fn into_halves(self) -> (Self::ReadHalf, Self::WriteHalf);
    /// The TCP socket, if this is one (for kernel TLS).
    fn into_tcp(self) -> std::result::Result<TcpStream, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

impl NbdStream for TcpStream {
    type ReadHalf = tokio::net::tcp::OwnedReadHalf;
    type WriteHalf = tokio::net::tcp::OwnedWriteHalf;
    fn into_halves(self) -> (Self::ReadHalf, Self::WriteHalf) {
        self.into_split()
    }
    fn into_tcp(self) -> std::result::Result<TcpStream, Self> {
        Ok(self)
    }
}

impl NbdStream for UnixStream {
    type ReadHalf = tokio::net::unix::OwnedReadHalf;
    type WriteHalf = tokio::net::unix::OwnedWriteHalf;
    fn into_halves(self) -> (Self::ReadHalf, Self::WriteHalf) {
        self.into_split()
    }
}

/// Any other stream (e.g. a future TLS stream), split with `tokio::io::split`.
pub struct GenericStream<S>(pub S);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for GenericStream<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for GenericStream<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> NbdStream for GenericStream<S> {
    type ReadHalf = tokio::io::ReadHalf<S>;
    type WriteHalf = tokio::io::WriteHalf<S>;
    fn into_halves(self) -> (Self::ReadHalf, Self::WriteHalf) {
        tokio::io::split(self.0)
    }
}
