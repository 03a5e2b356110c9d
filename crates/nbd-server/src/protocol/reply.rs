//! Transmission replies: encoders into a [`Reply`] of segments, plus small decoders.
//!
//! A reply is a list of [`Segment`]s so that READ data travels from the device to the
//! socket without a copy: headers are small inline arrays, data is the device's `Bytes`,
//! and zero runs are written from a static zero page. The writer (`transmission.rs`) turns
//! the segments of many replies into one vectored write.
//!
//! The decoders at the bottom ([`decode_simple_reply`], [`decode_chunk_header`]) are pure
//! and used by the raw-socket tests and the fuzz round-trip.

use std::os::unix::fs::FileExt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::device::FileRange;

use super::consts::{EXTENDED_REPLY_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, reply_flags, reply_type};
use super::framing::ReplyTo;

/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Length of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Length of an extended reply chunk header.
pub const EXTENDED_CHUNK_HEADER_LEN: usize = 32;
const MAX_CHUNK_HEADER_LEN: usize = EXTENDED_CHUNK_HEADER_LEN;
/// Inline segments hold at most this many bytes (largest: extended chunk header + hole payload).
pub const INLINE_MAX: usize = EXTENDED_CHUNK_HEADER_LEN + 12;

/// Bytes of a small header, stored inline to avoid an allocation per reply.
#[derive(Clone, Copy)]
pub struct Inline {
    len: u8,
    buf: [u8; INLINE_MAX],
}

impl Inline {
    fn new(bytes: &[u8]) -> Self {
        debug_assert!(bytes.len() <= INLINE_MAX);
        let mut buf = [0u8; INLINE_MAX];
        buf[..bytes.len()].copy_from_slice(bytes);
        Self { len: bytes.len() as u8, buf }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Inline({:02x?})", self.as_slice())
    }
}

/// One contiguous piece of a reply on the wire.
#[derive(Debug, Clone)]
pub enum Segment {
    Inline(Inline),
    Data(Bytes),
    /// This many zero bytes.
    Zeroes(usize),
    /// Bytes of a file, sent from its mapping or with `sendfile` (see `crate::send_file`).
    File(FileRange),
}

impl Segment {
    pub fn len(&self) -> usize {
        match self {
            Segment::Inline(i) => i.len as usize,
            Segment::Data(b) => b.len(),
            Segment::Zeroes(n) => *n,
            Segment::File(range) => range.len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything sent for one request, in order.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub segments: Vec<Segment>,
}

impl Reply {
    pub fn with_capacity(segments: usize) -> Self {
        Self { segments: Vec::with_capacity(segments) }
    }

    pub fn wire_len(&self) -> usize {
        self.segments.iter().map(Segment::len).sum()
    }

    fn push_inline(&mut self, bytes: &[u8]) {
        self.segments.push(Segment::Inline(Inline::new(bytes)));
    }

    /// Appends a data segment, dropping empty ones.
    pub fn push_data(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.segments.push(Segment::Data(data));
        }
    }

    pub fn push_zeroes(&mut self, len: usize) {
        if len > 0 {
            self.segments.push(Segment::Zeroes(len));
        }
    }

    /// Flattens the segments (tests and debugging; the writer never does this). Panics if a
    /// file segment cannot be read.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.wire_len());
        for segment in &self.segments {
            match segment {
                Segment::Inline(i) => out.extend_from_slice(i.as_slice()),
                Segment::Data(b) => out.extend_from_slice(b),
                Segment::Zeroes(n) => out.resize(out.len() + n, 0),
                Segment::File(range) => {
                    let start = out.len();
                    out.resize(start + range.len as usize, 0);
                    range.file.read_exact_at(&mut out[start..], range.offset).expect("file segment readable");
                }
            }
        }
        out
    }

