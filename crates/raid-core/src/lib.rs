//! raid-core: the pure heart of raidnbd.
//!
//! Linux md compatible RAID, with no runtime, sockets or io_uring in sight:
//!
//! ```text
//!  geometry   where each array sector lives (linear, 0, 1, 4, 5, 6, 10; md layouts)
//!  parity     XOR P, GF(2^8) Q, recovery of one or two lost blocks (lib/raid6 math)
//!  md         v1.2 superblock encode/decode, default data offset, assembly planning,
//!             the metadata store and start-up (md::start: assembly -> running Array)
//!  engine     Array<M: Member>: turns block requests into member I/O, degraded mode,
//!             per-stripe locking, RMW vs reconstruct-write
//!  volume     the Volume trait an array and the layers stacked on it (write cache) serve
//!  read_data  ReadData, what a volume read returns (member buffers, no copy); FileExtent
//!  write_cache  the write-back cache, a Volume over an Array
//!  member     the async member I/O trait backends implement; MemoryMember
//!  conformance  (feature `testing`) the suite every Member implementation must pass
//!  decorator  Decorated<M, D>: one forwarding of every Member method for wrappers
//!             (throttle, fault injection, metrics) that only add hooks
//!  bad_ranges BadRanges: sorted sector ranges (bad blocks of a member)
//!  buf        AlignedBuf, the owned page-aligned buffer every member I/O carries
//!  payload    Payload, a client write borrowed or shared (Bytes) on its way to the members
//! ```
//!
//! Dependencies point one way: backends (member-io) implement [`member::Member`]; the
//! binary drives [`engine::Array`]; nothing here knows about NBD. Inside, `engine` implements
//! `volume`, which uses `read_data`, which uses neither.

pub mod allocation;
pub mod bad_ranges;
pub mod buf;
#[cfg(feature = "testing")]
pub mod conformance;
pub mod copy_count;
pub mod decorator;
pub mod engine;
pub mod error;
pub mod geometry;
pub mod integrity;
pub mod journal;
pub mod md;
pub mod member;
pub mod parity;
pub mod payload;
pub mod ppl;
pub mod read_data;
pub mod volume;
pub mod write_cache;

pub use allocation::Allocation;
pub use buf::AlignedBuf;
pub use error::{ErrorKind, RaidError};
pub use member::{Member, MemoryMember};
pub use volume::Volume;

/// Bytes per sector, the unit of every md field.
pub const SECTOR_BYTES: u64 = 512;
