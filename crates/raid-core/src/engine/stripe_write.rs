//! raid4/5/6 writes: stripe-locked, with parity.
//!
//! ```text
//!  write_striped ─ lock the stripes (ascending) ─ widen to pages (if the policy logs pages)
//!     └ write_stripes_locked ─ write intent ─ per attempt:
//!          plan_jobs (mode and reads per segment, from the member states now)
//!          └ WriteHole::write ─ StripeWork::compute (read_and_compute: reads, parity)
//!                             ─ the policy's protection ─ write_computed (member writes)
//! ```
//!
//! Failure handling: a failed read marks the member faulty and the whole request is
//! planned again (nothing was written yet, and the stripe locks are still held). A failed
//! write marks the member faulty and is not retried: the other blocks of the stripe are
//! already consistent with the new data, so the lost block is reconstructable.

use futures::future::join_all;

use super::block_buf::BlockBuf;
use super::stripe_compute::{compute_job, concat_runs};
use super::stripe_plan::{Mode, Segment, StripeWrite, choose_mode, segments, stripe_writes};
use super::stripe_read::block_role;
use super::write_hole::{StripeWork, WriteRules, Written};
use super::{Array, Layout};
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::StripeLayout;
use crate::member::Member;
use crate::payload::Payload;

/// Where the new data of a write comes from.
#[derive(Clone)]
pub(crate) enum WriteSource<'a> {
    Data(Payload<'a>),
    Zeros,
}

/// One block of a stripe to write to a member.
pub(crate) struct MemberWrite {
    pub role: usize,
    pub member_sector: u64,
    pub buf: BlockBuf,
}

/// One segment of one stripe being written, as planned.
pub(crate) struct Job {
    /// Index into the request's stripe writes.
    pub write: usize,
    pub member_sector: u64,
    pub rows: (u32, u32),
    pub written: u64,
    pub mode: Mode,
    /// Blocks to read before computing (decided with the plan, from the same states).
    pub(super) reads: Vec<usize>,
    /// Block buffers (data.., P, Q), filled by reads then by computation.
    pub(super) blocks: Vec<Option<AlignedBuf>>,
}

impl Job {
    pub fn sectors(&self) -> u64 {
        u64::from(self.rows.1 - self.rows.0)
    }
}

/// A job with its new blocks computed.
pub(crate) struct ComputedJob {
    /// Index into the request's stripe writes (and their layouts).
    pub write: usize,
    pub stripe: u64,
    /// First member sector (from the data origin) of its rows.
    pub member_sector: u64,
    pub rows: (u32, u32),
    /// Bit k: data block k is written.
    pub written: u64,
    pub mode: Mode,
    /// The new contents of every block it writes, in block order (data, P, Q), also for
    /// roles that take no writes now.
    pub blocks: Vec<(usize, BlockBuf)>,
    /// The XOR of the data blocks it does not write, when asked for and it writes P.
    pub partial_parity: Option<AlignedBuf>,
}

impl ComputedJob {
    pub fn sectors(&self) -> u64 {
        u64::from(self.rows.1 - self.rows.0)
    }

    /// Its member writes: the blocks whose role takes writes now.
    pub fn member_writes<M: Member + ?Sized>(self, array: &Array<M>, layout: &StripeLayout) -> Vec<MemberWrite> {
        let member_sector = self.member_sector;
        self.blocks
            .into_iter()
            .map(|(b, buf)| MemberWrite { role: block_role(layout, b), member_sector, buf })
            .filter(|w| array.members.slots()[w.role].is_writable())
            .collect()
    }
}

impl<M: Member + ?Sized> Array<M> {
    pub(super) async fn write_striped(
        &self,
        layout: &Layout,
        start_sector: u64,
        sectors: u64,
        src: WriteSource<'_>,
        fua: bool,
    ) -> Result<()> {
        let stripes = self.stripes_of(layout, start_sector, sectors);
        let _guards = self.locks.lock_all(stripes).await;
        if let Some((start, buf)) = self.widen_to_pages(layout, start_sector, sectors, &src).await? {
            return self.write_striped_locked(layout, start, buf.as_slice().into(), fua).await;
        }
        let pg = layout.parity().expect("a parity layout");
        let writes = stripe_writes(start_sector, sectors, pg.chunk_sectors(), pg.data_disks());
        self.write_stripes_locked(layout, &writes, src, fua).await
    }

