//! Replay of the partial parity log at start, after an unclean stop: parity of each logged
//! stripe := its partial parity XOR the modified data now on the members, so parity agrees
//! with the data whatever part of the write landed.
//!
//! With a data member missing, the rows it cannot replay are marked bad (bad_blocks.rs),
//! unless the entry's data checksums (raidnbd's, in the header's reserved bytes) show its
//! write landed whole: acknowledged data on a lost member never reads as an error, and a
//! row whose parity matches neither old nor new data never reads as garbage.

use std::sync::atomic::Ordering;

use futures::future::join_all;

use super::ParityLog;
use crate::SECTOR_BYTES;
use crate::buf::AlignedBuf;
use crate::engine::Array;
use crate::error::{RaidError, Result};
use crate::member::Member;
use crate::ppl::{DataChecksums, PPL_HEADER_BYTES, PplHeader, newest_header, ppl_checksum};

/// What replay at start found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Logs with a valid newest header.
    pub logs: usize,
    pub entries_replayed: u64,
    /// Entries whose partial parity does not match its checksum: a log write torn by the
    /// crash, whose member writes therefore never started.
    pub entries_torn: u64,
    /// Entries with rows not replayed because a modified data member is missing (its data
    /// was in flight: md does the same).
    pub entries_degraded: u64,
    /// Of those, entries whose data checksums (raidnbd's, in the header) show the write
    /// landed whole: the lost block rebuilds as its new data, nothing is marked.
    pub entries_landed: u64,
    /// Parity sectors of the other degraded rows marked bad: rows where another block was
    /// written too, so parity may match neither the old nor the new data and the lost chunk
    /// cannot be rebuilt there (reads of it fail instead of returning garbage).
    pub parity_sectors_bad: u64,
    /// Entries no writer makes (bad span, wrong parity member): the array then resyncs.
    pub entries_invalid: u64,
    /// Parity sectors rewritten.
    pub parity_sectors: u64,
}

impl ParityLog {
    /// At start: after an unclean stop, replays every member's newest header (parity of each
    /// logged stripe := partial parity XOR its modified data); then clears every log area and
    /// writes an empty header, as md does. When the replay covered everything the array is
    /// in sync: no resync follows.
    pub(super) async fn start_log<M: Member + ?Sized>(&self, array: &Array<M>, unclean: bool) -> Result<ReplayReport> {
        let log = self;
        let mut report = ReplayReport::default();
        let roles: Vec<usize> =
            (0..array.members.slots().len()).filter(|&r| array.members.slots()[r].is_writable()).collect();
        let mut max_generation = 0;
        for &role in &roles {
            let member = array.members.slots()[role].member();
            let (res, area) =
                member.read_at(log.config.area_offset_bytes, AlignedBuf::zeroed(log.config.area_bytes as usize)).await;
            res.map_err(|e| RaidError::io(format!("{}: cannot read the parity log", member.name()), e))?;
            let Some((at, header)) = newest_header(area.as_slice(), log.config.signature) else {
                tracing::warn!(role, member = member.name(), "no valid parity log header");
                continue;
            };
            report.logs += 1;
            max_generation = max_generation.max(header.generation);
            if unclean {
                let data = PplHeader::data_checksums(&area.as_slice()[at..]);
                let pp_area = &area.as_slice()[at + PPL_HEADER_BYTES..];
                self.replay_header(array, role, &header, &data, pp_area, &mut report).await?;
            }
        }
        if unclean {
            array.flush().await?;
        }
        log.generation.fetch_max(max_generation, Ordering::AcqRel);
        // Empty headers over cleared areas (a stale chain must not follow a new header).
        let results = join_all(roles.iter().map(|&role| {
            let member = array.members.slots()[role].member();
            async move { (role, log.clear_area(&*member).await) }
        }))
        .await;
        for (role, res) in results {
            match res {
                Ok(()) => log.cleared(role, array.members.slots()[role].device().map(|d| d.id)),
                Err(e) => array.member_failed(role, &e, "parity log reset").await,
            }
        }
        array.check_survives("parity log start")?;
        if unclean && report.entries_invalid == 0 && report.logs == roles.len() {
            array.mark_resynced();
        }
        Ok(report)
    }

