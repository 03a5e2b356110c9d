//! The member conformance suite for [`member_io::NbdMember`] over a real NBD server
//! (nbdkit's memory plugin). Its own test binary: cargo runs test binaries one at a time,
//! so the nbdkit process does not compete with the timing-sensitive cancellation checks of
//! the file backends in `member_io`.

use std::sync::Arc;

use raid_core::Member;
use raid_core::conformance::{InFlight, MIN_MEMBER_BYTES, run_all};

/// Serves nbdkit's memory plugin (with `filter` args before it and `params` after) on a Unix
/// socket and runs the conformance suite over it.
async fn conformance_over_nbdkit(filter: &[&str], params: &[&str], query: &str) {
    let found = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("nbdkit").is_file()));
    assert!(found, "nbdkit is required: apt-get install nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("m.sock");
    let mut child = std::process::Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "-U"])
        .arg(&socket)
        .args(filter)
        .args(["memory", &MIN_MEMBER_BYTES.to_string()])
        .args(params)
        .spawn()
        .expect("start nbdkit");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() {
        assert!(std::time::Instant::now() < deadline, "nbdkit did not start");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let uri = format!("nbd+unix:///?socket={}{query}", socket.display());
    let m = Arc::new(
        member_io::NbdMember::connect(&uri, std::time::Duration::from_secs(5), Default::default())
            .await
            .expect("connect"),
    );
    assert_eq!(m.len_bytes(), MIN_MEMBER_BYTES);
    assert_eq!(m.alignment(), 1, "nbdkit serves any byte range");
    // Buffers are copied in and out of the connection: nothing outlives a dropped future.
    run_all(m, InFlight::Synchronous).await;
    let _ = child.kill();
    let _ = child.wait();
}

/// A member that is an NBD export: nbdkit's memory plugin over a Unix socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd_member_over_nbdkit() {
    conformance_over_nbdkit(&[], &[], "").await;
}

/// An export with FLUSH but no FUA (nbdkit's fua filter; its default mode, none): FUA writes (every
/// superblock and bitmap write) become a write and a FLUSH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd_member_over_an_export_without_fua() {
    conformance_over_nbdkit(&["--filter=fua"], &[], "").await;
}

/// `?connections=4` on an export with CAN_MULTI_CONN (nbdkit memory): requests go round four
/// connections (counted by nbdkit's log filter), and the suite passes over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd_member_over_four_connections() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let logfile = format!("logfile={}", log.path().display());
    conformance_over_nbdkit(&["--filter=log"], &[&logfile], "&connections=4").await;
    let text = std::fs::read_to_string(log.path()).unwrap();
    let connections = text.lines().filter(|l| l.contains("Connect ")).count();
    assert_eq!(connections, 4, "{text}");
    // Every connection carried requests.
    let mut used = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| l.contains("Write id=") || l.contains("Read id=")) {
        if let Some(conn) = line.split_whitespace().find(|w| w.starts_with("connection=")) {
            used.insert(conn.to_string());
        }
    }
    assert_eq!(used.len(), 4, "requests on {used:?}");
}
