//! Real clients against the server: nbdinfo, nbdcopy, qemu-io, fio, nbdfuse + losetup +
//! mkfs.ext4 + e2fsck.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::util::{TestServer, pattern, require_tool, run_ok};

#[test]
fn nbdinfo_json_list_and_map() {
    let nbdinfo = require_tool("nbdinfo", "libnbd-bin");
    let qemu_io = require_tool("qemu-io", "qemu-utils");
    let server = TestServer::standard();

    let out = run_ok(Command::new(&nbdinfo).args(["--json", "--list", &server.uri("")]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --json output");
    assert_eq!(json["protocol"], "newstyle-fixed");
    assert_eq!(json["structured"], true);
    let exports = json["exports"].as_array().expect("exports array");
    let find = |name: &str| exports.iter().find(|e| e["export-name"] == name).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(exports.len(), 6);
    let mem = find("mem");
    assert_eq!(mem["export-size"], 64 << 20);
    assert_eq!(mem["description"], "the main test disk");
    assert_eq!(mem["can_multi_conn"], true);
    assert_eq!(mem["can_fast_zero"], true);
    assert_eq!(mem["contexts"], serde_json::json!(["base:allocation"]));
    let ro = find("ro");
    assert_eq!(ro["is_read_only"], true);
    assert_eq!(ro["can_trim"], false);
    let aligned = find("aligned");
    assert_eq!(aligned["block_size_minimum"], 4096);
    assert_eq!(aligned["block_size_preferred"], 65536);
    assert_eq!(aligned["block_size_maximum"], 64 << 20);

    let out = run_ok(Command::new(&nbdinfo).args(["--json", &server.uri("file")]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["exports"][0]["export-size"], 16 << 20);

    // Write 1 MiB at 1 MiB, then the allocation map must show exactly that.
    run_ok(Command::new(&qemu_io).args(["-f", "raw", "-c", "write -P 0x42 1M 1M", &server.uri("mem")]));
    let out = run_ok(Command::new(&nbdinfo).args(["--map", &server.uri("mem")]));
    let map: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let expected = [["0", "1048576", "3"], ["1048576", "1048576", "0"], ["2097152", "65011712", "3"]];
    assert_eq!(map.len(), 3, "{map:?}");
    for (line, want) in map.iter().zip(expected) {
        assert_eq!(&line[..3], &want[..], "{map:?}");
    }
    server.stop();
}

/// Random data with zero stretches, so nbdcopy exercises both data and zeroing paths.
fn random_image(path: &Path, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    for hole in [(1 << 20)..(3 << 20), (7 << 20)..(7 << 20) + 4096, (12 << 20)..(14 << 20)] {
        data[hole].fill(0);
    }
    std::fs::write(path, &data).unwrap();
    data
}

#[test]
fn nbdcopy_round_trip_of_random_data() {
    let nbdcopy = require_tool("nbdcopy", "libnbd-bin");
    let server = TestServer::standard();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    let data = random_image(&src, 16 << 20);

    // Upload (multi-conn, 64 requests in flight per connection, zero detection), download.
    run_ok(Command::new(&nbdcopy).args(["--flush", "--connections=4"]).arg(&src).arg(server.uri("file")));
    std::fs::File::create(&back).unwrap();
    run_ok(
        Command::new(&nbdcopy).args(["--connections=4", "--request-size=1048576"]).arg(server.uri("file")).arg(&back),
    );
    let round_trip = std::fs::read(&back).unwrap();
    assert!(round_trip == data, "nbdcopy round trip differs");
    // The file the server wrote holds the same bytes.
    assert!(std::fs::read(&server.devices.file_path).unwrap() == data, "backing file differs");

    // NBD to NBD: file export → first 16 MiB of mem, then compare via another download.
    let partial = dir.path().join("mem.img");
    run_ok(Command::new(&nbdcopy).args(["--synchronous"]).arg(server.uri("file")).arg(server.uri("mem")));
    std::fs::File::create(&partial).unwrap();
    run_ok(Command::new(&nbdcopy).arg(server.uri("mem")).arg(&partial));
    let mem = std::fs::read(&partial).unwrap();
    assert_eq!(mem.len(), 64 << 20);
    assert!(mem[..16 << 20] == data[..] && mem[16 << 20..].iter().all(|&b| b == 0), "NBD to NBD copy differs");
    server.stop();
}

/// qemu-io binaries to test: the one on PATH, plus any listed in `NBD_TEST_EXTRA_QEMU_IO`
/// (colon-separated; e.g. a qemu 10 build, which opens with NBD_OPT_EXTENDED_HEADERS).
fn qemu_io_binaries() -> Vec<std::path::PathBuf> {
    let mut all = vec![require_tool("qemu-io", "qemu-utils")];
    if let Some(extra) = std::env::var_os("NBD_TEST_EXTRA_QEMU_IO") {
        all.extend(std::env::split_paths(&extra).filter(|p| !p.as_os_str().is_empty()));
    }
    all
}

#[test]
fn qemu_io_pattern_writes_and_reads() {
    let server = TestServer::standard();
    let commands = [
        "write -P 0x5a 0 1M",
        "read -P 0x5a 0 1M",
        "write -f -P 0xa5 1M 64k",
        "read -P 0xa5 1M 64k",
        "writev -P 0x33 4M 4k 8k 16k",
        "readv -P 0x33 4M 28k",
        "write -z 0 64k",
        "read -P 0 0 64k",
        "read -P 0x5a 64k 960k",
        "write -z -u 2M 1M",
        "read -P 0 2M 1M",
        "discard 8M 1M",
        "aio_write -P 0x77 12M 256k",
        "aio_write -P 0x78 13M 256k",
        "aio_flush",
        "read -P 0x77 12M 256k",
        "read -P 0x78 13M 256k",
        "flush",
    ];
    for (qemu_io, export) in qemu_io_binaries().iter().flat_map(|q| [(q.clone(), "mem"), (q.clone(), "file")]) {
        let mut cmd = Command::new(&qemu_io);
        cmd.args(["-f", "raw"]);
        for c in commands {
            cmd.args(["-c", c]);
        }
        let out = run_ok(cmd.arg(server.uri(export)));
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(!text.contains("Pattern verification failed"), "{text}");
        assert!(!text.to_lowercase().contains("error"), "{text}");
        let done = text
            .lines()
            .filter(|l| l.starts_with("read ") || l.starts_with("wrote ") || l.starts_with("discard "))
            .count();
        assert_eq!(done, 16, "every read/write/discard must report completion:\n{text}");
    }
    server.stop();
}

#[test]
fn fio_nbd_engine_with_crc32c_verify() {
    let fio = require_tool("fio", "fio");
    let server = TestServer::standard();
    let dir = tempfile::tempdir().unwrap();
    // Small writes run in the reader; from 128 KiB on they are handed off to another task,
    // or received straight into the file on tmpfs ("shm").
    for (export, rw, bs, depth) in [
        ("mem", "randwrite", "4k", "32"),
        ("file", "write", "64k", "8"),
        ("file", "randwrite", "16k", "16"),
        ("mem", "randwrite", "256k", "16"),
        ("file", "write", "1m", "8"),
        ("shm", "write", "1m", "8"),
        ("shm", "randwrite", "128k", "32"),
    ] {
        let out = run_ok(Command::new(&fio).current_dir(dir.path()).args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri(export)),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--iodepth={depth}"),
            "--size=8m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--randrepeat=1",
            "--verify_state_save=0",
        ]));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("err= 0"), "{text}");
        assert!(!text.contains("verify: bad"), "{text}");
    }
    server.stop();
}

