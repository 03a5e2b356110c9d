//! A restart of raidnbd is not an outage for a client that reconnects: qemu's NBD client
//! with `reconnect-delay` keeps writing and reading through a SIGTERM and a new `serve` on
//! the same port; no request fails and every byte is right.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

const STEPS: u32 = 40;

fn serve_on(d: &std::path::Path, port: u16) -> Served {
    Served::run_on(d, port, |listen| {
        ["serve", "--listen", listen, "--export", "r", "m0", "m1", "m2"].iter().map(|s| s.to_string()).collect()
    })
}

#[test]
fn qemu_with_reconnect_delay_rides_through_a_restart_of_raidnbd() {
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "64M", "m0", "m1", "m2"]));
    let port = free_port();
    let served = serve_on(d, port);
    let opts =
        format!("driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export=r,reconnect-delay=60");
    // 1 MiB written and read back every 250 ms for 10 s, on one connection.
    let mut io = Command::new("qemu-io");
    io.args(["--image-opts", &opts]);
    for i in 0..STEPS {
        let pattern = i % 250 + 1;
        io.args(["-c", &format!("write -P {pattern} {i}M 1M"), "-c", &format!("read -P {pattern} {i}M 1M")]);
        io.args(["-c", "sleep 250"]);
    }
    let client = io.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("qemu-io");
    std::thread::sleep(Duration::from_secs(3));
    let log = served.stop();
    assert!(!log.contains("panicked"), "{log}");
    std::thread::sleep(Duration::from_millis(500));
    let served = serve_on(d, port);
    let out = client.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "qemu-io: {stdout}\n{stderr}");
    for bad in ["error", "failed", "Pattern verification failed"] {
        assert!(!stdout.contains(bad) && !stderr.contains(bad), "qemu-io saw {bad:?}:\n{stdout}\n{stderr}");
    }
    assert_eq!(stdout.matches("wrote 1048576/1048576").count(), STEPS as usize, "{stdout}");
    assert_eq!(stdout.matches("read 1048576/1048576").count(), STEPS as usize, "{stdout}");
    // The new server holds every write (a fresh client reads them all back).
    let mut check = Command::new("qemu-io");
    check.args(["-f", "raw", &served.uri("r")]);
    for i in 0..STEPS {
        check.args(["-c", &format!("read -P {} {i}M 1M", i % 250 + 1)]);
    }
    let text = run_ok(&mut check);
    assert!(!text.contains("failed"), "{text}");
    served.stop();
    assert_ok(&raidnbd(d, &["check", "m0", "m1", "m2"]));
}
