//! `ReadData`: the result of an array read, as member buffers plus the slices of them
//! that make up the requested range, in order. Handing member buffers out as-is lets the
//! NBD layer send them without copying.

use std::fs::File;
use std::sync::Arc;

use crate::buf::AlignedBuf;

/// A slice of one buffer of a [`ReadData`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub buf: usize,
    pub start_bytes: usize,
    pub len_bytes: usize,
}

#[derive(Debug, Default)]
pub struct ReadData {
    pub(crate) bufs: Vec<AlignedBuf>,
    pub(crate) segments: Vec<Segment>,
    pub(crate) len_bytes: usize,
}

impl ReadData {
    /// Total bytes.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// The data, piece by piece, in order.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        self.segments.iter().map(|s| &self.bufs[s.buf].as_slice()[s.start_bytes..s.start_bytes + s.len_bytes])
    }

    /// Copies everything into one vector (tests, small reads).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len_bytes);
        self.slices().for_each(|s| v.extend_from_slice(s));
        v
    }

    /// The buffers and the segments that index them.
    pub fn into_parts(self) -> (Vec<AlignedBuf>, Vec<Segment>) {
        (self.bufs, self.segments)
    }
}

/// `len_bytes` of an array request that are, in place, bytes of a member file in memory
/// (see [`crate::engine::Array::read_in_place`] and [`crate::engine::Array::write_in_place`]).
#[derive(Debug, Clone)]
pub struct FileExtent {
    pub file: Arc<File>,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// Collects pieces of a read that complete out of order.
pub(crate) struct ReadAssembler {
    bufs: Vec<AlignedBuf>,
    /// (offset in the request, segment)
    pieces: Vec<(usize, Segment)>,
    len_bytes: usize,
}

impl ReadAssembler {
    pub fn new(len_bytes: usize) -> Self {
        Self { bufs: Vec::new(), pieces: Vec::new(), len_bytes }
    }

    /// Adds a buffer; returns its index for [`ReadAssembler::piece`].
    pub fn add_buf(&mut self, buf: AlignedBuf) -> usize {
        self.bufs.push(buf);
        self.bufs.len() - 1
    }

    /// Records that request bytes `[req_offset, req_offset + len)` are `buf[start..start+len]`.
    pub fn piece(&mut self, req_offset_bytes: usize, buf: usize, start_bytes: usize, len_bytes: usize) {
        debug_assert!(start_bytes + len_bytes <= self.bufs[buf].len());
        self.pieces.push((req_offset_bytes, Segment { buf, start_bytes, len_bytes }));
    }

    /// Orders the pieces and checks they tile the request exactly.
    pub fn finish(mut self) -> ReadData {
        self.pieces.sort_unstable_by_key(|p| p.0);
        let mut expect = 0;
        for (off, seg) in &self.pieces {
            assert_eq!(*off, expect, "read pieces must tile the request");
            expect += seg.len_bytes;
        }
        assert_eq!(expect, self.len_bytes, "read pieces must cover the request");
        ReadData {
            bufs: self.bufs,
            segments: self.pieces.into_iter().map(|p| p.1).collect(),
            len_bytes: self.len_bytes,
        }
    }
}
