//! Replay of the journal at start: every whole unit from the tail, in seq order, rewrites
//! the stripes it logged from its pages, so every stripe holds the data of a whole logged
//! write (or an older one) with matching parity, whatever part of its member writes landed.

use std::hash::{BuildHasher, Hasher};

use super::Journal;
use super::ring::Unit;
use crate::buf::AlignedBuf;
use crate::engine::Array;
use crate::error::{ErrorKind, RaidError, Result};
use crate::journal::{JOURNAL_PAGE_BYTES, JOURNAL_PAGE_SECTORS, MetaBlock, Payload, RECOVERY_SEQ_STEP, crc32c_le};
use crate::member::Member;

/// What the start found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalReport {
    /// No valid unit at the tail: a new log was started (md does the same).
    pub created: bool,
    /// Whole units replayed.
    pub units: u64,
    /// Stripes (4 KiB rows) rewritten from their pages.
    pub stripes: u64,
    /// Stripes with data but no parity in a unit (md's data-only stripes, from its
    /// write-back mode: the start fails rather than lose them).
    pub data_only_stripes: u64,
    /// Pages not written because their member is missing.
    pub pages_skipped: u64,
    /// Payloads no writer makes (outside the array, wrong parity sector): replay stopped there.
    pub invalid: u64,
}

impl<M: Member + ?Sized> Journal<M> {
    /// With `replay` (a start that may write): replays the ring from the tail, then writes an
    /// empty meta block where the log ended, flushes and records it as the new tail, as md
    /// does; every logged write is then on the members, so nothing needs a resync. Without:
    /// what a start would replay, writing nothing (read-only starts).
    pub(super) async fn walk(&self, array: &Array<M>, replay: bool) -> Result<JournalReport> {
        let j = self;
        let mut report = JournalReport::default();
        let ring = j.ring();
        let io = |e: std::io::Error| RaidError::io(format!("{}: write journal", j.device.member.name()), e);
        let tail = j.config.tail_sectors;
        let first = self.read_ring(tail, JOURNAL_PAGE_BYTES).await.map_err(io)?;
        let (mut position, mut seq) = match MetaBlock::decode(first.as_slice(), j.config.seed) {
            Ok(mb) if mb.position == tail => (tail, mb.seq),
            other => {
                tracing::info!(tail, found = ?other.err(), "no valid journal unit at the tail: starting a new log");
                report.created = true;
                (0, random_seq())
            }
        };
        if report.created && !replay {
            return Ok(report);
        }
        if !report.created {
            // Whole units, in seq order, until one is not (at most a ring's worth).
            for _ in 0..ring / JOURNAL_PAGE_SECTORS {
                let meta = self.read_ring(position, JOURNAL_PAGE_BYTES).await.map_err(io)?;
                let Ok(mb) = MetaBlock::decode(meta.as_slice(), j.config.seed) else { break };
                if mb.seq != seq || mb.position != position || mb.unit_sectors() >= ring {
                    break;
                }
                let pages_at = (position + JOURNAL_PAGE_SECTORS) % ring;
                let pages = self.read_ring(pages_at, mb.pages() * JOURNAL_PAGE_BYTES).await.map_err(io)?;
                if !self.unit_whole(&mb, pages.as_slice()) {
                    break;
                }
                if !self.replay_unit(array, &mb, pages.as_slice(), replay, &mut report).await? {
                    break;
                }
                report.units += 1;
                position = (position + mb.unit_sectors()) % ring;
                seq += 1;
            }
            if !replay {
                return Ok(report);
            }
            if report.data_only_stripes > 0 {
                // Only md's write-back mode leaves those: their data is acknowledged and
                // lives only in the log. raidnbd does not rebuild them; md does.
                return Err(RaidError::new(
                    ErrorKind::CannotAssemble,
                    format!(
                        "the write journal holds {} stripes of data without parity (md's write-back mode): assemble \
                         the array with mdadm once to write them to the members",
                        report.data_only_stripes
                    ),
                ));
            }
            seq += RECOVERY_SEQ_STEP;
            array.flush().await?;
        }
        let empty = MetaBlock { seq, position, payloads: Vec::new() }.encode(j.config.seed);
        self.write_ring(position, AlignedBuf::from_slice(&empty)).await.map_err(io)?;
        array.record_journal_tail(position).await?;
        {
            let mut st = j.lock();
            st.tail = position;
            st.head = (position + JOURNAL_PAGE_SECTORS) % ring;
            st.next_seq = seq + 1;
            st.units.clear();
            // The empty unit occupies its block until the tail moves past it.
            st.units.push_back(Unit { seq, position, durable: true, done: true });
        }
        array.check_survives("journal start")?;
        array.mark_resynced();
        Ok(report)
    }

