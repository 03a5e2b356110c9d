//! A level change that moves no data (md's takeover, `mdadm --grow --level L` with the
//! layout preserved): the new level places every existing byte where it already is, so one
//! superblock update and a new shape, made while every request pauses, change it.
//!
//! | from | to | how (md's rule) |
//! |---|---|---|
//! | raid1 of 2 | raid5 of 2 | a 2-member raid5's parity is a copy of its data: the members are the same; the chunk is the largest power of two up to 64 KiB that divides the size (`raid5_takeover_raid1`) |
//! | raid5 of 2 | raid1 | the same, back (`raid1_takeover`) |
//! | raid4 | raid5 `parity-last` | parity on the last member in both (`raid5_takeover_raid4`) |
//! | raid5 `parity-last` | raid4 | back (`raid4_takeover`) |
//! | raid5 (`ls`, `la`, `rs`, `ra`, `parity-first`, `parity-last`) | raid6 with one role more | the raid6 layouts `*-6` put Q on the new last role and keep the raid5 placement: the array is a raid6 missing its Q role, and the member given (or a spare added later) is rebuilt into it (`raid6_takeover_raid5`) |
//! | raid6 `*-6` / `parity-last` | raid5 | the Q role goes; its device becomes a spare (`raid5_takeover_raid6`) |
//! | raid0 of one zone | raid4/raid5 `parity-last` with one role more | raid0's placement is that of its data roles; the parity role is rebuilt onto the member given (`raid45_takeover_raid0`) |
//! | raid4/raid5 `parity-last`, its parity role missing | raid0 | back; every member's data area becomes md's `size` (`raid0_takeover_raid45`) |
//!
//! Refused where md refuses or where it would lose redundancy silently: arrays with a log
//! (PPL, journal), a reshape or background work running, a replacement being built, a raid0
//! target with a bitmap, and any change that would leave the new level without its data.
//! After a change to a `*-6` layout, moving Q to md's usual rotation is a layout change
//! (a reshape), not done here.

use std::sync::Arc;

use super::shape::Layout;
use super::slot::SlotState;
use super::{Array, META_LOCK_KEY, StateChange};
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level, ParityLayout};
use crate::member::Member;

/// What a level change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelChanged {
    pub from: Level,
    pub to: Level,
    /// md's layout code afterwards.
    pub layout: u32,
    pub raid_disks: usize,
    /// A role the new level has that no device serves yet (rebuilt onto the next spare).
    pub missing_role: Option<usize>,
}

/// The new level's md fields.
pub(super) struct Plan {
    pub(super) level: Level,
    pub(super) layout: u32,
    pub(super) chunk_sectors: u32,
    pub(super) raid_disks: usize,
    pub(super) size_sectors: u64,
    /// raid0: every member's data area becomes `size_sectors` (one zone).
    pub(super) data_size_is_size: bool,
}

fn refused(message: String) -> RaidError {
    RaidError::new(ErrorKind::Refused, message)
}

/// raid5 layout -> the raid6 layout that keeps it and adds Q on a new last role.
fn raid6_keeping(layout: ParityLayout) -> Option<ParityLayout> {
    Some(match layout {
        ParityLayout::LeftAsymmetric => ParityLayout::LeftAsymmetric6,
        ParityLayout::RightAsymmetric => ParityLayout::RightAsymmetric6,
        ParityLayout::LeftSymmetric => ParityLayout::LeftSymmetric6,
        ParityLayout::RightSymmetric => ParityLayout::RightSymmetric6,
        ParityLayout::ParityFirst => ParityLayout::ParityFirst6,
        ParityLayout::ParityLast => ParityLayout::ParityLast,
        _ => return None,
    })
}

/// The raid5 layout a raid6 layout keeps for its first roles, when Q is on the last role.
fn raid5_within(layout: ParityLayout) -> Option<ParityLayout> {
    Some(match layout {
        ParityLayout::LeftAsymmetric6 => ParityLayout::LeftAsymmetric,
        ParityLayout::RightAsymmetric6 => ParityLayout::RightAsymmetric,
        ParityLayout::LeftSymmetric6 => ParityLayout::LeftSymmetric,
        ParityLayout::RightSymmetric6 => ParityLayout::RightSymmetric,
        ParityLayout::ParityFirst6 => ParityLayout::ParityFirst,
        ParityLayout::ParityLast => ParityLayout::ParityLast,
        _ => return None,
    })
}

