//! Drives the python3-libnbd conformance scripts in tests/py/, each against its own server.

use std::path::PathBuf;
use std::process::Command;

use crate::util::{TestServer, require_tool, run_ok};

/// Runs `tests/py/<script>` with /usr/bin/python3 against a fresh standard server and
/// checks it reported at least one passed and no failed check.
fn run_script(script: &str) {
    let python = require_tool("/usr/bin/python3", "python3");
    let probe = Command::new(&python).args(["-c", "import nbd"]).output().expect("run python3");
    assert!(probe.status.success(), "python module `nbd` missing: apt-get install python3-libnbd");
    let server = TestServer::standard();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py");
    let output =
        run_ok(Command::new(&python).arg(dir.join(script)).arg(server.port().to_string()).env("PYTHONPATH", &dir));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout.lines().last().unwrap_or_default();
    let (passed, failed) = summary
        .strip_suffix(" failed")
        .and_then(|s| s.split_once(" passed, "))
        .and_then(|(p, f)| Some((p.parse::<u32>().ok()?, f.parse::<u32>().ok()?)))
        .unwrap_or_else(|| panic!("no summary line in output of {script}: {summary:?}"));
    assert!(passed > 0 && failed == 0, "{script}: {passed} passed, {failed} failed");
    server.stop();
}

#[test]
fn libnbd_handshake_variants() {
    run_script("handshake.py");
}

#[test]
fn libnbd_every_command_and_flag() {
    run_script("commands.py");
}

#[test]
fn libnbd_every_error_path() {
    run_script("errors.py");
}

#[test]
fn libnbd_pipelining() {
    run_script("pipelining.py");
}

#[test]
fn libnbd_multi_conn_consistency() {
    run_script("multiconn.py");
}
