//! The conformance suite, once per backend and wrapper.

use std::sync::Arc;

use member_io::{
    DirectMode, EngineKind, FaultControl, Faulty, InlineMember, IoEngine, OpenOptions, ThreadPoolMember, Throttle,
    ThrottleConfig, Throttled, UringConfig, UringDriver, UringMember, open_member,
};
use raid_core::{Member, MemoryMember};

use crate::util::{EXT4_SUPER_MAGIC, LoopDevice, RamfsMount, fs_magic, require_uring, scratch_dir, sparse_file};
use raid_core::conformance::{InFlight, MIN_MEMBER_BYTES, run_all};

fn assert_ext4(dir: &std::path::Path) {
    assert_eq!(
        fs_magic(dir),
        EXT4_SUPER_MAGIC,
        "{} must be on ext4 for the O_DIRECT-on-ext4 case (CARGO_TARGET_TMPDIR lives in the target dir)",
        dir.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_direct_on_ext4() {
    require_uring();
    let dir = scratch_dir();
    assert_ext4(dir.path());
    let m = Arc::new(UringMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::On, false).unwrap());
    assert!(m.is_direct());
    assert!(m.alignment() >= 512, "ext4 O_DIRECT alignment {}", m.alignment());
    let probe = Arc::clone(&m);
    run_all(m, InFlight::counter(move || probe.in_flight_ops())).await;
}

/// The opt-in registered-buffer pool (ReadFixed/WriteFixed with copies for I/O up to 64 KiB,
/// plain Read/Write for larger I/O or when every slot is busy), on a private ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_direct_registered_buffers() {
    require_uring();
    let driver = UringDriver::start(&UringConfig { registered_buffers: true, ring_threads: 1, ..Default::default() })
        .expect("private ring");
    assert!(driver.registered_slots() > 0, "registered buffers refused: RLIMIT_MEMLOCK (ulimit -l) too low?");
    let dir = scratch_dir();
    let path = sparse_file(dir.path(), "m", MIN_MEMBER_BYTES);
    let m = Arc::new(UringMember::open_on(path, DirectMode::On, false, driver).unwrap());
    let probe = Arc::clone(&m);
    run_all(m, InFlight::counter(move || probe.in_flight_ops())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_buffered() {
    require_uring();
    let dir = scratch_dir();
    let m =
        Arc::new(UringMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::Off, false).unwrap());
    assert!(!m.is_direct());
    assert_eq!(m.alignment(), 1);
    let probe = Arc::clone(&m);
    run_all(m, InFlight::counter(move || probe.in_flight_ops())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_direct_on_dev_shm() {
    require_uring();
    let dir = tempfile::tempdir_in("/dev/shm").expect("/dev/shm");
    let m =
        Arc::new(UringMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::Auto, false).unwrap());
    let probe = Arc::clone(&m);
    run_all(m, InFlight::counter(move || probe.in_flight_ops())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_direct_on_ext4() {
    let dir = scratch_dir();
    assert_ext4(dir.path());
    let m = Arc::new(
        ThreadPoolMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::On, false).unwrap(),
    );
    assert!(m.is_direct());
    let probe = Arc::clone(&m);
    run_all(m, InFlight::counter(move || probe.in_flight_ops())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_buffered() {
    let dir = scratch_dir();
    let m = Arc::new(
        ThreadPoolMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::Off, false).unwrap(),
    );
    assert!(!m.is_direct());
    let probe = Arc::clone(&m);
    run_all(m, InFlight::counter(move || probe.in_flight_ops())).await;
}

/// ramfs has neither O_DIRECT nor fallocate: `DirectMode::Auto` falls back to buffered I/O
/// and discard/write_zeroes fall back to writing zero buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ramfs_without_direct_io_or_fallocate() {
    require_uring();
    let fs = RamfsMount::new();
    let path = sparse_file(fs.path(), "m", MIN_MEMBER_BYTES);
    assert!(
        matches!(
            UringMember::open(&path, DirectMode::On, false),
            Err(member_io::MemberIoError::DirectIoRefused { .. })
        ),
        "direct=on must fail where O_DIRECT is refused"
    );
    let uring = Arc::new(UringMember::open(&path, DirectMode::Auto, false).unwrap());
    assert!(!uring.is_direct(), "direct=auto falls back to buffered on ramfs");
    let probe = Arc::clone(&uring);
    run_all(uring, InFlight::counter(move || probe.in_flight_ops())).await;
    let path = sparse_file(fs.path(), "m2", MIN_MEMBER_BYTES);
    let threads = Arc::new(ThreadPoolMember::open(&path, DirectMode::Auto, false).unwrap());
    let probe = Arc::clone(&threads);
    run_all(threads, InFlight::counter(move || probe.in_flight_ops())).await;
    let path = sparse_file(fs.path(), "m3", MIN_MEMBER_BYTES);
    run_all(Arc::new(InlineMember::open(&path, DirectMode::Auto, false).unwrap()), InFlight::Synchronous).await;
}

/// The inline engine where `--io auto` picks it (a file on tmpfs) and, forced, on ext4 with O_DIRECT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_on_dev_shm_and_ext4() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("/dev/shm");
    let m =
        Arc::new(InlineMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::Auto, false).unwrap());
    run_all(m, InFlight::Synchronous).await;
    let dir = scratch_dir();
    assert_ext4(dir.path());
    let m =
        Arc::new(InlineMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::On, false).unwrap());
    assert!(m.is_direct());
    run_all(m, InFlight::Synchronous).await;
}

