//! The reader task: replies in any order, each checked before a byte of it is used.
//!
//! Every reply must name a request in flight; a READ's data chunks must lie inside the
//! request without overlapping, and together with holes cover it exactly before DONE, so a
//! READ returns only bytes the server sent for those offsets: an error is better than a
//! wrong byte. Lengths are bounded before anything is read (a data chunk by its request, an
//! error chunk by the spec's 4 KiB message). Anything else is a protocol violation, which
//! ends the connection (every request in flight fails).

use std::sync::Arc;

use nbd_server::protocol::client_codec::{decode_error_chunk, decode_offset_hole};
use nbd_server::protocol::consts::{SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, reply_flags, reply_type};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::client::Shared;
use crate::error::{ClientError, Result};

/// Largest error chunk accepted: errno, message length, a 4 KiB message, an offset.
const MAX_ERROR_CHUNK_BYTES: u32 = 4 + 2 + 4096 + 8;

/// A READ's data so far, and the ranges of it received (relative to the request).
type ReadSoFar = (Vec<u8>, Vec<(u32, u32)>);

/// A request waiting for its reply.
pub(crate) struct Waiter {
    command: &'static str,
    offset: u64,
    len: u32,
    read: Option<ReadSoFar>,
    error: Option<(u32, String)>,
    tx: oneshot::Sender<Result<Option<Vec<u8>>>>,
    _permit: OwnedSemaphorePermit,
}

impl Waiter {
    pub(crate) fn new(
        command: &'static str,
        offset: u64,
        len: u32,
        is_read: bool,
        tx: oneshot::Sender<Result<Option<Vec<u8>>>>,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let read = is_read.then(|| (vec![0u8; len as usize], Vec::new()));
        Self { command, offset, len, read, error: None, tx, _permit: permit }
    }

    pub(crate) fn fail(self, e: ClientError) {
        let _ = self.tx.send(Err(e));
    }

    /// Records `[at, at + n)` (relative to the request) as received; overlaps are violations.
    fn cover(&mut self, at: u32, n: u32) -> std::result::Result<(), String> {
        let Some((_, ranges)) = &mut self.read else { return Err(format!("data for a {}", self.command)) };
        if ranges.iter().any(|&(a, b)| at < b && a < at + n) {
            return Err(format!("overlapping data at {}+{n}", self.offset + u64::from(at)));
        }
        ranges.push((at, at + n));
        Ok(())
    }

    fn finish(self, address: &str) -> std::result::Result<(), String> {
        let result = match (self.error, self.read) {
            (Some((errno, message)), _) => Err(ClientError::Errno {
                address: address.to_string(),
                command: self.command,
                offset: self.offset,
                len: u64::from(self.len),
                errno,
                message,
            }),
            (None, Some((data, ranges))) => {
                let covered: u64 = ranges.iter().map(|&(a, b)| u64::from(b - a)).sum();
                if covered != u64::from(self.len) {
                    return Err(format!("READ at {}+{} answered with {covered} bytes", self.offset, self.len));
                }
                Ok(Some(data))
            }
            (None, None) => Ok(None),
        };
        let _ = self.tx.send(result);
        Ok(())
    }
}

/// Reads replies until the connection ends, then fails whatever is still waiting.
pub(crate) async fn read_replies<R: AsyncRead + Unpin>(mut reader: R, shared: Arc<Shared>, structured: bool) {
    let why = match reply_loop(&mut reader, &shared, structured).await {
        Ok(()) => "the server closed the connection".to_string(),
        Err(why) => why,
    };
    shared.close(why);
}

/// `Ok(())` on a clean EOF between replies; `Err(why)` otherwise.
async fn reply_loop<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
    structured: bool,
) -> std::result::Result<(), String> {
    let io = |e: std::io::Error| format!("reading replies: {e}");
    loop {
        let mut magic = [0u8; 4];
        match reader.read_exact(&mut magic).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        }
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                let mut rest = [0u8; 12];
                reader.read_exact(&mut rest).await.map_err(io)?;
                let errno = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
                let cookie = u64::from_be_bytes(rest[4..].try_into().expect("8 bytes"));
                let mut waiter = take(shared, cookie)?;
                if errno != 0 {
                    waiter.error = Some((errno, String::new()));
                } else if let Some((data, ranges)) = &mut waiter.read {
                    if structured {
                        return Err(format!("a simple reply to a READ (cookie {cookie}) after structured replies"));
                    }
                    reader.read_exact(data).await.map_err(io)?;
                    ranges.push((0, waiter.len));
                }
                waiter.finish(&shared.address)?;
            }
            STRUCTURED_REPLY_MAGIC if structured => {
                let mut rest = [0u8; 16];
                reader.read_exact(&mut rest).await.map_err(io)?;
                let flags = u16::from_be_bytes(rest[..2].try_into().expect("2 bytes"));
                let kind = u16::from_be_bytes(rest[2..4].try_into().expect("2 bytes"));
                let cookie = u64::from_be_bytes(rest[4..12].try_into().expect("8 bytes"));
                let len = u32::from_be_bytes(rest[12..].try_into().expect("4 bytes"));
                chunk(reader, shared, flags, kind, cookie, len).await?;
            }
            other => return Err(format!("bad reply magic {other:#010x}")),
        }
    }
}

