//! Framing READ data into replies: pure, so the fuzz target can check that what is sent
//! decodes back to exactly the data the device returned.
//!
//! Simple replies send the header only once all data is in hand, so a device failure is
//! always an error reply, never a broken stream. Structured replies merge neighbouring data
//! pieces into one `OFFSET_DATA` chunk and send zero runs of at least `MIN_HOLE_BYTES` as
//! `OFFSET_HOLE`; with DF everything is one `OFFSET_DATA` chunk (holes as explicit zeroes,
//! which the spec requires). The last chunk carries DONE. Errors go in one place: the
//! device error kind is mapped by [`device_errno`], and its offset is reported
//! (`ERROR_OFFSET`) only when it lies inside the request.

use super::framing::ReplyTo;
use super::reply::{Reply, Segment};
use crate::device::{DeviceError, DeviceResult, ReadChunk};
use crate::error::device_errno;

/// How READ data is framed: by the connection's framing, and per request for DF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFraming {
    Simple,
    Structured,
    /// Structured, one content chunk (DF).
    Unfragmented,
}

impl ReadFraming {
    pub fn of(to: ReplyTo, df: bool) -> Self {
        match (to.framing.structured(), df) {
            (false, _) => ReadFraming::Simple,
            (true, false) => ReadFraming::Structured,
            (true, true) => ReadFraming::Unfragmented,
        }
    }
}

/// Appends the error reply for a device failure of the request at `to.offset`, `len` long.
pub fn push_device_error(reply: &mut Reply, to: ReplyTo, e: &DeviceError, len: u64, fast_zero: bool) {
    let in_request = e.offset.filter(|&o| o >= to.offset && o - to.offset < len);
    reply.push_error(to, device_errno(e.kind, fast_zero), &e.message, in_request);
}

/// Frames READ data (or its failure).
///
/// Simple replies send the header only once all data is in hand, so a failure is always an
/// error reply, never a broken stream. Structured replies merge neighbouring data pieces
/// into one OFFSET_DATA chunk and send zero runs as OFFSET_HOLE; with DF everything is one
/// OFFSET_DATA chunk. The last chunk carries DONE.
pub fn read_reply(to: ReplyTo, len: u32, df: bool, result: DeviceResult<Vec<ReadChunk>>) -> Reply {
    let framing = ReadFraming::of(to, df);
    let offset = to.offset;
    let chunks: Vec<ReadChunk> = match result {
        Ok(chunks) => chunks.into_iter().filter(|c| !c.is_empty()).collect(),
        Err(e) => {
            let mut reply = Reply::with_capacity(1);
            push_device_error(&mut reply, to, &e, len.into(), false);
            return reply;
        }
    };
    debug_assert_eq!(chunks.iter().map(ReadChunk::len).sum::<usize>(), len as usize, "chunks must cover the read");
    let mut reply = Reply::with_capacity(chunks.len() + 2);
    match framing {
        ReadFraming::Simple => {
            reply.push_simple(to, 0);
            push_chunk_data(&mut reply, chunks);
        }
        ReadFraming::Unfragmented | ReadFraming::Structured if len == 0 => reply.push_none_done(to),
        ReadFraming::Unfragmented => {
            reply.push_offset_data_header(true, to, offset, len);
            push_chunk_data(&mut reply, chunks);
        }
        ReadFraming::Structured => push_structured_read(&mut reply, to, chunks),
    }
    debug_assert!(framing != ReadFraming::Simple || reply.wire_len() == 16 + len as usize);
    reply
}

fn push_chunk_data(reply: &mut Reply, chunks: Vec<ReadChunk>) {
    for chunk in chunks {
        match chunk {
            ReadChunk::Data(data) => reply.push_data(data),
            ReadChunk::Zero(n) => reply.push_zeroes(n as usize),
            ReadChunk::File(range) => reply.segments.push(Segment::File(range)),
        }
    }
}

/// Zero runs shorter than this are sent as data: a hole chunk would cost more than it saves.
const MIN_HOLE_BYTES: u32 = 4096;

