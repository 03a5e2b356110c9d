//! `base:allocation` of the array: where its bytes are holes and zeros, from what its members
//! say of theirs ([`Member::allocation`]: a file's holes, an NBD export's own block status),
//! through the geometry.
//!
//! - linear, raid0: the member holding the range;
//! - raid1, raid10: every copy a read may pick (readable there): a hole where all are holes,
//!   zero where all read as zero, so the answer holds whichever copy a read takes;
//! - raid4/5/6: a data chunk reads as zero where its member does; it is a hole where its
//!   member and the parity covering it are holes. A data chunk a read rebuilds (its member
//!   missing, recovering or bad there) reads as zero where every block it is rebuilt from
//!   does (the other data blocks, P and Q: zero in, zero out).
//!
//! Maintenance asks the same of its members ([`Array::device_hole`]): a resync, check or
//! rebuild skips what is a hole on every block it would read, and keeps a rebuilt device
//! sparse there (holes read as zeros, so it holds what md's full copy would have written).
//!
//! The answer is a snapshot: a write racing it may or may not be seen, as for any two
//! requests in flight together; a write that completed before it is. A request only covers
//! as much as [`MAX_STATUS_STEPS`] steps reach (the caller asks again for the rest), and an
//! array in the middle of a reshape answers "data" (always true).

use std::collections::BTreeMap;

use super::{Array, DataPath, Device, Layout};
use crate::SECTOR_BYTES;
use crate::allocation::{Allocation, push_merged, total_bytes};
use crate::error::Result;
use crate::member::Member;

/// Sub-ranges (runs of constant state) one request walks at most.
const MAX_STATUS_STEPS: usize = 1 << 16;

/// Member sectors asked of a member at a time, at least.
const MIN_FETCH_SECTORS: u64 = 2048;

/// The states of one role's member sectors, as far as they have been asked: start sector →
/// (end sector, hole, zero); sorted, not overlapping.
#[derive(Default)]
struct Known {
    runs: BTreeMap<u64, (u64, bool, bool)>,
}

impl Known {
    /// The state at `sector` and where it ends, if known.
    fn at(&self, sector: u64) -> Option<(bool, bool, u64)> {
        let (_, &(end, hole, zero)) = self.runs.range(..=sector).next_back()?;
        (end > sector).then_some((hole, zero, end))
    }

    /// Records what a member said of its bytes from member sector `first` on. A hole or zero
    /// extent that starts or ends inside a sector leaves that sector "data" (the sector is
    /// not all hole); at least one sector is recorded.
    fn record(&mut self, first: u64, extents: &[Allocation]) {
        let mut next = first; // first sector not yet recorded
        let mut at_bytes = 0u64; // offset of the extent in bytes from `first`
        for e in extents {
            let (start, end) = (at_bytes, at_bytes + e.len_bytes);
            at_bytes = end;
            if e.hole || e.zero {
                let (s0, s1) = ((first + start.div_ceil(SECTOR_BYTES)).max(next), first + end / SECTOR_BYTES);
                if s1 <= s0 {
                    continue;
                }
                if s0 > next {
                    self.runs.insert(next, (s0, false, false));
                }
                self.runs.insert(s0, (s1, e.hole, e.zero));
                next = s1;
            } else {
                let s1 = first + end.div_ceil(SECTOR_BYTES);
                if s1 > next {
                    self.runs.insert(next, (s1, false, false));
                    next = s1;
                }
            }
        }
        if next == first {
            self.runs.insert(first, (first + 1, false, false));
        }
    }
}

/// The states of one sub-range of a run: one per term (role and member sector) it depends on.
#[derive(Clone, Copy)]
struct TermState {
    hole: bool,
    zero: bool,
}

/// How the array's state of a run follows from its terms' states.
enum Rule {
    /// Copies: hole where all are holes, zero where all read as zero.
    AllAgree,
    /// A readable data block (term 0) and its parity (the other terms): zero where the data
    /// is, hole where all are holes.
    DataWithParity,
}

impl Rule {
    fn combine(&self, states: &[TermState]) -> (bool, bool) {
        let all_hole = states.iter().all(|s| s.hole);
        match self {
            Rule::AllAgree => (all_hole, states.iter().all(|s| s.zero)),
            Rule::DataWithParity => (all_hole, states[0].zero),
        }
    }
}

