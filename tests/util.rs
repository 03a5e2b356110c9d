//! Helpers: run the binary, temporary member files, a served array on a free port.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_raidnbd");

/// Runs raidnbd with `args` in `dir`.
pub fn raidnbd(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN).args(args).current_dir(dir).env("RUST_LOG", "warn").output().expect("run raidnbd")
}

/// Asserts a failed run: exit status 2, one `raidnbd: error:` line containing `needle`,
/// and no panic.
#[track_caller]
pub fn assert_user_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "expected exit 2, got {:?}; stderr:\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("raidnbd: error:")).collect();
    assert_eq!(errors.len(), 1, "exactly one error line expected:\n{stderr}");
    assert!(errors[0].contains(needle), "error line {:?} should mention {needle:?}", errors[0]);
}

/// Asserts a command-line usage error (reported by the argument parser): exit 2, the
/// message mentions `needle`, no panic.
#[track_caller]
pub fn assert_usage_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "expected exit 2, got {:?}; stderr:\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.lines().next().is_some_and(|l| l.starts_with("error:") && l.contains(needle)), "{stderr}");
}

#[track_caller]
pub fn assert_ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "raidnbd failed ({:?}):\n{stderr}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("raidnbd-e2e").tempdir_in(std::env::temp_dir()).expect("tempdir")
}

/// A temporary directory on /dev/shm (tmpfs): member files there are files in memory.
pub fn shm_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("raidnbd-e2e").tempdir_in("/dev/shm").expect("a directory on /dev/shm")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Debian's python, which has python3-libnbd (`python3` on PATH may be another).
pub const PYTHON: &str = "/usr/bin/python3";

/// Fails naming the package unless Debian's python can import libnbd.
#[track_caller]
pub fn require_libnbd_python() {
    assert!(Path::new(PYTHON).exists(), "/usr/bin/python3 is required: apt-get install python3-libnbd");
    let ok = Command::new(PYTHON).args(["-c", "import nbd"]).status().is_ok_and(|s| s.success());
    assert!(ok, "python3 module nbd is required: apt-get install python3-libnbd");
}

/// Fails with the Debian package to install when `tool` is missing.
#[track_caller]
pub fn require_tool(tool: &str, package: &str) {
    let found =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false);
    assert!(found, "{tool} is required for this test: apt-get install {package} (deploy/test-all.sh does it)");
}

/// A `raidnbd serve` process, killed on drop.
pub struct Served {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Served {
    pub fn start(dir: &Path, export: &str, extra: &[&str], members: &[&str]) -> Served {
        Self::run(dir, |listen| {
            let mut args =
                vec!["serve".to_string(), "--listen".into(), listen.into(), "--export".into(), export.into()];
            args.extend(extra.iter().chain(members).map(|a| a.to_string()));
            args
        })
    }

    /// Runs `raidnbd ARGS` (ARGS from the listen address on a free port) until it listens.
    pub fn run(dir: &Path, args: impl FnOnce(&str) -> Vec<String>) -> Served {
        Self::run_on(dir, free_port(), args)
    }

    /// [`Served::run`] on `port` (a restart on the port clients know).
    pub fn run_on(dir: &Path, port: u16, args: impl FnOnce(&str) -> Vec<String>) -> Served {
        let log = dir.join(format!("serve-{port}.log"));
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(BIN)
            .args(args(&format!("127.0.0.1:{port}")))
            .current_dir(dir)
            .env("RUST_LOG", "info")
            // Away records in the test's directory, not /var/lib/raidnbd.
            .env("STATE_DIRECTORY", dir.join("state"))
            .stdout(log_file.try_clone().expect("log file"))
            .stderr(log_file)
            .spawn()
            .expect("spawn raidnbd serve");
        let served = Served { child, port, log };
        served.wait_listening();
        served
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("raidnbd serve did not listen on {}; log:\n{}", self.port, self.log_text());
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM and wait; returns the log.
    pub fn stop(mut self) -> String {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().expect("wait serve");
        let log = self.log_text();
        assert!(status.success(), "serve exited with {status:?}; log:\n{log}");
        log
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a client command may run before it counts as hung: the clients these tests
/// run finish in seconds, so a client still waiting after this has met a server that
/// stopped answering, and the test fails naming it instead of hanging the suite.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(300);

/// Runs a command to completion within [`CLIENT_DEADLINE`], capturing its output; past
/// the deadline it is killed and the test fails with what it printed so far.
#[track_caller]
pub fn output(cmd: &mut Command) -> Output {
    output_within(cmd, CLIENT_DEADLINE)
}

/// [`output`] with another deadline.
#[track_caller]
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    use std::sync::{Arc, Mutex};
    type Drained = (std::thread::JoinHandle<()>, Arc<Mutex<Vec<u8>>>);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // Each pipe is drained into a shared buffer, so a hung client's output so far can be
    // shown without waiting for the pipe to close (a child of the client may hold it open).
    let drain = |mut pipe: Box<dyn Read + Send>| -> Drained {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = bytes.clone();
        let reader = std::thread::spawn(move || {
            let mut piece = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut piece) {
                sink.lock().unwrap().extend_from_slice(&piece[..n]);
            }
        });
        (reader, bytes)
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let text = |(_, bytes): &Drained| String::from_utf8_lossy(&bytes.lock().unwrap()).into_owned();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for a client") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {limit:?} (killed): {}\n{}", text(&stdout), text(&stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let take = |(reader, bytes): Drained| {
        let _ = reader.join();
        std::mem::take(&mut *bytes.lock().unwrap())
    };
    Output { status, stdout: take(stdout), stderr: take(stderr) }
}

#[test]
fn a_client_past_its_deadline_fails_the_test_with_its_output() {
    let started = Instant::now();
    let hung = std::panic::catch_unwind(|| {
        output_within(Command::new("sh").args(["-c", "echo waiting; exec sleep 30"]), Duration::from_secs(1))
    });
    let message = hung.expect_err("a hung client must fail the test");
    let message = message.downcast_ref::<String>().expect("a formatted panic message");
    assert!(message.contains("still running after 1s") && message.contains("waiting"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "the hung client was killed, not waited for");
    assert!(output(&mut Command::new("true")).status.success());
}

/// Runs a command within [`CLIENT_DEADLINE`], asserting success; returns stdout.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// fio with crc32c verify headers, 16 KiB random writes at QD8 over `[offset, offset + size)`
/// of the export at `uri`: `args` add to it (`--do_verify=1` writes and verifies,
/// `--verify_only` checks what an earlier run wrote).
pub fn fio_verify(uri: &str, offset: &str, size: &str, args: &[&str]) -> Command {
    let mut fio = Command::new("fio");
    fio.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=16k",
        &format!("--offset={offset}"),
        &format!("--size={size}"),
        "--randseed=34",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--iodepth=8",
    ]);
    fio.args(args);
    fio
}

/// Asserts `got == want`, naming the differing byte ranges (at most 8, and whether `got`
/// holds zeros there) instead of printing both buffers.
#[track_caller]
pub fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for i in (0..got.len().min(want.len())).filter(|&i| got[i] != want[i]) {
        match ranges.last_mut() {
            Some((_, end)) if *end == i => *end = i + 1,
            _ => ranges.push((i, i + 1)),
        }
    }
    let shown: Vec<String> = ranges
        .iter()
        .take(8)
        .map(|&(s, e)| format!("{s}..{e} ({} bytes, zeros: {})", e - s, got[s..e].iter().all(|&b| b == 0)))
        .collect();
    panic!("{what}: {} vs {} bytes, {} differing ranges: {}", got.len(), want.len(), ranges.len(), shown.join(", "));
}
