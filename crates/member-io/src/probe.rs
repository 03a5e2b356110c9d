//! Cached io_uring availability probe and the advice logged when it fails.
//!
//! The probe builds a 4-entry ring and checks the opcodes the backend uses (Read, Write,
//! ReadFixed, WriteFixed, Fsync, Fallocate: Linux 5.6+). The answer is computed once per
//! process (`OnceLock`), like cloud-hypervisor's `block_io_uring_is_supported` and monoio's
//! `uring_detect`. Typical failures:
//!
//! | errno  | cause                                                    | fix                                            |
//! |--------|----------------------------------------------------------|------------------------------------------------|
//! | EPERM  | seccomp profile (Docker default) or `kernel.io_uring_disabled` = 1/2 | allow io_uring_* syscalls / set the sysctl to 0 |
//! | ENOSYS | kernel without CONFIG_IO_URING, or a sandbox returning ENOSYS | same, or a newer kernel                         |
//! | ENOMEM | RLIMIT_MEMLOCK too low for the ring (kernels < 5.12)     | systemd `LimitMEMLOCK=`, `ulimit -l`           |

use std::fmt;
use std::sync::OnceLock;

use io_uring::{IoUring, Probe, opcode};

/// Why io_uring cannot be used in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringUnavailable {
    /// The errno of the failing step, if it was a syscall.
    pub errno: Option<i32>,
    /// What failed, e.g. "io_uring_setup: Operation not permitted (os error 1)".
    pub reason: String,
}

impl UringUnavailable {
    /// `EPERM`, `ENOSYS`, ... for logs.
    pub fn errno_name(&self) -> String {
        match self.errno {
            Some(libc::EPERM) => "EPERM".into(),
            Some(libc::ENOSYS) => "ENOSYS".into(),
            Some(libc::ENOMEM) => "ENOMEM".into(),
            Some(libc::EINVAL) => "EINVAL".into(),
            Some(libc::EACCES) => "EACCES".into(),
            Some(n) => format!("errno {n}"),
            None => "no errno".into(),
        }
    }

    /// The operator's fix for this failure.
    pub fn advice(&self) -> &'static str {
        match self.errno {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                "allow io_uring_setup/io_uring_enter/io_uring_register in the seccomp profile (Docker/Podman: \
                 --security-opt seccomp=<profile>), or set sysctl kernel.io_uring_disabled=0 (or add the user \
                 to kernel.io_uring_group)"
            }
            Some(libc::ENOSYS) => {
                "the kernel lacks io_uring (CONFIG_IO_URING) or a sandbox/seccomp profile returns ENOSYS; allow the \
                 io_uring_* syscalls or run a Linux 5.6+ kernel with io_uring"
            }
            Some(libc::ENOMEM) => "raise the locked-memory limit: systemd LimitMEMLOCK= (or ulimit -l)",
            _ => "run a Linux 5.6+ kernel with io_uring enabled, or pass --io threads to choose the thread pool",
        }
    }
}

impl fmt::Display for UringUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]; fix: {}", self.reason, self.errno_name(), self.advice())
    }
}

/// Whether io_uring works here, computed once per process.
pub fn uring_probe() -> Result<(), &'static UringUnavailable> {
    static PROBE: OnceLock<Result<(), UringUnavailable>> = OnceLock::new();
    PROBE.get_or_init(probe_uncached).as_ref().copied()
}

fn probe_uncached() -> Result<(), UringUnavailable> {
    let ring = IoUring::new(4)
        .map_err(|e| UringUnavailable { errno: e.raw_os_error(), reason: format!("io_uring_setup: {e}") })?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| UringUnavailable { errno: e.raw_os_error(), reason: format!("io_uring_register(PROBE): {e}") })?;
    let needed = [
        ("Read", opcode::Read::CODE),
        ("Write", opcode::Write::CODE),
        ("ReadFixed", opcode::ReadFixed::CODE),
        ("WriteFixed", opcode::WriteFixed::CODE),
        ("Fsync", opcode::Fsync::CODE),
        ("Fallocate", opcode::Fallocate::CODE),
    ];
    let missing: Vec<&str> = needed.iter().filter(|(_, code)| !probe.is_supported(*code)).map(|(n, _)| *n).collect();
    if !missing.is_empty() {
        return Err(UringUnavailable { errno: None, reason: format!("kernel lacks io_uring opcodes {missing:?}") });
    }
    Ok(())
}
