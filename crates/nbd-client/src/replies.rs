//! The reader task: replies in any order, each checked before a byte of it is used.
//!
//! Every field is checked, with checked arithmetic, against the request it answers and the
//! spec: the magic; the cookie (a request in flight); a structured chunk's flags (DONE only),
//! type and length (NONE: empty and DONE; OFFSET_HOLE: 12 bytes; OFFSET_DATA: at most the
//! request's length; BLOCK_STATUS: one per BLOCK_STATUS request, for the context negotiated,
//! extents of non-zero length, clipped to the request; an error chunk: at most the spec's
//! 4 KiB message); offsets and lengths
//! (inside the request, no overlap, no wrap past 2^64); error chunks (a non-zero errno, an
//! ERROR_OFFSET inside the request); and a READ must be covered exactly by data and holes
//! before DONE. So a READ returns only bytes the server sent for those offsets: an error is
//! better than a wrong byte. Lengths are bounded before anything is read. Anything else is a
//! protocol violation, which ends the connection (every request in flight fails with
//! [`ClientError::Protocol`]); chunks in any order are not: the spec allows them.
//!
//! [`ClientError::Protocol`]: crate::ClientError::Protocol

use std::sync::Arc;

use nbd_server::protocol::client_codec::{
    BLOCK_DESCRIPTOR_EXT_LEN, BLOCK_DESCRIPTOR_LEN, decode_block_descriptor, decode_error_chunk, decode_offset_hole,
};
use nbd_server::protocol::consts::{
    EXTENDED_REPLY_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, reply_flags, reply_type,
};
use nbd_server::protocol::framing::Framing;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::shared::{Closed, Shared};
use crate::waiter::{Violation, Waiter};

/// Block status extents kept of one answer (the rest are read and dropped).
pub(crate) const MAX_STATUS_EXTENTS: usize = 1 << 16;

/// Largest error chunk accepted: errno, message length, a 4 KiB message, an offset.
pub(crate) const MAX_ERROR_CHUNK_BYTES: u32 = 4 + 2 + 4096 + 8;

/// The reply stream's read buffer.
const REPLY_BUFFER_BYTES: usize = 64 << 10;

/// Reads replies until the connection ends, then fails whatever is still waiting.
pub(crate) async fn read_replies<R: AsyncRead + Unpin>(reader: R, shared: Arc<Shared>, framing: Framing) {
    // Buffered: one `read` brings many small replies (headers, 4 KiB data) instead of three
    // reads each; a large READ's data past the buffer is read straight into its own.
    let mut reader = tokio::io::BufReader::with_capacity(REPLY_BUFFER_BYTES, reader);
    let closed = match reply_loop(&mut reader, &shared, framing).await {
        Ok(()) => Closed::lost("the server closed the connection"),
        Err(Ended::Io(e)) => Closed::lost(format!("reading replies: {e}")),
        Err(Ended::Violation(what)) => Closed::violation(what),
    };
    shared.close(closed);
}

/// How the reply stream ended, other than a clean EOF between replies.
pub(crate) enum Ended {
    Io(std::io::Error),
    Violation(Violation),
}

impl From<Violation> for Ended {
    fn from(what: Violation) -> Self {
        Ended::Violation(what)
    }
}

impl From<std::io::Error> for Ended {
    fn from(e: std::io::Error) -> Self {
        Ended::Io(e)
    }
}

