//! The io_uring → thread-pool fallback, forced three ways:
//! - a seccomp filter making io_uring_setup fail with EPERM (child process, like Docker's
//!   default profile): the cached probe reports EPERM, `Auto` logs the reason and the fix
//!   and serves I/O from the thread pool, `Uring` fails with a typed error;
//! - the `RAIDNBD_IO=threads` environment variable (child process, so the parent's
//!   environment stays untouched);
//! - the explicit `IoEngine::Threads` option.

use std::path::Path;
use std::sync::Arc;

use member_io::{
    DirectMode, EngineKind, IO_ENGINE_ENV, IoEngine, MemberIoError, OpenOptions, open_member, resolve_engine,
    uring_probe,
};
use raid_core::Member;

use crate::util::{CHILD_ENV, pattern, run_child, scratch_dir, sparse_file};
use raid_core::conformance::{read, write};

fn init_logging_to_stderr() {
    let _ = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).try_init();
}

/// Installs a seccomp filter on every thread of this process: io_uring_setup → EPERM.
fn block_io_uring_with_seccomp() {
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let insn = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut filter = [
        insn(ld, 0, 0, 4), // seccomp_data.arch
        insn(jeq, 1, 0, AUDIT_ARCH_X86_64),
        insn(ret, 0, 0, libc::SECCOMP_RET_ALLOW), // other arches: not our concern
        insn(ld, 0, 0, 0),                        // seccomp_data.nr
        insn(jeq, 0, 1, libc::SYS_io_uring_setup as u32),
        insn(ret, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        insn(ret, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
    // SAFETY: prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error());
    // SAFETY: `prog` points at `filter`, both alive for the call; TSYNC applies it to all threads.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const _,
        )
    };
    assert_eq!(rc, 0, "seccomp(SET_MODE_FILTER): {}", std::io::Error::last_os_error());
}

async fn round_trip(m: &dyn Member) {
    let data = pattern(77, 64 << 10);
    write(m, 4096, &data, true).await.unwrap();
    m.flush().await.unwrap();
    assert!(read(m, 4096, 64 << 10).await.unwrap() == data, "fallback round trip");
    m.discard(4096, 4096).await.unwrap();
    assert!(read(m, 4096, 4096).await.unwrap().iter().all(|&b| b == 0));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn child_seccomp(dir: &Path) {
    init_logging_to_stderr();
    block_io_uring_with_seccomp();
    let probe = uring_probe().expect_err("io_uring must be blocked by the filter");
    assert_eq!(probe.errno, Some(libc::EPERM), "{probe}");
    println!("CHILD probe: {probe}");
    assert_eq!(resolve_engine(IoEngine::Auto).unwrap(), EngineKind::Threads);
    let forced = resolve_engine(IoEngine::Uring).expect_err("--io uring must fail when io_uring is unavailable");
    assert!(matches!(forced, MemberIoError::UringUnavailable { .. }), "{forced}");
    let path = sparse_file(dir, "m", 1 << 20);
    let m = open_member(&path, &OpenOptions::default()).expect("Auto falls back to the thread pool");
    runtime().block_on(round_trip(&*m));
    let err = open_member(&path, &OpenOptions { engine: IoEngine::Uring, ..Default::default() }).map(drop).unwrap_err();
    println!("CHILD forced uring: {err}");
    println!("CHILD-OK engine=threads");
}

#[test]
fn seccomp_blocked_uring_falls_back_to_threads() {
    if std::env::var(CHILD_ENV).as_deref() == Ok("seccomp") {
        let dir = scratch_dir();
        child_seccomp(dir.path());
        return;
    }
    let out = run_child("fallback::seccomp_blocked_uring_falls_back_to_threads", &[(CHILD_ENV, "seccomp")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("CHILD-OK engine=threads"), "child did not finish:\n{stdout}");
    assert!(stdout.contains("io_uring_setup: Operation not permitted"), "probe result:\n{stdout}");
    // The logged reason names the errno and the fixes.
    let warn = stderr.lines().find(|l| l.contains("WARN") && l.contains("io_uring unavailable")).unwrap_or_else(|| {
        panic!("no fallback warning logged:\n{stderr}");
    });
    for needle in ["EPERM", "seccomp", "kernel.io_uring_disabled", "falling back to the thread-pool backend"] {
        assert!(warn.contains(needle), "warning lacks {needle:?}: {warn}");
    }
    assert_eq!(stderr.matches("io_uring unavailable").count(), 1, "the warning is logged once:\n{stderr}");
    assert!(stdout.contains("io_uring requested but unavailable"), "forced uring error:\n{stdout}");
}

fn child_env_threads(dir: &Path) {
    init_logging_to_stderr();
    assert_eq!(std::env::var(IO_ENGINE_ENV).as_deref(), Ok("threads"));
    assert_eq!(resolve_engine(IoEngine::Auto).unwrap(), EngineKind::Threads, "env forces threads under Auto");
    // An explicit option wins over the environment.
    if uring_probe().is_ok() {
        assert_eq!(resolve_engine(IoEngine::Uring).unwrap(), EngineKind::Uring);
    }
    let path = sparse_file(dir, "m", 1 << 20);
    let m = open_member(&path, &OpenOptions::default()).unwrap();
    runtime().block_on(round_trip(&*m));
    println!("CHILD-OK env");
}

#[test]
fn env_var_forces_threads() {
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("env") => {
            let dir = scratch_dir();
            child_env_threads(dir.path());
            return;
        }
        Ok("env-bogus") => {
            let err = resolve_engine(IoEngine::Auto).unwrap_err();
            assert!(matches!(err, MemberIoError::InvalidOption(_)), "{err}");
            println!("CHILD-OK bogus: {err}");
            return;
        }
        _ => {}
    }
    let out = run_child("fallback::env_var_forces_threads", &[(CHILD_ENV, "env"), (IO_ENGINE_ENV, "threads")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("CHILD-OK env"), "child failed\n{stdout}\n{stderr}");
    assert!(stderr.contains("engine=thread pool"), "the factory logs its choice:\n{stderr}");
    assert!(!stderr.contains("io_uring unavailable"), "forcing threads is not a fallback:\n{stderr}");

    let out = run_child("fallback::env_var_forces_threads", &[(CHILD_ENV, "env-bogus"), (IO_ENGINE_ENV, "epoll")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("CHILD-OK bogus"), "bogus env child\n{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn option_forces_threads() {
    assert_eq!(resolve_engine(IoEngine::Threads).unwrap(), EngineKind::Threads);
    let dir = scratch_dir();
    let path = sparse_file(dir.path(), "m", 1 << 20);
    let opts = OpenOptions { engine: "threads".parse().unwrap(), direct: DirectMode::On, read_only: false };
    let m: Arc<dyn Member> = open_member(&path, &opts).unwrap();
    round_trip(&*m).await;
}
