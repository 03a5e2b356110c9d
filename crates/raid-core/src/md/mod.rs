//! Linux md v1.2 on-disk metadata: the superblock, mdadm's placement defaults, the in-memory
//! array model, create and assembly planning (`md-format.md` §1).
//!
//! ```text
//!  member bytes 4096..8192 ──► Superblock::decode ──► Candidate ─┐
//!                                                                ├─► assemble() ─► Assembly { ArrayMetadata, roles → members }
//!  CreateParams (level, sizes, name) ──► create() ───────────────┼─► ArrayMetadata
//!                                                                │
//!  ArrayMetadata ── mark_faulty / bump_events / set_dirty ... ──► superblock_for(i) ─► Superblock::encode ─► 4096 bytes
//! ```
//!
//! Everything here is pure — it takes bytes and numbers and returns plans and bytes — except
//! two files at the seam to the engine: `store` ([`MdStore`], the engine's metadata store
//! that renders superblocks for each state change) and `start` ([`start()`]: reads the
//! superblock area and bitmap through the members and brings an [`Assembly`] up as a running
//! `engine::Array`). The superblock lives at byte 4096 of each member
//! ([`SUPERBLOCK_BYTE_OFFSET`], [`SUPERBLOCK_BYTES`] bytes).
//!
//! Compatibility stance: decode is as strict as the kernel and refuses what raidnbd does not
//! implement (reshape, journal, clustering, metadata 1.0/1.1); create writes what mdadm 4.6
//! would write (except: clean at create, see [`create()`]); assembly follows md's event-count rules.

mod assemble;
mod bad_block_log;
mod bitmap;
mod checksum;
mod create;
mod data_offset;
mod dev_role;
mod feature;
mod metadata;
mod reshape;
mod start;
mod store;
mod superblock;
mod uuid;

pub use crate::journal;
pub use crate::ppl;
pub use assemble::{Assembly, Candidate, assemble};
pub use bad_block_log::{decode_bad_blocks, encode_bad_blocks};
pub use bitmap::{BITMAP_STALE, Bitmap, DEFAULT_BITMAP_CHUNK_BYTES};
pub use checksum::{SB_CSUM_OFFSET, sb_checksum};
pub use create::{CreateParams, DEFAULT_CHUNK_SECTORS, create};
pub use data_offset::{
    BBLOG_SECTORS, BITMAP_OFFSET_SECTORS, BblogPlacement, bblog_with_space, bitmap_space_sectors,
    data_offset_with_space, default_bblog, default_data_offset_sectors, default_max_dev,
};
pub use dev_role::{DevRole, ROLE_FAULTY, ROLE_JOURNAL, ROLE_MAX, ROLE_SPARE};
pub use feature::FeatureMap;
pub use metadata::{ArrayMetadata, MemberMetadata};
pub use reshape::ReshapeState;
pub use start::{StartOptions, Started, read_superblock_area, start};
pub use store::MdStore;
pub use superblock::{
    DEVFLAG_FAILFAST, DEVFLAG_WRITE_MOSTLY, HEADER_BYTES, MAX_DEV, MD_SB_MAGIC, MIN_DATA_SIZE, RESYNC_CLEAN,
    SUPER_OFFSET_1_2, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES, Superblock, TIME_SECS_MASK, name_from_bytes,
    superblock_sectors,
};
pub use uuid::MdUuid;
