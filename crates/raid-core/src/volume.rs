//! `Volume`: a byte-addressed block device made of members — the contract between an array
//! (or a layer stacked on one) and whatever serves it.
//!
//! ```text
//!   NBD export (binary) ──► Arc<dyn Volume>
//!                              ├── engine::Array          the array itself (writethrough)
//!                              └── write_cache::WriteCache over an Array (writeback)
//!                                  (a parity log would stack here the same way)
//! ```
//!
//! Contract (as [`engine::Array`](crate::engine::Array)'s own methods):
//! - Offsets and lengths are bytes, multiples of 512; `read` and `write` take at most
//!   [`MAX_IO_BYTES`](crate::engine::MAX_IO_BYTES). A read returns the bytes last written or
//!   an error, never other bytes.
//! - `write(.., fua = true)` is durable when it returns; `flush` makes every write that
//!   completed before it durable; `trim` and `write_zeroes` leave the range reading as zeros.
//! - Byte-granular writes are optional: a volume that [`writes_bytes`](Volume::writes_bytes)
//!   takes [`write_bytes`](Volume::write_bytes) at any offset and length, patching partial
//!   sectors atomically (an array: under its write locks); the default refuses.
//! - `block_status` (NBD's `base:allocation`) is optional: the default says "data" everywhere.
//! - The in-place paths are optional: a volume that can name the member-file pages holding a
//!   range (members that are files in memory) returns them; the default is `None`, and the
//!   caller then uses `read` / `write`.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::allocation::Allocation;
use crate::error::{ErrorKind, RaidError, Result};
use crate::read_data::{FileExtent, ReadData};

/// A boxed, sendable future of a volume operation.
pub type VolumeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

pub trait Volume: Send + Sync {
    /// Size in bytes.
    fn size_bytes(&self) -> u64;

    /// Reads `len_bytes` at `offset_bytes`.
    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, ReadData>;

    /// Writes `data` at `offset_bytes`; with `fua` it is durable on return.
    fn write<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> VolumeFuture<'a, ()>;

    /// [`write`](Self::write) of shared bytes, which the volume may keep (reference-counted)
    /// until its member writes are done instead of copying them. By default, borrowed.
    fn write_shared(&self, offset_bytes: u64, data: Bytes, fua: bool) -> VolumeFuture<'_, ()> {
        Box::pin(async move { self.write(offset_bytes, &data, fua).await })
    }

    /// The memory alignment a [`write_shared`](Self::write_shared) payload should start at to
    /// reach the members without a copy (members written with O_DIRECT: theirs); 1: any.
    fn payload_alignment(&self) -> usize {
        1
    }

    /// Makes every completed write durable.
    fn flush(&self) -> VolumeFuture<'_, ()>;

    /// Discards a range (a hint); discarded ranges read back as zeros.
    fn trim(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> VolumeFuture<'_, ()>;

    /// Zeroes a range, deallocating where `may_deallocate` allows.
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64, may_deallocate: bool, fua: bool) -> VolumeFuture<'_, ()>;

    /// Whether trim is worth advertising (on an array with a write journal it costs a logged
    /// write of zeros, so it is not: md does not advertise discard there either).
    fn can_trim(&self) -> bool {
        true
    }

    /// Whether [`write_bytes`](Self::write_bytes) is supported.
    fn writes_bytes(&self) -> bool {
        false
    }

    /// Writes `data` at any byte offset (neither offset nor length a multiple of 512).
    fn write_bytes<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> VolumeFuture<'a, ()> {
        let _ = (offset_bytes, data, fua);
        Box::pin(std::future::ready(Err(RaidError::new(ErrorKind::Refused, "byte-granular writes are not supported"))))
    }

    /// What a rebuild or resync will touch from `offset_bytes` (sector aligned): (length,
    /// flags) extents with [`NOT_IN_SYNC`](crate::engine::NOT_IN_SYNC) and
    /// [`BITMAP_DIRTY`](crate::engine::BITMAP_DIRTY), covering at least one sector and at
    /// most `len_bytes`. The default: nothing pending.
    fn sync_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<(u64, u32)>> {
        let _ = offset_bytes;
        Ok(vec![(len_bytes, 0)])
    }

    /// A hint that `[offset_bytes, +len_bytes)` will be read soon (NBD's CACHE); nothing by
    /// default.
    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, ()> {
        let _ = (offset_bytes, len_bytes);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether zeroing `[offset_bytes, +len_bytes)` writes no data (NBD's FAST_ZERO: a
    /// client asks so that it can fall back to writing itself). `false` by default.
    fn zeroes_fast(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        let _ = (offset_bytes, len_bytes);
        false
    }

    /// `base:allocation` from `offset_bytes` (sector aligned): extents in order, covering at
    /// least one sector and at most `len_bytes`, `hole`/`zero` only where they hold for
    /// every write that completed before the call. The default, all data, is always true.
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Allocation>> {
        let _ = offset_bytes;
        Box::pin(std::future::ready(Ok(vec![Allocation::data(len_bytes)])))
    }

    /// The member-file ranges holding `[offset_bytes, +len_bytes)`, to be read in place.
    fn read_in_place(&self, offset_bytes: u64, len_bytes: usize) -> Result<Option<Vec<FileExtent>>> {
        let _ = (offset_bytes, len_bytes);
        Ok(None)
    }

    /// The member-file ranges to write `[offset_bytes, +len_bytes)` into in place; on
    /// `Some`, the volume counts the write as done once the caller has filled them.
    fn write_in_place(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, Option<Vec<FileExtent>>> {
        let _ = (offset_bytes, len_bytes);
        Box::pin(std::future::ready(Ok(None)))
    }
}