    /// When the policy logs whole pages, a write that starts or ends inside a page becomes a
    /// write of whole pages: the rest of those pages is read first. A page lies in one chunk,
    /// so the widened write takes the same stripe locks (held).
    async fn widen_to_pages(
        &self,
        layout: &Layout,
        start: u64,
        sectors: u64,
        src: &WriteSource<'_>,
    ) -> Result<Option<(u64, AlignedBuf)>> {
        let end = start + sectors;
        let Some(page) = self.write_rules().page_sectors else { return Ok(None) };
        if start.is_multiple_of(page) && end.is_multiple_of(page) {
            return Ok(None);
        }
        let (first, last) = (start / page * page, end.div_ceil(page) * page);
        let mut buf = AlignedBuf::zeroed(((last - first) * SECTOR_BYTES) as usize);
        let page_bytes = (page * SECTOR_BYTES) as usize;
        // Only the pages the write covers in part are read, each once.
        let mut partial = Vec::with_capacity(2);
        if start != first {
            partial.push(first);
        }
        if end != last && partial.last() != Some(&(last - page)) {
            partial.push(last - page);
        }
        for at in partial {
            let old = self.read_striped_in(layout, at, page_bytes, true).await?.to_vec();
            let off = ((at - first) * SECTOR_BYTES) as usize;
            buf.as_mut_slice()[off..off + page_bytes].copy_from_slice(&old);
        }
        let off = ((start - first) * SECTOR_BYTES) as usize;
        let len = (sectors * SECTOR_BYTES) as usize;
        match src {
            WriteSource::Data(data) => {
                crate::copy_count::copied(len);
                data.copy_to(&mut buf.as_mut_slice()[off..off + len])
            }
            WriteSource::Zeros => buf.as_mut_slice()[off..off + len].fill(0),
        }
        Ok(Some((first, buf)))
    }

    /// The stripes `[start_sector, +sectors)` lies in, in ascending order (the keys its
    /// write locks).
    pub(super) fn stripes_of(&self, layout: &Layout, start_sector: u64, sectors: u64) -> Vec<u64> {
        let pg = layout.parity().expect("a parity layout");
        stripe_writes(start_sector, sectors, pg.chunk_sectors(), pg.data_disks()).iter().map(|w| w.stripe).collect()
    }

    /// Writes whole sectors with the stripes' locks already held.
    pub(super) async fn write_striped_locked(
        &self,
        layout: &Layout,
        start_sector: u64,
        data: Payload<'_>,
        fua: bool,
    ) -> Result<()> {
        let pg = layout.parity().expect("a parity layout");
        let sectors = data.len() as u64 / SECTOR_BYTES;
        if let Some((start, buf)) =
            self.widen_to_pages(layout, start_sector, sectors, &WriteSource::Data(data.clone())).await?
        {
            let writes = stripe_writes(start, buf.len() as u64 / SECTOR_BYTES, pg.chunk_sectors(), pg.data_disks());
            return self.write_stripes_locked(layout, &writes, WriteSource::Data(buf.as_slice().into()), fua).await;
        }
        let writes = stripe_writes(start_sector, sectors, pg.chunk_sectors(), pg.data_disks());
        self.write_stripes_locked(layout, &writes, WriteSource::Data(data), fua).await
    }

    async fn write_stripes_locked(
        &self,
        layout: &Layout,
        writes: &[StripeWrite],
        src: WriteSource<'_>,
        fua: bool,
    ) -> Result<()> {
        debug_assert!(
            writes.iter().all(|w| self.locks.is_locked(w.stripe)),
            "data and parity of a stripe are written only under its lock"
        );
        let pg = layout.parity().expect("a parity layout");
        let stripe_layouts: Vec<StripeLayout> = writes.iter().map(|w| pg.stripe(w.stripe)).collect();
        let (Some(first), Some(last)) = (writes.first(), writes.last()) else { return Ok(()) };
        // Resync sectors: the member rows of the stripes in md's resync space.
        let _intent =
            self.intent_begin(pg.stripe_member_sector(first.stripe)..pg.stripe_member_sector(last.stripe + 1)).await?;
        let rules = self.write_rules();
        for _attempt in 0..=self.members.slots().len() {
            let jobs = self.plan_jobs(layout, writes, &stripe_layouts, &rules)?;
            // Bad ranges these writes make right (cleared once they are done).
            let clears: Vec<(usize, u64, u64)> = match self.any_bad() {
                true => jobs.iter().flat_map(|job| self.rewritten(job, &stripe_layouts[job.write])).collect(),
                false => Vec::new(),
            };
            let work = StripeWork { layout, stripe_layouts: &stripe_layouts, jobs, src: src.clone(), writes };
            match self.write_hole.write(self, work, fua).await? {
                Written::ReadFailed => continue,
                Written::Done => {
                    self.check_survives("write")?;
                    return self.clear_bad(&clears).await;
                }
            }
        }
        Err(RaidError::new(ErrorKind::Io, "write: members kept failing"))
    }

