//! One role of the array: the device serving it (if any), its state, and an optional
//! replacement being built alongside it.
//!
//! States follow md's per-device flags:
//! - `InSync`: readable and writable everywhere.
//! - `Recovering`: being rebuilt; writable everywhere, readable only below
//!   `recovery_offset_sectors` (member sectors from the data offset), as md's
//!   `recovery_offset`.
//! - `Faulty`: failed at run time; never read or written again.
//! - `Missing`: no device.
//!
//! Independent of the state, a slot's *bad ranges* (md's bad blocks, `bad_blocks.rs`) are
//! member sectors its device cannot be trusted to hold: never readable until rewritten.
//!
//! A *replacement* (md `--replace`) is a second device for an in-sync role: every write
//! to the role also goes to it, a background copy fills it, and when the copy is done it
//! takes over the role. Reads never go to a replacement.
//!
//! States change without locks (atomics, and a short RwLock for the device handle): a
//! request samples them when it plans its I/O, and any I/O error marks the member faulty
//! before the request is retried.

use super::read_balance::ReadBalance;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::bad_ranges::BadRanges;
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
    /// Identifies the device to the metadata store (md: index of its member record).
    pub device_id: usize,
}

/// A device of the array: a member plus where its data starts.
pub struct Device<M: ?Sized> {
    pub id: usize,
    pub member: Arc<M>,
    pub data_offset_bytes: u64,
}

impl<M: ?Sized> Device<M> {
    /// Where `member_sector` (of the array's data on this device) lies on the device, in bytes.
    pub fn offset_bytes(&self, member_sector: u64) -> u64 {
        self.data_offset_bytes + member_sector * crate::SECTOR_BYTES
    }

    /// Moves where the data starts by `delta_bytes`.
    ///
    /// # Panics
    /// If the data start would leave the device's address range.
    pub fn move_origin(&mut self, delta_bytes: i64) {
        self.data_offset_bytes =
            self.data_offset_bytes.checked_add_signed(delta_bytes).expect("a data origin inside the device");
    }
}

impl<M: ?Sized> Clone for Device<M> {
    fn clone(&self) -> Self {
        Device { id: self.id, member: self.member.clone(), data_offset_bytes: self.data_offset_bytes }
    }
}

/// A device being filled to take over a role.
pub(crate) struct Replacement<M: ?Sized> {
    pub device: Device<M>,
    /// Member sectors copied so far.
    pub done_sectors: AtomicU64,
}

pub(crate) struct Slot<M: ?Sized> {
    device: RwLock<Option<Device<M>>>,
    state: AtomicU8,
    recovery_offset_sectors: AtomicU64,
    replacement: RwLock<Option<Arc<Replacement<M>>>>,
    /// The recovering device is a returning member: only chunks dirty in the write-intent
    /// bitmap need copying (md's bitmap-based re-add).
    pub bitmap_recovery: AtomicBool,
    /// Bytes of reads in flight, for read balancing between copies.
    pub inflight_read_bytes: AtomicU64,
    /// Write-mostly and measured read latency (read_balance.rs).
    pub read_balance: ReadBalance,
    /// Devices of this role that failed so far, and the name of the last (for monitors).
    failures: AtomicU64,
    last_failed: RwLock<Option<String>>,
    /// Member sectors (from the data offset) the device does not hold right.
    bad: RwLock<BadRanges>,
    /// `bad` is not empty (checked first, so healthy slots take no lock).
    has_bad: AtomicBool,
}

impl<M: Member + ?Sized> Slot<M> {
    pub fn new(member: Option<RoleMember<M>>) -> Self {
        let slot = Slot {
            device: RwLock::new(None),
            state: AtomicU8::new(SlotState::Missing as u8),
            recovery_offset_sectors: AtomicU64::new(0),
            replacement: RwLock::new(None),
            bitmap_recovery: AtomicBool::new(false),
            inflight_read_bytes: AtomicU64::new(0),
            read_balance: ReadBalance::default(),
            failures: AtomicU64::new(0),
            last_failed: RwLock::new(None),
            bad: RwLock::new(BadRanges::default()),
            has_bad: AtomicBool::new(false),
        };
        if let Some(rm) = member {
            let device = Device { id: rm.device_id, member: rm.member, data_offset_bytes: rm.data_offset_bytes };
            slot.install(device, rm.recovery_offset_sectors);
        }
        slot
    }

