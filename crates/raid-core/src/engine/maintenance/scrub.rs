//! Scrub: compare redundancy with data, count mismatches the way md's `mismatch_cnt`
//! does, and optionally repair them.
//!
//! Units (md semantics): raid4/5/6 count 8 sectors per 4 KiB page whose parity disagrees
//! with its data; raid1/raid10 count the 64 KiB resync block (128 sectors) whose copies
//! differ. Repair recomputes parity from data (raid4/5/6) or copies the first copy over the
//! others (raid1/raid10), as md's `repair` does, except where redundancy names the member
//! that is wrong: a raid6 page whose P and Q syndromes point at one block (the math of
//! `raid6check`, [`parity::locate_bad_block`]), a mirror of three or more copies where a
//! majority agrees. There the wrong member is named in the mismatch log ([`Mismatch`]) and
//! repair rewrites it, not the parity (or copies the majority, not the first copy).
//!
//! Scrubbing works in *units* the caller iterates with progress: stripes for parity levels,
//! 1 MiB array ranges for mirrored levels. Each unit is locked while it is compared, so a
//! scrub can run while clients write.

use futures::future::join_all;

use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::engine::stripe_read::{block_kinds, block_role};
use crate::engine::{Array, DataPath, Layout};
use crate::error::{ErrorKind, RaidError, Result};
use crate::member::Member;
use crate::parity::{self, BlockKind, Located};

/// Page size parity mismatches are counted in (md stripe cache unit).
const PARITY_PAGE_SECTORS: u64 = 8;
/// Mirror resync block.
const MIRROR_BLOCK_SECTORS: u64 = 128;
/// Array sectors per mirror scrub unit.
pub(crate) const MIRROR_UNIT_SECTORS: u64 = 2048;

/// Mismatches kept per scrub (the first ones; the counts have them all).
pub const MISMATCH_LOG_LIMIT: usize = 256;

/// Times a stripe is read again after members reported wrong bytes in it (each time they
/// are marked and read around).
const MAX_CORRUPT_RETRIES: usize = 4;

/// One mismatch a scrub found, and the member whose bytes are wrong when redundancy can
/// tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The stripe (raid4/5/6), or `None` on a mirror.
    pub stripe: Option<u64>,
    /// Where, in sectors from the member's data start (the located member's, else the
    /// first copy's on a mirror), and how many.
    pub member_sector: u64,
    pub sectors: u64,
    /// The role whose bytes are wrong, when located.
    pub role: Option<usize>,
    /// Repair rewrote it.
    pub repaired: bool,
}

/// Result of scrubbing some units.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScrubCounts {
    /// md's mismatch_cnt: sectors in mismatching pages/blocks.
    pub mismatch_sectors: u64,
    /// Sectors rewritten by repair.
    pub repaired_sectors: u64,
    /// Array bytes covered.
    pub scrubbed_bytes: u64,
    /// Sectors of parity pages not compared because a block there is bad (bad_blocks.rs).
    pub skipped_bad_sectors: u64,
    /// Mismatching sectors whose wrong member redundancy named (raid6, mirrors of 3+).
    pub located_sectors: u64,
    /// Array bytes (of `scrubbed_bytes`) that were holes on every member and so were not
    /// read: consistent by construction (all zeros).
    pub hole_bytes: u64,
}

impl std::ops::AddAssign for ScrubCounts {
    fn add_assign(&mut self, o: Self) {
        self.mismatch_sectors += o.mismatch_sectors;
        self.repaired_sectors += o.repaired_sectors;
        self.scrubbed_bytes += o.scrubbed_bytes;
        self.skipped_bad_sectors += o.skipped_bad_sectors;
        self.located_sectors += o.located_sectors;
        self.hole_bytes += o.hole_bytes;
    }
}

impl<M: Member + ?Sized> Array<M> {
    /// Number of scrub units (see the module docs).
    pub(crate) fn scrub_units(&self) -> u64 {
        match self.layout().parity() {
            Some(pg) => pg.stripes(),
            None => self.layout().geometry().array_sectors().div_ceil(MIRROR_UNIT_SECTORS),
        }
    }

    /// Scrubs `count` units from `first`. Needs every member: a degraded array has no
    /// redundancy to compare (md refuses to check it too).
    pub(crate) async fn scrub(&self, first: u64, count: u64, repair: bool) -> Result<ScrubCounts> {
        self.scrub_as(first, count, repair, true).await
    }

