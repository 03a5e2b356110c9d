//! The blocking syscalls behind [`FileOps`](crate::file_ops::FileOps), one per primitive:
//! run on a pool thread by the thread-pool engine, in the caller by the inline engine.

use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use bytes::Bytes;
use raid_core::AlignedBuf;

use crate::file_ops::TransferResult;
use crate::member_file::FileRef;

pub(crate) fn read(file: &FileRef, offset_bytes: u64, mut buf: AlignedBuf, range: Range<usize>) -> TransferResult {
    let res = retry_eintr(|| file.file().as_file().read_at(&mut buf.as_mut_slice()[range.clone()], offset_bytes));
    (res, buf)
}

pub(crate) fn write(file: &FileRef, offset_bytes: u64, buf: AlignedBuf, range: Range<usize>) -> TransferResult {
    (write_slice(file, offset_bytes, &buf.as_slice()[range]), buf)
}

/// `pwrite` of a borrowed slice (also the inline engine's copy-free writes).
pub(crate) fn write_slice(file: &FileRef, offset_bytes: u64, data: &[u8]) -> io::Result<usize> {
    retry_eintr(|| file.file().as_file().write_at(data, offset_bytes))
}

/// `pwritev` of shared pieces, one after another from `offset_bytes` (at most `IOV_MAX`
/// of them per call; the caller continues after a short write).
pub(crate) fn write_pieces(file: &FileRef, offset_bytes: u64, pieces: Vec<Bytes>) -> io::Result<usize> {
    let iovecs = IoVecs::new(pieces);
    let offset = libc::off_t::try_from(offset_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    retry_eintr(|| {
        // SAFETY: every iovec points into a piece `iovecs` owns, alive for the call.
        let n = unsafe { libc::pwritev(file.raw_fd(), iovecs.as_ptr(), iovecs.count(), offset) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
    })
}

/// Shared pieces and their iovecs (for at most `IOV_MAX` of them), for `pwritev` and
/// io_uring's `Writev`: the iovecs stay valid as long as this lives (`Bytes` never move
/// their memory).
pub(crate) struct IoVecs {
    iovecs: Vec<libc::iovec>,
    _pieces: Vec<Bytes>,
}

// SAFETY: the iovecs only point into the pieces this owns (immutable, reference-counted
// memory); moving it to another thread moves the owners with the pointers.
unsafe impl Send for IoVecs {}

impl IoVecs {
    /// Most iovecs one call takes (Linux's UIO_MAXIOV).
    const MAX: usize = 1024;

    pub(crate) fn new(pieces: Vec<Bytes>) -> Self {
        let iovecs = pieces
            .iter()
            .take(Self::MAX)
            .map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() })
            .collect();
        Self { iovecs, _pieces: pieces }
    }

    pub(crate) fn as_ptr(&self) -> *const libc::iovec {
        self.iovecs.as_ptr()
    }

    pub(crate) fn count(&self) -> i32 {
        self.iovecs.len() as i32
    }
}

pub(crate) fn fdatasync(file: &FileRef) -> io::Result<()> {
    retry_eintr(|| file.file().as_file().sync_data())
}

pub(crate) fn fallocate(file: &FileRef, mode: i32, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    let offset = libc::off_t::try_from(offset_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let len = libc::off_t::try_from(len_bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    retry_eintr(|| {
        // SAFETY: fallocate takes plain integers; the fd stays open while `file` lives.
        let rc = unsafe { libc::fallocate(file.raw_fd(), mode, offset, len) };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    })
}

fn retry_eintr<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
