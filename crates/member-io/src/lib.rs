//! member-io: backends implementing [`raid_core::Member`] for files and block devices,
//! and wrappers that throttle or break any member.
//!
//! ```text
//!  open_member(path, &OpenOptions) ──► Arc<dyn Member>
//!     │ resolve_engine: --io / RAIDNBD_IO / cached io_uring probe (warn! + fallback)
//!     ├─► UringMember       ── requests ──► shared ring threads (eventfd doorbell, oneshots)
//!     ├─► ThreadPoolMember  ── jobs ──────► shared blocking pool (pread/pwrite)
//!     └─► InlineMember      ── pread/pwrite in the caller (auto for files on tmpfs/ramfs)
//!          all = FileMember<engine>: range/alignment checks, short-I/O loops, FUA,
//!                 discard/write_zeroes fallback chains, O_DIRECT (statx DIOALIGN) or buffered
//!
//!  NbdMember ── an NBD export elsewhere (nbd://, nbd+unix://), through nbd-client
//!
//!  Throttled<M> = Decorated<M, Throttle>   bandwidth / IOPS / latency token buckets
//!                                           (cloud-volume emulation)
//!  Faulty<M> = Decorated<M, FaultGate>     EIO after N ops, in ranges or at random (seeded);
//!                                           delays; switched at run time (Arc<FaultControl>)
//!  (raid-core's decorator forwards every Member method; these only decide what to wait or fail)
//! ```
//!
//! Buffers are owned (`AlignedBuf`) and travel with each request, so dropping a member
//! future at any point never leaves the kernel or a worker touching freed memory.
//! Member operations return `std::io::Error`; opening and configuration return
//! [`MemberIoError`].

mod dio_align;
mod error;
mod factory;
mod fault;
mod file_allocation;
mod file_member;
mod file_ops;
mod inline;
mod link_stats;
mod member_file;
mod memory_fs;
mod nbd_member;
mod options;
mod probe;
mod sync_ops;
mod threads;
mod throttle;
mod uring;

pub use error::{MemberIoError, Result};
pub use factory::{engine_for, open_member, resolve_engine};
pub use fault::{FaultControl, FaultGate, FaultOps, Faulty};
pub use file_member::{InlineMember, ThreadPoolMember, UringMember};
pub use link_stats::{LinkError, LinkErrorKind, LinkState, LinkStats};
pub use member_file::create_sparse_file;
pub use nbd_member::{MAX_VIOLATIONS, NbdMember, VIOLATION_WINDOW};
pub use options::{DirectMode, EngineKind, IO_ENGINE_ENV, IoEngine, OpenOptions};
pub use probe::{UringUnavailable, uring_probe};
pub use throttle::{DEFAULT_BURST, IOPS_UNIT_BYTES, SharedThrottle, Throttle, ThrottleConfig, Throttled, io_cost};
pub use uring::driver::{UringConfig, UringDriver};