    /// The resync after an unclean stop: as md, parity from data and the first copy over the
    /// others. A half-done write leaves one block different from the others there, which is
    /// no member's fault (and not something to undo), so nothing is located.
    pub(crate) async fn resync_units(&self, first: u64, count: u64) -> Result<ScrubCounts> {
        self.scrub_as(first, count, true, false).await
    }

    async fn scrub_as(&self, first: u64, count: u64, repair: bool, locate: bool) -> Result<ScrubCounts> {
        if repair {
            self.check_writable("repair")?;
        }
        if !self.members.is_optimal() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("cannot check a degraded array (failed roles {:?})", self.members.failed_roles()),
            ));
        }
        if !self.has_redundancy() {
            return Err(RaidError::new(
                ErrorKind::Refused,
                format!("{} has no redundancy to check", self.layout().geometry().level()),
            ));
        }
        let shape = self.shape.load();
        if shape.reshape().is_some() {
            return Err(RaidError::new(ErrorKind::Refused, "cannot check an array while it is reshaped"));
        }
        let layout = shape.layout();
        if first == 0 && locate {
            self.maintenance.lock().mismatches.clear();
        }
        let mut total = ScrubCounts::default();
        let end = (first + count).min(self.scrub_units());
        for unit in first..end {
            total += match DataPath::of(layout) {
                DataPath::Striped => self.scrub_stripe(layout, unit, repair, locate).await?,
                DataPath::Mirrored => self.scrub_mirror_unit(layout, unit, repair, locate).await?,
            };
        }
        Ok(total)
    }

    async fn scrub_stripe(
        &self,
        array_layout: &Layout,
        stripe: u64,
        repair: bool,
        locate: bool,
    ) -> Result<ScrubCounts> {
        let pg = array_layout.parity().expect("parity level");
        let _guard = self.locks.lock(stripe).await;
        let layout = pg.stripe(stripe);
        let chunk = u64::from(pg.chunk_sectors());
        let member_sector = array_layout.stripe_member_sector(stripe);
        let kinds = block_kinds(&layout, pg.parity_disks());
        let roles: Vec<usize> = (0..kinds.len()).map(|b| block_role(&layout, b)).collect();
        let stripe_bytes = pg.stripe_data_sectors() * SECTOR_BYTES;
        if !self.any_bad() && self.roles_hole(&roles, member_sector, chunk).await {
            return Ok(ScrubCounts { scrubbed_bytes: stripe_bytes, hole_bytes: stripe_bytes, ..Default::default() });
        }
        let blocks = self.read_all(&roles, member_sector, chunk).await?;
        let page = (PARITY_PAGE_SECTORS * SECTOR_BYTES) as usize;
        let mut counts = ScrubCounts { scrubbed_bytes: stripe_bytes, ..Default::default() };
        // Pages where a block is bad (bad_blocks.rs) are neither compared nor repaired: their
        // parity may be the only way to rebuild the bad data, or is known wrong already.
        let unknown_page = |p: usize| {
            let at = member_sector + p as u64 * PARITY_PAGE_SECTORS;
            roles.iter().any(|&r| self.members.slots()[r].has_bad_in(at, PARITY_PAGE_SECTORS))
        };
        let mut bad_pages = Vec::new();
        let mut unknown_pages = Vec::new();
        for p in 0..(chunk / PARITY_PAGE_SECTORS) as usize {
            if unknown_page(p) {
                unknown_pages.push(p);
                continue;
            }
            let slices: Vec<&[u8]> = blocks.iter().map(|b| &b.as_slice()[p * page..(p + 1) * page]).collect();
            if !parity::parity_matches(&slices, &kinds) {
                bad_pages.push(p);
            }
        }
        counts.mismatch_sectors = bad_pages.len() as u64 * PARITY_PAGE_SECTORS;
        counts.skipped_bad_sectors = unknown_pages.len() as u64 * PARITY_PAGE_SECTORS;
        let dd = layout.data_roles.len();
        // raid6: the syndromes may name the one wrong block of a page.
        let mut wrong_data: Vec<(usize, usize)> = Vec::new();
        for &p in &bad_pages {
            let located = if locate && kinds.contains(&BlockKind::Q) {
                let slices: Vec<&[u8]> = blocks.iter().map(|b| &b.as_slice()[p * page..(p + 1) * page]).collect();
                parity::locate_bad_block(&slices, &kinds)
            } else {
                Located::Unknown
            };
            let role = match located {
                Located::Block(b) => {
                    counts.located_sectors += PARITY_PAGE_SECTORS;
                    if b < dd {
                        wrong_data.push((b, p));
                    }
                    Some(roles[b])
                }
                _ => None,
            };
            let at = member_sector + p as u64 * PARITY_PAGE_SECTORS;
            if locate {
                self.log_mismatch(Mismatch {
                    stripe: Some(stripe),
                    member_sector: at,
                    sectors: PARITY_PAGE_SECTORS,
                    role,
                    repaired: repair,
                });
            }
            if let Some(role) = role {
                tracing::warn!(stripe, role, member_sector = at, "scrub: the member's bytes are wrong (P and Q agree)");
            }
        }
        if repair && !bad_pages.is_empty() {
            let mut blocks = blocks;
            // A data page named wrong is rebuilt from the rest (then the parity matches it);
            // only unlocated pages get their parity recomputed from possibly wrong data.
            for &(b, p) in &wrong_data {
                let mut slices: Vec<&mut [u8]> =
                    blocks.iter_mut().map(|buf| &mut buf.as_mut_slice()[p * page..(p + 1) * page]).collect();
                let rebuilt = parity::reconstruct(&mut slices, &kinds, &[b]);
                debug_assert!(rebuilt, "one block of a raid6 page can always be rebuilt");
            }
            let mut data_roles: Vec<usize> = wrong_data.iter().map(|&(b, _)| b).collect();
            data_roles.sort_unstable();
            data_roles.dedup();
            let data_writes: Vec<(usize, AlignedBuf)> =
                data_roles.iter().map(|&b| (roles[b], blocks[b].clone())).collect();
            let kept: Vec<(usize, usize, Vec<u8>)> = unknown_pages
                .iter()
                .flat_map(|&p| (dd..blocks.len()).map(move |b| (b, p)))
                .map(|(b, p)| (b, p, blocks[b].as_slice()[p * page..(p + 1) * page].to_vec()))
                .collect();
            {
                let mut slices: Vec<&mut [u8]> = blocks.iter_mut().map(|b| b.as_mut_slice()).collect();
                parity::compute_parity(&mut slices, &kinds);
            }
            for (b, p, old) in kept {
                blocks[b].as_mut_slice()[p * page..(p + 1) * page].copy_from_slice(&old);
            }
            let parity_blocks: Vec<(usize, AlignedBuf)> =
                blocks.into_iter().enumerate().skip(dd).map(|(b, buf)| (roles[b], buf)).collect();
            let results =
                join_all(parity_blocks.into_iter().chain(data_writes).map(|(role, buf)| async move {
                    (role, self.write_member(role, member_sector, buf, false).await)
                }))
                .await;
            for (role, res) in results {
                if let Err(e) = res {
                    self.member_failed(role, &e, "repair write").await;
                    return Err(RaidError::io(format!("repair of stripe {stripe} failed"), e));
                }
            }
            counts.repaired_sectors = counts.mismatch_sectors;
        }
        Ok(counts)
    }

    async fn scrub_mirror_unit(&self, layout: &Layout, unit: u64, repair: bool, locate: bool) -> Result<ScrubCounts> {
        let start = unit * MIRROR_UNIT_SECTORS;
        let end = (start + MIRROR_UNIT_SECTORS).min(layout.geometry().array_sectors());
        let _guards = self.lock_mirror_range(layout, start, end - start).await;
        let mut counts = ScrubCounts { scrubbed_bytes: (end - start) * SECTOR_BYTES, ..Default::default() };
        if self.mirror_range_hole(layout, start, end).await {
            counts.hole_bytes = counts.scrubbed_bytes;
            return Ok(counts);
        }
        let mut sector = start;
        while sector < end {
            let mapped = layout.map(sector);
            let run = mapped.len_sectors.min(end - sector).min(MIRROR_BLOCK_SECTORS - sector % MIRROR_BLOCK_SECTORS);
            // Copies marked bad there (being healed) are left out; one that reports wrong
            // bytes now is marked and left out too.
            let mut copies = mapped.copies.clone();
            copies.retain(|c| !self.members.slots()[c.role].has_bad_in(c.member_sector, run));
            let reads = join_all(copies.iter().map(|c| self.read_member(c.role, c.member_sector, run))).await;
            let mut bufs = Vec::with_capacity(reads.len());
            let mut kept = Vec::with_capacity(reads.len());
            for (c, res) in copies.iter().zip(reads) {
                match res {
                    Ok(b) => {
                        bufs.push(b);
                        kept.push(*c);
                    }
                    Err(e) => {
                        self.member_failed(c.role, &e, "check read").await;
                        if crate::integrity::corruption_of(&e).is_none() {
                            return Err(RaidError::io(format!("check of array sector {sector} failed"), e));
                        }
                    }
                }
            }
            let mut mapped = mapped;
            mapped.copies = kept;
            if bufs.len() < 2 {
                sector += run;
                continue;
            }
            // Three copies or more: a strict majority names the wrong ones; else the first
            // copy is the reference (md).
            let agreeing = |i: usize| bufs.iter().filter(|b| b.as_slice() == bufs[i].as_slice()).count();
            let majority =
                (locate && bufs.len() >= 3).then(|| (0..bufs.len()).find(|&i| agreeing(i) * 2 > bufs.len())).flatten();
            let reference = majority.unwrap_or(0);
            let differing: Vec<usize> =
                (0..bufs.len()).filter(|&i| bufs[i].as_slice() != bufs[reference].as_slice()).collect();
            if !differing.is_empty() {
                counts.mismatch_sectors += run;
                for &i in &differing {
                    let role = majority.map(|_| mapped.copies[i].role);
                    let at =
                        if role.is_some() { mapped.copies[i].member_sector } else { mapped.copies[0].member_sector };
                    if locate {
                        self.log_mismatch(Mismatch {
                            stripe: None,
                            member_sector: at,
                            sectors: run,
                            role,
                            repaired: repair,
                        });
                    }
                    if majority.is_none() {
                        break; // one entry: which copy is wrong is not known
                    }
                }
                if majority.is_some() {
                    counts.located_sectors += run;
                }
                if repair {
                    for &i in &differing {
                        let c = mapped.copies[i];
                        self.write_member(c.role, c.member_sector, bufs[reference].clone(), false)
                            .await
                            .map_err(|e| RaidError::io(format!("repair of array sector {sector} failed"), e))?;
                    }
                    counts.repaired_sectors += run;
                }
            }
            sector += run;
        }
        Ok(counts)
    }

    /// Keeps `mismatch` in the scrub's log (the first [`MISMATCH_LOG_LIMIT`]).
    fn log_mismatch(&self, mismatch: Mismatch) {
        let mut m = self.maintenance.lock();
        if m.mismatches.len() < MISMATCH_LOG_LIMIT {
            m.mismatches.push(mismatch);
        }
    }

    /// Reads `roles` at `member_sector`; blocks marked bad read as zeros (the caller skips
    /// their pages). A member that reports wrong bytes has them marked (heal.rs) and is read
    /// again around them.
    async fn read_all(&self, roles: &[usize], member_sector: u64, sectors: u64) -> Result<Vec<AlignedBuf>> {
        'attempt: for _attempt in 0..=MAX_CORRUPT_RETRIES {
            let results = join_all(roles.iter().map(|&r| self.read_around_bad(r, member_sector, sectors))).await;
            let mut out = Vec::with_capacity(roles.len());
            let mut corrupt = false;
            for (&role, res) in roles.iter().zip(results) {
                match res {
                    Ok(b) => out.push(b),
                    Err(e) => {
                        self.member_failed(role, &e, "check read").await;
                        if crate::integrity::corruption_of(&e).is_none() || !self.has_redundancy() {
                            return Err(RaidError::io(format!("check read of role {role} failed"), e));
                        }
                        corrupt = true;
                    }
                }
            }
            if corrupt {
                continue 'attempt;
            }
            return Ok(out);
        }
        Err(RaidError::new(
            ErrorKind::Io,
            format!("check read at member sector {member_sector}: members kept returning wrong bytes"),
        ))
    }

    /// Reads `[member_sector, +sectors)` of `role`, zeros where it is marked bad.
    async fn read_around_bad(&self, role: usize, member_sector: u64, sectors: u64) -> std::io::Result<AlignedBuf> {
        let slot = &self.members.slots()[role];
        if !slot.has_bad_in(member_sector, sectors) {
            return self.read_member(role, member_sector, sectors).await;
        }
        let mut out = AlignedBuf::zeroed((sectors * SECTOR_BYTES) as usize);
        let bad = slot.bad();
        let end = member_sector + sectors;
        let mut cuts: Vec<u64> = vec![member_sector];
        cuts.extend(bad.cuts(member_sector, end));
        cuts.push(end);
        for w in cuts.windows(2) {
            let (at, n) = (w[0], w[1] - w[0]);
            if bad.overlaps(at, n) {
                continue;
            }
            let buf = self.read_member(role, at, n).await?;
            out.as_mut_slice()[((at - member_sector) * SECTOR_BYTES) as usize..][..buf.len()]
                .copy_from_slice(buf.as_slice());
        }
        Ok(out)
    }
}
