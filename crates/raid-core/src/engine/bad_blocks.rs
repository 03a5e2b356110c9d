//! Bad blocks (md's bad-block log): member sectors a role's device does not hold right.
//!
//! Where they come from:
//! - a partial parity log replayed with a data member missing: a stripe row whose write was
//!   in flight on the lost member *and* on another block has parity that matches neither
//!   the old nor the new data, so the lost chunk cannot be rebuilt there. Replay marks the
//!   parity rows bad (`parity_log.rs`), and reads of the lost chunk fail with EIO instead of
//!   returning garbage;
//! - a rebuild that meets such rows marks them bad on the rebuilt device;
//! - the bad-block logs of arrays made elsewhere (read at start).
//!
//! Contract:
//! - A bad range is never read: `Slot::is_readable` is false there, so reads rebuild from
//!   the rest of the stripe (or other copies) or fail with EIO.
//! - A mark is durable (`StateChange::BadBlocks`) before anything relies on it; a mark that
//!   cannot be recorded (no log, log full) fails the device, as md does.
//! - A write that makes a range right again (its data, or parity computed from readable data)
//!   clears it, after the member writes are flushed: a crash then leaves the range marked
//!   (EIO), never unmarked over stale contents.
//! - A stripe row whose parity is bad and whose missing data cannot be rebuilt still takes
//!   writes of its other data blocks (`Mode::DataOnly`): parity stays bad.
//! - Not yet: mirrored levels honour bad ranges on reads (another copy is read) but writes
//!   do not clear them; whole-stripe zeroing does not clear them either (reads then fail
//!   where they could succeed, never the other way).

use super::slot::Slot;
use super::{Array, META_LOCK_KEY, StateChange};
use crate::bad_ranges::BadRanges;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::StripeLayout;
use crate::member::Member;

impl<M: Member + ?Sized> Array<M> {
    pub(super) fn any_bad(&self) -> bool {
        self.members.slots().iter().any(Slot::has_bad)
    }

    /// Marks `[member_sector, +sectors)` of `role` bad, durably. If the mark cannot be
    /// recorded the role's member is failed (md does the same) and an error returned.
    pub(super) async fn mark_bad(&self, role: usize, member_sector: u64, sectors: u64) -> Result<()> {
        let slot = &self.members.slots()[role];
        let Some(device) = slot.device() else { return Ok(()) };
        let recorded = {
            let _g = self.locks.lock(META_LOCK_KEY).await;
            let mut bad = slot.bad();
            if !bad.add(member_sector, sectors) {
                return Ok(());
            }
            slot.set_bad(bad.clone());
            tracing::warn!(role, member = device.member.name(), member_sector, sectors, "sectors marked bad");
            self.try_persist_locked(StateChange::BadBlocks { device: device.id, ranges: bad.ranges().to_vec() }).await
        };
        if let Err(e) = recorded {
            let io = std::io::Error::other(format!("cannot record bad blocks: {e}"));
            self.member_faulted(role, &io, "bad-block log").await;
            return Err(RaidError::new(
                ErrorKind::Io,
                format!(
                    "role {role}: sectors {member_sector}..{} are bad and cannot be recorded: {e}",
                    member_sector + sectors
                ),
            ));
        }
        Ok(())
    }

    /// Clears the bad parts of `ranges` (role, member sector, sectors) that writes just made
    /// right. The members are flushed first, so the clear never becomes durable before the
    /// contents it vouches for.
    pub(super) async fn clear_bad(&self, ranges: &[(usize, u64, u64)]) -> Result<()> {
        let touched: Vec<&(usize, u64, u64)> =
            ranges.iter().filter(|&&(role, s, n)| self.members.slots()[role].has_bad_in(s, n)).collect();
        if touched.is_empty() {
            return Ok(());
        }
        self.flush_members().await?;
        let _g = self.locks.lock(META_LOCK_KEY).await;
        let mut roles: Vec<usize> = touched.iter().map(|r| r.0).collect();
        roles.sort_unstable();
        roles.dedup();
        for role in roles {
            let slot = &self.members.slots()[role];
            let Some(device) = slot.device() else { continue };
            let mut bad = slot.bad();
            let mut changed = false;
            for &&(_, s, n) in touched.iter().filter(|r| r.0 == role) {
                changed |= bad.remove(s, n);
            }
            if changed {
                slot.set_bad(bad.clone());
                // A failed record leaves the ranges marked on disk: reads there fail after a
                // restart, never return stale bytes.
                self.persist_locked(StateChange::BadBlocks { device: device.id, ranges: bad.ranges().to_vec() }).await;
            }
        }
        Ok(())
    }

    /// A replacement that took over `role` gets the bad ranges of the device it replaced: it
    /// was copied from that device, and could not copy what the device did not hold. The
    /// caller holds the metadata lock.
    pub(super) async fn inherit_bad_locked(&self, role: usize, bad: BadRanges) {
        let slot = &self.members.slots()[role];
        let Some(device) = slot.device().filter(|_| !bad.is_empty()) else { return };
        slot.set_bad(bad.clone());
        self.persist_locked(StateChange::BadBlocks { device: device.id, ranges: bad.ranges().to_vec() }).await;
    }

    /// Rows (offsets from `member_sector`) inside `(0, sectors)` where some block of the
    /// stripe starts or stops being bad: between two cuts every block is uniformly good or bad.
    pub(super) fn bad_cuts(&self, layout: &StripeLayout, member_sector: u64, sectors: u64) -> Vec<u32> {
        let end = member_sector + sectors;
        let mut cuts: Vec<u32> = layout
            .data_roles
            .iter()
            .chain([&layout.p_role])
            .chain(layout.q_role.as_ref())
            .map(|&r| &self.members.slots()[r])
            .filter(|slot| slot.has_bad_in(member_sector, sectors))
            .flat_map(|slot| {
                slot.bad().cuts(member_sector, end).map(|c| (c - member_sector) as u32).collect::<Vec<_>>()
            })
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }
}
