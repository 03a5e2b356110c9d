//! The single entry point: `open_member(path, &OpenOptions) -> Arc<dyn Member>`.
//!
//! ```text
//!  OpenOptions.engine ─ Auto ─► RAIDNBD_IO set? ─► that engine
//!                     │                  └─ no ─► regular file on tmpfs/ramfs? ─ yes ─► inline
//!                     │                                      └─ no ─► cached uring_probe() ─ ok ─► io_uring
//!                     │                                             └─ err ─► warn!(errno, fix) ─► thread pool
//!                     ├ Uring ─► cached probe ─ err ─► MemberIoError::UringUnavailable
//!                     ├ Threads ─► thread pool (io_uring never touched)
//!                     └ Inline ─► syscalls in the caller
//! ```
//!
//! Modelled on cloud-hypervisor `block/src/factory.rs`: one place decides the backend, the
//! probe is cached, the decision is logged, and the fallback can be forced.

use std::path::Path;
use std::sync::{Arc, Once};

use raid_core::Member;

use crate::error::{MemberIoError, Result};
use crate::file_member::{InlineMember, ThreadPoolMember, UringMember};
use crate::memory_fs::is_memory_backed;
use crate::options::{DirectMode, EngineKind, IoEngine, OpenOptions};
use crate::probe::{UringUnavailable, uring_probe};

/// Decides which engine `requested` means in this process for a member that is not in
/// memory (env override, cached probe). With `Auto`, a failed probe logs one warning
/// naming the errno and the fix.
pub fn resolve_engine(requested: IoEngine) -> Result<EngineKind> {
    let requested = match requested {
        IoEngine::Auto => IoEngine::from_env()?.unwrap_or(IoEngine::Auto),
        explicit => explicit,
    };
    match requested {
        IoEngine::Threads => Ok(EngineKind::Threads),
        IoEngine::Inline => Ok(EngineKind::Inline),
        IoEngine::Uring => match uring_probe() {
            Ok(()) => Ok(EngineKind::Uring),
            Err(e) => Err(MemberIoError::UringUnavailable { reason: e.to_string() }),
        },
        IoEngine::Auto => match uring_probe() {
            Ok(()) => Ok(EngineKind::Uring),
            Err(e) => {
                warn_fallback_once(e);
                Ok(EngineKind::Threads)
            }
        },
    }
}

fn warn_fallback_once(e: &UringUnavailable) {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            errno = %e.errno_name(),
            "io_uring unavailable ({}); falling back to the thread-pool backend (pread/pwrite). Fix: {}",
            e.reason,
            e.advice()
        );
    });
}

/// The engine `open_member` starts `path` on: under `Auto` (and no `RAIDNBD_IO`), inline for
/// a regular file in memory, otherwise what `resolve_engine` decides. (If io_uring's
/// thread cannot start, `open_member` still falls back to the thread pool and logs it.)
pub fn engine_for(path: &Path, options: &OpenOptions) -> Result<EngineKind> {
    choose_engine(options, is_memory_backed(path))
}

fn choose_engine(options: &OpenOptions, in_memory: bool) -> Result<EngineKind> {
    let requested = match options.engine {
        IoEngine::Auto => IoEngine::from_env()?.unwrap_or(IoEngine::Auto),
        explicit => explicit,
    };
    if requested == IoEngine::Auto && in_memory { Ok(EngineKind::Inline) } else { resolve_engine(requested) }
}

/// Opens one member (regular file or block device) on the engine `options` select.
///
/// A file in memory (tmpfs, ramfs) is opened buffered under `DirectMode::Auto`: O_DIRECT
/// there bypasses nothing (its pages are the storage), and buffered I/O has no alignment
/// rule, so the inline engine can write a client's bytes where they lie.
pub fn open_member(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Arc<dyn Member>> {
    let path = path.as_ref();
    let in_memory = is_memory_backed(path);
    let mut engine = choose_engine(options, in_memory)?;
    let options = &OpenOptions {
        direct: if in_memory && options.direct == DirectMode::Auto { DirectMode::Off } else { options.direct },
        ..options.clone()
    };
    let member: Arc<dyn Member> = match engine {
        EngineKind::Uring => match UringMember::open(path, options.direct, options.read_only) {
            Ok(m) => Arc::new(m),
            Err(MemberIoError::RingSetup { source }) if options.engine == IoEngine::Auto => {
                tracing::warn!(
                    "cannot start the io_uring thread ({source}); falling back to the thread pool. \
                     Fix: raise LimitMEMLOCK or pass --io threads"
                );
                engine = EngineKind::Threads;
                Arc::new(ThreadPoolMember::open(path, options.direct, options.read_only)?)
            }
            Err(e) => return Err(e),
        },
        EngineKind::Threads => Arc::new(ThreadPoolMember::open(path, options.direct, options.read_only)?),
        EngineKind::Inline => Arc::new(InlineMember::open(path, options.direct, options.read_only)?),
    };
    tracing::info!(
        member = %path.display(),
        engine = %engine,
        len_bytes = member.len_bytes(),
        alignment = member.alignment(),
        read_only = options.read_only,
        "member opened"
    );
    Ok(member)
}
