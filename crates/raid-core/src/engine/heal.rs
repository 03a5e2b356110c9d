//! Silent corruption met on a read: a member said the bytes are wrong (its checksums,
//! `integrity/`), not that it failed.
//!
//! - The blocks are marked bad at once (`bad_blocks.rs`, durable), so the read that met them,
//!   and every read after, goes around them: another copy, or the stripe rebuilt from parity.
//!   Without redundancy left there, the read fails with EIO: never a wrong byte.
//! - The range is queued; the maintenance task heals it first of all its work
//!   ([`Array::heal_step`]): rebuilt from redundancy under the stripe (mirror range) lock,
//!   written back to the member, members flushed, the mark cleared.
//! - A device that returned wrong bytes more than [`MAX_CORRUPTIONS`] times is failed.
//! - Counted per role ([`CorruptionCounts`]) for status displays and metrics.

use std::collections::VecDeque;

use super::maintenance::{MaintenanceWork, Step};
use super::slot::SlotState;
use super::stripe_read::block_role;
use super::{Array, Layout};
use crate::SECTOR_BYTES;
use crate::error::Result;
use crate::geometry::Level;
use crate::integrity::Corruption;
use crate::member::Member;

/// Reports of wrong bytes after which a device is failed.
pub const MAX_CORRUPTIONS: u64 = 32;

/// Ranges waiting to be healed, at most (more stay marked bad until a write or a rebuild).
const MAX_QUEUED: usize = 4096;

/// What silent corruption one role met so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CorruptionCounts {
    /// Reports of wrong bytes (one per read that met some).
    pub reports: u64,
    /// Member sectors reported wrong.
    pub found_sectors: u64,
    /// Member sectors rebuilt from redundancy and written back.
    pub healed_sectors: u64,
}

#[derive(Debug, Clone, Copy)]
struct HealItem {
    role: usize,
    device_id: usize,
    member_sector: u64,
    sectors: u64,
}

#[derive(Default)]
pub(super) struct HealState {
    queue: VecDeque<HealItem>,
    by_role: Vec<CorruptionCounts>,
    /// Reports per device id (a device that keeps lying fails).
    by_device: std::collections::HashMap<usize, u64>,
}

impl HealState {
    fn role(&mut self, role: usize) -> &mut CorruptionCounts {
        if self.by_role.len() <= role {
            self.by_role.resize(role + 1, CorruptionCounts::default());
        }
        &mut self.by_role[role]
    }