    /// Every page of the unit matches its checksum (else the unit was torn by the crash).
    fn unit_whole(&self, mb: &MetaBlock, pages: &[u8]) -> bool {
        let seed = self.config.seed;
        let mut at = 0;
        for p in &mb.payloads {
            let sums: &[u32] = match p {
                Payload::Data { checksum, .. } => std::slice::from_ref(checksum),
                Payload::Parity { checksums, .. } => checksums,
                Payload::Flush { .. } => &[],
            };
            for &sum in sums {
                if crc32c_le(seed, &pages[at..at + JOURNAL_PAGE_BYTES]) != sum {
                    return false;
                }
                at += JOURNAL_PAGE_BYTES;
            }
        }
        true
    }

    /// Writes (with `write`) the stripes of one whole unit that have parity in it. `false` when a payload
    /// is one no writer makes (replay stops there, as at a torn unit).
    async fn replay_unit(
        &self,
        array: &Array<M>,
        mb: &MetaBlock,
        pages: &[u8],
        write: bool,
        report: &mut JournalReport,
    ) -> Result<bool> {
        let layout = array.layout();
        let pg = layout.parity().expect("journal arrays have parity");
        let chunk = u64::from(pg.chunk_sectors());
        let dd = pg.data_disks() as u64;
        let member_sectors = layout.geometry().member_sectors(0);
        let mut rows: Vec<ReplayRow> = Vec::new();
        let mut page = 0usize;
        for p in &mb.payloads {
            let (row, writes, parity) = match p {
                Payload::Data { array_sector, .. } => {
                    if array_sector.saturating_add(JOURNAL_PAGE_SECTORS) > layout.geometry().array_sectors()
                        || !array_sector.is_multiple_of(JOURNAL_PAGE_SECTORS)
                    {
                        report.invalid += 1;
                        return Ok(false);
                    }
                    let stripe = array_sector / (dd * chunk);
                    let k = ((array_sector % (dd * chunk)) / chunk) as usize;
                    let row = pg.stripe_member_sector(stripe) + array_sector % chunk;
                    (row, vec![(pg.stripe(stripe).data_roles[k], page)], false)
                }
                Payload::Parity { member_sector, checksums, .. } => {
                    let expected = 1 + usize::from(pg.stripe(0).q_role.is_some());
                    if member_sector.saturating_add(JOURNAL_PAGE_SECTORS) > member_sectors
                        || !member_sector.is_multiple_of(JOURNAL_PAGE_SECTORS)
                        || checksums.len() != expected
                    {
                        report.invalid += 1;
                        return Ok(false);
                    }
                    let layout = pg.stripe(member_sector / chunk);
                    let mut w = vec![(layout.p_role, page)];
                    if let Some(q) = layout.q_role {
                        w.push((q, page + 1));
                    }
                    (*member_sector, w, true)
                }
                Payload::Flush { .. } => continue,
            };
            page += p.pages();
            match rows.iter_mut().find(|r| r.member_sector == row) {
                Some(r) => {
                    r.pages.extend(writes);
                    r.has_parity |= parity;
                }
                None => rows.push(ReplayRow { member_sector: row, pages: writes, has_parity: parity }),
            }
        }
        for ReplayRow { member_sector: row, pages: writes, has_parity } in rows {
            if !has_parity {
                report.data_only_stripes += 1;
                continue;
            }
            report.stripes += 1;
            if !write {
                continue;
            }
            for (role, page) in writes {
                if !array.members.slots()[role].is_writable() {
                    report.pages_skipped += 1;
                    continue;
                }
                let bytes = &pages[page * JOURNAL_PAGE_BYTES..(page + 1) * JOURNAL_PAGE_BYTES];
                if let Err(e) = array.write_member(role, row, AlignedBuf::from_slice(bytes), false).await {
                    array.member_failed(role, &e, "journal replay").await;
                }
            }
        }
        Ok(true)
    }
}

/// One stripe row of a unit being replayed.
struct ReplayRow {
    member_sector: u64,
    /// (role, page index in the unit) to write.
    pages: Vec<(usize, usize)>,
    /// The unit has the row's parity (else md's data-only stripe: not written).
    has_parity: bool,
}

/// A random first seq for a new log (md: `get_random_u32()`).
fn random_seq() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6433_c509);
    u64::from(h.finish() as u32)
}
