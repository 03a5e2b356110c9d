//! Test helpers: scratch directories on the project filesystem, data patterns, a tmpfs
//! mount of bounded size, a loop block device, and small child-process plumbing.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use member_io::create_sparse_file;

/// A scratch dir on the disk holding the target dir (ext4 on the project machines), so
/// O_DIRECT really goes to a block device (unlike /tmp on tmpfs systems).
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("member-io-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir")
}

/// A new sparse file of `len_bytes` in `dir`.
pub fn sparse_file(dir: &Path, name: &str, len_bytes: u64) -> PathBuf {
    let path = dir.join(name);
    create_sparse_file(&path, len_bytes).expect("create sparse file");
    path
}

/// statfs magic of the filesystem holding `path`.
pub fn fs_magic(path: &Path) -> i64 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statfs is plain data; zeroed is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and out pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statfs {}: {}", path.display(), std::io::Error::last_os_error());
    st.f_type as i64
}

pub const EXT4_SUPER_MAGIC: i64 = 0xEF53;

/// Asserts io_uring works here (these tests need it; the fallback has its own tests).
pub fn require_uring() {
    if let Err(e) = member_io::uring_probe() {
        panic!("this test needs io_uring, which is unavailable here: {e}");
    }
}

/// Deterministic bytes for `(seed, len)`.
pub use raid_core::conformance::pattern;

/// A tmpfs of `size` mounted on a fresh directory; unmounted (lazily) on drop.
pub struct TmpfsMount {
    dir: tempfile::TempDir,
}

/// Mounts a `fstype` filesystem with `opts` on a fresh scratch directory.
fn mount_scratch(fstype: &str, opts: &str, why: &str) -> tempfile::TempDir {
    let dir = scratch_dir();
    let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
    let fs = CString::new(fstype).unwrap();
    let data = CString::new(opts).unwrap();
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe { libc::mount(fs.as_ptr(), target.as_ptr(), fs.as_ptr(), 0, data.as_ptr().cast()) };
    if rc != 0 {
        panic!(
            "cannot mount {fstype} ({opts}) on {} ({}); {why} needs root (CAP_SYS_ADMIN) to mount it",
            dir.path().display(),
            std::io::Error::last_os_error()
        );
    }
    dir
}

fn unmount(path: &Path) {
    let target = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
}

impl TmpfsMount {
    pub fn new(size: &str) -> Self {
        Self { dir: mount_scratch("tmpfs", &format!("size={size}"), "the ENOSPC test") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        unmount(self.dir.path());
    }
}

/// A ramfs (no O_DIRECT, no fallocate) on a fresh directory; unmounted on drop.
pub struct RamfsMount {
    dir: tempfile::TempDir,
}

impl RamfsMount {
    pub fn new() -> Self {
        Self { dir: mount_scratch("ramfs", "", "the no-fallocate test") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RamfsMount {
    fn drop(&mut self) {
        unmount(self.dir.path());
    }
}

/// A loop block device over a backing file; detached on drop.
pub struct LoopDevice {
    pub device: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopDevice {
    pub fn new(len_bytes: u64) -> Self {
        let dir = scratch_dir();
        let backing = sparse_file(dir.path(), "backing.img", len_bytes);
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&backing).output().unwrap_or_else(|e| {
            panic!("cannot run losetup ({e}); the block-device test needs losetup (Debian package mount) and root")
        });
        assert!(
            out.status.success(),
            "losetup --find --show failed (needs root and /dev/loop-control): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let device = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Self { device, _dir: dir }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Name of the environment variable that turns a test into a child-process body.
pub const CHILD_ENV: &str = "MEMBER_IO_TEST_CHILD";

/// Re-runs the single test `test_name` of this binary in a child with `env` set; returns the output.
pub fn run_child(test_name: &str, env: &[(&str, &str)]) -> std::process::Output {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"]).env_remove(member_io::IO_ENGINE_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run child test process")
}