    /// Simple reply header (the READ data, if any, is pushed after it by the caller); never
    /// with extended headers.
    pub fn push_simple(&mut self, to: ReplyTo, error: u32) {
        debug_assert!(!to.framing.extended(), "no simple replies with extended headers");
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&error.to_be_bytes());
        b[8..16].copy_from_slice(&to.cookie.to_be_bytes());
        self.push_inline(&b);
    }

    /// Success of a command without data: a simple reply, or with extended headers (which
    /// have none) a NONE chunk with DONE.
    pub fn push_ok(&mut self, to: ReplyTo) {
        if to.framing.extended() { self.push_none_done(to) } else { self.push_simple(to, 0) }
    }

    /// `NBD_REPLY_TYPE_NONE` with DONE: success of a non-READ command or end of a READ.
    pub fn push_none_done(&mut self, to: ReplyTo) {
        let (header, n) = chunk_header(reply_flags::DONE, reply_type::NONE, to, 0);
        self.push_inline(&header[..n]);
    }

    /// Header of an `OFFSET_DATA` chunk carrying `data_len` bytes; the caller pushes the data.
    pub fn push_offset_data_header(&mut self, done: bool, to: ReplyTo, offset: u64, data_len: u32) {
        debug_assert!(data_len > 0 && data_len <= u32::MAX - 8);
        let (b, n) = chunk_header(done_flag(done), reply_type::OFFSET_DATA, to, data_len + 8);
        let mut out = [0u8; MAX_CHUNK_HEADER_LEN + 8];
        out[..n].copy_from_slice(&b[..n]);
        out[n..n + 8].copy_from_slice(&offset.to_be_bytes());
        self.push_inline(&out[..n + 8]);
    }

    /// An `OFFSET_HOLE` chunk.
    pub fn push_offset_hole(&mut self, done: bool, to: ReplyTo, offset: u64, hole_len: u32) {
        debug_assert!(hole_len > 0);
        let (b, n) = chunk_header(done_flag(done), reply_type::OFFSET_HOLE, to, 12);
        let mut out = [0u8; MAX_CHUNK_HEADER_LEN + 12];
        out[..n].copy_from_slice(&b[..n]);
        out[n..n + 8].copy_from_slice(&offset.to_be_bytes());
        out[n + 8..n + 12].copy_from_slice(&hole_len.to_be_bytes());
        self.push_inline(&out[..n + 12]);
    }

    /// An error reply: an error chunk (with `offset` and `message`) when structured replies
    /// or extended headers were negotiated, else a simple reply carrying only `error`.
    pub fn push_error(&mut self, to: ReplyTo, error: u32, message: &str, offset: Option<u64>) {
        if to.framing.structured() {
            self.push_error_chunk(to, error, message, offset);
        } else {
            self.push_simple(to, error);
        }
    }

    /// A final error chunk: `ERROR_OFFSET` when `offset` is known, else `ERROR`.
    pub fn push_error_chunk(&mut self, to: ReplyTo, error: u32, message: &str, offset: Option<u64>) {
        debug_assert!(error != 0);
        let message = clip_message(message);
        let tail = if offset.is_some() { 8 } else { 0 };
        let payload_len = 6 + message.len() + tail;
        let chunk_type = if offset.is_some() { reply_type::ERROR_OFFSET } else { reply_type::ERROR };
        let (header, n) = chunk_header(reply_flags::DONE, chunk_type, to, payload_len as u32);
        let mut b = BytesMut::with_capacity(n + payload_len);
        b.put_slice(&header[..n]);
        b.put_u32(error);
        b.put_u16(message.len() as u16);
        b.put_slice(message.as_bytes());
        if let Some(offset) = offset {
            b.put_u64(offset);
        }
        self.segments.push(Segment::Data(b.freeze()));
    }

    /// A block-status chunk for meta context `context_id` (the last of the reply when
    /// `done`); `extents` are (length, flags): `BLOCK_STATUS` with 32-bit lengths, or with
    /// extended headers `BLOCK_STATUS_EXT` (a descriptor count, then 64-bit lengths and flags).
    pub fn push_block_status(&mut self, to: ReplyTo, context_id: u32, extents: &[(u64, u32)], done: bool) {
        debug_assert!(!extents.is_empty() && extents.iter().all(|&(len, _)| len > 0));
        let extended = to.framing.extended();
        let payload_len = if extended { 8 + 16 * extents.len() } else { 4 + 8 * extents.len() };
        let chunk_type = if extended { reply_type::BLOCK_STATUS_EXT } else { reply_type::BLOCK_STATUS };
        let (header, n) = chunk_header(done_flag(done), chunk_type, to, payload_len as u32);
        let mut b = BytesMut::with_capacity(n + payload_len);
        b.put_slice(&header[..n]);
        b.put_u32(context_id);
        if extended {
            b.put_u32(extents.len() as u32);
        }
        for &(len, flags) in extents {
            if extended {
                b.put_u64(len);
                b.put_u64(flags.into());
            } else {
                debug_assert!(len <= u64::from(u32::MAX), "compact requests are 32-bit");
                b.put_u32(len as u32);
                b.put_u32(flags);
            }
        }
        self.segments.push(Segment::Data(b.freeze()));
    }
}

