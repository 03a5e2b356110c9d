//! One role of the array: the member serving it (if any) and its state.
//!
//! States follow md's per-device flags:
//! - `InSync`: readable and writable everywhere.
//! - `Recovering`: being rebuilt; writable everywhere, readable only below
//!   `recovery_offset_sectors` (member sectors from the data offset), as md's
//!   `recovery_offset`.
//! - `Faulty`: failed at run time; never touched again until replaced.
//! - `Missing`: absent at assembly.
//!
//! States change without locks (atomics): a request samples them when it plans its I/O,
//! and any I/O error marks the member faulty before the request is retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::member::Member;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    InSync = 0,
    Recovering = 1,
    Faulty = 2,
    Missing = 3,
}

impl SlotState {
    fn from_u8(v: u8) -> SlotState {
        match v {
            0 => SlotState::InSync,
            1 => SlotState::Recovering,
            2 => SlotState::Faulty,
            _ => SlotState::Missing,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SlotState::InSync => "in_sync",
            SlotState::Recovering => "recovering",
            SlotState::Faulty => "faulty",
            SlotState::Missing => "missing",
        }
    }
}

/// A member given to the array for one role.
pub struct RoleMember<M: ?Sized> {
    pub member: Arc<M>,
    /// Where this member's data area starts (md `data_offset`), in bytes.
    pub data_offset_bytes: u64,
    /// `Some(sectors)` if the member is only rebuilt up to there (md `recovery_offset`).
    pub recovery_offset_sectors: Option<u64>,
}

pub(crate) struct Slot<M: ?Sized> {
    pub member: Option<Arc<M>>,
    pub data_offset_bytes: u64,
    state: AtomicU8,
    recovery_offset_sectors: AtomicU64,
    /// Bytes of reads in flight, for read balancing between copies.
    pub inflight_read_bytes: AtomicU64,
}

impl<M: Member + ?Sized> Slot<M> {
    pub fn new(member: Option<RoleMember<M>>) -> Self {
        match member {
            None => Slot {
                member: None,
                data_offset_bytes: 0,
                state: AtomicU8::new(SlotState::Missing as u8),
                recovery_offset_sectors: AtomicU64::new(0),
                inflight_read_bytes: AtomicU64::new(0),
            },
            Some(rm) => {
                let (state, offset) = match rm.recovery_offset_sectors {
                    Some(s) => (SlotState::Recovering, s),
                    None => (SlotState::InSync, u64::MAX),
                };
                Slot {
                    member: Some(rm.member),
                    data_offset_bytes: rm.data_offset_bytes,
                    state: AtomicU8::new(state as u8),
                    recovery_offset_sectors: AtomicU64::new(offset),
                    inflight_read_bytes: AtomicU64::new(0),
                }
            }
        }
    }

    pub fn state(&self) -> SlotState {
        SlotState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn recovery_offset_sectors(&self) -> u64 {
        self.recovery_offset_sectors.load(Ordering::Acquire)
    }

    /// Marks the slot faulty; returns false if it already was faulty or missing.
    pub fn set_faulty(&self) -> bool {
        let prev = self.state.swap(SlotState::Faulty as u8, Ordering::AcqRel);
        matches!(SlotState::from_u8(prev), SlotState::InSync | SlotState::Recovering)
    }

    pub fn set_recovery_offset(&self, sectors: u64) {
        self.recovery_offset_sectors.store(sectors, Ordering::Release);
    }

    pub fn set_in_sync(&self) {
        self.recovery_offset_sectors.store(u64::MAX, Ordering::Release);
        self.state.store(SlotState::InSync as u8, Ordering::Release);
    }

    pub fn is_writable(&self) -> bool {
        matches!(self.state(), SlotState::InSync | SlotState::Recovering)
    }

    /// Whether member sectors `[member_sector, member_sector + sectors)` hold valid data.
    pub fn is_readable(&self, member_sector: u64, sectors: u64) -> bool {
        match self.state() {
            SlotState::InSync => true,
            SlotState::Recovering => member_sector + sectors <= self.recovery_offset_sectors(),
            SlotState::Faulty | SlotState::Missing => false,
        }
    }

    pub fn member(&self) -> &Arc<M> {
        self.member.as_ref().expect("live slot has a member")
    }
}