    /// The write rules of the array's write-hole policy.
    pub(super) fn write_rules(&self) -> WriteRules {
        self.write_hole.rules(self.members.slots().len())
    }

    /// Reads what `work`'s jobs need and computes their new blocks (see
    /// [`StripeWork::compute`]).
    pub(super) async fn read_and_compute(
        &self,
        work: StripeWork<'_>,
        partial_parity: bool,
    ) -> Result<Option<Vec<ComputedJob>>> {
        let StripeWork { layout, stripe_layouts, mut jobs, src, writes } = work;
        let reads: Vec<(usize, usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| job.reads.iter().map(move |&b| (j, b, block_role(&stripe_layouts[job.write], b))))
            .collect();
        let results = join_all(
            reads.iter().map(|&(j, _, role)| self.read_member(role, jobs[j].member_sector, jobs[j].sectors())),
        )
        .await;
        let mut read_failed = false;
        for (&(j, b, role), res) in reads.iter().zip(results) {
            match res {
                Ok(buf) => jobs[j].blocks[b] = Some(buf),
                Err(e) => {
                    self.member_failed(role, &e, "read").await;
                    read_failed = true;
                }
            }
        }
        if read_failed {
            return Ok(None);
        }
        let np = layout.parity().expect("a parity layout").parity_disks();
        let computed = jobs
            .into_iter()
            .map(|job| {
                let (write, sl) = (&writes[job.write], &stripe_layouts[job.write]);
                let want_pp = partial_parity && self.members.slots()[sl.p_role].is_writable();
                compute_job(job, write, sl, np, src.clone(), want_pp)
            })
            .collect();
        Ok(Some(computed))
    }

    /// Issues the member writes of `jobs` (contiguous ones on a member joined), and marks the
    /// members whose write failed.
    pub(super) async fn write_computed(&self, jobs: Vec<ComputedJob>, stripe_layouts: &[StripeLayout], fua: bool) {
        let writes: Vec<MemberWrite> = jobs
            .into_iter()
            .flat_map(|job| {
                let layout = &stripe_layouts[job.write];
                job.member_writes(self, layout)
            })
            .collect();
        self.write_runs(writes, fua).await;
    }

    /// Writes `writes` (joining those contiguous on one member) and marks the members whose
    /// write failed.
    pub(super) async fn write_runs(&self, writes: Vec<MemberWrite>, fua: bool) {
        let runs = concat_runs(writes);
        let results = join_all(runs.into_iter().map(|mut run| async move {
            let written = match (run.bufs.len(), run.bufs.pop()) {
                (1, Some(BlockBuf::Owned(buf))) => self.write_member(run.role, run.member_sector, buf, fua).await,
                (_, last) => {
                    // Several buffers, or the client's shared bytes: one gathering write.
                    let pieces = run.bufs.into_iter().chain(last).map(|b| Payload::Shared(b.into_bytes())).collect();
                    self.write_member_pieces(run.role, run.member_sector, pieces, fua).await
                }
            };
            (run.role, written)
        }))
        .await;
        for (role, res) in results {
            if let Err(e) = res {
                self.member_failed(role, &e, "write").await;
            }
        }
    }

    /// The (role, member sector, sectors) a job rewrites with right contents: its data
    /// blocks, and its parity unless it leaves parity alone.
    fn rewritten(&self, job: &Job, layout: &StripeLayout) -> Vec<(usize, u64, u64)> {
        let (dd, np) = (layout.data_roles.len(), 1 + usize::from(layout.q_role.is_some()));
        let parity = (job.mode != Mode::DataOnly).then_some(dd..dd + np).into_iter().flatten();
        (0..dd)
            .filter(|&k| job.written & (1 << k) != 0)
            .chain(parity)
            .map(|b| (block_role(layout, b), job.member_sector, job.sectors()))
            .collect()
    }

