//! The member I/O contract: what the array engine needs from one RAID member.
//!
//! ```text
//!   raid-core::Array<M: Member> ──► M::read_at / write_at / flush / discard / write_zeroes
//!                                     ▲
//!            member-io: UringMember, ThreadPoolMember, Throttled<M>, Faulty<M>
//!            raid-core: MemoryMember (tests, property models)
//! ```
//!
//! Contract:
//! - Offsets and lengths are in bytes from the start of the member *device* (the engine
//!   adds the md `data_offset` itself; superblocks live on the same address space).
//! - The engine only issues I/O whose offset, length and buffer address are multiples of
//!   [`Member::alignment`] (buffers are [`AlignedBuf`], page aligned). A backend may reject
//!   anything else with `InvalidInput`.
//! - `read_at` fills the whole buffer or fails; a short read (past the end) is an error.
//! - Buffers are owned and travel with the request, so dropping a returned future never
//!   leaves a kernel writing into freed memory: the backend keeps the buffer alive until the
//!   I/O has completed, then drops it.
//! - `write_at(.., fua = true)` completes only when the data is on stable storage.
//! - `flush` makes every write that completed before the call durable.
//! - `discard` and `write_zeroes` both leave the range reading as zeros (RAID parity relies
//!   on it); `discard` may deallocate, `write_zeroes` keeps the range allocated.
//! - Errors are `std::io::Error`; the engine treats any error from a member as a member
//!   fault (except `InvalidInput`, which is an engine bug and is asserted against).
//!
//! The futures are boxed so that `dyn Member` works: backends are chosen at run time
//! (io_uring or thread pool, optionally wrapped by throttles or fault injectors).

use std::fs::File;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::allocation::{Allocation, push_merged};
use crate::buf::AlignedBuf;
use crate::integrity::IntegrityReport;

/// A boxed, sendable future returned by member operations.
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Result of an operation that moved a buffer: the buffer always comes back.
pub type BufResult = (io::Result<()>, AlignedBuf);

/// One RAID member: a file, a block device, or a wrapper around either.
pub trait Member: Send + Sync {
    /// Human-readable name used in logs and errors (normally the path).
    fn name(&self) -> &str;

    /// Size of the member device in bytes.
    fn len_bytes(&self) -> u64;

    /// The device's size now, asked again (it may have grown since it was opened: a volume
    /// resized in the cloud, a file extended). A larger size is taken for this member's range
    /// checks from here on, a smaller one never (a device that shrank under the array keeps
    /// failing what lies past its end). By default, [`len_bytes`](Self::len_bytes).
    fn refresh_len(&self) -> IoFuture<'_, io::Result<u64>> {
        Box::pin(std::future::ready(Ok(self.len_bytes())))
    }

    /// Required alignment (bytes, power of two, 1..=4096) of offsets, lengths and buffers.
    fn alignment(&self) -> usize {
        512
    }

    /// Alignment (bytes, power of two, at most 4096) of the *addresses* this member writes from in place
    /// (O_DIRECT's memory alignment; 1 where any address goes). The engine copies a shared
    /// payload that misses it once, before its member writes, rather than have each member
    /// copy its own leg.
    fn memory_alignment(&self) -> usize {
        1
    }

    /// Reads `buf.len()` bytes at `offset_bytes` into `buf`.
    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult>;

    /// Writes all of `buf` at `offset_bytes`; with `fua` the data is durable on completion.
    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult>;

    /// `write_at` from borrowed bytes. The default copies them into an `AlignedBuf`; a member
    /// that writes synchronously (memory, files in memory) overrides it to skip that copy.
    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> IoFuture<'a, io::Result<()>> {
        let buf = AlignedBuf::from_slice(data);
        crate::copy_count::copied(data.len());
        Box::pin(async move { self.write_at(offset_bytes, buf, fua).await.0 })
    }

    /// Writes `pieces` one after another from `offset_bytes` (a gathering write of shared,
    /// reference-counted bytes, e.g. the NBD server's receive buffer); with `fua` durable on
    /// completion. The engine sends only pieces whose lengths are multiples of 512 and whose
    /// total meets [`alignment`](Self::alignment); a backend that needs aligned memory
    /// (O_DIRECT) checks the addresses itself. A backend that can keep the pieces alive until
    /// its I/O completes writes them in place, without a copy (io_uring, threads, NBD). The
    /// default borrows one piece through [`write_slice_at`](Self::write_slice_at) and joins
    /// several into one buffer (a copy).
    fn write_shared_at(&self, offset_bytes: u64, pieces: Vec<Bytes>, fua: bool) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            match pieces.as_slice() {
                [one] => self.write_slice_at(offset_bytes, one, fua).await,
                _ => self.write_at(offset_bytes, join_pieces(&pieces), fua).await.0,
            }
        })
    }

    /// The open file whose page cache *is* this member's storage (tmpfs, ramfs), if the
    /// bytes `[offset_bytes, offset_bytes + len_bytes)` may be read from it in place (sent
    /// to a socket with `sendfile`) instead of through `read_at`; member offsets are file
    /// offsets. Such a read does not wait for a disk (short of swap) and cannot fail with a
    /// media error.
    /// `None` (the default) for anything else, and from wrappers that must see every read
    /// (throttles, fault injection).
    fn memory_file(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        let _ = (offset_bytes, len_bytes);
        None
    }

    /// Like [`memory_file`](Self::memory_file), for writing the range in place (the caller
    /// puts the bytes into the file's pages itself, e.g. a socket receive into a mapping of
    /// it): only for a member open for writing. A member returns the same `Arc` every time
    /// (callers keep one mapping per file). `None` by default and from wrappers.
    fn memory_file_for_write(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        let _ = (offset_bytes, len_bytes);
        None
    }

    /// Makes all completed writes durable (fdatasync).
    fn flush(&self) -> IoFuture<'_, io::Result<()>>;

    /// Deallocates the range if possible; it reads back as zeros afterwards.
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>>;

    /// Zeroes the range, keeping it allocated.
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>>;

    /// A hint that `[offset_bytes, +len_bytes)` will be read soon (NBD's CACHE): a file
    /// reads it ahead into the page cache, an NBD member passes the hint on. Nothing by
    /// default; a hint never fails the member.
    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        let _ = (offset_bytes, len_bytes);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether `discard` and `write_zeroes` change only what is allocated (a file's
    /// `fallocate`), never write zeros as data: NBD's FAST_ZERO is honoured only over
    /// members that say so. `false` by default.
    fn zeroes_fast(&self) -> bool {
        false
    }

    /// How `[offset_bytes, offset_bytes + len_bytes)` is stored: extents in order from
    /// `offset_bytes`, covering at least one byte of the range and none past it (the caller
    /// asks again for the rest), `hole`/`zero` only where known to hold (a file's holes, an
    /// NBD export's `base:allocation`); past the end an error, as for I/O. The default, one
    /// extent of allocated data, is always true.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<Vec<Allocation>>> {
        let answer = check_range(self.name(), self.len_bytes(), offset_bytes, len_bytes)
            .map(|()| vec![Allocation::data(len_bytes)]);
        Box::pin(std::future::ready(answer))
    }

    /// The array no longer uses this member (`why`: it failed, or was removed): let go of
    /// what it holds open for I/O (a remote member's connections). No I/O follows. Nothing
    /// by default.
    fn retire(&self, why: &str) {
        let _ = why;
    }

    /// What the member's checksums found, if it has them ([`IntegrityMember`]). `None` by
    /// default; wrappers pass it on.
    ///
    /// [`IntegrityMember`]: crate::integrity::IntegrityMember
    fn integrity(&self) -> Option<IntegrityReport> {
        None
    }
}

