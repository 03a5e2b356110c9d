//! `ReadData`: the result of a volume read, as member buffers plus the slices of them
//! that make up the requested range, in order. Handing member buffers out as-is lets the
//! NBD layer send them without copying. [`FileExtent`]: a range of a member file in memory,
//! for the in-place paths.
//!
//! Contract: the segments, in order, tile the requested range exactly ([`ReadData::len`]
//! bytes); each lies inside its buffer. Part of the [`Volume`](crate::Volume) contract, so
//! it depends on nothing but buffers (the engine builds it with `engine::ReadAssembler`).

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

    /// `self` followed by `next` (a request read in two parts), without copying bytes.
    pub(crate) fn append(mut self, next: ReadData) -> ReadData {
        let base = self.bufs.len();
        self.bufs.extend(next.bufs);
        self.segments.extend(next.segments.into_iter().map(|s| Segment { buf: s.buf + base, ..s }));
        self.len_bytes += next.len_bytes;
        self
    }
}

/// `len_bytes` of an array request that are, in place, bytes of a member file in memory
/// (see [`Volume::read_in_place`](crate::Volume::read_in_place) and
/// [`Volume::write_in_place`](crate::Volume::write_in_place)).
#[derive(Debug, Clone)]
pub struct FileExtent {
    pub file: Arc<File>,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}
