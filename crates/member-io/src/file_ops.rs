//! `FileOps`: the four primitive operations an engine performs on a member file.
//!
//! ```text
//!   FileMember<O: FileOps>  (policy: range/alignment checks, short-I/O loops, FUA,
//!        │                   discard/zeroing fallback chains — written once)
//!        ▼
//!   O::read / write / fdatasync / fallocate   (one syscall each, maybe short)
//!        ├─ UringOps:  a request to the ring thread, completion through a oneshot
//!        ├─ ThreadOps: a job on the blocking pool doing pread/pwrite/...
//!        └─ InlineOps: the same syscalls in the calling task (files in memory)
//! ```
//!
//! Every op takes a [`FileRef`] and owns its buffer; both are released only when the
//! syscall or CQE has finished, whatever happened to the future that asked for it.
//! If an engine loses a buffer (its thread died) it hands back a fresh zeroed one of the
//! same length together with an error, so `BufResult` can always return a buffer.

use std::future::Future;
use std::io;
use std::ops::Range;

use bytes::Bytes;
use raid_core::AlignedBuf;

use crate::member_file::FileRef;

/// Result of a single read or write syscall: bytes transferred (maybe short) and the buffer.
pub(crate) type TransferResult = (io::Result<usize>, AlignedBuf);

pub(crate) trait FileOps: Send + Sync + 'static {
    /// Every op completes in its first poll, so a borrowed buffer can be written directly
    /// (nothing can outlive the caller's borrow).
    const SYNCHRONOUS: bool = false;

    /// Reads into `buf[range]` from `offset_bytes`; may return fewer bytes (0 at end of file).
    fn read(
        &self,
        file: FileRef,
        offset_bytes: u64,
        buf: AlignedBuf,
        range: Range<usize>,
    ) -> impl Future<Output = TransferResult> + Send;

    /// Writes `buf[range]` at `offset_bytes`; may write fewer bytes.
    fn write(
        &self,
        file: FileRef,
        offset_bytes: u64,
        buf: AlignedBuf,
        range: Range<usize>,
    ) -> impl Future<Output = TransferResult> + Send;

    /// Writes the shared `pieces` one after another at `offset_bytes` (a gathering write);
    /// may write fewer bytes. The op holds the pieces until the syscall or CQE is done.
    fn write_pieces(
        &self,
        file: FileRef,
        offset_bytes: u64,
        pieces: Vec<Bytes>,
    ) -> impl Future<Output = io::Result<usize>> + Send;

    fn fdatasync(&self, file: FileRef) -> impl Future<Output = io::Result<()>> + Send;

    /// `fallocate(fd, mode, offset, len)`.
    fn fallocate(
        &self,
        file: FileRef,
        mode: i32,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = io::Result<()>> + Send;
}

/// Error for an engine whose worker vanished with the request.
pub(crate) fn engine_gone(engine: &str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, format!("{engine} worker is gone; request dropped"))
}
