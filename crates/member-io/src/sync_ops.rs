//! The blocking syscalls behind [`FileOps`](crate::file_ops::FileOps), one per primitive:
//! run on a pool thread by the thread-pool engine, in the caller by the inline engine.

use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

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