    pub(super) fn counts(&self) -> Vec<CorruptionCounts> {
        self.by_role.clone()
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// `role`'s device returned wrong bytes (`corruption`, device bytes): mark, queue, count.
    pub(super) async fn member_corrupt(&self, role: usize, corruption: &Corruption) {
        let slot = &self.members.slots()[role];
        let Some(device) = slot.device() else { return };
        let start = corruption.offset_bytes.saturating_sub(device.data_offset_bytes) / SECTOR_BYTES;
        let end = (corruption.offset_bytes + corruption.len_bytes)
            .saturating_sub(device.data_offset_bytes)
            .div_ceil(SECTOR_BYTES);
        let sectors = end.saturating_sub(start);
        tracing::error!(member = device.member.name(), role, member_sector = start, sectors, "{corruption}");
        if !self.has_redundancy() || sectors == 0 {
            return; // the read fails: nothing to heal from
        }
        let reports = {
            let mut m = self.maintenance.lock();
            let counts = m.heal.role(role);
            counts.reports += 1;
            counts.found_sectors += sectors;
            let reports = m.heal.by_device.entry(device.id).or_default();
            *reports += 1;
            *reports
        };
        if reports > MAX_CORRUPTIONS {
            let why = format!("returned wrong bytes {reports} times");
            tracing::error!(member = device.member.name(), role, "{why}: member marked faulty");
            self.mark_faulty(role, &why).await;
            self.maintenance.wake();
            return;
        }
        if self.mark_bad(role, start, sectors).await.is_err() {
            return; // the mark could not be recorded: the member failed instead
        }
        {
            let mut m = self.maintenance.lock();
            if m.heal.queue.len() < MAX_QUEUED {
                m.heal.queue.push_back(HealItem { role, device_id: device.id, member_sector: start, sectors });
            }
        }
        self.maintenance.wake();
    }

    /// Heals one queued range, if any (called by `Maintenance::step` on a settled array).
    pub(super) async fn heal_step(&self) -> Result<Option<Step>> {
        let Some(item) = self.maintenance.lock().heal.queue.pop_front() else { return Ok(None) };
        let worked = |bytes| Ok(Some(Step::Worked { work: MaintenanceWork::Heal, bytes }));
        let slot = &self.members.slots()[item.role];
        let same_device = slot.device().is_some_and(|d| d.id == item.device_id);
        if !same_device || slot.state() != SlotState::InSync || !slot.has_bad_in(item.member_sector, item.sectors) {
            return worked(0); // failed, replaced, or made right by a write since
        }
        let layout = self.layout();
        let (mut at, end) = (item.member_sector, item.member_sector + item.sectors);
        let mut healed = 0;
        while at < end {
            let run = match layout.parity() {
                Some(pg) => {
                    let chunk = u64::from(pg.chunk_sectors());
                    let stripe = at / chunk;
                    let run = (end - at).min((stripe + 1) * chunk - at);
                    if self.heal_stripe_rows(&layout, stripe, item.role, at, run).await? {
                        healed += run;
                    }
                    run
                }
                None => {
                    // raid10 copies move between members chunk by chunk; raid1's lie alike.
                    let run = match layout.geometry().level() {
                        Level::Raid10 => {
                            let chunk = u64::from(layout.geometry().chunk_sectors());
                            (end - at).min(chunk - at % chunk)
                        }
                        _ => end - at,
                    };
                    if let Some(array_sector) = layout.geometry().array_sector_of(item.role, at)
                        && self.rebuild_mirror_piece(item.role, at, array_sector, run, None).await?
                    {
                        self.clear_bad(&[(item.role, at, run)]).await?;
                        healed += run;
                    }
                    run
                }
            };
            at += run;
        }
        if healed > 0 {
            self.maintenance.lock().heal.role(item.role).healed_sectors += healed;
            tracing::info!(
                member = slot.name().unwrap_or_default(),
                role = item.role,
                member_sector = item.member_sector,
                sectors = healed,
                "healed from redundancy"
            );
        }
        worked(healed * SECTOR_BYTES)
    }

    /// Rebuilds `[at, +sectors)` of `role` (inside `stripe`) from the rest of the stripe and
    /// writes it back; false when the rest cannot rebuild it (the mark stays: reads fail there).
    async fn heal_stripe_rows(&self, layout: &Layout, stripe: u64, role: usize, at: u64, sectors: u64) -> Result<bool> {
        let pg = layout.parity().expect("a parity layout");
        let _guard = self.locks.lock(stripe).await;
        let stripe_layout = pg.stripe(stripe);
        let base = layout.stripe_member_sector(stripe);
        debug_assert!(base <= at && at + sectors <= base + u64::from(pg.chunk_sectors()));
        let blocks = stripe_layout.data_roles.len() + pg.parity_disks();
        let block = (0..blocks).find(|&b| block_role(&stripe_layout, b) == role).expect("the role is in every stripe");
        let lost = (0..blocks)
            .filter(|&b| {
                let r = block_role(&stripe_layout, b);
                r == role || !self.members.slots()[r].is_readable(at, sectors)
            })
            .count();
        if lost > pg.parity_disks() {
            return Ok(false);
        }
        let rows = ((at - base) as u32, (at - base + sectors) as u32);
        let mut loaded = self.load_stripe_rows(layout, stripe, rows).await?;
        let buf = loaded[block].take().expect("every block loaded");
        if let Err(e) = self.write_member(role, at, buf, false).await {
            self.member_failed(role, &e, "heal write").await;
            return Ok(false);
        }
        self.clear_bad(&[(role, at, sectors)]).await?;
        Ok(true)
    }
}
