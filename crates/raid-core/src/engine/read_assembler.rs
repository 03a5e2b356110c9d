//! `ReadAssembler`: how the engine builds a [`ReadData`] from member reads that complete
//! out of order. `finish` asserts that the pieces tile the request exactly.

use crate::buf::AlignedBuf;
use crate::read_data::{ReadData, Segment};

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
