//! `MdStore`: the engine's [`MetadataStore`] for md v1.2 arrays.
//!
//! It owns the array's [`ArrayMetadata`], applies each [`StateChange`] as the kernel's
//! `md_update_sb` would (new event count, update time), and renders one superblock per
//! member serving a role. Spares get no runtime updates (md also skips them while their
//! events are close enough; they are rewritten when they take a role).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::buf::AlignedBuf;
use crate::engine::{MetadataStore, StateChange, SuperblockWrite};
use crate::md::{ArrayMetadata, SUPERBLOCK_BYTE_OFFSET};

pub struct MdStore {
    metadata: ArrayMetadata,
    /// Per role: index into `metadata.members` of the member serving it.
    role_members: Vec<Option<usize>>,
}

impl MdStore {
    /// `role_members[role]` = index into `metadata.members` of the member serving `role`.
    pub fn new(metadata: ArrayMetadata, role_members: Vec<Option<usize>>) -> Self {
        assert_eq!(role_members.len(), metadata.raid_disks as usize, "one entry per role");
        Self { metadata, role_members }
    }

    pub fn metadata(&self) -> &ArrayMetadata {
        &self.metadata
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl MetadataStore for MdStore {
    fn apply(&mut self, change: &StateChange) -> Vec<SuperblockWrite> {
        let meta = &mut self.metadata;
        match *change {
            StateChange::Dirty => meta.set_dirty(),
            StateChange::Clean => meta.set_clean(),
            StateChange::Faulty { role } => {
                if let Some(dev) = self.role_members[role].map(|i| meta.members[i].dev_number) {
                    meta.mark_faulty(dev).expect("member of this array");
                }
            }
            StateChange::RecoveryProgress { role, sectors } => {
                if let Some(dev) = self.role_members[role].map(|i| meta.members[i].dev_number) {
                    meta.set_recovery_offset(dev, Some(sectors)).expect("member of this array");
                }
            }
            StateChange::InSync { role } => {
                if let Some(dev) = self.role_members[role].map(|i| meta.members[i].dev_number) {
                    meta.set_recovery_offset(dev, None).expect("member of this array");
                }
            }
        }
        meta.bump_events();
        meta.touch_utime(now_secs());
        (0..self.role_members.len())
            .filter_map(|role| {
                let index = self.role_members[role]?;
                let image = self.metadata.superblock_for(index).encode();
                Some(SuperblockWrite { role, offset_bytes: SUPERBLOCK_BYTE_OFFSET, image: AlignedBuf::from_slice(&image) })
            })
            .collect()
    }
}
