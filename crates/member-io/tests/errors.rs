//! Errors surface as errors, for every file backend: deleted member (keeps working),
//! truncated under us, read past the end, ENOSPC on a 1 MiB tmpfs, read-only members.

use std::io;
use std::path::Path;
use std::sync::Arc;

use member_io::{DirectMode, ThreadPoolMember, UringMember, create_sparse_file};
use raid_core::Member;

use crate::util::{TmpfsMount, pattern, require_uring, scratch_dir, sparse_file};
use raid_core::conformance::{read, write};

/// Every file backend configuration, opened on `path`.
fn backends(path: &Path, read_only: bool) -> Vec<(&'static str, Arc<dyn Member>)> {
    require_uring();
    vec![
        ("uring direct", Arc::new(UringMember::open(path, DirectMode::On, read_only).unwrap())),
        ("uring buffered", Arc::new(UringMember::open(path, DirectMode::Off, read_only).unwrap())),
        ("threads direct", Arc::new(ThreadPoolMember::open(path, DirectMode::On, read_only).unwrap())),
        ("threads buffered", Arc::new(ThreadPoolMember::open(path, DirectMode::Off, read_only).unwrap())),
    ]
}

/// Documented behaviour: a member file unlinked while open keeps working (the open fd pins
/// the inode), exactly like a disk whose /dev node was removed. Data lives until close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_member_keeps_working() {
    let dir = scratch_dir();
    let path = sparse_file(dir.path(), "m", 1 << 20);
    let members = backends(&path, false);
    std::fs::remove_file(&path).unwrap();
    for (i, (what, m)) in members.iter().enumerate() {
        let data = pattern(i as u64, 64 << 10);
        let offset = i as u64 * (64 << 10);
        write(&**m, offset, &data, true).await.unwrap_or_else(|e| panic!("{what}: write after unlink: {e}"));
        m.flush().await.unwrap();
        assert!(read(&**m, offset, 64 << 10).await.unwrap() == data, "{what}: read after unlink");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_under_us_read_past_new_end_fails() {
    let dir = scratch_dir();
    let path = sparse_file(dir.path(), "m", 1 << 20);
    let members = backends(&path, false);
    write(&*members[0].1, 0, &pattern(1, 1 << 20), false).await.unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(256 << 10).unwrap();
    for (what, m) in &members {
        assert_eq!(m.len_bytes(), 1 << 20, "{what}: size is fixed at open");
        // Entirely past the new end, and straddling it: both are errors, never zeros.
        let err = read(&**m, 512 << 10, 64 << 10).await.expect_err("read past the new end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{what}: {err}");
        let err = read(&**m, (256 << 10) - 4096, 8192).await.expect_err("read across the new end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{what}: {err}");
        // Before the new end still works.
        assert!(read(&**m, 0, 4096).await.unwrap() == pattern(1, 1 << 20)[..4096], "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_past_end_fails() {
    let dir = scratch_dir();
    let path = sparse_file(dir.path(), "m", 1 << 20);
    for (what, m) in backends(&path, false) {
        let err = read(&*m, 1 << 20, 4096).await.expect_err("past end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{what}: {err}");
        let err = read(&*m, (1 << 20) - 4096, 8192).await.expect_err("across end");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{what}: {err}");
    }
}

/// A 1 MiB tmpfs holds a 4 MiB sparse member: writing it fills the filesystem and the
/// backend must report ENOSPC (not succeed, not hang, not panic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_is_reported() {
    require_uring();
    let fs = TmpfsMount::new("1m");
    let path = fs.path().join("m");
    create_sparse_file(&path, 4 << 20).unwrap();
    let members: Vec<(&str, Arc<dyn Member>)> = vec![
        ("uring", Arc::new(UringMember::open(&path, DirectMode::Auto, false).unwrap())),
        ("threads", Arc::new(ThreadPoolMember::open(&path, DirectMode::Auto, false).unwrap())),
    ];
    for (what, m) in members {
        let chunk = pattern(3, 256 << 10);
        let mut failure = None;
        for i in 0..16u64 {
            if let Err(e) = write(&*m, i * (256 << 10), &chunk, false).await {
                failure = Some(e);
                break;
            }
        }
        let err = failure.unwrap_or_else(|| panic!("{what}: 4 MiB fit in a 1 MiB tmpfs?"));
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{what}: expected ENOSPC, got {err}");
        // Free the space again for the next backend (punch-hole works on tmpfs).
        m.discard(0, 4 << 20).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_member_refuses_writes() {
    let dir = scratch_dir();
    let path = sparse_file(dir.path(), "m", 1 << 20);
    for (what, m) in backends(&path, true) {
        assert!(read(&*m, 0, 4096).await.is_ok(), "{what}: reads work");
        let err = write(&*m, 0, &[1; 4096], false).await.expect_err("write on read-only");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{what}: {err}");
        assert_eq!(m.discard(0, 4096).await.unwrap_err().raw_os_error(), Some(libc::EROFS), "{what}");
        assert_eq!(m.write_zeroes(0, 4096).await.unwrap_err().raw_os_error(), Some(libc::EROFS), "{what}");
        m.flush().await.unwrap();
    }
}

#[test]
fn open_errors_are_typed() {
    let dir = scratch_dir();
    let missing = dir.path().join("missing");
    assert!(matches!(
        ThreadPoolMember::open(&missing, DirectMode::Auto, false),
        Err(member_io::MemberIoError::Stat { .. })
    ));
    assert!(matches!(
        ThreadPoolMember::open(dir.path(), DirectMode::Auto, false),
        Err(member_io::MemberIoError::NotFileOrBlockDevice { .. })
    ));
    let existing = sparse_file(dir.path(), "m", 4096);
    assert!(matches!(create_sparse_file(&existing, 8192), Err(member_io::MemberIoError::Create { .. })));
    assert_eq!(std::fs::metadata(&existing).unwrap().len(), 4096, "create_sparse_file never resizes");
}
