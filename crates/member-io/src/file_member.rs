//! `FileMember<O>`: the `raid_core::Member` policy for a file or block device, written once
//! for every engine; and the public [`UringMember`] / [`ThreadPoolMember`] / [`InlineMember`]
//! built on it.
//!
//! Policy (what callers can rely on):
//! - Range: anything beyond the size seen at open fails with `UnexpectedEof` (`check_range`).
//! - Alignment: with O_DIRECT, offsets and lengths must be multiples of `alignment()` or the
//!   op fails with `InvalidInput` before reaching the kernel (the engine never sends them).
//! - Reads fill the whole buffer: short reads are continued; end of file (e.g. the file
//!   was truncated under us) is an `UnexpectedEof` error, never zeros.
//! - Writes are continued after short writes; `fua` = write, then fdatasync.
//! - `flush` = fdatasync (a no-op success on read-only members).
//! - `discard`: fallocate(PUNCH_HOLE|KEEP_SIZE) → the `write_zeroes` chain.
//! - `write_zeroes`: fallocate(ZERO_RANGE|KEEP_SIZE) → (regular files) PUNCH_HOLE then
//!   re-allocate → writing zero buffers. Only EOPNOTSUPP/ENOSYS move down the chain (and are
//!   remembered per member); real errors (EIO, ENOSPC) are returned. On block devices
//!   fallocate zeroes through the block layer (write-zeroes / zero pages), like BLKZEROOUT.
//! - Read-only members fail writes, discards and zeroing with EROFS.
//! - A member whose file is unlinked while open keeps working (the fd pins the inode).
//! - `allocation`: the file's holes (`file_allocation.rs`); block devices are all data.
//! - `cache`: `posix_fadvise(WILLNEED)` on buffered members, nothing with O_DIRECT.
//! - `zeroes_fast`: regular files, unless neither ZERO_RANGE nor PUNCH_HOLE works there
//!   (block devices may write zeros, so they say no).
//! - `memory_file`: a buffered regular file on tmpfs/ramfs hands out its `File` (the same
//!   `Arc` every time) for in-place reads (any engine; in range, and only while the file
//!   still holds the range); `memory_file_for_write` likewise for in-place writes, unless the
//!   member is read-only. O_DIRECT files and devices never do.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Buf, Bytes};
use raid_core::member::{BufResult, IoFuture, check_range};
use raid_core::{AlignedBuf, Member};

use crate::error::Result;
use crate::file_allocation::file_allocation;
use crate::file_ops::FileOps;
use crate::inline::InlineOps;
use crate::member_file::{FileRef, MemberFile, open_member_file};
use crate::options::DirectMode;
use crate::threads::ops::ThreadOps;
use crate::uring::driver::UringDriver;
use crate::uring::ops::UringOps;

/// Largest single syscall/SQE (aligned for every O_DIRECT alignment; below Linux's MAX_RW_COUNT).
const MAX_OP_BYTES: usize = 1 << 30;
/// Size of the zero buffer used when the filesystem cannot zero a range itself.
const ZERO_CHUNK_BYTES: usize = 1 << 20;

pub(crate) struct FileMember<O: FileOps> {
    file: Arc<MemberFile>,
    ops: O,
}

impl<O: FileOps> FileMember<O> {
    fn new(file: MemberFile, ops: O) -> Self {
        Self { file: Arc::new(file), ops }
    }