impl<M: Member + ?Sized> Member for Arc<M> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn len_bytes(&self) -> u64 {
        (**self).len_bytes()
    }
    fn refresh_len(&self) -> IoFuture<'_, io::Result<u64>> {
        (**self).refresh_len()
    }
    fn alignment(&self) -> usize {
        (**self).alignment()
    }
    fn memory_alignment(&self) -> usize {
        (**self).memory_alignment()
    }
    fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        (**self).read_at(offset_bytes, buf)
    }
    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
        (**self).write_at(offset_bytes, buf, fua)
    }
    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], fua: bool) -> IoFuture<'a, io::Result<()>> {
        (**self).write_slice_at(offset_bytes, data, fua)
    }
    fn write_shared_at(&self, offset_bytes: u64, pieces: Vec<Bytes>, fua: bool) -> IoFuture<'_, io::Result<()>> {
        (**self).write_shared_at(offset_bytes, pieces, fua)
    }
    fn memory_file(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        (**self).memory_file(offset_bytes, len_bytes)
    }
    fn memory_file_for_write(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<File>> {
        (**self).memory_file_for_write(offset_bytes, len_bytes)
    }
    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        (**self).flush()
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        (**self).discard(offset_bytes, len_bytes)
    }
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        (**self).write_zeroes(offset_bytes, len_bytes)
    }
    fn cache(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        (**self).cache(offset_bytes, len_bytes)
    }
    fn zeroes_fast(&self) -> bool {
        (**self).zeroes_fast()
    }
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<Vec<Allocation>>> {
        (**self).allocation(offset_bytes, len_bytes)
    }
    fn retire(&self, why: &str) {
        (**self).retire(why)
    }
    fn integrity(&self) -> Option<IntegrityReport> {
        (**self).integrity()
    }
}

/// Checks an I/O range against a member of `len_bytes`; used by every backend so that
/// out-of-range requests fail the same way everywhere.
pub fn check_range(name: &str, len_bytes: u64, offset_bytes: u64, io_len_bytes: u64) -> io::Result<()> {
    match offset_bytes.checked_add(io_len_bytes) {
        Some(end) if end <= len_bytes => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{name}: I/O at {offset_bytes}+{io_len_bytes} beyond end of member ({len_bytes} bytes)"),
        )),
    }
}

