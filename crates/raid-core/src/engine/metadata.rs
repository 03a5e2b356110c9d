//! How the engine records state changes on disk.
//!
//! The engine does not know the superblock format: it hands a [`StateChange`] to a
//! [`MetadataStore`] (md v1.2: [`crate::md::MdStore`]), which updates its model and
//! returns the superblock images to write. The engine writes them (FUA) to every live
//! device, serialised so a newer image is never overwritten by an older one.
//!
//! Devices are named by a *device id* the engine and the store agree on (for md: the
//! index of the device's member record). New devices get the next id.
//!
//! Ordering guarantees the engine provides:
//! - `Dirty` is durable before the first data write after a clean state.
//! - `Faulty` is durable before any write that skipped that device is acknowledged
//!   (else a restart could trust the stale device).
//! - `Assign` is durable before the rebuild writes to the device; `RecoveryProgress`
//!   never runs ahead of what was rebuilt.
//! - A `BadBlocks` change that adds ranges is durable before anything relies on them; one
//!   that removes ranges is made only after the writes that made them right are durable.
//! - The images of one change are written to a device in the order returned (a bad-block
//!   log or bitmap before the superblock that points at it).

use crate::buf::AlignedBuf;
use crate::error::RaidError;

/// A change of array state that must reach the superblocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// Writes are about to start: parity/mirrors may disagree after a crash.
    Dirty,
    /// Orderly stop: everything is in sync.
    Clean,
    /// Orderly stop while the resync after an unclean stop had only reached `sectors`
    /// (md resync address space): below is in sync, the rest must be resynced.
    ResyncProgress { sectors: u64 },
    /// The device failed.
    Faulty { device: usize },
    /// A new device joins as a spare.
    AddSpare { device: usize, device_bytes: u64 },
    /// A spare takes `role` (rebuild from sector 0), or becomes its replacement.
    Assign { device: usize, role: usize, replacement: bool },
    /// Rebuild progress of a device (member sectors from the data offset).
    RecoveryProgress { device: usize, sectors: u64 },
    /// A device finished rebuilding and is in sync.
    InSync { device: usize },
    /// A replacement finished: `new` holds the role, `old` leaves the array.
    Replaced { old: usize, new: usize },
    /// The device leaves the array (it was faulty or a spare).
    Remove { device: usize },
    /// The write journal's tail moved (md: `journal_tail` of the journal device), in
    /// sectors from the start of its ring.
    JournalTail { sectors: u64 },
    /// Write-intent bitmap bits to set / clear (resync chunks); no new event count.
    Bitmap { set: Vec<u64>, clear: Vec<u64> },
    /// A reshape begins (md's `raid5_start_reshape`): the array has `raid_disks` roles from now
    /// (the devices of `new_roles`, `(device, role)`, take theirs in sync), the new layout and
    /// chunk, every device's data start moves by `offset_delta_sectors` (md's `new_offset`), and
    /// the front is at `position_sectors` (array sectors, md's `reshape_position`).
    ReshapeStart {
        raid_disks: usize,
        new_roles: Vec<(usize, usize)>,
        new_layout: u32,
        new_chunk_sectors: u32,
        offset_delta_sectors: i64,
        position_sectors: u64,
    },
    /// The reshape's front is at `position_sectors`: everything below it is in the new layout,
    /// durably (the member writes were flushed before).
    ReshapeProgress { position_sectors: u64 },
    /// The reshape finished: the new layout, chunk and data offsets are the array's; with
    /// `then_raid0` the raid4 (without its parity member) it was is a raid0 of the roles
    /// before the last, in the same update (md's raid0 grow, mdadm's level change after it).
    /// With `bitmap_chunk` the bitmap covers `resync_sectors` from now with bits of that many
    /// sectors (raid10, whose resync space is the array's size).
    ReshapeEnd { then_raid0: bool, resync_sectors: u64, bitmap_chunk: Option<u64> },
    /// The array's size changed (md's `--grow --size`): every device uses `used_sectors` from
    /// now (md's `size`), and `data_sectors` is the data area each `(device, sectors)` has as
    /// measured now (md's `data_size`). The bitmap, if any, covers `resync_sectors` with bits
    /// of `bitmap_chunk_sectors` (set bits kept in the bits covering them, those past the end
    /// dropped), and the bits `bitmap_dirty` (new space) set. `resync_offset`: where a resync
    /// of the new space starts (md's `recovery_cp`), when the superblocks must say so.
    Resize {
        used_sectors: u64,
        data_sectors: Vec<(usize, u64)>,
        resync_sectors: u64,
        bitmap_chunk_sectors: Option<u64>,
        bitmap_dirty: std::ops::Range<u64>,
        resync_offset: Option<u64>,
    },
    /// A linear array grew by appending devices: each `(device, role)` of `new_roles` is in
    /// sync in its new role, and the array has `raid_disks` roles.
    Append { raid_disks: usize, new_roles: Vec<(usize, usize)> },
    /// The level changed without moving data (md's takeover, engine/takeover.rs): the array
    /// is `level` with `layout`, `chunk_sectors` and `raid_disks` roles of `size_sectors`
    /// (md's `size`); with `data_size_is_size` every device's data area is that size (a
    /// raid0 of one zone). `dropped_device` served the role that went and becomes a spare.
    Takeover {
        level: crate::geometry::Level,
        layout: u32,
        chunk_sectors: u32,
        raid_disks: usize,
        size_sectors: u64,
        data_size_is_size: bool,
        dropped_device: Option<usize>,
    },
    /// The device's bad blocks are now `ranges` (member sectors from the data offset, as
    /// `(start, len)`): md's bad-block log. A store without room for them refuses.
    BadBlocks { device: usize, ranges: Vec<(u64, u64)> },
}

/// One superblock image to write to a device.
pub struct SuperblockWrite {
    pub device: usize,
    pub offset_bytes: u64,
    pub image: AlignedBuf,
}

/// What the metadata says about the array, for decisions outside the engine (re-add).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataSummary {
    pub uuid: [u8; 16],
    pub events: u64,
    /// Sectors free before the data on every device (where a reshape can move the data
    /// start: md's `new_offset`); `None` when the store does not know.
    pub headroom_sectors: Option<u64>,
    /// The smallest data area of the devices (md's `data_size`): a reshape that removes
    /// members moves the data start up into what lies past the used part; `None` when the
    /// store does not know.
    pub data_area_sectors: Option<u64>,
    /// The bitmap's events_cleared: a returning member whose events are at least this only
    /// needs the chunks dirty in the bitmap copied (md's re-add).
    pub bitmap_events_cleared: Option<u64>,
    /// Bits the space reserved for the bitmap holds (a resize takes larger bitmap chunks
    /// when the array outgrows it); `None` without a bitmap.
    pub bitmap_room_chunks: Option<u64>,
}

/// Model of the on-disk metadata that turns state changes into superblock images.
pub trait MetadataStore: Send {
    fn summary(&self) -> MetadataSummary;

    /// Applies `change` (bumping the event counter as md does) and returns the images
    /// to write, one per device that should receive it. An error means the change is
    /// impossible (e.g. no free slot for a new device); nothing was changed.
    fn apply(&mut self, change: &StateChange) -> Result<Vec<SuperblockWrite>, RaidError>;
}