    fn check_io(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_range(self.file.name(), self.file.len_bytes(), offset_bytes, len_bytes)?;
        let align = self.file.align_bytes() as u64;
        if !offset_bytes.is_multiple_of(align) || !len_bytes.is_multiple_of(align) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: unaligned I/O at {offset_bytes}+{len_bytes}: O_DIRECT needs {align}-byte alignment",
                    self.file.name()
                ),
            ));
        }
        Ok(())
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.file.is_read_only() { Err(io::Error::from_raw_os_error(libc::EROFS)) } else { Ok(()) }
    }

    async fn read(&self, offset_bytes: u64, buf: AlignedBuf) -> BufResult {
        if let Err(e) = self.check_io(offset_bytes, buf.len() as u64) {
            return (Err(e), buf);
        }
        self.transfer(false, offset_bytes, buf).await
    }

    async fn write(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> BufResult {
        if let Err(e) = self.check_io(offset_bytes, buf.len() as u64).and_then(|()| self.check_writable()) {
            return (Err(e), buf);
        }
        let (res, buf) = self.transfer(true, offset_bytes, buf).await;
        if res.is_ok()
            && fua
            && let Err(e) = self.flush().await
        {
            return (Err(e), buf);
        }
        (res, buf)
    }

    /// `write` from borrowed bytes: pwrite straight from `data` on a synchronous engine (when
    /// the bytes meet the O_DIRECT alignment), else through a copy.
    async fn write_slice(&self, offset_bytes: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let align = self.file.align_bytes();
        if !O::SYNCHRONOUS || !(data.as_ptr() as usize).is_multiple_of(align) {
            raid_core::copy_count::copied(data.len());
            return self.write(offset_bytes, AlignedBuf::from_slice(data), fua).await.0;
        }
        self.check_io(offset_bytes, data.len() as u64).and_then(|()| self.check_writable())?;
        let file = FileRef::new(&self.file);
        let mut done = 0;
        while done < data.len() {
            let end = data.len().min(done + MAX_OP_BYTES);
            let n = crate::sync_ops::write_slice(&file, offset_bytes + done as u64, &data[done..end])?;
            done = self.advance(io::ErrorKind::WriteZero, offset_bytes, done..end, data.len(), n)?;
        }
        drop(file);
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// `write` of shared pieces, one after another, straight from them (`pwritev`, io_uring
    /// `Writev`); the op keeps them alive. With O_DIRECT, pieces whose address or length
    /// misses the file's alignment are joined into one aligned buffer first (a copy).
    async fn write_shared(&self, offset_bytes: u64, mut pieces: Vec<Bytes>, fua: bool) -> io::Result<()> {
        let align = self.file.align_bytes();
        let misaligned = |p: &Bytes| !(p.as_ptr() as usize).is_multiple_of(align) || !p.len().is_multiple_of(align);
        if self.file.is_direct() && pieces.iter().any(misaligned) {
            return self.write(offset_bytes, raid_core::member::join_pieces(&pieces), fua).await.0;
        }
        let len: usize = pieces.iter().map(Bytes::len).sum();
        self.check_io(offset_bytes, len as u64).and_then(|()| self.check_writable())?;
        let mut done = 0;
        while done < len {
            let file = FileRef::new(&self.file);
            let n = self.ops.write_pieces(file, offset_bytes + done as u64, pieces.clone()).await?;
            done = self.advance(io::ErrorKind::WriteZero, offset_bytes, done..len, len, n)?;
            skip_front(&mut pieces, n);
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }

    /// Reads (or writes) all of `buf` at `offset_bytes`, in operations of at most
    /// `MAX_OP_BYTES`, continuing after short transfers.
    async fn transfer(&self, write: bool, offset_bytes: u64, mut buf: AlignedBuf) -> BufResult {
        let short_kind = if write { io::ErrorKind::WriteZero } else { io::ErrorKind::UnexpectedEof };
        let len = buf.len();
        let mut done = 0;
        while done < len {
            let end = len.min(done + MAX_OP_BYTES);
            let (file, at) = (FileRef::new(&self.file), offset_bytes + done as u64);
            let (res, back) = if write {
                self.ops.write(file, at, buf, done..end).await
            } else {
                self.ops.read(file, at, buf, done..end).await
            };
            buf = back;
            match res.and_then(|n| self.advance(short_kind, offset_bytes, done..end, len, n)) {
                Ok(next) => done = next,
                Err(e) => return (Err(e), buf),
            }
        }
        (Ok(()), buf)
    }

    /// Accepts a transfer of `n` bytes of the piece `piece` of a `len`-byte I/O at
    /// `offset_bytes`: the new count of bytes done, or the short-I/O error when nothing moved
    /// or a short O_DIRECT transfer ended at end of file (continuing would be misaligned).
    fn advance(
        &self,
        kind: io::ErrorKind,
        offset_bytes: u64,
        piece: std::ops::Range<usize>,
        len: usize,
        n: usize,
    ) -> io::Result<usize> {
        debug_assert!(n <= piece.len(), "transfer of more than asked");
        let done = piece.start + n;
        if n == 0 || n > piece.len() || (done < len && !done.is_multiple_of(self.file.align_bytes())) {
            return Err(self.short_io(kind, offset_bytes, done.min(piece.end), len));
        }
        Ok(done)
    }

    fn short_io(&self, kind: io::ErrorKind, offset_bytes: u64, done: usize, len: usize) -> io::Error {
        let what = if kind == io::ErrorKind::WriteZero { "write" } else { "read" };
        io::Error::new(
            kind,
            format!(
                "{}: short {what} at {offset_bytes}+{len}: stopped after {done} bytes (file shrank or device ended)",
                self.file.name()
            ),
        )
    }

    async fn flush(&self) -> io::Result<()> {
        if self.file.is_read_only() {
            return Ok(());
        }
        self.ops.fdatasync(FileRef::new(&self.file)).await
    }

    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check_io(offset_bytes, len_bytes)?;
        self.check_writable()?;
        if len_bytes == 0 {
            return Ok(());
        }
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        if self.try_fallocate(punch, &self.file.punch_hole_unsupported, offset_bytes, len_bytes).await? {
            return Ok(());
        }
        self.zero_range(offset_bytes, len_bytes).await
    }

    async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check_io(offset_bytes, len_bytes)?;
        self.check_writable()?;
        if len_bytes == 0 {
            return Ok(());
        }
        self.zero_range(offset_bytes, len_bytes).await
    }

    /// The zeroing chain after the caller's checks: ZERO_RANGE, punch + allocate, zero writes.
    async fn zero_range(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let file = &self.file;
        let zero_range = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        if self.try_fallocate(zero_range, &file.zero_range_unsupported, offset_bytes, len_bytes).await? {
            return Ok(());
        }
        if !file.is_block_device() && !file.allocate_unsupported.load(Ordering::Relaxed) {
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            if self.try_fallocate(punch, &file.punch_hole_unsupported, offset_bytes, len_bytes).await? {
                // The range reads as zeros now; allocate it again so it stays provisioned.
                let allocate = libc::FALLOC_FL_KEEP_SIZE;
                self.try_fallocate(allocate, &file.allocate_unsupported, offset_bytes, len_bytes).await?;
                return Ok(());
            }
        }
        self.write_zero_buffers(offset_bytes, len_bytes).await
    }

    /// `Ok(true)` if fallocate did it, `Ok(false)` if the mode is unsupported here (remembered).
    async fn try_fallocate(
        &self,
        mode: i32,
        unsupported: &AtomicBool,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> io::Result<bool> {
        if unsupported.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match self.ops.fallocate(FileRef::new(&self.file), mode, offset_bytes, len_bytes).await {
            Ok(()) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                tracing::debug!(member = self.file.name(), mode, "fallocate mode unsupported; falling back");
                unsupported.store(true, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    async fn write_zero_buffers(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let chunk = usize::try_from(len_bytes).unwrap_or(usize::MAX).min(ZERO_CHUNK_BYTES);
        let mut zeros = AlignedBuf::zeroed(chunk);
        let mut done = 0u64;
        while done < len_bytes {
            let n = (len_bytes - done).min(chunk as u64) as usize;
            zeros.set_len(n);
            let (res, back) = self.write(offset_bytes + done, zeros, false).await;
            res?;
            zeros = back;
            debug_assert!(zeros.as_slice().iter().all(|&b| b == 0), "zero buffer was modified");
            done += n as u64;
        }
        Ok(())
    }
}

/// Implements `Member` and the inspection methods of a public backend type with its `FileMember`.
macro_rules! file_member_type {
    ($name:ident) => {
        impl $name {
            /// Whether the member was opened with O_DIRECT.
            pub fn is_direct(&self) -> bool {
                self.inner.file.is_direct()
            }
            /// Operations the kernel or a worker still holds, including ones whose futures
            /// were dropped (tests use this to wait for cancelled I/O to finish).
            pub fn in_flight_ops(&self) -> usize {
                self.inner.file.in_flight_ops()
            }
        }

        impl Member for $name {
            fn name(&self) -> &str {
                self.inner.file.name()
            }
            fn len_bytes(&self) -> u64 {
                self.inner.file.len_bytes()
            }
            fn refresh_len(&self) -> IoFuture<'_, io::Result<u64>> {
                Box::pin(std::future::ready(self.inner.file.refresh_len()))
            }
            fn alignment(&self) -> usize {
                self.inner.file.align_bytes()
            }
            fn memory_alignment(&self) -> usize {
                if self.inner.file.is_direct() { self.inner.file.align_bytes() } else { 1 }
            }
            fn read_at(&self, offset_bytes: u64, buf: AlignedBuf) -> IoFuture<'_, BufResult> {
                Box::pin(self.inner.read(offset_bytes, buf))
            }
            fn write_at(&self, offset_bytes: u64, buf: AlignedBuf, fua: bool) -> IoFuture<'_, BufResult> {
                Box::pin(self.inner.write(offset_bytes, buf, fua))
            }
            fn write_slice_at<'a>(
                &'a self,
                offset_bytes: u64,
                data: &'a [u8],
                fua: bool,
            ) -> IoFuture<'a, io::Result<()>> {
                Box::pin(self.inner.write_slice(offset_bytes, data, fua))
            }
            fn write_shared_at(
                &self,
                offset_bytes: u64,
                pieces: Vec<Bytes>,
                fua: bool,
            ) -> IoFuture<'_, io::Result<()>> {
                Box::pin(self.inner.write_shared(offset_bytes, pieces, fua))
            }
            fn memory_file(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<std::fs::File>> {
                memory_file_holding(&self.inner.file, offset_bytes, len_bytes)
            }
            fn memory_file_for_write(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<std::fs::File>> {
                if self.inner.file.is_read_only() {
                    return None;
                }
                memory_file_holding(&self.inner.file, offset_bytes, len_bytes)
            }
            fn flush(&self) -> IoFuture<'_, io::Result<()>> {
                Box::pin(self.inner.flush())
            }
            fn discard(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
                Box::pin(self.inner.discard(offset_bytes, len_bytes))
            }
            fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
                Box::pin(self.inner.write_zeroes(offset_bytes, len_bytes))
            }
            fn cache(&self, offset_bytes: u64, len_bytes: u64) -> IoFuture<'_, io::Result<()>> {
                let file = &self.inner.file;
                let answer = check_range(file.name(), file.len_bytes(), offset_bytes, len_bytes).and_then(|()| {
                    if file.is_direct() { Ok(()) } else { read_ahead(file.as_file(), offset_bytes, len_bytes) }
                });
                Box::pin(std::future::ready(answer))
            }
            fn zeroes_fast(&self) -> bool {
                let file = &self.inner.file;
                !file.is_block_device()
                    && !(file.zero_range_unsupported.load(Ordering::Relaxed)
                        && file.punch_hole_unsupported.load(Ordering::Relaxed))
            }
            fn allocation(
                &self,
                offset_bytes: u64,
                len_bytes: u64,
            ) -> IoFuture<'_, io::Result<Vec<raid_core::Allocation>>> {
                let file = &self.inner.file;
                let answer = check_range(file.name(), file.len_bytes(), offset_bytes, len_bytes)
                    .and_then(|()| file_allocation(file.as_file(), offset_bytes, len_bytes));
                Box::pin(std::future::ready(answer))
            }
        }
    };
}