/// md's chunk for a raid1 taken over by raid5: the largest power of two up to 64 KiB that
/// divides the size, at least 4 KiB.
fn chunk_for_raid1(size_sectors: u64) -> Option<u32> {
    let mut chunk = 128u64;
    while chunk >= 8 && !size_sectors.is_multiple_of(chunk) {
        chunk /= 2;
    }
    (chunk >= 8).then_some(chunk as u32)
}

impl<M: Member + ?Sized> Array<M> {
    /// The new level's fields, or why the change cannot be made.
    pub(super) fn takeover_plan(&self, geometry: &Geometry, to: Level) -> Result<Plan> {
        let from = geometry.level();
        let disks = geometry.raid_disks();
        let parity_layout = geometry.parity().map(|pg| pg.layout());
        let cannot = |why: &str| refused(format!("{from} cannot become {to}: {why}"));
        let plan = |level, layout: u32, chunk_sectors, raid_disks, size_sectors| Plan {
            level,
            layout,
            chunk_sectors,
            raid_disks,
            size_sectors,
            data_size_is_size: level == Level::Raid0,
        };
        let size = geometry.component_sectors();
        Ok(match (from, to) {
            (Level::Raid1, Level::Raid5) if disks == 2 => {
                let chunk = chunk_for_raid1(size).ok_or_else(|| cannot("its size is not a multiple of 4 KiB"))?;
                plan(Level::Raid5, ParityLayout::LeftSymmetric as u32, chunk, 2, size)
            }
            (Level::Raid1, Level::Raid5) => return Err(cannot("only a mirror of two members is a raid5 of two")),
            (Level::Raid5, Level::Raid1) if disks == 2 => plan(Level::Raid1, 0, 0, 2, size),
            (Level::Raid5, Level::Raid1) => {
                return Err(cannot("only a raid5 of two members is a mirror (remove members first)"));
            }
            (Level::Raid4, Level::Raid5) => {
                plan(Level::Raid5, ParityLayout::ParityLast as u32, geometry.chunk_sectors(), disks, size)
            }
            (Level::Raid5, Level::Raid4) if parity_layout == Some(ParityLayout::ParityLast) => {
                plan(Level::Raid4, 0, geometry.chunk_sectors(), disks, size)
            }
            (Level::Raid5, Level::Raid4) => {
                return Err(cannot("its parity rotates; only layout parity-last is a raid4 (a layout change first)"));
            }
            (Level::Raid5, Level::Raid6) => {
                let layout = parity_layout
                    .and_then(raid6_keeping)
                    .ok_or_else(|| cannot("its layout has no raid6 counterpart"))?;
                if disks + 1 < Level::Raid6.min_members() {
                    return Err(cannot(&format!("a raid6 has at least {} members", Level::Raid6.min_members())));
                }
                plan(Level::Raid6, layout as u32, geometry.chunk_sectors(), disks + 1, size)
            }
            (Level::Raid6, Level::Raid5) => {
                let layout = parity_layout.and_then(raid5_within).ok_or_else(|| {
                    cannot("Q is not on the last member (only the *-6 layouts and parity-last keep a raid5 inside)")
                })?;
                plan(Level::Raid5, layout as u32, geometry.chunk_sectors(), disks - 1, size)
            }
            (Level::Raid0, Level::Raid4 | Level::Raid5) => {
                let zones = geometry.raid0().map_or(0, |g| g.zones().len());
                if zones != 1 {
                    return Err(cannot("its members differ in size (md takes over a raid0 of one zone only)"));
                }
                let size = geometry.member_sectors(0);
                let layout = if to == Level::Raid4 { 0 } else { ParityLayout::ParityLast as u32 };
                plan(to, layout, geometry.chunk_sectors(), disks + 1, size)
            }
            (Level::Raid4 | Level::Raid5, Level::Raid0)
                if from == Level::Raid4 || parity_layout == Some(ParityLayout::ParityLast) =>
            {
                if self.intent.is_some() {
                    return Err(cannot("it has a write-intent bitmap, which a raid0 cannot keep"));
                }
                plan(Level::Raid0, 0, geometry.chunk_sectors(), disks - 1, size)
            }
            (Level::Raid5, Level::Raid0) => return Err(cannot("only layout parity-last is a raid0 plus parity")),
            _ if from == to => return Err(refused(format!("the array is {to} already"))),
            _ => return Err(cannot("md has no takeover between them (a reshape would move the data)")),
        })
    }