/// `Ok(())` on a clean EOF between replies; how it ended otherwise.
pub(crate) async fn reply_loop<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
    framing: Framing,
) -> std::result::Result<(), Ended> {
    loop {
        let mut magic = [0u8; 4];
        match reader.read_exact(&mut magic).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC if framing.extended() => {
                return Err("a simple reply after extended headers".to_string().into());
            }
            SIMPLE_REPLY_MAGIC => {
                let mut rest = [0u8; 12];
                reader.read_exact(&mut rest).await?;
                let errno = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
                let cookie = u64::from_be_bytes(rest[4..].try_into().expect("8 bytes"));
                let mut waiter = take(shared, cookie)?;
                if framing.structured() && waiter.read.is_some() {
                    // The spec: never a simple reply to a READ, not even an error.
                    put_back(shared, cookie, waiter);
                    return Err(format!("a simple reply to a READ (cookie {cookie}) after structured replies").into());
                }
                if errno != 0 {
                    waiter.error = Some((errno, String::new()));
                } else if let Some((data, ranges)) = &mut waiter.read {
                    if let Err(e) = reader.read_exact(data.bytes_mut()).await {
                        put_back(shared, cookie, waiter);
                        return Err(e.into());
                    }
                    ranges.push((0, waiter.len));
                }
                waiter.finish(&shared.address);
            }
            STRUCTURED_REPLY_MAGIC if framing == Framing::Structured => {
                let mut rest = [0u8; 16];
                reader.read_exact(&mut rest).await?;
                let flags = u16::from_be_bytes(rest[..2].try_into().expect("2 bytes"));
                let kind = u16::from_be_bytes(rest[2..4].try_into().expect("2 bytes"));
                let cookie = u64::from_be_bytes(rest[4..12].try_into().expect("8 bytes"));
                let len = u32::from_be_bytes(rest[12..].try_into().expect("4 bytes"));
                chunk(reader, shared, ChunkHeader { flags, kind, cookie, offset: None, len }, framing).await?;
            }
            STRUCTURED_REPLY_MAGIC => {
                return Err(format!("a structured reply chunk, with {framing:?} framing negotiated").into());
            }
            EXTENDED_REPLY_MAGIC if framing.extended() => {
                let mut rest = [0u8; 28];
                reader.read_exact(&mut rest).await?;
                let flags = u16::from_be_bytes(rest[..2].try_into().expect("2 bytes"));
                let kind = u16::from_be_bytes(rest[2..4].try_into().expect("2 bytes"));
                let cookie = u64::from_be_bytes(rest[4..12].try_into().expect("8 bytes"));
                let offset = u64::from_be_bytes(rest[12..20].try_into().expect("8 bytes"));
                let len = u64::from_be_bytes(rest[20..].try_into().expect("8 bytes"));
                // Every payload this side reads fits 32 bits (a READ is at most 4 GiB).
                let len = u32::try_from(len).map_err(|_| format!("a reply chunk of {len} bytes"))?;
                chunk(reader, shared, ChunkHeader { flags, kind, cookie, offset: Some(offset), len }, framing).await?;
            }
            EXTENDED_REPLY_MAGIC => return Err("an extended reply chunk, which was not negotiated".to_string().into()),
            other => return Err(format!("bad reply magic {other:#010x}").into()),
        }
    }
}

/// A structured or extended chunk header, decoded (the payload length bounded to 32 bits).
struct ChunkHeader {
    flags: u16,
    kind: u16,
    cookie: u64,
    /// The request's offset, repeated by an extended header.
    offset: Option<u64>,
    len: u32,
}

/// One structured chunk. The waiter is taken out while its chunk is read and put back
/// unless this was its last; on a violation it stays for the close to fail.
async fn chunk<R: AsyncRead + Unpin>(
    reader: &mut R,
    shared: &Shared,
    header: ChunkHeader,
    framing: Framing,
) -> std::result::Result<(), Ended> {
    let ChunkHeader { flags, kind, cookie, offset, len } = header;
    if flags & !reply_flags::DONE != 0 {
        return Err(format!("unknown reply flags {flags:#06x}").into());
    }
    let mut waiter = take(shared, cookie)?;
    if let Some(offset) = offset.filter(|&o| o != waiter.offset) {
        let what = format!("a chunk header for offset {offset}, answering the {} at {}", waiter.command, waiter.offset);
        put_back(shared, cookie, waiter);
        return Err(what.into());
    }
    let read = chunk_into(reader, &mut waiter, flags, kind, len, framing).await;
    let done = flags & reply_flags::DONE != 0;
    match read.and_then(|()| if done { waiter.check_complete().map_err(Ended::from) } else { Ok(()) }) {
        Ok(()) if done => waiter.finish(&shared.address),
        Ok(()) => put_back(shared, cookie, waiter),
        Err(e) => {
            put_back(shared, cookie, waiter);
            return Err(e);
        }
    }
    Ok(())
}