fn done_flag(done: bool) -> u16 {
    if done { reply_flags::DONE } else { 0 }
}

/// Error messages are strings: at most 4096 bytes, cut on a character boundary.
fn clip_message(message: &str) -> &str {
    let mut end = message.len().min(super::consts::MAX_STRING_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// A reply chunk header: structured (20 bytes) or extended (32 bytes, with the request's
/// offset and a 64-bit payload length). Returns the buffer and how much of it is used.
pub fn chunk_header(flags: u16, chunk_type: u16, to: ReplyTo, payload_len: u32) -> ([u8; MAX_CHUNK_HEADER_LEN], usize) {
    debug_assert!(to.framing.structured());
    let mut b = [0u8; MAX_CHUNK_HEADER_LEN];
    let magic = if to.framing.extended() { EXTENDED_REPLY_MAGIC } else { STRUCTURED_REPLY_MAGIC };
    b[0..4].copy_from_slice(&magic.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    b[8..16].copy_from_slice(&to.cookie.to_be_bytes());
    if to.framing.extended() {
        b[16..24].copy_from_slice(&to.offset.to_be_bytes());
        b[24..32].copy_from_slice(&u64::from(payload_len).to_be_bytes());
    } else {
        b[16..20].copy_from_slice(&payload_len.to_be_bytes());
    }
    (b, to.framing.chunk_header_len())
}

/// At most this many extents go into one BLOCK_STATUS chunk (the spec suggests <= 2^20).
pub const MAX_EXTENTS_PER_REPLY: usize = 1 << 16;

/// Turns device extents into wire descriptors `(length, flags)` for a request of `len` bytes.
///
/// Zero-length extents are skipped, neighbours with equal flags merged, the total clipped
/// to `len` (never overshooting), and the count capped (the spec lets a server describe
/// less than asked). With `req_one` only the first descriptor is kept. If the device said
/// nothing usable, one extent of status 0 ("allocated, contents unknown") covers the
/// request, which is always a correct answer.
pub fn encode_extents(extents: &[crate::device::Extent], len: u64, req_one: bool) -> Vec<(u64, u32)> {
    use super::consts::state;
    let flagged = extents
        .iter()
        .map(|e| (e.len_bytes, if e.hole { state::HOLE } else { 0 } | if e.zero { state::ZERO } else { 0 }));
    encode_descriptors(flagged, len, req_one)
}

/// [`encode_extents`] for any meta context's `(length, flags)` (0 is every context's
/// "nothing to say").
pub fn encode_descriptors(extents: impl IntoIterator<Item = (u64, u32)>, len: u64, req_one: bool) -> Vec<(u64, u32)> {
    debug_assert!(len > 0);
    let limit = if req_one { 1 } else { MAX_EXTENTS_PER_REPLY };
    let mut out: Vec<(u64, u32)> = Vec::new();
    let mut remaining = len;
    for (extent_len, flags) in extents {
        if remaining == 0 {
            break;
        }
        if extent_len == 0 {
            continue;
        }
        let piece = extent_len.min(remaining);
        if let Some((last_len, last_flags)) = out.last_mut()
            && *last_flags == flags
        {
            *last_len += piece;
        } else if out.len() == limit {
            break;
        } else {
            out.push((piece, flags));
        }
        remaining -= piece;
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    debug_assert!(out.iter().map(|&(l, _)| l).sum::<u64>() <= len);
    out
}

/// A decoded simple reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReplyHeader {
    pub error: u32,
    pub cookie: u64,
}

/// Decodes a simple reply header; `None` if the buffer is short or the magic differs.
pub fn decode_simple_reply(buf: &[u8]) -> Option<SimpleReplyHeader> {
    let raw = buf.first_chunk::<SIMPLE_REPLY_LEN>()?;
    if u32::from_be_bytes(raw[0..4].try_into().ok()?) != SIMPLE_REPLY_MAGIC {
        return None;
    }
    Some(SimpleReplyHeader {
        error: u32::from_be_bytes(raw[4..8].try_into().ok()?),
        cookie: u64::from_be_bytes(raw[8..16].try_into().ok()?),
    })
}

/// A decoded chunk header, structured or extended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub chunk_type: u16,
    pub cookie: u64,
    pub payload_len: u32,
}

/// Decodes a structured chunk header; `None` if the buffer is short or the magic differs.
pub fn decode_chunk_header(buf: &[u8]) -> Option<ChunkHeader> {
    let raw = buf.first_chunk::<CHUNK_HEADER_LEN>()?;
    if u32::from_be_bytes(raw[0..4].try_into().ok()?) != STRUCTURED_REPLY_MAGIC {
        return None;
    }
    Some(ChunkHeader {
        flags: u16::from_be_bytes(raw[4..6].try_into().ok()?),
        chunk_type: u16::from_be_bytes(raw[6..8].try_into().ok()?),
        cookie: u64::from_be_bytes(raw[8..16].try_into().ok()?),
        payload_len: u32::from_be_bytes(raw[16..20].try_into().ok()?),
    })
}

/// Decodes an extended chunk header into the header and the offset it repeats; `None` if
/// the buffer is short, the magic differs or the payload length is over 32 bits.
pub fn decode_extended_chunk_header(buf: &[u8]) -> Option<(ChunkHeader, u64)> {
    let raw = buf.first_chunk::<EXTENDED_CHUNK_HEADER_LEN>()?;
    if u32::from_be_bytes(raw[0..4].try_into().ok()?) != EXTENDED_REPLY_MAGIC {
        return None;
    }
    let header = ChunkHeader {
        flags: u16::from_be_bytes(raw[4..6].try_into().ok()?),
        chunk_type: u16::from_be_bytes(raw[6..8].try_into().ok()?),
        cookie: u64::from_be_bytes(raw[8..16].try_into().ok()?),
        payload_len: u32::try_from(u64::from_be_bytes(raw[24..32].try_into().ok()?)).ok()?,
    };
    Some((header, u64::from_be_bytes(raw[16..24].try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::consts::BASE_ALLOCATION_ID;
    use crate::protocol::framing::Framing;

    fn to(framing: Framing, cookie: u64) -> ReplyTo {
        ReplyTo { framing, cookie, offset: 4096 }
    }

    #[test]
    fn simple_reply_round_trips() {
        let mut r = Reply::default();
        r.push_simple(to(Framing::Simple, 0xdead_beef_0000_0001), 22);
        r.push_data(Bytes::from_static(b"abc"));
        r.push_zeroes(2);
        let wire = r.to_vec();
        assert_eq!(wire.len(), 16 + 5);
        assert_eq!(decode_simple_reply(&wire), Some(SimpleReplyHeader { error: 22, cookie: 0xdead_beef_0000_0001 }));
        assert_eq!(&wire[16..], b"abc\0\0");
    }

    #[test]
    fn chunks_round_trip() {
        let mut r = Reply::default();
        r.push_offset_data_header(false, to(Framing::Structured, 5), 4096, 3);
        r.push_data(Bytes::from_static(b"xyz"));
        r.push_offset_hole(true, to(Framing::Structured, 5), 4099, 512);
        let wire = r.to_vec();
        let h = decode_chunk_header(&wire).unwrap();
        assert_eq!(h, ChunkHeader { flags: 0, chunk_type: reply_type::OFFSET_DATA, cookie: 5, payload_len: 11 });
        assert_eq!(u64::from_be_bytes(wire[20..28].try_into().unwrap()), 4096);
        let h2 = decode_chunk_header(&wire[31..]).unwrap();
        assert_eq!(h2.flags, reply_flags::DONE);
        assert_eq!(h2.chunk_type, reply_type::OFFSET_HOLE);
        assert_eq!(h2.payload_len, 12);
        assert_eq!(u32::from_be_bytes(wire[31 + 28..31 + 32].try_into().unwrap()), 512);
    }

    #[test]
    fn error_and_block_status_chunks() {
        let mut r = Reply::default();
        r.push_error_chunk(to(Framing::Structured, 9), 5, "boom", Some(1024));
        let wire = r.to_vec();
        let h = decode_chunk_header(&wire).unwrap();
        assert_eq!((h.chunk_type, h.payload_len, h.flags), (reply_type::ERROR_OFFSET, 6 + 4 + 8, reply_flags::DONE));
        assert_eq!(&wire[26..30], b"boom");
        let mut r = Reply::default();
        r.push_block_status(to(Framing::Structured, 9), BASE_ALLOCATION_ID, &[(512, 3), (1024, 0)], true);
        let wire = r.to_vec();
        let h = decode_chunk_header(&wire).unwrap();
        assert_eq!((h.chunk_type, h.payload_len), (reply_type::BLOCK_STATUS, 20));
        assert_eq!(u32::from_be_bytes(wire[20..24].try_into().unwrap()), BASE_ALLOCATION_ID);
    }

    #[test]
    fn extended_chunks_repeat_the_request_offset_and_never_reply_simply() {
        let ext = to(Framing::Extended, 3);
        let mut r = Reply::default();
        r.push_ok(ext);
        r.push_offset_hole(true, ext, 8192, 4096);
        r.push_block_status(ext, BASE_ALLOCATION_ID, &[(6 << 30, 3)], true);
        r.push_error_chunk(ext, 5, "x", None);
        let wire = r.to_vec();
        let (h, offset) = decode_extended_chunk_header(&wire).unwrap();
        assert_eq!((h.chunk_type, h.flags, h.payload_len, offset), (reply_type::NONE, reply_flags::DONE, 0, 4096));
        let (h, _) = decode_extended_chunk_header(&wire[32..]).unwrap();
        assert_eq!((h.chunk_type, h.payload_len), (reply_type::OFFSET_HOLE, 12));
        assert_eq!(u64::from_be_bytes(wire[64..72].try_into().unwrap()), 8192);
        let (h, _) = decode_extended_chunk_header(&wire[76..]).unwrap();
        assert_eq!((h.chunk_type, h.payload_len), (reply_type::BLOCK_STATUS_EXT, 8 + 16));
        let payload = &wire[108..132];
        assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), BASE_ALLOCATION_ID);
        assert_eq!(u32::from_be_bytes(payload[4..8].try_into().unwrap()), 1, "descriptor count");
        assert_eq!(u64::from_be_bytes(payload[8..16].try_into().unwrap()), 6 << 30);
        assert_eq!(u64::from_be_bytes(payload[16..24].try_into().unwrap()), 3);
        let (h, _) = decode_extended_chunk_header(&wire[132..]).unwrap();
        assert_eq!((h.chunk_type, h.payload_len), (reply_type::ERROR, 7));
        assert_eq!(wire.len(), 132 + 32 + 7);
        let mut simple = Reply::default();
        simple.push_ok(to(Framing::Structured, 3));
        assert_eq!(simple.wire_len(), SIMPLE_REPLY_LEN, "compact framings answer success simply");
    }

    #[test]
    fn extents_are_merged_clipped_and_never_empty() {
        use crate::device::Extent;
        let e = |len_bytes, hole, zero| Extent { len_bytes, hole, zero };
        let extents = [e(512, false, false), e(0, true, true), e(512, false, false), e(1 << 40, true, true)];
        assert_eq!(encode_extents(&extents, 4096, false), vec![(1024, 0), (3072, 3)]);
        assert_eq!(encode_extents(&extents, 4096, true), vec![(1024, 0)]);
        assert_eq!(encode_extents(&[], 4096, false), vec![(4096, 0)]);
        assert_eq!(encode_extents(&[e(0, true, true)], 7, true), vec![(7, 0)]);
        assert_eq!(encode_extents(&[e(u64::MAX, true, false)], u32::MAX.into(), false), vec![(u32::MAX.into(), 1)]);
        assert_eq!(encode_extents(&[e(u64::MAX, true, false)], 1 << 40, false), vec![(1 << 40, 1)]);
    }
}