    /// Changes the level (see the module docs). A role the new level adds is missing until a
    /// spare is rebuilt into it.
    pub(crate) async fn take_over(&self, to: Level) -> Result<LevelChanged> {
        self.check_writable("level change")?;
        if !self.write_hole.reshapes() {
            return Err(refused(
                "an array with a log (PPL, journal) keeps its level, as in md: switch the log off first \
                 (mdadm --grow --consistency-policy=resync)"
                    .into(),
            ));
        }
        let paused = self.shape.pause().await;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let geometry = self.settled_and_idle("change the level")?;
        let slots = self.members.slots();
        if slots.iter().any(|s| s.replacement().is_some() || s.state() == SlotState::Recovering) {
            return Err(refused("a member is being rebuilt or replaced: change the level when it is done".into()));
        }
        let from = geometry.level();
        let plan = self.takeover_plan(&geometry, to)?;
        let disks = geometry.raid_disks();
        let failed: Vec<usize> =
            slots.iter().enumerate().filter(|(_, s)| s.state() != SlotState::InSync).map(|(r, _)| r).collect();
        // A role that goes must hold nothing the new level needs; the rest must still carry it.
        let dropped = (plan.raid_disks < disks).then_some(disks - 1);
        if to == Level::Raid0 && failed != [disks - 1] {
            return Err(refused(format!(
                "{from} becomes raid0 only with its parity member (role {}) failed and no other: fail it first",
                disks - 1
            )));
        }
        let kept_failed = failed.iter().filter(|&&r| Some(r) != dropped).count();
        let added = plan.raid_disks.saturating_sub(disks);
        let tolerates = match plan.level {
            Level::Raid1 => plan.raid_disks - 1,
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        };
        if kept_failed + added > tolerates {
            return Err(refused(format!(
                "{to} would be missing {} members with roles {failed:?} failed now: rebuild them first",
                kept_failed + added
            )));
        }
        let member_sectors = vec![plan.size_sectors; plan.raid_disks];
        let new_geometry = Geometry::new(plan.level, plan.layout, plan.chunk_sectors, &member_sectors)
            .map_err(|e| refused(format!("{to}: {e}")))?;
        debug_assert_eq!(
            new_geometry.array_sectors(),
            geometry.array_sectors(),
            "a takeover keeps every byte where it is"
        );
        // A working device of the role that goes stays as a spare (md); a failed one is gone.
        let dropped_device =
            dropped.filter(|&r| slots[r].state() == SlotState::InSync).and_then(|r| slots[r].device()).map(|d| d.id);
        self.try_persist_locked(StateChange::Takeover {
            level: plan.level,
            layout: plan.layout,
            chunk_sectors: plan.chunk_sectors,
            raid_disks: plan.raid_disks,
            size_sectors: plan.size_sectors,
            data_size_is_size: plan.data_size_is_size,
            dropped_device,
        })
        .await?;
        let gone = if dropped.is_some() { self.members.drop_last_role() } else { None };
        if let Some(device) = gone.filter(|d| dropped_device == Some(d.id)) {
            self.members.add_spares(vec![device]);
        }
        let missing_role = (added > 0).then(|| self.members.add_missing_role());
        if from == Level::Raid0 {
            // Recorded clean with the takeover (no parity yet to go stale): the next write
            // marks it dirty only once a parity member is being built (`ensure_dirty`).
            self.dirty.store(false, std::sync::atomic::Ordering::Release);
        }
        self.shape.install(self.shape.next_shape(Arc::new(Layout::settled(new_geometry)), None));
        drop(_g);
        drop(paused);
        tracing::info!(from = %from, to = %to, layout = plan.layout, raid_disks = plan.raid_disks, "level changed");
        self.maintenance.wake();
        Ok(LevelChanged { from, to, layout: plan.layout, raid_disks: plan.raid_disks, missing_role })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md_chunks_for_a_raid1_taken_over() {
        assert_eq!(chunk_for_raid1(1 << 20), Some(128));
        assert_eq!(chunk_for_raid1(1000 * 8), Some(64));
        assert_eq!(chunk_for_raid1(12), None);
    }

    #[test]
    fn raid6_layouts_keep_the_raid5_inside() {
        for l in ParityLayout::ALL {
            if let Some(six) = raid6_keeping(l) {
                assert_eq!(raid5_within(six), Some(l), "{l:?}");
            }
        }
    }
}
