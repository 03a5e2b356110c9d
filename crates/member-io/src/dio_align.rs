//! O_DIRECT alignment probe: `statx(STATX_DIOALIGN)`, then `BLKSSZGET`, then 512.
//!
//! Linux 6.1+ reports the memory and file-offset alignment O_DIRECT needs
//! (`stx_dio_mem_align`, `stx_dio_offset_align`). Both zero (with the mask bit set) means
//! the file does not support O_DIRECT at all. Filesystems that report nothing (tmpfs,
//! older kernels) get the logical block size for block devices, else 512, the classic
//! sector size every O_DIRECT implementation accepts.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// What the probe learned about O_DIRECT on one open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DioAlign {
    /// O_DIRECT needs offsets, lengths and buffers aligned to this many bytes.
    Bytes(u64),
    /// The kernel says this file cannot do O_DIRECT.
    Unsupported,
}

/// Conservative default when nothing is reported.
const DEFAULT_ALIGN_BYTES: u64 = 512;

pub(crate) fn probe(fd: BorrowedFd<'_>, is_block_device: bool) -> io::Result<DioAlign> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the duration of the call, the path is a NUL-terminated empty
    // string (AT_EMPTY_PATH: stat the fd itself) and `stx` is a valid out pointer.
    let rc = unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 {
        let mem = u64::from(stx.stx_dio_mem_align);
        let offset = u64::from(stx.stx_dio_offset_align);
        if mem == 0 && offset == 0 {
            return Ok(DioAlign::Unsupported);
        }
        return Ok(DioAlign::Bytes(mem.max(offset).max(1)));
    }
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ENOSYS) {
            return Err(err);
        }
    }
    if is_block_device {
        let mut sector_bytes: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the valid pointer; fd is a block device.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::BLKSSZGET, &mut sector_bytes) };
        if rc == 0 && sector_bytes > 0 {
            return Ok(DioAlign::Bytes(sector_bytes as u64));
        }
    }
    Ok(DioAlign::Bytes(DEFAULT_ALIGN_BYTES))
}
