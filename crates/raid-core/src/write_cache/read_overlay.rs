//! Building a read result from cached bytes: either entirely from the cache, or by
//! patching the dirty bytes into the buffers of an array read, in place (the array's
//! buffers stay the ones handed to the NBD layer, so a read that is mostly clean is not
//! copied again).

use super::extent_map::Extent;
use crate::buf::AlignedBuf;
use crate::read_data::{ReadData, Segment};

/// The read of `[offset, offset + len)` when `pieces` (clipped, in order) cover all of it.
pub(super) fn from_cache(offset_bytes: u64, len_bytes: usize, pieces: &[(u64, Extent)]) -> ReadData {
    let mut buf = AlignedBuf::for_overwrite(len_bytes); // the pieces cover it (asserted below)
    let mut covered = 0;
    for (at, piece) in pieces {
        let from = (at - offset_bytes) as usize;
        buf.as_mut_slice()[from..from + piece.len_bytes as usize].copy_from_slice(piece.bytes());
        covered += piece.len_bytes as usize;
    }
    assert_eq!(covered, len_bytes, "cached pieces must cover the read");
    ReadData { bufs: vec![buf], segments: vec![Segment { buf: 0, start_bytes: 0, len_bytes }], len_bytes }
}

/// Lays `pieces` (clipped to the request, in order) over the array read `data` of the range
/// starting at `offset_bytes`.
pub(super) fn overlay(data: &mut ReadData, offset_bytes: u64, pieces: &[(u64, Extent)]) {
    if pieces.is_empty() {
        return;
    }
    debug_assert!(segments_disjoint(&data.segments), "read segments share buffer bytes");
    // Request offset where each segment starts.
    let mut seg_starts = Vec::with_capacity(data.segments.len());
    let mut at = 0usize;
    for s in &data.segments {
        seg_starts.push(at);
        at += s.len_bytes;
    }
    debug_assert_eq!(at, data.len_bytes);
    for (piece_offset, piece) in pieces {
        let piece_start = (piece_offset - offset_bytes) as usize;
        let piece_end = piece_start + piece.len_bytes as usize;
        let bytes = piece.bytes();
        // First segment that ends after the piece starts.
        let first = seg_starts.partition_point(|&s| s <= piece_start).saturating_sub(1);
        for (i, seg) in data.segments.iter().enumerate().skip(first) {
            let seg_start = seg_starts[i];
            if seg_start >= piece_end {
                break;
            }
            let from = piece_start.max(seg_start);
            let to = piece_end.min(seg_start + seg.len_bytes);
            if from >= to {
                continue;
            }
            let dst = seg.start_bytes + (from - seg_start);
            data.bufs[seg.buf].as_mut_slice()[dst..dst + (to - from)]
                .copy_from_slice(&bytes[from - piece_start..to - piece_start]);
        }
    }
}

/// No two segments refer to the same bytes of a buffer (so patching one cannot change another).
fn segments_disjoint(segments: &[Segment]) -> bool {
    let mut spans: Vec<(usize, usize, usize)> =
        segments.iter().map(|s| (s.buf, s.start_bytes, s.start_bytes + s.len_bytes)).collect();
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].0 != w[1].0 || w[0].2 <= w[1].1)
}