/// Waits for a path to exist and be non-empty.
fn wait_for_file(path: &Path, timeout: Duration) {
    let start = Instant::now();
    while !std::fs::metadata(path).map(|m| m.len() > 0).unwrap_or(false) {
        assert!(start.elapsed() < timeout, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nbdfuse_loop_device_mkfs_ext4_and_fsck() {
    let nbdfuse = require_tool("nbdfuse", "libnbd-bin");
    let losetup = require_tool("losetup", "mount");
    let mkfs = require_tool("mkfs.ext4", "e2fsprogs");
    let e2fsck = require_tool("e2fsck", "e2fsprogs");
    let mount = require_tool("mount", "mount");
    let umount = require_tool("umount", "mount");
    let server = TestServer::standard();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let pidfile = dir.path().join("nbdfuse.pid");
    let mountpoint = dir.path().join("mnt");
    std::fs::File::create(&image).unwrap();
    std::fs::create_dir(&mountpoint).unwrap();

    let mut fuse = Command::new(&nbdfuse)
        .arg("-P")
        .arg(&pidfile)
        .arg(&image)
        .args(["--tcp", "127.0.0.1", &server.port().to_string()])
        .spawn()
        .expect("start nbdfuse");
    wait_for_file(&pidfile, Duration::from_secs(10));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20, "nbdfuse exposes the default export");

    let out = run_ok(Command::new(&losetup).args(["--find", "--show"]).arg(&image));
    let loop_dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let result = std::panic::catch_unwind(|| {
        run_ok(Command::new(&mkfs).args(["-q", "-F", &loop_dev]));
        run_ok(Command::new(&e2fsck).args(["-fn", &loop_dev]));
        run_ok(Command::new(&mount).arg(&loop_dev).arg(&mountpoint));
        let payload = pattern(77, 8 << 20);
        std::fs::write(mountpoint.join("payload"), &payload).unwrap();
        run_ok(Command::new(&umount).arg(&mountpoint));
        run_ok(Command::new(&e2fsck).args(["-fn", &loop_dev]));
        run_ok(Command::new(&mount).args(["-o", "ro"]).arg(&loop_dev).arg(&mountpoint));
        let back = std::fs::read(mountpoint.join("payload")).unwrap();
        run_ok(Command::new(&umount).arg(&mountpoint));
        assert!(back == payload, "file read back through ext4-on-NBD differs");
    });
    let _ = Command::new(&umount).arg(&mountpoint).output();
    run_ok(Command::new(&losetup).args(["-d", &loop_dev]));
    run_ok(Command::new(&umount).arg(&image));
    let status = fuse.wait().expect("nbdfuse exit");
    assert!(status.success(), "nbdfuse exited with {status}");
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    // The superblock magic of ext4 (0xEF53 at byte 1080) reached the device.
    let server_mem = &server.devices.mem;
    let sb = server.runtime.block_on(nbd_server::BlockDevice::read(&**server_mem, 1024, 1024)).unwrap();
    let bytes: Vec<u8> = sb
        .iter()
        .flat_map(|c| match c {
            nbd_server::ReadChunk::Data(d) => d.to_vec(),
            nbd_server::ReadChunk::Zero(n) => vec![0; *n as usize],
            nbd_server::ReadChunk::File(_) => unreachable!("a memory device returns no file ranges"),
        })
        .collect();
    assert_eq!(&bytes[56..58], &[0x53, 0xef], "ext4 superblock magic");
    server.stop();
}
