//! How the engine records state changes on disk.
//!
//! The engine does not know the superblock format: it hands a [`StateChange`] to a
//! [`MetadataStore`] (md v1.2: `md::ArrayMetadata`), which updates its model and returns
//! the superblock images to write. The engine writes them (FUA) to every live member,
//! serialised so a newer image is never overwritten by an older one.
//!
//! Ordering guarantees the engine provides:
//! - `Dirty` is durable before the first data write after a clean state.
//! - `Faulty(role)` is durable before any write that skipped that member is acknowledged
//!   (else a restart could trust the stale member).

use crate::buf::AlignedBuf;

/// A change of array state that must reach the superblocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// Writes are about to start: parity/mirrors may disagree after a crash.
    Dirty,
    /// Orderly stop: everything is in sync.
    Clean,
    /// The member in `role` failed.
    Faulty { role: usize },
    /// Rebuild progress of `role` (member sectors from the data offset).
    RecoveryProgress { role: usize, sectors: u64 },
    /// `role` finished rebuilding.
    InSync { role: usize },
}

/// One superblock image to write to the member serving `role`.
pub struct SuperblockWrite {
    pub role: usize,
    pub offset_bytes: u64,
    pub image: AlignedBuf,
}

/// Model of the on-disk metadata that turns state changes into superblock images.
pub trait MetadataStore: Send {
    /// Applies `change` (bumping the event counter as md does) and returns the images
    /// to write, one per member that should receive it.
    fn apply(&mut self, change: &StateChange) -> Vec<SuperblockWrite>;
}