    /// Chooses a mode and the reads for every written segment of every stripe, from the
    /// current member states.
    fn plan_jobs(
        &self,
        layout: &Layout,
        writes: &[StripeWrite],
        stripe_layouts: &[StripeLayout],
        rules: &WriteRules,
    ) -> Result<Vec<Job>> {
        let pg = layout.parity().expect("a parity layout");
        let (dd, np) = (pg.data_disks(), pg.parity_disks());
        let mut jobs = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let sl = &stripe_layouts[i];
            let dead = (0..dd + np).filter(|&b| !self.members.slots()[block_role(sl, b)].is_writable()).count();
            if dead > np {
                return Err(RaidError::new(
                    ErrorKind::ArrayFailed,
                    format!("write: {} has lost roles {:?}", pg.level(), self.members.failed_roles()),
                ));
            }
            let full_mask = (1u64 << dd) - 1;
            // Rows where a block starts or stops being bad cut segments too, so each
            // segment's blocks are uniformly readable.
            let stripe_sector = layout.stripe_member_sector(w.stripe);
            let bad_cuts = if self.any_bad() {
                self.bad_cuts(sl, stripe_sector, u64::from(pg.chunk_sectors()))
            } else {
                Vec::new()
            };
            let pieces = segments(&w.blocks).into_iter().flat_map(|seg| {
                let step =
                    if seg.written == full_mask && !rules.split_full_stripes { u64::MAX } else { rules.max_job_rows };
                let (lo, hi) = (u64::from(seg.rows.0), u64::from(seg.rows.1));
                let mut bounds: Vec<u64> = (lo..hi).step_by(step.min(hi - lo).max(1) as usize).collect();
                bounds.extend(bad_cuts.iter().map(|&c| u64::from(c)).filter(|&c| lo < c && c < hi));
                bounds.sort_unstable();
                bounds.dedup();
                bounds.push(hi);
                bounds
                    .windows(2)
                    .map(|b| Segment { rows: (b[0] as u32, b[1] as u32), written: seg.written })
                    .collect::<Vec<_>>()
            });
            for seg in pieces {
                let member_sector = stripe_sector + u64::from(seg.rows.0);
                let sectors = u64::from(seg.rows.1 - seg.rows.0);
                let readable = |b: usize| self.members.slots()[block_role(sl, b)].is_readable(member_sector, sectors);
                let written = |k: usize| seg.written & (1 << k) != 0;
                let unreadable_data = (0..dd).filter(|&k| !readable(k)).fold(0u64, |m, k| m | 1 << k);
                let readable_parity: Vec<usize> = (dd..dd + np).filter(|&b| readable(b)).collect();
                // Parity on a writable member must be recomputed from all data when it was not
                // resynced since an unclean stop (as md), or when it is being rebuilt here: that
                // stripe may already be rebuilt, and must get the new parity.
                let writable = |b: usize| self.members.slots()[block_role(sl, b)].is_writable();
                let recompute_parity = (dd..dd + np).any(writable)
                    && ((dd..dd + np).any(|b| writable(b) && !readable(b)) || !self.stripe_synced(w.stripe));
                let mut mode = choose_mode(dd, seg.written, unreadable_data, readable_parity.len(), recompute_parity);
                let mut reads: Vec<usize> = match mode {
                    Mode::Full | Mode::DataOnly => Vec::new(),
                    Mode::ReadModifyWrite if readable_parity.is_empty() => Vec::new(),
                    Mode::ReadModifyWrite => (0..dd).filter(|&k| written(k)).chain(readable_parity).collect(),
                    Mode::ReconstructWrite => (0..dd).filter(|&k| !written(k)).collect(),
                    Mode::Degraded => (0..dd + np).filter(|&b| readable(b)).collect(),
                };
                let parity_bad = (dd..dd + np)
                    .all(|b| !writable(b) || self.members.slots()[block_role(sl, b)].all_bad(member_sector, sectors));
                if mode == Mode::Degraded && dd + np - reads.len() > np && parity_bad && rules.data_only {
                    mode = Mode::DataOnly;
                    reads.clear();
                }
                if mode == Mode::Degraded && dd + np - reads.len() > np {
                    return Err(RaidError::new(
                        ErrorKind::Io,
                        format!(
                            "write: stripe {} cannot be rebuilt (failed roles {:?})",
                            w.stripe,
                            self.members.failed_roles()
                        ),
                    ));
                }
                jobs.push(Job {
                    write: i,
                    member_sector,
                    rows: seg.rows,
                    written: seg.written,
                    mode,
                    reads,
                    blocks: (0..dd + np).map(|_| None).collect(),
                });
            }
        }
        Ok(jobs)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::executor::block_on;

    use crate::engine::{ArrayBuilder, RoleMember};
    use crate::geometry::{Geometry, Level};
    use crate::member::MemoryMember;

    #[test]
    #[should_panic(expected = "only under its lock")]
    fn parity_is_never_written_without_the_stripe_lock() {
        let geometry = Geometry::new(Level::Raid5, 2, 8, &[64; 3]).unwrap();
        let members = (0..3)
            .map(|r| {
                Some(RoleMember {
                    member: Arc::new(MemoryMember::new(format!("m{r}"), 64 * 512)),
                    data_offset_bytes: 0,
                    recovery_offset_sectors: None,
                    device_id: r,
                })
            })
            .collect();
        let array = ArrayBuilder::new(geometry, members).build().unwrap();
        let layout = array.layout();
        block_on(array.write_striped_locked(&layout, 0, [7; 4096].as_slice().into(), false)).unwrap();
    }
}
