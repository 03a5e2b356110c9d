//! A member file's holes as `raid_core::Allocation` extents, from the same SEEK_DATA /
//! SEEK_HOLE walk the NBD server's file exports use (`nbd_server::file_device::extents_of`).
//!
//! Holes are reported as holes that read as zero; everything else as data (allocated zeros
//! are data: only a read could tell). A file system that cannot seek holes reports all
//! data, as do block devices (the kernel's generic answer); a range past the file's end (a
//! file truncated under the array) is data too, because reads there fail rather than
//! return zeros.

use std::fs::File;
use std::io;

use nbd_server::file_device::extents_of;
use raid_core::Allocation;

/// How `[offset_bytes, offset_bytes + len_bytes)` of `file` is stored (at least one byte of
/// it; the caller asks again for the rest).
pub(crate) fn file_allocation(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<Vec<Allocation>> {
    let file_len = file.metadata()?.len();
    let in_file = file_len.saturating_sub(offset_bytes).min(len_bytes);
    if in_file == 0 {
        return Ok(vec![Allocation::data(len_bytes)]);
    }
    match extents_of(file, offset_bytes, in_file) {
        Ok(extents) if !extents.is_empty() => {
            Ok(extents.iter().map(|e| Allocation { len_bytes: e.len_bytes, hole: e.hole, zero: e.zero }).collect())
        }
        Ok(_) => Ok(vec![Allocation::data(in_file)]),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::ENODEV)) => {
            Ok(vec![Allocation::data(in_file)])
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn holes_and_data_of_a_sparse_file_and_beyond_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let file =
            File::options().read(true).write(true).create(true).truncate(true).open(dir.path().join("f")).unwrap();
        file.set_len(8 << 20).unwrap();
        file.write_all_at(&[1u8; 4096], 1 << 20).unwrap();
        let extents = file_allocation(&file, 0, 8 << 20).unwrap();
        if extents.len() == 1 {
            // A file system without SEEK_HOLE: all data, which is still true.
            assert_eq!(extents, vec![Allocation::data(8 << 20)]);
            return;
        }
        assert_eq!(extents[0], Allocation::hole(1 << 20));
        assert!(!extents[1].hole && !extents[1].zero && extents[1].len_bytes >= 4096);
        assert!(extents[2].hole && extents[2].zero);
        assert_eq!(raid_core::allocation::total_bytes(&extents), 8 << 20);
        // Part of a hole; a range reaching past the end of the file stops at it, and what
        // lies past it is data (reads there fail).
        assert_eq!(file_allocation(&file, 2 << 20, 4096).unwrap(), vec![Allocation::hole(4096)]);
        file.set_len(4 << 20).unwrap();
        assert_eq!(file_allocation(&file, (4 << 20) - 4096, 8192).unwrap(), vec![Allocation::hole(4096)]);
        assert_eq!(file_allocation(&file, 4 << 20, 8192).unwrap(), vec![Allocation::data(8192)]);
    }
}
