//! `Payload`: the bytes of a client write on their way through the engine to the members.
//!
//! A write arrives either borrowed (`Array::write(&[u8])`: tests, the write-back cache,
//! byte-granular patches) or shared (`Array::write_shared(Bytes)`: the NBD server's receive
//! buffer, reference-counted). The engine cuts it into member pieces with [`Payload::slice`]
//! without copying either kind; a shared piece goes to [`Member::write_shared_at`], which
//! keeps it alive until the member has written it, so the receive buffer is the only copy of
//! the data in memory (crates/raid-core/doc/one-copy-write-path.md).
//!
//! [`Member::write_shared_at`]: crate::member::Member::write_shared_at

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

/// Written data: borrowed for the duration of the write, shared, or several shared pieces
/// read as one (writes gathered into whole stripes).
#[derive(Clone, Debug)]
pub enum Payload<'a> {
    Borrowed(&'a [u8]),
    Shared(Bytes),
    Gathered(Gathered),
}

impl<'a> Payload<'a> {
    pub fn len(&self) -> usize {
        match self {
            Payload::Borrowed(data) => data.len(),
            Payload::Shared(data) => data.len(),
            Payload::Gathered(g) => g.range.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes `range` of this payload without a copy: of the same kind, or one shared piece
    /// where a gathered range lies in one.
    ///
    /// # Panics
    /// If `range` is not within `0..len()`.
    pub fn slice(&self, range: Range<usize>) -> Payload<'a> {
        match self {
            Payload::Borrowed(data) => Payload::Borrowed(&data[range]),
            Payload::Shared(data) => Payload::Shared(data.slice(range)),
            Payload::Gathered(g) => g.slice(range),
        }
    }

    /// Copies the payload into `dst` (of the same length).
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len(), "copy_to a buffer of the payload's length");
        match self {
            Payload::Borrowed(data) => dst.copy_from_slice(data),
            Payload::Shared(data) => dst.copy_from_slice(data),
            Payload::Gathered(g) => {
                let mut at = 0;
                for piece in g.pieces() {
                    dst[at..at + piece.len()].copy_from_slice(&piece);
                    at += piece.len();
                }
            }
        }
    }

    /// The payload as shared pieces in order (no copy), unless it is borrowed.
    pub fn shared_pieces(&self) -> Option<Vec<Bytes>> {
        match self {
            Payload::Borrowed(_) => None,
            Payload::Shared(data) => Some(vec![data.clone()]),
            Payload::Gathered(g) => Some(g.pieces().collect()),
        }
    }
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(data: &'a [u8]) -> Self {
        Payload::Borrowed(data)
    }
}

impl From<Bytes> for Payload<'_> {
    fn from(data: Bytes) -> Self {
        Payload::Shared(data)
    }
}

/// Consecutive shared pieces (the writes of a gathered group, in order) read as one payload;
/// a range of them, sliced without joining.
#[derive(Clone, Debug)]
pub struct Gathered {
    pieces: Arc<[Bytes]>,
    /// Where each piece starts in the whole.
    starts: Arc<[usize]>,
    range: Range<usize>,
}

impl Gathered {
    /// The pieces, one after another: one piece is simply shared.
    pub fn payload(pieces: Vec<Bytes>) -> Payload<'static> {
        let mut pieces = pieces;
        pieces.retain(|p| !p.is_empty());
        if pieces.len() <= 1 {
            return Payload::Shared(pieces.pop().unwrap_or_default());
        }
        let starts: Vec<usize> = pieces
            .iter()
            .scan(0, |at, p| {
                let start = *at;
                *at += p.len();
                Some(start)
            })
            .collect();
        let len = starts.last().copied().unwrap_or(0) + pieces.last().map_or(0, Bytes::len);
        Payload::Gathered(Gathered { pieces: pieces.into(), starts: starts.into(), range: 0..len })
    }

    fn slice(&self, range: Range<usize>) -> Payload<'static> {
        assert!(range.start <= range.end && range.end <= self.range.len(), "slice within the payload");
        let whole = self.range.start + range.start..self.range.start + range.end;
        // The piece holding the first byte (the last that starts at or before it).
        let i = self.starts.partition_point(|&s| s <= whole.start).saturating_sub(1);
        let (start, piece) = (self.starts[i], &self.pieces[i]);
        if whole.end <= start + piece.len() {
            return Payload::Shared(piece.slice(whole.start - start..whole.end - start));
        }
        Payload::Gathered(Gathered { pieces: self.pieces.clone(), starts: self.starts.clone(), range: whole })
    }

    /// The parts of the pieces in the range, in order.
    fn pieces(&self) -> impl Iterator<Item = Bytes> + '_ {
        self.pieces.iter().zip(self.starts.iter()).filter_map(move |(piece, &start)| {
            let from = self.range.start.max(start);
            let to = self.range.end.min(start + piece.len());
            (from < to).then(|| piece.slice(from - start..to - start))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_and_borrow_the_same_bytes() {
        let data: Vec<u8> = (0..=255).collect();
        let shared = Payload::Shared(Bytes::from(data.clone()));
        let borrowed = Payload::Borrowed(&data);
        let cuts = [0, 10, 100, 101, 256];
        let gathered = Gathered::payload(cuts.windows(2).map(|w| Bytes::from(data[w[0]..w[1]].to_vec())).collect());
        let bytes_of = |p: &Payload<'_>| {
            let mut out = vec![0; p.len()];
            p.copy_to(&mut out);
            out
        };
        for p in [shared.clone(), borrowed, gathered.clone()] {
            let s = p.slice(16..48);
            assert_eq!(bytes_of(&s), &data[16..48]);
            assert_eq!(bytes_of(&s.slice(8..16)), &data[24..32]);
            assert_eq!(s.len(), 32);
            assert_eq!(bytes_of(&p.slice(0..256)), data);
            for (a, b) in [(0, 10), (5, 100), (99, 102), (100, 101), (0, 256), (255, 256), (7, 7)] {
                assert_eq!(bytes_of(&p.slice(a..b)), &data[a..b], "{a}..{b}");
            }
        }
        // A range inside one gathered piece is that piece, shared; across pieces, their parts.
        assert!(matches!(gathered.slice(20..90), Payload::Shared(_)));
        let across = gathered.slice(5..150).shared_pieces().unwrap();
        assert_eq!(across.iter().map(Bytes::len).collect::<Vec<_>>(), [5, 90, 1, 49]);
        let Payload::Shared(whole) = shared else { unreachable!() };
        let Payload::Shared(part) = Payload::Shared(whole.clone()).slice(100..200) else { unreachable!() };
        // Same memory, not a copy.
        assert_eq!(part.as_ptr(), whole[100..].as_ptr());
    }
}