    /// Replays one header's entries on the parity member `role`, in order.
    async fn replay_header<M: Member + ?Sized>(
        &self,
        array: &Array<M>,
        role: usize,
        header: &PplHeader,
        data: &DataChecksums,
        pp_area: &[u8],
        report: &mut ReplayReport,
    ) -> Result<()> {
        let layout = array.layout();
        let pg = layout.parity().expect("raid5 has parity");
        let chunk = u64::from(pg.chunk_sectors());
        let dd = pg.data_disks() as u64;
        let mut pp_at = 0usize;
        // Where the next entry's data checksums start; None once an entry's count is unknown.
        let mut crc_at = Some(0usize);
        for (i, e) in header.entries.iter().enumerate() {
            let pp_len = e.pp_size as usize;
            let pp = pp_area.get(pp_at..pp_at + pp_len);
            pp_at += pp_len;
            let span = e.span(chunk, dd).filter(|s| s.end_sector <= layout.geometry().array_sectors());
            let mut crcs: Option<&[u32]> = None;
            if i < data.entries {
                crc_at = crc_at.zip(span).map(|(at, span)| {
                    let blocks = span.modified_disks(chunk);
                    let n = if crate::ppl::carries_data_crcs(blocks) { blocks as usize } else { 0 };
                    crcs = data.crcs.get(at..at + n).filter(|c| !c.is_empty());
                    at + n
                });
            }
            let (Some(pp), Some(span)) = (pp, span) else {
                report.entries_invalid += 1;
                continue;
            };
            if e.parity_disk as usize != role {
                report.entries_invalid += 1;
                continue;
            }
            if ppl_checksum(pp) != e.checksum {
                report.entries_torn += 1;
                continue;
            }
            let mut parity = vec![0u8; (span.rows * SECTOR_BYTES) as usize];
            let mut row_ok = vec![true; span.rows as usize];
            // Data blocks the entry's write modified, per row.
            let mut modified = vec![0u32; span.rows as usize];
            // Per modified block: the CRC-32C of its rows now, if it is here whole.
            let mut block_crcs: Vec<Option<u32>> = Vec::with_capacity(span.data_disks as usize);
            for disk in 0..span.data_disks {
                let start = span.first_sector + disk * chunk;
                let rows = span.rows.min(span.end_sector.saturating_sub(start));
                if rows == 0 {
                    continue;
                }
                modified[..rows as usize].iter_mut().for_each(|m| *m += 1);
                let mut crc = (rows == span.rows).then_some(0u32);
                let mut row = 0;
                while row < rows {
                    let mapped = layout.map(start + row);
                    let n = mapped.len_sectors.min(rows - row);
                    let copy = mapped.copies[0];
                    if !array.members.slots()[copy.role].is_readable(copy.member_sector, n) {
                        row_ok[row as usize..(row + n) as usize].fill(false);
                        crc = None;
                    } else {
                        let buf = array.read_member(copy.role, copy.member_sector, n).await.map_err(|err| {
                            RaidError::io(format!("parity log replay: cannot read role {}", copy.role), err)
                        })?;
                        let at = (row * SECTOR_BYTES) as usize;
                        crate::parity::xor_into(&mut parity[at..at + buf.len()], buf.as_slice());
                        crc = crc.map(|c| crc32c::crc32c_append(c, buf.as_slice()));
                    }
                    row += n;
                }
                block_crcs.push(crc);
            }
            if !pp.is_empty() {
                let n = parity.len().min(pp.len());
                crate::parity::xor_into(&mut parity[..n], &pp[..n]);
            }
            let degraded = row_ok.iter().any(|ok| !ok);
            if degraded {
                report.entries_degraded += 1;
            }
            // A write whose data checksums show it landed whole (its other blocks hold their
            // new data, and parity rebuilds the lost one as its new data): nothing to mark.
            let landed = match crcs {
                Some(crcs) if degraded => self.landed_whole(array, role, &span, crcs, &block_crcs, &parity).await?,
                _ => false,
            };
            if landed {
                report.entries_landed += 1;
            }
            // Rows that cannot be replayed: parity may be a mix of the old and new data of
            // several blocks. Marked bad, so the lost chunk reads as an error there.
            let mut row = 0u64;
            while row < span.rows && !landed {
                let unknown = |row: u64| !row_ok[row as usize] && modified[row as usize] >= 2;
                if !unknown(row) {
                    row += 1;
                    continue;
                }
                let (stripe, _, r) = pg.locate(span.first_sector + row);
                let mut n = 1;
                while row + n < span.rows && unknown(row + n) && pg.locate(span.first_sector + row + n).0 == stripe {
                    n += 1;
                }
                if pg.stripe(stripe).p_role == role {
                    array.mark_bad(role, pg.stripe_member_sector(stripe) + u64::from(r), n).await?;
                    report.parity_sectors_bad += n;
                }
                row += n;
            }
            // Parity of each row, in runs of rows that are replayable and contiguous on the member.
            let mut row = 0u64;
            while row < span.rows {
                if !row_ok[row as usize] {
                    row += 1;
                    continue;
                }
                let (stripe, _, r) = pg.locate(span.first_sector + row);
                let layout = pg.stripe(stripe);
                let member_sector = pg.stripe_member_sector(stripe) + u64::from(r);
                let mut n = 1;
                while row + n < span.rows
                    && row_ok[(row + n) as usize]
                    && pg.locate(span.first_sector + row + n).0 == stripe
                {
                    n += 1;
                }
                if layout.p_role != role {
                    report.entries_invalid += 1;
                    break;
                }
                let at = (row * SECTOR_BYTES) as usize;
                let buf = AlignedBuf::from_slice(&parity[at..at + (n * SECTOR_BYTES) as usize]);
                array
                    .write_member(role, member_sector, buf, false)
                    .await
                    .map_err(|err| RaidError::io("parity log replay: cannot write parity", err))?;
                report.parity_sectors += n;
                row += n;
            }
            report.entries_replayed += 1;
        }
        Ok(())
    }
}