/// `--io auto` runs a member on tmpfs inline (its I/O completes in the first poll) and one
/// on ext4 on a ring or pool thread. (Whether a ring read of a hole is ready at the first
/// poll depends on the kernel, so the ext4 side checks the decision, not the timing.)
#[test]
fn auto_runs_files_in_memory_inline_and_others_on_threads() {
    use std::task::{Context, Poll, Waker};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let auto = OpenOptions::default();
    let shm = tempfile::tempdir_in("/dev/shm").expect("/dev/shm");
    let in_memory = sparse_file(shm.path(), "m", MIN_MEMBER_BYTES);
    assert_eq!(member_io::engine_for(&in_memory, &auto).unwrap(), EngineKind::Inline);
    let m = open_member(&in_memory, &auto).unwrap();
    let mut read = m.read_at(0, raid_core::AlignedBuf::zeroed(4096));
    let ready = read.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(matches!(ready, Poll::Ready((Ok(()), _))), "tmpfs member must run inline");
    drop(read);
    let dir = scratch_dir();
    assert_ext4(dir.path());
    let on_disk = sparse_file(dir.path(), "m", MIN_MEMBER_BYTES);
    let engine = member_io::engine_for(&on_disk, &auto).unwrap();
    assert!(matches!(engine, EngineKind::Uring | EngineKind::Threads), "ext4 member must not run inline: {engine}");
    assert_eq!(
        member_io::engine_for(&in_memory, &OpenOptions { engine: IoEngine::Threads, ..auto.clone() }).unwrap(),
        EngineKind::Threads,
        "an explicit engine wins over memory"
    );
}