/// One structured chunk for `cookie`.
async fn chunk<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
    flags: u16,
    kind: u16,
    cookie: u64,
    len: u32,
) -> std::result::Result<(), String> {
    let io = |e: std::io::Error| format!("reading replies: {e}");
    let mut waiter = take(shared, cookie)?;
    match kind {
        reply_type::OFFSET_DATA => {
            let Some(n) = len.checked_sub(8).filter(|&n| n <= waiter.len) else {
                return Err(format!("OFFSET_DATA chunk of {len} bytes for a {}-byte {}", waiter.len, waiter.command));
            };
            let mut offset = [0u8; 8];
            reader.read_exact(&mut offset).await.map_err(io)?;
            let at = relative(&waiter, u64::from_be_bytes(offset), n)?;
            waiter.cover(at, n)?;
            let (data, _) = waiter.read.as_mut().expect("covered only for reads");
            reader.read_exact(&mut data[at as usize..(at + n) as usize]).await.map_err(io)?;
        }
        reply_type::OFFSET_HOLE => {
            if len != 12 {
                return Err(format!("OFFSET_HOLE chunk of {len} bytes"));
            }
            let mut payload = [0u8; 12];
            reader.read_exact(&mut payload).await.map_err(io)?;
            let (offset, n) = decode_offset_hole(&payload).map_err(|e| e.to_string())?;
            let at = relative(&waiter, offset, n)?;
            waiter.cover(at, n)?;
            let (data, _) = waiter.read.as_mut().expect("covered only for reads");
            data[at as usize..(at + n) as usize].fill(0);
        }
        reply_type::NONE if len == 0 => {}
        error if error & 0x8000 != 0 => {
            if len > MAX_ERROR_CHUNK_BYTES {
                return Err(format!("error chunk of {len} bytes"));
            }
            let mut payload = vec![0u8; len as usize];
            reader.read_exact(&mut payload).await.map_err(io)?;
            let with_offset = error == reply_type::ERROR_OFFSET;
            let (errno, message, _) = if error == reply_type::ERROR || with_offset {
                decode_error_chunk(&payload, with_offset).map_err(|e| e.to_string())?
            } else {
                // An error type this side does not know: still an error for the request.
                (nbd_server::protocol::consts::errno::EIO, format!("error chunk type {error}"), None)
            };
            if errno == 0 {
                return Err("an error chunk with errno 0".into());
            }
            waiter.error.get_or_insert((errno, message));
        }
        other => return Err(format!("unexpected chunk type {other} ({len} bytes) for a {}", waiter.command)),
    }
    if flags & reply_flags::DONE != 0 {
        waiter.finish(&shared.address)
    } else {
        shared.lock().by_cookie.insert(cookie, waiter);
        Ok(())
    }
}

/// The waiter for `cookie` (taken out while its reply is read).
fn take(shared: &Shared, cookie: u64) -> std::result::Result<Waiter, String> {
    shared
        .lock()
        .by_cookie
        .remove(&cookie)
        .ok_or_else(|| format!("a reply for cookie {cookie}, which is not in flight"))
}

/// `offset..offset + n` as a range of the request, which it must lie in.
fn relative(waiter: &Waiter, offset: u64, n: u32) -> std::result::Result<u32, String> {
    let inside = offset >= waiter.offset && offset + u64::from(n) <= waiter.offset + u64::from(waiter.len);
    if waiter.read.is_none() || !inside {
        return Err(format!(
            "chunk at {offset}+{n} outside the {} at {}+{}",
            waiter.command, waiter.offset, waiter.len
        ));
    }
    Ok((offset - waiter.offset) as u32)
}