/// One request's walk: what its roles said so far, and how many steps are left.
struct Walk {
    known: Vec<Known>,
    steps_left: usize,
    out: Vec<Allocation>,
}

impl<M: Member + ?Sized> Array<M> {
    /// `base:allocation` from `offset_bytes` (sector aligned, in the array): extents in
    /// order, covering at least one sector and at most `len_bytes`. See the module docs.
    pub async fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<Allocation>> {
        self.check_io(offset_bytes, len_bytes, false)?;
        let shape = self.shape.load();
        if len_bytes == 0 || shape.reshape().is_some() {
            return Ok(vec![Allocation::data(len_bytes)]);
        }
        let layout = shape.layout();
        let mut walk = Walk {
            known: (0..self.members.slots().len()).map(|_| Known::default()).collect(),
            steps_left: MAX_STATUS_STEPS,
            out: Vec::new(),
        };
        let (mut sector, end) = (offset_bytes / SECTOR_BYTES, (offset_bytes + len_bytes) / SECTOR_BYTES);
        while sector < end && walk.steps_left > 0 {
            let mapped = layout.map(sector);
            let run = mapped.len_sectors.min(end - sector);
            let (terms, rule) = match DataPath::of(layout) {
                DataPath::Mirrored => {
                    let readable = mapped
                        .copies
                        .iter()
                        .filter(|c| self.members.slots()[c.role].is_readable(c.member_sector, run))
                        .map(|c| (c.role, c.member_sector))
                        .collect();
                    (readable, Rule::AllAgree)
                }
                DataPath::Striped => self.striped_terms(layout, sector, mapped.copies[0].member_sector, run),
            };
            let remaining = end - sector;
            sector += self.walk_terms(&terms, &rule, run, remaining, &mut walk).await;
        }
        debug_assert!(!walk.out.is_empty(), "a status covers at least one sector");
        Ok(walk.out)
    }

    /// The blocks a raid4/5/6 run of data at `member_sector` (the same row on every role)
    /// depends on, and how; none when it cannot be read at all.
    fn striped_terms(&self, layout: &Layout, sector: u64, member_sector: u64, run: u64) -> (Vec<(usize, u64)>, Rule) {
        let pg = layout.parity().expect("striped layout");
        let (stripe, data_index, _) = pg.locate(sector);
        let stripe = pg.stripe(stripe);
        let readable = |role: usize| self.members.slots()[role].is_readable(member_sector, run);
        let data_role = stripe.data_roles[data_index];
        let parity_roles = std::iter::once(stripe.p_role).chain(stripe.q_role);
        if readable(data_role) {
            let terms = std::iter::once(data_role)
                .chain(parity_roles.filter(|&r| readable(r)))
                .map(|r| (r, member_sector))
                .collect();
            return (terms, Rule::DataWithParity);
        }
        // Rebuilt from the rest of its stripe: zero in, zero out.
        let others: Vec<usize> =
            stripe.data_roles.iter().copied().chain(parity_roles).filter(|&r| r != data_role).collect();
        let sources: Vec<(usize, u64)> = others.iter().filter(|&&r| readable(r)).map(|&r| (r, member_sector)).collect();
        let missing = 1 + others.len() - sources.len();
        if missing > pg.parity_disks() {
            return (Vec::new(), Rule::AllAgree);
        }
        (sources, Rule::AllAgree)
    }

    /// Appends the states of a run of `run` sectors whose blocks are `terms` (none: data),
    /// split where any term's state changes; returns the sectors covered (at least one,
    /// fewer than `run` once the walk's steps run out).
    async fn walk_terms(&self, terms: &[(usize, u64)], rule: &Rule, run: u64, remaining: u64, walk: &mut Walk) -> u64 {
        if terms.is_empty() {
            walk.steps_left -= 1;
            push_merged(&mut walk.out, Allocation::data(run * SECTOR_BYTES));
            return run;
        }
        let mut done = 0;
        let mut states = Vec::with_capacity(terms.len());
        while done < run && walk.steps_left > 0 {
            walk.steps_left -= 1;
            states.clear();
            let mut step = run - done;
            for &(role, member_sector) in terms {
                let (hole, zero, until) = self.role_state(role, member_sector + done, remaining - done, walk).await;
                step = step.min(until - (member_sector + done));
                states.push(TermState { hole, zero });
            }
            let (hole, zero) = rule.combine(&states);
            push_merged(&mut walk.out, Allocation { len_bytes: step * SECTOR_BYTES, hole, zero });
            done += step;
        }
        done
    }

