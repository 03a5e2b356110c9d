//! Building an array from fresh members and serving it with this very binary.
//!
//! The bench runs `raidnbd create` and `raidnbd serve` as child processes of
//! `std::env::current_exe()`, on a free 127.0.0.1 port: the same binary, code path and
//! flags users run, not an in-process shortcut. Members are sparse files in a fresh
//! directory (removed afterwards unless `--keep`) or the `--devices` given.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use super::plan::{ArraySpec, REMOTE_THREADS, RemoteMembers, RemoteServer};
use crate::shared_args::{CacheMode, MemberIoArgs};

/// Export name the bench serves.
pub const EXPORT: &str = "bench";

/// How long a server may take to flush and stop (a full write-back cache of random 4 KiB
/// writes on 200-IOPS members needs minutes).
const STOP_LIMIT: Duration = Duration::from_secs(3600);

/// The directory holding member files and logs; removed on drop unless kept.
pub struct Workspace {
    pub root: PathBuf,
    keep: bool,
}

impl Workspace {
    /// Makes `raidnbd-bench-PID-TIME` inside `parent` (default /var/tmp, else the current directory).
    pub fn new(parent: Option<&Path>, keep: bool) -> Result<Self> {
        let parent = match parent {
            Some(p) => p.to_path_buf(),
            None if Path::new("/var/tmp").is_dir() => PathBuf::from("/var/tmp"),
            None => std::env::current_dir().context("cannot find the current directory")?,
        };
        let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let root = parent.join(format!("raidnbd-bench-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
        Ok(Self { root, keep })
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The members of one array; temporary files are deleted on drop unless kept, nbdkit
/// servers of remote members are stopped.
pub struct Members {
    /// What `create` and `serve` are given: paths, or nbd:// URIs of remote members.
    pub paths: Vec<String>,
    /// Array size as `create` reported it.
    pub array_bytes: Option<u64>,
    files: Vec<PathBuf>,
    files_dir: Option<PathBuf>,
    peers: Vec<Child>,
    keep: bool,
}

impl Drop for Members {
    fn drop(&mut self) {
        for peer in &mut self.peers {
            // nbdkit ignores SIGTERM while a client is connected.
            let _ = peer.kill();
            let _ = peer.wait();
        }
        if let Some(dir) = &self.files_dir
            && !self.keep
        {
            // The array's own directory: member files, member servers' logs and state.
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the raidnbd executable")
}

/// Serves `file` on a free 127.0.0.1 port as `remote` asks; returns the server and the
/// member URI.
fn start_member_server(file: &Path, remote: &RemoteMembers, log: &Path) -> Result<(Child, String)> {
    match remote.server {
        RemoteServer::Nbdkit => start_nbdkit(file, remote, log),
        RemoteServer::Raidnbd => start_raidnbd_member(file, remote, log),
    }
}

/// Serves `file` with `raidnbd serve` (a one-member linear array of it), throttled by its
/// token buckets.
fn start_raidnbd_member(file: &Path, remote: &RemoteMembers, log: &Path) -> Result<(Child, String)> {
    let path = file.to_string_lossy().into_owned();
    let create = ["create", "--level", "linear", "--name", "member", path.as_str()];
    let out = Command::new(exe()?).args(create).env("RUST_LOG", "warn").stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("raidnbd {} failed: {}", create.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    let port = free_port()?;
    let mut args =
        vec!["serve".into(), "--listen".into(), format!("127.0.0.1:{port}"), "--export".into(), "member".into()];
    if let Some(bw) = remote.bytes_per_sec {
        args.extend(["--member-bw".into(), bw.to_string()]);
    }
    if let Some(iops) = remote.iops {
        args.extend(["--member-iops".into(), iops.to_string()]);
    }
    args.push(path);
    let mut cmd = Command::new(exe()?);
    cmd.args(&args).env("RUST_LOG", "warn").env("STATE_DIRECTORY", file.with_extension("state"));
    let what = format!("raidnbd {}", args.join(" "));
    spawn_listening(cmd, port, log, &what, "cannot run raidnbd serve for a remote member")
}

/// Runs the server `cmd` (stdin and stdout closed, stderr to `log`) until it listens on
/// `port`; fails with its log if it exits or takes 20 s. Returns it and its NBD URI.
fn spawn_listening(mut cmd: Command, port: u16, log: &Path, what: &str, cannot_run: &str) -> Result<(Child, String)> {
    let log_file = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log_file).spawn().context(cannot_run.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited ({status}): {}", std::fs::read_to_string(log).unwrap_or_default().trim());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("{what} did not listen within 20s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((child, format!("nbd://127.0.0.1:{port}/")))
}

/// Serves `file` with `nbdkit file` on a free 127.0.0.1 port, with the rate and delay
/// filters `remote` asks for; returns the child and the member URI.
fn start_nbdkit(file: &Path, remote: &RemoteMembers, log: &Path) -> Result<(Child, String)> {
    let port = free_port()?;
    let mut args: Vec<String> = vec!["-f".into(), "-i".into(), "127.0.0.1".into(), "-p".into(), port.to_string()];
    if remote.iops.is_some() {
        args.extend(["-t".into(), REMOTE_THREADS.to_string()]);
    }
    let delay = remote.request_delay();
    if remote.bytes_per_sec.is_some() {
        args.push("--filter=rate".into());
    }
    if !delay.is_zero() {
        args.push("--filter=delay".into());
    }
    args.extend(["file".into(), file.to_string_lossy().into_owned()]);
    if let Some(bw) = remote.bytes_per_sec {
        args.push(format!("rate={}", bw * 8));
    }
    if !delay.is_zero() {
        let ms = delay.as_secs_f64() * 1e3;
        args.extend([format!("rdelay={ms:.3}ms"), format!("wdelay={ms:.3}ms")]);
    }
    let mut cmd = Command::new("nbdkit");
    cmd.args(&args);
    let what = format!("nbdkit {}", args.join(" "));
    spawn_listening(cmd, port, log, &what, "cannot run nbdkit (--remote-members needs it: apt install nbdkit)")
}

/// Creates `array` on fresh members: sparse files under `workspace` (served by nbdkit when
/// `remote`), or `devices`.
pub fn create_array(
    array: &ArraySpec,
    workspace: &Workspace,
    plan: &super::plan::Plan,
    remote: Option<&RemoteMembers>,
) -> Result<Members> {
    let (devices, member_bytes, keep) = (&plan.devices, plan.member_bytes, plan.keep);
    let mut args: Vec<String> = vec!["create".into()];
    args.extend(array.create_args());
    use raid_core::geometry::Level;
    let journal = plan.consistency_policy.as_deref() == Some("journal")
        && matches!(array.level, Some(Level::Raid4 | Level::Raid5 | Level::Raid6));
    match (&plan.consistency_policy, array.level) {
        _ if journal => {}
        (Some(policy), Some(Level::Raid5)) if policy != "journal" => {
            args.extend(["--consistency-policy".into(), policy.clone()]);
        }
        _ => {}
    }
    args.extend(["--name".into(), EXPORT.into()]);
    let mut members =
        Members { paths: Vec::new(), array_bytes: None, files: Vec::new(), files_dir: None, peers: Vec::new(), keep };
    if devices.is_empty() {
        let dir = workspace.root.join(array.id());
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        members.files = (0..array.members).map(|i| dir.join(format!("member{i}.img"))).collect();
        members.files_dir = Some(dir);
        for p in &members.files {
            let _ = std::fs::remove_file(p);
        }
        match remote {
            Some(remote) => {
                for (i, file) in members.files.iter().enumerate() {
                    member_io::create_sparse_file(file, member_bytes)
                        .with_context(|| format!("cannot create {}", file.display()))?;
                    let log = file.with_file_name(format!("server{i}.log"));
                    let (child, uri) = start_member_server(file, remote, &log)?;
                    members.peers.push(child);
                    members.paths.push(uri);
                }
            }
            None => {
                members.paths = members.files.iter().map(|f| f.to_string_lossy().into_owned()).collect();
                args.extend(["--size".into(), member_bytes.to_string()]);
            }
        }
    } else {
        args.push("--force".into());
        members.paths = devices[..array.members].to_vec();
    }
    if journal {
        // The journal: one more file like the members, local: throttled like them with
        // --member-bw (a fifth volume), not with --remote-members (a local disk).
        let (Some(dir), true) = (&members.files_dir, devices.is_empty()) else {
            bail!("--consistency-policy journal is for arrays of member files (not --devices)");
        };
        let path = dir.join("journal.img").to_string_lossy().into_owned();
        let _ = std::fs::remove_file(&path);
        member_io::create_sparse_file(Path::new(&path), member_bytes)
            .with_context(|| format!("cannot create {path}"))?;
        members.files.push(PathBuf::from(&path));
        args.extend(["--write-journal".into(), path]);
    }
    args.extend(members.paths.iter().cloned());
    if let (true, Some(j)) = (journal, members.files.last()) {
        members.paths.push(j.to_string_lossy().into_owned()); // served with the members
    }
    let out = Command::new(exe()?)
        .args(&args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .context("cannot run raidnbd create")?;
    if !out.status.success() {
        bail!("raidnbd {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    members.array_bytes = reported_bytes(&String::from_utf8_lossy(&out.stdout));
    Ok(members)
}

/// The `(N bytes)` that `raidnbd create` prints.
fn reported_bytes(stdout: &str) -> Option<u64> {
    let end = stdout.find(" bytes)")?;
    let start = stdout[..end].rfind('(')? + 1;
    stdout[start..end].trim().parse().ok()
}

/// A serve attempt: running, or refused because a feature is not available yet.
pub enum Served {
    Running(ServedArray),
    Unavailable(String),
}

/// A `raidnbd serve` child process; killed on drop.
pub struct ServedArray {
    child: Child,
    pub port: u16,
    /// Where its metrics are (`--metrics`): what each run costs it (cost.rs).
    pub metrics_port: u16,
    pub log: PathBuf,
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

fn value_name<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value().map_or_else(String::new, |p| p.get_name().to_string())
}

/// The member I/O flags of `serve`, as given to the bench.
pub fn member_io_flags(io: &MemberIoArgs) -> Vec<String> {
    let mut flags = vec!["--io".to_string(), value_name(&io.io.unwrap_or_default())];
    if let Some(bw) = io.member_bw {
        flags.extend(["--member-bw".into(), bw.to_string()]);
    }
    if let Some(iops) = io.member_iops {
        flags.extend(["--member-iops".into(), iops.to_string()]);
    }
    if let Some(bw) = io.export_bw {
        flags.extend(["--export-bw".into(), bw.to_string()]);
    }
    if io.buffered {
        flags.push("--buffered".into());
    }
    flags
}

/// Starts `raidnbd serve` on `members` and waits until it accepts connections.
pub fn serve(
    members: &[String],
    cache: CacheMode,
    cache_bytes: Option<u64>,
    io: &MemberIoArgs,
    write_gather_us: Option<u64>,
    log: &Path,
) -> Result<Served> {
    let port = free_port()?;
    let metrics_port = free_port()?;
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--metrics".into(),
        format!("127.0.0.1:{metrics_port}"),
        "--export".into(),
        EXPORT.into(),
        "--cache".into(),
        value_name(&cache),
    ];
    if let Some(bytes) = cache_bytes.filter(|_| cache == CacheMode::Writeback) {
        args.extend(["--cache-size".into(), bytes.to_string()]);
    }
    args.extend(member_io_flags(io));
    if let Some(us) = write_gather_us {
        args.extend(["--write-gather-us".into(), us.to_string()]);
    }
    args.extend(members.iter().cloned());
    let log_file = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let child = Command::new(exe()?)
        .args(&args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .context("cannot start raidnbd serve")?;
    let mut served = ServedArray { child, port, metrics_port, log: log.to_path_buf() };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = served.child.try_wait().context("waiting for raidnbd serve")? {
            let text = served.log_text();
            let error = text.lines().rev().find(|l| l.contains("error")).unwrap_or("").trim().to_string();
            if error.contains("not available") {
                return Ok(Served::Unavailable(error.trim_start_matches("raidnbd: error: ").to_string()));
            }
            bail!("raidnbd {} exited ({status}) before serving: {}", args.join(" "), text.trim());
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(Served::Running(served));
        }
        if Instant::now() > deadline {
            bail!("raidnbd serve did not listen on 127.0.0.1:{port} within 60s; log:\n{}", served.log_text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl ServedArray {
    pub fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/{EXPORT}", self.port)
    }

    /// Whether the server process is still alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM (drain, flush, mark clean), then wait; errors if it exits badly. A write-back
    /// cache full of small random writes drains at the members' IOPS, which on throttled
    /// members takes minutes: the wait is long and says so.
    pub fn stop(mut self) -> Result<()> {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let started = Instant::now();
        let mut next_note = Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("raidnbd serve exited with {status}; log:\n{}", self.log_text());
                }
                return Ok(());
            }
            let waited = started.elapsed();
            if waited > STOP_LIMIT {
                bail!("raidnbd serve did not stop within {}s of SIGTERM", STOP_LIMIT.as_secs());
            }
            if waited > next_note {
                eprintln!("  waiting for raidnbd serve to flush and stop ({}s so far)", waited.as_secs());
                next_note += Duration::from_secs(30);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServedArray {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use member_io::IoEngine;

    #[test]
    fn reads_the_created_size() {
        let out = "created raid5 array 'bench': 4 members, 64K chunk, left-symmetric, size 3.0 GiB (3218866176 bytes), UUID x";
        assert_eq!(reported_bytes(out), Some(3218866176));
        assert_eq!(reported_bytes("nothing"), None);
    }

    #[test]
    fn passes_member_io_flags_through() {
        let io = MemberIoArgs {
            io: Some(IoEngine::Auto),
            member_bw: Some(20 << 20),
            member_iops: Some(200),
            export_bw: None,
            buffered: false,
            member_timeout: None,
        };
        assert_eq!(member_io_flags(&io), ["--io", "auto", "--member-bw", "20971520", "--member-iops", "200"]);
    }
}