    pub fn state(&self) -> SlotState {
        SlotState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn recovery_offset_sectors(&self) -> u64 {
        self.recovery_offset_sectors.load(Ordering::Acquire)
    }

    /// The device serving the role (also when faulty, until it is removed).
    pub fn device(&self) -> Option<Device<M>> {
        self.device.read().expect("slot lock").clone()
    }

    /// Puts `device` in the role: in sync, or recovering from `recovery_offset`. It has no
    /// bad ranges (see `set_bad`).
    pub fn install(&self, device: Device<M>, recovery_offset: Option<u64>) {
        debug_assert_eq!(self.state(), SlotState::Missing, "a device is installed only in an empty role");
        self.set_bad(BadRanges::default());
        *self.device.write().expect("slot lock") = Some(device);
        match recovery_offset {
            Some(offset) => {
                self.recovery_offset_sectors.store(offset, Ordering::Release);
                self.state.store(SlotState::Recovering as u8, Ordering::Release);
            }
            None => self.set_in_sync(),
        }
    }

    /// Moves where the device's data starts by `delta_bytes` (a reshape starting moves every
    /// device's data origin to the new data start, below both layouts).
    pub fn move_origin(&self, delta_bytes: i64) {
        if let Some(d) = self.device.write().expect("slot lock").as_mut() {
            d.move_origin(delta_bytes);
        }
        debug_assert!(self.replacement().is_none(), "no replacement is built while the array reshapes");
    }

    /// Takes the device out of the role, which becomes missing.
    pub fn take_device(&self) -> Option<Device<M>> {
        self.state.store(SlotState::Missing as u8, Ordering::Release);
        self.device.write().expect("slot lock").take()
    }

    /// Marks the slot faulty; returns false if it already was faulty or missing.
    pub fn set_faulty(&self) -> bool {
        let prev = self.state.swap(SlotState::Faulty as u8, Ordering::AcqRel);
        if matches!(SlotState::from_u8(prev), SlotState::Missing) {
            self.state.store(SlotState::Missing as u8, Ordering::Release);
        }
        let failed = matches!(SlotState::from_u8(prev), SlotState::InSync | SlotState::Recovering);
        if failed {
            *self.last_failed.write().expect("slot lock") = self.name();
            self.failures.fetch_add(1, Ordering::AcqRel);
        }
        failed
    }

    /// How often a device of this role has failed, and the name of the last one: a monitor
    /// that polls sees every failure even when a spare took the role over in between.
    pub fn failures(&self) -> (u64, Option<String>) {
        (self.failures.load(Ordering::Acquire), self.last_failed.read().expect("slot lock").clone())
    }

    /// Records rebuild progress of a recovering slot: it only grows (a restart from an
    /// earlier point goes through `install`).
    pub fn set_recovery_offset(&self, sectors: u64) {
        let before = self.recovery_offset_sectors.swap(sectors, Ordering::AcqRel);
        debug_assert_eq!(self.state(), SlotState::Recovering, "recovery progress on a slot that is not recovering");
        debug_assert!(sectors >= before, "recovery offset went back from {before} to {sectors}");
    }

    /// The slot's device holds every sector: after a rebuild, or when installed whole. A
    /// faulty device never becomes in sync (it is replaced by a rebuilt one).
    pub fn set_in_sync(&self) {
        debug_assert_ne!(self.state(), SlotState::Faulty, "a faulty slot became in sync without a rebuild");
        self.bitmap_recovery.store(false, Ordering::Release);
        self.recovery_offset_sectors.store(u64::MAX, Ordering::Release);
        self.state.store(SlotState::InSync as u8, Ordering::Release);
    }

    pub fn is_writable(&self) -> bool {
        matches!(self.state(), SlotState::InSync | SlotState::Recovering)
    }

    /// Whether member sectors `[member_sector, member_sector + sectors)` hold valid data.
    pub fn is_readable(&self, member_sector: u64, sectors: u64) -> bool {
        let holds = match self.state() {
            SlotState::InSync => true,
            SlotState::Recovering => member_sector + sectors <= self.recovery_offset_sectors(),
            SlotState::Faulty | SlotState::Missing => false,
        };
        holds && !self.has_bad_in(member_sector, sectors)
    }

    /// Whether any of the sectors is bad.
    pub fn has_bad_in(&self, member_sector: u64, sectors: u64) -> bool {
        self.has_bad.load(Ordering::Acquire) && self.bad.read().expect("slot lock").overlaps(member_sector, sectors)
    }

    /// Whether every one of the sectors is bad.
    pub fn all_bad(&self, member_sector: u64, sectors: u64) -> bool {
        self.has_bad.load(Ordering::Acquire) && self.bad.read().expect("slot lock").covers(member_sector, sectors)
    }

    pub fn bad(&self) -> BadRanges {
        self.bad.read().expect("slot lock").clone()
    }

    pub fn has_bad(&self) -> bool {
        self.has_bad.load(Ordering::Acquire)
    }

    pub fn set_bad(&self, bad: BadRanges) {
        let mut guard = self.bad.write().expect("slot lock");
        self.has_bad.store(!bad.is_empty(), Ordering::Release);
        *guard = bad;
    }

    /// The member serving the role.
    ///
    /// # Panics
    /// If the role has no device (callers check `is_readable`/`is_writable` first).
    pub fn member(&self) -> Arc<M> {
        self.device().expect("live slot has a device").member
    }

    pub fn name(&self) -> Option<String> {
        self.device().map(|d| d.member.name().to_string())
    }

    pub fn replacement(&self) -> Option<Arc<Replacement<M>>> {
        self.replacement.read().expect("slot lock").clone()
    }

    pub fn set_replacement(&self, replacement: Option<Arc<Replacement<M>>>) {
        *self.replacement.write().expect("slot lock") = replacement;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::MemoryMember;

    fn device(id: usize) -> Device<MemoryMember> {
        Device { id, member: Arc::new(MemoryMember::new(format!("m{id}"), 1 << 20)), data_offset_bytes: 0 }
    }

    #[test]
    fn a_role_goes_missing_installed_faulty_missing() {
        let slot: Slot<MemoryMember> = Slot::new(None);
        assert_eq!(slot.state(), SlotState::Missing);
        slot.install(device(0), Some(0));
        assert_eq!(slot.state(), SlotState::Recovering);
        slot.set_recovery_offset(64);
        assert!(slot.is_readable(0, 64) && !slot.is_readable(0, 65));
        slot.set_in_sync();
        assert!(slot.set_faulty(), "an in-sync device fails");
        assert!(!slot.set_faulty(), "a faulty one fails once");
        assert_eq!(slot.take_device().map(|d| d.id), Some(0));
        slot.install(device(1), None);
        assert_eq!(slot.state(), SlotState::InSync);
    }

    #[test]
    #[should_panic(expected = "installed only in an empty role")]
    fn a_device_never_replaces_another_without_leaving_first() {
        let slot: Slot<MemoryMember> = Slot::new(None);
        slot.install(device(0), None);
        slot.install(device(1), None);
    }

    #[test]
    #[should_panic(expected = "became in sync without a rebuild")]
    fn a_faulty_device_never_becomes_in_sync() {
        let slot: Slot<MemoryMember> = Slot::new(None);
        slot.install(device(0), None);
        slot.set_faulty();
        slot.set_in_sync();
    }

    #[test]
    #[should_panic(expected = "went back")]
    fn recovery_never_goes_back() {
        let slot: Slot<MemoryMember> = Slot::new(None);
        slot.install(device(0), Some(128));
        slot.set_recovery_offset(64);
    }
}