/// An in-memory member: a `Vec<u8>` behind a mutex. Operations complete immediately.
///
/// Used by property tests and as the reference member in every backend test suite.
/// `flush` is a no-op (memory is as durable as it gets here).
pub struct MemoryMember {
    name: String,
    data: Mutex<Vec<u8>>,
}

impl MemoryMember {
    pub fn new(name: impl Into<String>, len_bytes: u64) -> Self {
        let len = usize::try_from(len_bytes).expect("memory member fits in memory");
        Self { name: name.into(), data: Mutex::new(vec![0; len]) }
    }

    /// Grows the member to `len_bytes` (zeros), as a resized volume (tests).
    pub fn grow_to(&self, len_bytes: u64) {
        let len = usize::try_from(len_bytes).expect("memory member fits in memory");
        let mut data = self.data.lock().expect("memory member lock");
        assert!(len >= data.len(), "a memory member only grows");
        data.resize(len, 0);
    }

    /// A copy of the whole member content.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().expect("memory member lock").clone()
    }

    /// Direct mutable access, for tests that corrupt members on purpose.
    pub fn with_data<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        f(&mut self.data.lock().expect("memory member lock"))
    }

    fn write_now(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        let r = self.range(offset_bytes, data.len() as u64)?;
        self.data.lock().expect("memory member lock")[r].copy_from_slice(data);
        Ok(())
    }

    fn range(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<std::ops::Range<usize>> {
        let len = self.data.lock().expect("memory member lock").len() as u64;
        check_range(&self.name, len, offset_bytes, len_bytes)?;
        Ok(offset_bytes as usize..(offset_bytes + len_bytes) as usize)
    }
}

impl Member for MemoryMember {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.data.lock().expect("memory member lock").len() as u64
    }

    fn alignment(&self) -> usize {
        1
    }

    fn read_at(&self, offset_bytes: u64, mut buf: AlignedBuf) -> IoFuture<'_, BufResult> {
        let res = self.range(offset_bytes, buf.len() as u64).map(|r| {
            buf.as_mut_slice().copy_from_slice(&self.data.lock().expect("memory member lock")[r]);
        });
        Box::pin(std::future::ready((res, buf)))
    }

    fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, _fua: bool) -> IoFuture<'_, BufResult> {
        let res = self.write_now(offset_bytes, buf.as_slice());
        Box::pin(std::future::ready((res, buf)))
    }

    fn write_slice_at<'a>(&'a self, offset_bytes: u64, data: &'a [u8], _fua: bool) -> IoFuture<'a, io::Result<()>> {
        Box::pin(std::future::ready(self.write_now(offset_bytes, data)))
    }

    fn write_shared_at(&self, offset_bytes: u64, pieces: Vec<Bytes>, _fua: bool) -> IoFuture<'_, io::Result<()>> {
        let total: usize = pieces.iter().map(Bytes::len).sum();
        let res = self.range(offset_bytes, total as u64).and_then(|_| {
            let mut at = offset_bytes;
            for piece in &pieces {
                self.write_now(at, piece)?;
                at += piece.len() as u64;
            }
            Ok(())
        });
        Box::pin(std::future::ready(res))
    }

    fn flush(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        self.write_zeroes(offset_bytes, len_bytes)
    }

    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
        let res = self.range(offset_bytes, len_bytes).map(|r| {
            self.data.lock().expect("memory member lock")[r].fill(0);
        });
        Box::pin(std::future::ready(res))
    }

    /// Blocks of [`MEMORY_HOLE_BYTES`] that are all zeros are holes, as in a sparse file.
    fn allocation(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<Vec<Allocation>>> {
        let res = self.range(offset_bytes, len_bytes).map(|r| {
            let data = self.data.lock().expect("memory member lock");
            let mut extents = Vec::new();
            let mut at = r.start;
            while at < r.end {
                let block_end = ((at / MEMORY_HOLE_BYTES + 1) * MEMORY_HOLE_BYTES).min(r.end);
                let block_start = at - at % MEMORY_HOLE_BYTES;
                let block = &data[block_start..(block_start + MEMORY_HOLE_BYTES).min(data.len())];
                let len = (block_end - at) as u64;
                let extent = if block.iter().all(|&b| b == 0) { Allocation::hole(len) } else { Allocation::data(len) };
                push_merged(&mut extents, extent);
                at = block_end;
            }
            extents
        });
        Box::pin(std::future::ready(res))
    }
}

/// `pieces` joined into one buffer (a copy, counted): for members that write one buffer.
pub fn join_pieces(pieces: &[Bytes]) -> AlignedBuf {
    let len = pieces.iter().map(Bytes::len).sum();
    let mut buf = AlignedBuf::for_overwrite(len);
    let mut at = 0;
    for piece in pieces {
        buf.as_mut_slice()[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
    crate::copy_count::copied(len);
    buf
}

/// The block size in which a [`MemoryMember`] reports holes (a file system's block).
pub const MEMORY_HOLE_BYTES: usize = 4096;
