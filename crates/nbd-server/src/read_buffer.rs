//! Reading whole messages out of a byte stream into a `BytesMut`.
//!
//! NBD is a byte stream: a header and its payload may arrive in any number of pieces (the
//! kernel even resumes a send interrupted by a signal mid-header). These helpers fill the
//! buffer until a decoder has enough, and tell a clean close at a message boundary apart
//! from a close in the middle of a message.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{Error, Result};

/// Read at least this much spare room at a time.
const READ_CHUNK_BYTES: usize = 128 * 1024;
/// Grow the buffer when less than this is free.
const MIN_SPARE_BYTES: usize = 4096;

/// Ensures `buf` holds at least `n` bytes. Returns `Ok(false)` if the peer closed the
/// stream while `buf` was empty (a clean close between messages).
pub(crate) async fn fill<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut BytesMut, n: usize) -> Result<bool> {
    fill_up_to(reader, buf, n, true).await
}

/// [`fill`], reading ahead whatever is queued when `read_ahead`; else nothing beyond the
/// `n`th byte, so what follows stays in the stream (a WRITE payload behind a header, to be
/// received into a buffer of its own).
pub(crate) async fn fill_up_to<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    n: usize,
    read_ahead: bool,
) -> Result<bool> {
    while buf.len() < n {
        let read = match read_ahead {
            true => {
                if buf.capacity() - buf.len() < MIN_SPARE_BYTES {
                    buf.reserve(READ_CHUNK_BYTES);
                }
                reader.read_buf(buf).await?
            }
            false => {
                buf.reserve(n - buf.len());
                (&mut *reader).take((n - buf.len()) as u64).read_buf(buf).await?
            }
        };
        if read == 0 {
            return if buf.is_empty() { Ok(false) } else { Err(Error::UnexpectedEof) };
        }
    }
    Ok(true)
}

/// Like [`fill`], but a close before `n` bytes is always an error.
pub(crate) async fn fill_exact<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut BytesMut, n: usize) -> Result<()> {
    if fill(reader, buf, n).await? { Ok(()) } else { Err(Error::UnexpectedEof) }
}

/// Consumes `n` bytes (buffered first, then from the stream) without keeping them.
pub(crate) async fn discard<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut BytesMut, n: u64) -> Result<()> {
    let from_buf = (buf.len() as u64).min(n);
    buf.advance(from_buf as usize);
    let rest = n - from_buf;
    if rest > 0 {
        let copied = tokio::io::copy(&mut (&mut *reader).take(rest), &mut tokio::io::sink()).await?;
        if copied < rest {
            return Err(Error::UnexpectedEof);
        }
    }
    Ok(())
}