/// `posix_fadvise(WILLNEED)`: the kernel starts reading the range into the page cache and
/// returns (CACHE on a buffered member; O_DIRECT members bypass the page cache, so for them
/// the hint means nothing).
fn read_ahead(file: &std::fs::File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(at), Ok(n)) = (libc::off_t::try_from(offset_bytes), libc::off_t::try_from(len_bytes)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: a plain syscall on a descriptor we borrow; no memory of ours is involved.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), at, n, libc::POSIX_FADV_WILLNEED) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// The member's file, if it is a buffered file in memory that still holds the range.
fn memory_file_holding(file: &MemberFile, offset_bytes: u64, len_bytes: u64) -> Option<Arc<std::fs::File>> {
    let memory_file = file.memory_file()?;
    check_range(file.name(), file.len_bytes(), offset_bytes, len_bytes).ok()?;
    // A file truncated under us: normal I/O fails and the engine fails the member over; a
    // range handed out would cut the client's connection instead.
    let end = offset_bytes + len_bytes;
    memory_file.metadata().is_ok_and(|m| m.len() >= end).then(|| Arc::clone(memory_file))
}

/// A member served by io_uring (a shared ring thread unless opened with [`UringMember::open_on`]).
pub struct UringMember {
    inner: FileMember<UringOps>,
}

