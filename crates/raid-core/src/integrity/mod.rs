//! Per-block checksums of a member (`create --integrity crc32c`): silent corruption found
//! on read.
//!
//! ```text
//!   member device:  │ superblock, bitmap … │ md data area ............ │ header │ checksum table │
//!                   0                      data_offset        data end ▲ (4 KiB)  4 bytes per 4 KiB
//!                                                           area start ┘  of every block before the area
//! ```
//!
//! The area lies past md's data area (`data_offset + data_size`), where md never looks: mdadm
//! and the kernel assemble the array and ignore it. [`IntegrityMember`] wraps a member whose
//! area it finds and keeps the table in memory (1/1024 of the member):
//! - every read of the data area is verified, 4 KiB at a time; a block whose bytes do not
//!   match fails the read with a [`Corruption`] (`io::ErrorKind::InvalidData`) naming the
//!   blocks. The engine reads around it and heals it from redundancy (`engine/heal.rs`);
//! - every write stamps its blocks when it completes; the table pages it changed are written
//!   (and flushed) before the next superblock write (clean, a rebuild checkpoint, ...) and
//!   before the next write to md's bitmap (so before a bit of the region can be cleared), not
//!   at every flush: a client's FLUSH costs no table write;
//! - crash consistency follows md's: after an unclean stop, the blocks md will resync (dirty
//!   bitmap chunks, or everything without a bitmap) are *untrusted*: read without
//!   verification and stamped from what is read (a resync reads every one), never reported
//!   as corruption. The same for everything when md (or anything else) wrote the superblocks
//!   since raidnbd last did: the header keeps the event count of the last superblock written
//!   through it, and a `check` stamps the array again (the header is rewritten, at a flush,
//!   only once no block is untrusted).
//!
//! A stamp is `crc32c(block) ^ crc32c(zero block)`, so a table of zeros (a sparse file)
//! matches blocks of zeros: a new member needs no table written.

mod area;
mod block_locks;
mod corruption;
mod member;
mod on_disk;
mod table;

pub use area::{ALGORITHM_CRC32C, BLOCK_BYTES, Header, IntegrityArea, reserve_bytes};
pub use corruption::{Corruption, corruption_of};
pub use member::{IntegrityMember, IntegrityReport};
pub use on_disk::{area_with_room, format};
pub use table::stamp;