    /// The state of `role`'s member sector `member_sector` and where it ends, asking the
    /// member (for up to `ahead` sectors) when the walk does not know it yet. A member that
    /// cannot say, or a role without a device, is "data".
    async fn role_state(&self, role: usize, member_sector: u64, ahead: u64, walk: &mut Walk) -> (bool, bool, u64) {
        if let Some(state) = walk.known[role].at(member_sector) {
            return state;
        }
        let extents = match self.members.slots()[role].device() {
            Some(device) => {
                let fetch_end = (member_sector + ahead.max(MIN_FETCH_SECTORS)) * SECTOR_BYTES;
                let member_end = device.member.len_bytes().saturating_sub(device.data_offset_bytes);
                let len = fetch_end.min(member_end).saturating_sub(member_sector * SECTOR_BYTES);
                let at = device.offset_bytes(member_sector);
                device.member.allocation(at, len.max(SECTOR_BYTES)).await.unwrap_or_default()
            }
            None => Vec::new(),
        };
        walk.known[role].record(member_sector, &extents);
        walk.known[role].at(member_sector).expect("at least one sector recorded")
    }
}

/// Answers of one member asked at most this many times for one range (it may answer in parts).
const MAX_HOLE_ASKS: usize = 64;

impl<M: Member + ?Sized> Array<M> {
    /// Whether `device`'s member sectors `[member_sector, +sectors)` are all a hole, asked
    /// now (maintenance asks under the lock of the range, so no write races the answer).
    /// Anything a member cannot say is not a hole.
    pub(super) async fn device_hole(&self, device: &Device<M>, member_sector: u64, sectors: u64) -> bool {
        let at = device.offset_bytes(member_sector);
        let len = sectors * SECTOR_BYTES;
        let mut done = 0;
        for _ in 0..MAX_HOLE_ASKS {
            if done >= len {
                return true;
            }
            let Ok(extents) = device.member.allocation(at + done, len - done).await else { return false };
            let answered = total_bytes(&extents);
            if answered == 0 || answered > len - done || extents.iter().any(|e| !e.hole) {
                return false;
            }
            done += answered;
        }
        done >= len
    }

    /// Whether every copy of array sectors `[start, end)` of a mirrored layout is a hole
    /// (with no bad blocks anywhere: those are read around, not trusted as holes).
    pub(super) async fn mirror_range_hole(&self, layout: &Layout, start: u64, end: u64) -> bool {
        if self.any_bad() {
            return false;
        }
        let mut sector = start;
        while sector < end {
            let mapped = layout.map(sector);
            let run = mapped.len_sectors.min(end - sector);
            for c in &mapped.copies {
                let Some(device) = self.members.slots()[c.role].device() else { return false };
                if !self.device_hole(&device, c.member_sector, run).await {
                    return false;
                }
            }
            sector += run;
        }
        true
    }

    /// Whether the devices of `roles` are all holes at `[member_sector, +sectors)` (a role
    /// without a device is not).
    pub(super) async fn roles_hole(&self, roles: &[usize], member_sector: u64, sectors: u64) -> bool {
        for &role in roles {
            let Some(device) = self.members.slots()[role].device() else { return false };
            if !self.device_hole(&device, member_sector, sectors).await {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_sectors_of_holes_are_data_and_something_is_always_recorded() {
        let mut known = Known::default();
        known.record(10, &[Allocation::data(100), Allocation::hole(2000), Allocation::data(512)]);
        // data [0,100) -> sector 0; hole [100,2100) -> sectors 1..4 (4 ends at 2048);
        // data [2100,2612) -> sectors 4..6.
        assert_eq!(known.at(10), Some((false, false, 11)));
        assert_eq!(known.at(11), Some((true, true, 14)));
        assert_eq!(known.at(14), Some((false, false, 16)));
        assert_eq!(known.at(16), None);

        let mut short = Known::default();
        short.record(0, &[Allocation::hole(100)]);
        assert_eq!(short.at(0), Some((false, false, 1)));
        let mut empty = Known::default();
        empty.record(7, &[]);
        assert_eq!(empty.at(7), Some((false, false, 8)));
    }
}
