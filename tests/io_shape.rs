//! Every client's I/O shape: clients that negotiate no block sizes (python3-libnbd with
//! `set_request_block_size(False)`, strict mode off) read and write at any byte offset and
//! length, from several connections at once whose writes share edge sectors, on RAID5 and
//! RAID10, checked against a model (tests/py/byte_io.py); a 48 MiB write and read; then the
//! array's redundancy is consistent (`raidnbd check`).

use std::path::Path;
use std::process::Command;

use crate::util::*;

fn byte_io(level: &str, members: &[&str], extra_create: &[&str]) {
    require_libnbd_python();
    let dir = tempdir();
    let d = dir.path();
    let mut create = vec!["create", "--level", level, "--chunk", "64K", "--size", "32M"];
    create.extend_from_slice(extra_create);
    create.extend_from_slice(members);
    assert_ok(&raidnbd(d, &create));
    let served = Served::start(d, "bytes", &[], members);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/byte_io.py");
    let out = run_ok(Command::new(PYTHON).arg(script).arg(served.uri("bytes")).args(["7", "4", "150"]));
    assert!(out.contains("byte_io ok"), "{out}");
    served.stop();
    let check: serde_json::Value =
        serde_json::from_str(&assert_ok(&raidnbd(d, &[&["check", "--json"][..], members].concat()))).unwrap();
    assert_eq!(check["mismatch_cnt"], 0, "redundancy consistent after the byte writes: {check}");
}

#[test]
fn raid5_serves_bytes_at_any_offset_to_clients_that_negotiate_no_block_size() {
    byte_io("5", &["m0", "m1", "m2", "m3"], &[]);
}

#[test]
fn raid10_serves_bytes_at_any_offset_to_clients_that_negotiate_no_block_size() {
    byte_io("10", &["m0", "m1", "m2", "m3"], &[]);
}