fn push_structured_read(reply: &mut Reply, to: ReplyTo, chunks: Vec<ReadChunk>) {
    let offset = to.offset;
    // Group pieces into runs: a hole run (one big zero chunk) or a data run (everything else).
    let is_hole = |c: &ReadChunk| matches!(c, ReadChunk::Zero(n) if *n >= MIN_HOLE_BYTES);
    let mut pos = offset;
    let mut run: Vec<Segment> = Vec::new();
    let mut run_len = 0u32;
    let mut chunks = chunks.into_iter().peekable();
    while let Some(chunk) = chunks.next() {
        let last_piece = chunks.peek().is_none();
        if is_hole(&chunk) {
            let n = chunk.len() as u32;
            reply.push_offset_hole(last_piece, to, pos, n);
            pos += u64::from(n);
            continue;
        }
        run_len += chunk.len() as u32;
        run.push(match chunk {
            ReadChunk::Data(data) => Segment::Data(data),
            ReadChunk::Zero(n) => Segment::Zeroes(n as usize),
            ReadChunk::File(range) => Segment::File(range),
        });
        let run_ends = chunks.peek().is_none_or(is_hole);
        if run_ends {
            reply.push_offset_data_header(last_piece, to, pos, run_len);
            reply.segments.append(&mut run);
            pos += u64::from(run_len);
            run_len = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceErrorKind;
    use crate::protocol::consts::{errno, reply_type};
    use crate::protocol::framing::Framing;
    use crate::protocol::reply::decode_chunk_header;
    use bytes::Bytes;

    fn to(framing: Framing) -> ReplyTo {
        ReplyTo { framing, cookie: 1, offset: 0 }
    }

    fn chunk_types(reply: &Reply) -> Vec<(u16, u16, u32)> {
        let wire = reply.to_vec();
        let mut out = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let h = decode_chunk_header(&wire[at..]).expect("chunk header");
            out.push((h.chunk_type, h.flags, h.payload_len));
            at += 20 + h.payload_len as usize;
        }
        assert_eq!(at, wire.len());
        out
    }

    #[test]
    fn structured_read_merges_data_and_sends_holes() {
        let chunks = vec![
            ReadChunk::Data(Bytes::from_static(&[1; 512])),
            ReadChunk::Zero(512),
            ReadChunk::Data(Bytes::from_static(&[2; 512])),
            ReadChunk::Zero(8192),
        ];
        let reply = read_reply(to(Framing::Structured), 512 * 3 + 8192, false, Ok(chunks));
        assert_eq!(chunk_types(&reply), vec![(reply_type::OFFSET_DATA, 0, 8 + 1536), (reply_type::OFFSET_HOLE, 1, 12)]);
    }

    #[test]
    fn unfragmented_read_is_one_chunk_and_simple_read_is_header_plus_data() {
        let chunks = vec![ReadChunk::Zero(8192), ReadChunk::Data(Bytes::from_static(&[2; 512]))];
        let reply = read_reply(to(Framing::Structured), 8704, true, Ok(chunks.clone()));
        assert_eq!(chunk_types(&reply), vec![(reply_type::OFFSET_DATA, 1, 8 + 8704)]);
        let reply = read_reply(to(Framing::Simple), 8704, true, Ok(chunks));
        assert_eq!(reply.wire_len(), 16 + 8704);
    }

    #[test]
    fn failed_read_is_an_error_chunk_or_simple_error() {
        let e = DeviceError::new(DeviceErrorKind::Io, "bad sector").at(4096);
        let reply = read_reply(to(Framing::Structured), 8192, false, Err(e.clone()));
        assert_eq!(chunk_types(&reply), vec![(reply_type::ERROR_OFFSET, 1, 6 + 10 + 8)]);
        let reply = read_reply(to(Framing::Simple), 8192, false, Err(e));
        let wire = reply.to_vec();
        assert_eq!(wire.len(), 16);
        assert_eq!(u32::from_be_bytes(wire[4..8].try_into().unwrap()), errno::EIO);
    }
}