impl ParityLog {
    /// Whether a degraded entry's write landed whole: every modified block that is here holds
    /// the new data its checksum names, and the one missing block, rebuilt from the parity on
    /// `role` and `partial` (the XOR of the partial parity and the blocks that are here), does
    /// too. One block must be missing (raid5).
    async fn landed_whole<M: Member + ?Sized>(
        &self,
        array: &Array<M>,
        role: usize,
        span: &crate::ppl::EntrySpan,
        crcs: &[u32],
        block_crcs: &[Option<u32>],
        partial: &[u8],
    ) -> Result<bool> {
        let missing: Vec<usize> = (0..block_crcs.len()).filter(|&d| block_crcs[d].is_none()).collect();
        let [lost] = missing[..] else { return Ok(false) };
        if crcs.len() != block_crcs.len() || (0..crcs.len()).any(|d| d != lost && block_crcs[d] != Some(crcs[d])) {
            return Ok(false);
        }
        let layout = array.layout();
        let pg = layout.parity().expect("raid5 has parity");
        let (stripe, _, r) = pg.locate(span.first_sector);
        if pg.stripe(stripe).p_role != role || u64::from(r) + span.rows > u64::from(pg.chunk_sectors()) {
            return Ok(false);
        }
        let at = pg.stripe_member_sector(stripe) + u64::from(r);
        let mut rebuilt = array
            .read_member(role, at, span.rows)
            .await
            .map_err(|err| RaidError::io("parity log replay: cannot read parity", err))?;
        crate::parity::xor_into(rebuilt.as_mut_slice(), partial);
        Ok(ppl_checksum(rebuilt.as_slice()) == crcs[lost])
    }
}
