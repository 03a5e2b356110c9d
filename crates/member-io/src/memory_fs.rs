//! Whether a member file lives in memory (tmpfs, ramfs): the engine factory (inline engine)
//! and `MemberFile` (in-place reads and writes) ask it of a path.

/// Whether `path` is a regular file on tmpfs or ramfs. (nbd-server's `FileDevice` makes the
/// same check on its own: the two crates do not depend on each other.)
pub(crate) fn is_memory_backed(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    if !std::fs::metadata(path).is_ok_and(|m| m.file_type().is_file()) {
        return false;
    }
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated; statfs fills the buffer when it returns 0, and the
    // buffer is only read in that case.
    if unsafe { libc::statfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statfs returned 0, so the struct is initialised.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)]
    let f_type = stat.f_type as i64;
    #[allow(clippy::unnecessary_cast)]
    let tmpfs = libc::TMPFS_MAGIC as i64;
    f_type == tmpfs || f_type == RAMFS_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_on_tmpfs_are_in_memory() {
        let shm = tempfile::NamedTempFile::new_in("/dev/shm").expect("/dev/shm");
        assert!(is_memory_backed(shm.path()));
        let disk = tempfile::NamedTempFile::new_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        assert!(!is_memory_backed(disk.path()));
        // Device nodes sit on devtmpfs, which reports tmpfs: their I/O still goes to a device.
        assert!(!is_memory_backed(std::path::Path::new("/dev/null")));
    }
}