impl UringMember {
    /// Opens `path` on the process-wide ring ([`UringDriver::shared`]).
    pub fn open(path: impl AsRef<Path>, direct: DirectMode, read_only: bool) -> Result<Self> {
        Self::open_on(path, direct, read_only, UringDriver::shared()?)
    }

    /// Opens `path` on a given ring thread.
    pub fn open_on(
        path: impl AsRef<Path>,
        direct: DirectMode,
        read_only: bool,
        driver: Arc<UringDriver>,
    ) -> Result<Self> {
        let file = open_member_file(path.as_ref(), direct, read_only)?;
        Ok(Self { inner: FileMember::new(file, UringOps::new(driver)) })
    }
}

file_member_type!(UringMember);

/// A member served by blocking pread/pwrite on the process-wide thread pool.
pub struct ThreadPoolMember {
    inner: FileMember<ThreadOps>,
}

impl ThreadPoolMember {
    pub fn open(path: impl AsRef<Path>, direct: DirectMode, read_only: bool) -> Result<Self> {
        let file = open_member_file(path.as_ref(), direct, read_only)?;
        Ok(Self { inner: FileMember::new(file, ThreadOps::global()) })
    }
}

file_member_type!(ThreadPoolMember);

/// A member whose syscalls run in the calling task (for files in memory; see `inline.rs`).
pub struct InlineMember {
    inner: FileMember<InlineOps>,
}

impl InlineMember {
    pub fn open(path: impl AsRef<Path>, direct: DirectMode, read_only: bool) -> Result<Self> {
        let file = open_member_file(path.as_ref(), direct, read_only)?;
        Ok(Self { inner: FileMember::new(file, InlineOps) })
    }
}

file_member_type!(InlineMember);

/// Drops the first `n` bytes of `pieces` (written by a short gathering write).
fn skip_front(pieces: &mut Vec<Bytes>, mut n: usize) {
    let whole = pieces.iter().take_while(|p| {
        let all = p.len() <= n;
        if all {
            n -= p.len();
        }
        all
    });
    let whole = whole.count();
    pieces.drain(..whole);
    if let Some(first) = pieces.first_mut() {
        first.advance(n);
    }
}