/// Files in memory (buffered) offer their `File` for in-place reads, on every engine and
/// only in range; files on disk, O_DIRECT files and the wrappers never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_files_offer_in_place_reads_and_writes() {
    use std::os::unix::fs::FileExt;
    require_uring();
    let shm = tempfile::tempdir_in("/dev/shm").expect("/dev/shm");
    let path = sparse_file(shm.path(), "m", MIN_MEMBER_BYTES);
    for engine in [IoEngine::Auto, IoEngine::Inline, IoEngine::Threads, IoEngine::Uring] {
        let m = open_member(&path, &OpenOptions { engine, ..OpenOptions::default() }).unwrap();
        let data = vec![0xA5u8; 8192];
        m.write_slice_at(1 << 20, &data, false).await.unwrap();
        let file = m.memory_file(1 << 20, 8192).unwrap_or_else(|| panic!("{engine:?}: tmpfs file in place"));
        let mut back = vec![0u8; 8192];
        file.read_exact_at(&mut back, 1 << 20).unwrap();
        assert!(back == data, "{engine:?}: the file holds the member's bytes at member offsets");
        assert!(m.memory_file(MIN_MEMBER_BYTES - 4096, 8192).is_none(), "{engine:?}: not past the end");
        let for_write = m.memory_file_for_write(1 << 20, 8192).expect("a writable tmpfs file takes writes in place");
        assert!(Arc::ptr_eq(&for_write, &file), "{engine:?}: the same file");
        assert!(m.memory_file_for_write(MIN_MEMBER_BYTES - 4096, 8192).is_none(), "{engine:?}: not past the end");
        let read_only = open_member(&path, &OpenOptions { engine, read_only: true, ..OpenOptions::default() }).unwrap();
        assert!(read_only.memory_file(0, 4096).is_some(), "{engine:?}: read-only files read in place");
        assert!(read_only.memory_file_for_write(0, 4096).is_none(), "{engine:?}: but take no writes");
    }
    // A file truncated under the member: the range it no longer holds reads the normal way
    // (and fails there), the rest is still offered.
    let shrunk = sparse_file(shm.path(), "shrunk", MIN_MEMBER_BYTES);
    let m = open_member(&shrunk, &OpenOptions::default()).unwrap();
    std::fs::OpenOptions::new().write(true).open(&shrunk).unwrap().set_len(1 << 20).unwrap();
    assert!(m.memory_file(0, 1 << 20).is_some());
    assert!(m.memory_file(1 << 20, 4096).is_none(), "not what the file no longer holds");
    let direct = InlineMember::open(&path, DirectMode::On, false);
    if let Ok(direct) = direct {
        assert!(direct.is_direct() && direct.memory_file(0, 4096).is_none(), "O_DIRECT files read through the engine");
    }
    let inline = Arc::new(InlineMember::open(&path, DirectMode::Off, false).unwrap());
    let faulty = Faulty::new(Arc::clone(&inline), FaultControl::new());
    assert!(faulty.memory_file(0, 4096).is_none() && faulty.memory_file_for_write(0, 4096).is_none());
    let throttled = Throttled::new(
        Arc::clone(&inline),
        Throttle::new(&ThrottleConfig { iops: Some(1000), ..Default::default() }).unwrap(),
    );
    assert!(throttled.memory_file(0, 4096).is_none() && throttled.memory_file_for_write(0, 4096).is_none());
    let dir = scratch_dir();
    assert_ext4(dir.path());
    let on_disk = open_member(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), &OpenOptions::default()).unwrap();
    assert!(on_disk.memory_file(0, 4096).is_none(), "ext4 files read through the engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_member() {
    run_all(Arc::new(MemoryMember::new("memory", MIN_MEMBER_BYTES)), InFlight::Synchronous).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_wrapper_unlimited_over_uring() {
    require_uring();
    let dir = scratch_dir();
    let inner =
        Arc::new(UringMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::On, false).unwrap());
    // Generous limits: the wrapper is in the path but never the bottleneck of the suite.
    let cfg = ThrottleConfig { bytes_per_sec: Some(10 << 30), iops: Some(10_000_000), ..Default::default() };
    let m = Arc::new(Throttled::new(Arc::clone(&inner), Throttle::new(&cfg).unwrap()));
    run_all(m, InFlight::counter(move || inner.in_flight_ops())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_wrapper_disarmed_over_threads() {
    let dir = scratch_dir();
    let inner = Arc::new(
        ThreadPoolMember::open(sparse_file(dir.path(), "m", MIN_MEMBER_BYTES), DirectMode::On, false).unwrap(),
    );
    let control = FaultControl::new();
    let m = Arc::new(Faulty::new(Arc::clone(&inner), Arc::clone(&control)));
    run_all(m, InFlight::counter(move || inner.in_flight_ops())).await;
    assert!(control.ops_seen() > 400, "the wrapper saw the suite's I/O");
    assert_eq!(control.injected_failures(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrappers_stacked_over_memory() {
    let control = FaultControl::new();
    let faulty = Faulty::new(MemoryMember::new("memory", MIN_MEMBER_BYTES), control);
    let m = Arc::new(Throttled::new(faulty, Throttle::new(&ThrottleConfig::default()).unwrap()));
    run_all(m, InFlight::Synchronous).await;
}

/// A loop block device: size via lseek, alignment via statx/BLKSSZGET, zeroing via
/// fallocate on the bdev.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_and_threads_on_block_device() {
    require_uring();
    let dev = LoopDevice::new(MIN_MEMBER_BYTES);
    let uring = Arc::new(UringMember::open(&dev.device, DirectMode::On, false).unwrap());
    check_block_device(&*uring);
    // Writable block devices are claimed exclusively (O_EXCL): a second writer is refused,
    // a reader is not.
    match ThreadPoolMember::open(&dev.device, DirectMode::On, false) {
        Err(member_io::MemberIoError::Open { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EBUSY)),
        other => panic!("second exclusive open of a block device: {:?}", other.map(|_| ())),
    }
    assert!(ThreadPoolMember::open(&dev.device, DirectMode::On, true).is_ok());
    let probe = Arc::clone(&uring);
    run_all(uring, InFlight::counter(move || probe.in_flight_ops())).await;
    let threads = Arc::new(ThreadPoolMember::open(&dev.device, DirectMode::On, false).unwrap());
    check_block_device(&*threads);
    let probe = Arc::clone(&threads);
    run_all(threads, InFlight::counter(move || probe.in_flight_ops())).await;
    // The factory opens block devices too.
    let m = open_member(&dev.device, &OpenOptions { engine: IoEngine::Threads, ..Default::default() }).unwrap();
    assert_eq!(m.len_bytes(), MIN_MEMBER_BYTES);
}

fn check_block_device(m: &dyn Member) {
    assert_eq!(m.len_bytes(), MIN_MEMBER_BYTES, "block device size");
    assert!(m.alignment() >= 512, "block device O_DIRECT alignment {}", m.alignment());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn factory_engines_round_trip() {
    let dir = scratch_dir();
    for (i, engine) in [IoEngine::Threads, IoEngine::Uring].into_iter().enumerate() {
        if engine == IoEngine::Uring {
            require_uring();
        }
        for direct in [DirectMode::Auto, DirectMode::On, DirectMode::Off] {
            let path = sparse_file(dir.path(), &format!("m{i}{direct:?}"), 1 << 20);
            let m = open_member(&path, &OpenOptions { engine, direct, read_only: false }).unwrap();
            raid_core::conformance::round_trip_aligned_small(&*m).await;
        }
    }
}

fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

/// Private rings shut down cleanly when their last member goes: the ring threads complete
/// their armed doorbell read and exit (checked in a child process, where no other test
/// starts rings).
#[test]
fn private_rings_exit_when_dropped() {
    if std::env::var(crate::util::CHILD_ENV).as_deref() == Ok("rings-exit") {
        require_uring();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = scratch_dir();
        let driver = UringDriver::start(&UringConfig { ring_threads: 3, ..Default::default() }).unwrap();
        assert_eq!(driver.ring_threads(), 3);
        assert_eq!(threads_named("member-io-uring"), 3);
        let m = UringMember::open_on(sparse_file(dir.path(), "m", 1 << 20), DirectMode::On, false, driver).unwrap();
        rt.block_on(raid_core::conformance::round_trip_aligned_small(&m));
        drop(m);
        let t0 = std::time::Instant::now();
        while threads_named("member-io-uring") > 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "ring threads did not exit");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        println!("CHILD-OK rings exited");
        return;
    }
    let out =
        crate::util::run_child("backends::private_rings_exit_when_dropped", &[(crate::util::CHILD_ENV, "rings-exit")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-OK rings exited"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