/// Reads one chunk's payload into `waiter`.
async fn chunk_into<R: AsyncRead + Unpin>(
    reader: &mut R,
    waiter: &mut Waiter,
    flags: u16,
    kind: u16,
    len: u32,
    framing: Framing,
) -> std::result::Result<(), Ended> {
    match kind {
        reply_type::OFFSET_DATA => {
            let Some(n) = len.checked_sub(8).filter(|&n| n <= waiter.len) else {
                return Err(
                    format!("OFFSET_DATA chunk of {len} bytes for a {}-byte {}", waiter.len, waiter.command).into()
                );
            };
            let mut offset = [0u8; 8];
            reader.read_exact(&mut offset).await?;
            let range = waiter.cover(u64::from_be_bytes(offset), n)?;
            let (data, _) = waiter.read.as_mut().expect("covered only for reads");
            reader.read_exact(&mut data.bytes_mut()[range]).await?;
        }
        reply_type::OFFSET_HOLE => {
            if len != 12 {
                return Err(format!("OFFSET_HOLE chunk of {len} bytes").into());
            }
            let mut payload = [0u8; 12];
            reader.read_exact(&mut payload).await?;
            let (offset, n) = decode_offset_hole(&payload).map_err(|e| e.to_string())?;
            let range = waiter.cover(offset, n)?;
            let (data, _) = waiter.read.as_mut().expect("covered only for reads");
            data.bytes_mut()[range].fill(0);
        }
        reply_type::BLOCK_STATUS if !framing.extended() => block_status(reader, waiter, len, false).await?,
        reply_type::BLOCK_STATUS_EXT if framing.extended() => block_status(reader, waiter, len, true).await?,
        reply_type::NONE => {
            if len != 0 || flags & reply_flags::DONE == 0 {
                return Err(format!("a NONE chunk of {len} bytes, flags {flags:#06x} (must be empty and DONE)").into());
            }
        }
        error if error & 0x8000 != 0 => {
            if len > MAX_ERROR_CHUNK_BYTES {
                return Err(format!("error chunk of {len} bytes").into());
            }
            let mut payload = vec![0u8; len as usize];
            reader.read_exact(&mut payload).await?;
            let with_offset = error == reply_type::ERROR_OFFSET;
            let (errno, message) = if error == reply_type::ERROR || with_offset {
                let (errno, message, offset) = decode_error_chunk(&payload, with_offset).map_err(|e| e.to_string())?;
                let request_end = waiter.offset.saturating_add(u64::from(waiter.len));
                if let Some(at) = offset.filter(|&at| at < waiter.offset || at >= request_end) {
                    return Err(format!(
                        "an error at offset {at}, outside the {} at {}+{}",
                        waiter.command, waiter.offset, waiter.len
                    )
                    .into());
                }
                (errno, message)
            } else {
                // An error type this side does not know: still an error for the request.
                (nbd_server::protocol::consts::errno::EIO, format!("error chunk type {error:#06x}"))
            };
            if errno == 0 {
                return Err("an error chunk with errno 0".to_string().into());
            }
            waiter.error.get_or_insert((errno, message));
        }
        other => {
            return Err(format!("unknown chunk type {other} ({len} bytes) for a {}", waiter.command).into());
        }
    }
    Ok(())
}

/// A BLOCK_STATUS (or, with extended headers, BLOCK_STATUS_EXT) chunk's payload into
/// `waiter`: one per request, for the context negotiated, at least one descriptor, none of
/// length 0, clipped to the request. The first [`MAX_STATUS_EXTENTS`] describe a prefix,
/// which is an answer too; the rest is read and dropped, so memory stays bounded whatever
/// the server sends.
async fn block_status<R: AsyncRead + Unpin>(
    reader: &mut R,
    waiter: &mut Waiter,
    len: u32,
    extended: bool,
) -> std::result::Result<(), Ended> {
    let Some((context, extents)) = waiter.status.as_mut() else {
        return Err(format!("block status for a {}", waiter.command).into());
    };
    if extents.is_some() {
        return Err("a second block status chunk for one context".to_string().into());
    }
    let (head, descriptor) = if extended { (8, BLOCK_DESCRIPTOR_EXT_LEN) } else { (4, BLOCK_DESCRIPTOR_LEN) };
    let count = (len as usize).checked_sub(head).filter(|n| *n > 0 && n % descriptor == 0).map(|n| n / descriptor);
    let Some(count) = count else { return Err(format!("a block status chunk of {len} bytes").into()) };
    let mut raw_head = [0u8; 8];
    reader.read_exact(&mut raw_head[..head]).await?;
    let id = u32::from_be_bytes(raw_head[..4].try_into().expect("4 bytes"));
    if id != *context {
        return Err(format!("block status for meta context {id}, not {context}").into());
    }
    if extended && u32::from_be_bytes(raw_head[4..].try_into().expect("4 bytes")) as usize != count {
        return Err("a BLOCK_STATUS_EXT descriptor count that disagrees with its length".to_string().into());
    }
    let mut kept = Vec::with_capacity(count.min(MAX_STATUS_EXTENTS));
    let mut covered = 0u64;
    let mut raw = [0u8; BLOCK_DESCRIPTOR_EXT_LEN];
    for _ in 0..count {
        reader.read_exact(&mut raw[..descriptor]).await?;
        let (n, flags) = decode_block_descriptor(&raw[..descriptor]).expect("a descriptor's length");
        let flags = u32::try_from(flags).map_err(|_| format!("block status flags {flags:#x} beyond 32 bits"))?;
        if n == 0 {
            return Err("a block status extent of length 0".to_string().into());
        }
        if kept.len() < MAX_STATUS_EXTENTS && covered < u64::from(waiter.len) {
            let n = n.min(u64::from(waiter.len) - covered) as u32;
            kept.push((n, flags));
            covered += u64::from(n);
        }
    }
    *extents = Some(kept);
    Ok(())
}

/// The waiter for `cookie` (taken out while its reply is read).
fn take(shared: &Shared, cookie: u64) -> std::result::Result<Waiter, Violation> {
    shared
        .lock()
        .by_cookie
        .remove(&cookie)
        .ok_or_else(|| format!("a reply for cookie {cookie}, which is not in flight"))
}

fn put_back(shared: &Shared, cookie: u64, waiter: Waiter) {
    shared.lock().by_cookie.insert(cookie, waiter);
}
