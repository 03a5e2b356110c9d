//! Starting an md array: from opened members to a running [`Array`].
//!
//! ```text
//!  members ─► read_superblock_area (4 KiB at byte 4096) ─► Candidate ─► assemble ─► Assembly
//!  Assembly + members ─► start(): write-hole policy ─► bitmap (first member with a valid one)
//!     ─► Geometry + RoleMembers + spares ─► Array (MdStore: state changes go to the superblocks)
//!     ─► write intent from the bitmap, resync resumed where an unclean stop left it
//! ```
//!
//! This is the one place that decides how an assembled array comes up; with md's PPL the
//! parity log is replayed here (after an unclean stop), before the array takes writes, and a
//! dirty degraded raid5 then serves read-write. The caller opens the members (files,
//! devices, remote exports) and serves the result.

use std::sync::Arc;

use crate::SECTOR_BYTES;
use crate::bad_ranges::BadRanges;
use crate::buf::AlignedBuf;
use crate::engine::{
    Array, ArrayBuilder, Device, Direction, JournalConfig, Layout, MIN_PARITY_LOG_AREA_BYTES, ParityLogConfig,
    RoleMember, WriteHoleReport, WriteHoleStart,
};
use crate::error::{ErrorKind, RaidError, Result};
use crate::geometry::{Geometry, Level};
use crate::journal::{JOURNAL_PAGE_SECTORS, journal_seed};
use crate::md::{
    Assembly, BITMAP_STALE, Bitmap, DEVFLAG_WRITE_MOSTLY, FeatureMap, MdStore, SUPERBLOCK_BYTE_OFFSET,
    SUPERBLOCK_BYTES, decode_bad_blocks,
};
use crate::member::Member;
use crate::ppl::ppl_signature;

/// Bitmaps are at most this large (mdadm reserves up to 128 KiB).
const MAX_BITMAP_BYTES: u64 = 128 << 10;

/// How to bring the array up.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartOptions {
    /// Write nothing at all: no superblocks, no resync.
    pub read_only: bool,
    /// Serve a dirty, degraded RAID4/5/6 read-write although its parity may be stale.
    pub force: bool,
}

/// A started array.
pub struct Started<M: Member + ?Sized> {
    pub array: Array<M>,
    /// The array was dirty and degraded (parity untrusted) and was started read-only.
    pub forced_read_only: bool,
}

/// Reads the 4 KiB superblock area of a member (zeros if the member is too small to hold one).
pub async fn read_superblock_area<M: Member + ?Sized>(member: &M) -> Result<Vec<u8>> {
    if member.len_bytes() < SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64 {
        return Ok(vec![0; SUPERBLOCK_BYTES]);
    }
    let (res, buf) = member.read_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::zeroed(SUPERBLOCK_BYTES)).await;
    res.map_err(|e| RaidError::io(format!("{}: cannot read the superblock: {e}", member.name()), e))?;
    Ok(buf.as_slice().to_vec())
}

/// Starts the array `assembly` describes over `members` (indexed as the candidates were).
///
/// A dirty, degraded raid4/5/6 (the write hole: parity of stripes written at the crash may be
/// stale, so data rebuilt from it may be wrong) is started read-only unless `options.force`.
pub async fn start<M: Member + ?Sized + 'static>(
    assembly: &Assembly,
    members: &[Arc<M>],
    options: StartOptions,
) -> Result<Started<M>> {
    let mut forced_read_only = false;
    let ppl = parity_log_config(assembly)?;
    if assembly.parity_untrusted() && !options.force && !options.read_only {
        tracing::warn!(
            "array {} was not shut down cleanly and is degraded: parity of stripes being written at the \
             crash may be stale (the RAID write hole), so rebuilding missing data from it could return \
             wrong bytes. Serving READ-ONLY; restart with --force to accept the risk and allow writes.",
            assembly.metadata.name()
        );
        forced_read_only = true;
    }
    if assembly.journal_missing && !options.read_only {
        tracing::warn!(
            "array {} has a write journal, but it is missing or stale: writes could not be journaled, so the \
             array is served READ-ONLY (as md does)",
            assembly.metadata.name()
        );
        forced_read_only = true;
    }
    if !options.read_only && !forced_read_only {
        catch_up_superblocks(assembly, members).await;
    }
    let bitmap = read_bitmap(assembly, members).await?;
    let mut builder = builder(assembly, members, bitmap)?;
    for (role, bad) in read_bad_blocks(assembly, members).await? {
        tracing::warn!(role, ranges = ?bad.ranges(), "member has bad blocks: those sectors are never read from it");
        builder = builder.bad_blocks(role, bad);
    }
    if let Some((device, config)) = journal_config(assembly, members)? {
        builder = builder.journal(device, config);
    }
    if let Some(config) = ppl {
        builder = builder.parity_log(config);
    }
    let unclean = !assembly.metadata.is_clean();
    let start = WriteHoleStart { unclean, read_only: options.read_only, forced_read_only };
    // A read-only array writes nothing at all: no superblocks, no resync.
    let (array, report) = builder.start(start).await?;
    log_write_hole_start(&report, &start);
    Ok(Started { array, forced_read_only })
}

/// Writes the superblock of every member one update behind the freshest (a crash while that
/// update was written) again, at the array's event count, and flushes it, before the array
/// writes anything: a crash in the array's next update then leaves no member two updates
/// behind, which assembly would drop as stale. A member that cannot be written is left as it
/// is (its next superblock write fails it).
async fn catch_up_superblocks<M: Member + ?Sized>(assembly: &Assembly, members: &[Arc<M>]) {
    for &k in &assembly.behind {
        let member = &members[assembly.member_candidates[k]];
        let image = AlignedBuf::from_slice(&assembly.metadata.superblock_for(k).encode());
        let (written, _) = member.write_at(SUPERBLOCK_BYTE_OFFSET, image, false).await;
        let flushed = match written {
            Ok(()) => member.flush().await,
            Err(e) => Err(e),
        };
        match flushed {
            Ok(()) => tracing::info!(member = member.name(), "superblock one update behind: written again"),
            Err(e) => tracing::warn!(member = member.name(), error = %e, "cannot bring the superblock up to date"),
        }
    }
}

/// Says what the write-hole policy's start found and did.
fn log_write_hole_start(report: &WriteHoleReport, start: &WriteHoleStart) {
    let scanned_only = start.read_only || start.forced_read_only;
    match report {
        WriteHoleReport::None => {}
        WriteHoleReport::Journal(report) if scanned_only => {
            if report.units > 1 {
                tracing::warn!(
                    "the write journal holds {} units after its tail, not replayed on a read-only start: stripes \
                     written at a crash may be half written until the array is served read-write once",
                    report.units
                );
            }
        }
        WriteHoleReport::Journal(report) if report.created => {
            tracing::info!("write journal: no valid unit at its tail, a new log was started (as md does)")
        }
        WriteHoleReport::Journal(report) => tracing::info!(
            "write journal replayed: {} units, {} stripes rewritten ({} pages of missing members skipped, {} \
             data-only stripes, {} invalid payloads)",
            report.units,
            report.stripes,
            report.pages_skipped,
            report.data_only_stripes,
            report.invalid
        ),
        WriteHoleReport::ParityLog(report) if start.unclean => {
            tracing::info!(
                "unclean stop: partial parity log replayed ({} logs, {} entries, {} parity sectors rewritten; {} \
                 torn, {} with a member missing ({} of them landed whole), {} invalid)",
                report.logs,
                report.entries_replayed,
                report.parity_sectors,
                report.entries_torn,
                report.entries_degraded,
                report.entries_landed,
                report.entries_invalid
            );
            if report.parity_sectors_bad > 0 {
                tracing::warn!(
                    "{} parity sectors marked bad: writes in flight at the crash on the missing member cannot be \
                     rebuilt there, so reads of those sectors fail until they are written again",
                    report.parity_sectors_bad
                );
            }
        }
        WriteHoleReport::ParityLog(_) => {}
    }
}

/// The PPL area of an md array that has one, checked to lie between the superblock and the
/// data on every member.
fn parity_log_config(assembly: &Assembly) -> Result<Option<ParityLogConfig>> {
    let meta = &assembly.metadata;
    let Some((offset_sectors, size_sectors)) = meta.ppl_area() else { return Ok(None) };
    let bad = |why: String| RaidError::new(ErrorKind::CannotAssemble, format!("array {}: PPL {why}", meta.name()));
    if meta.level != Level::Raid5 {
        return Err(bad(format!("on {} (md's PPL is raid5 only)", meta.level)));
    }
    let start = SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(offset_sectors) * 512;
    let len = u64::from(size_sectors) * SECTOR_BYTES;
    let data_start = meta.members.iter().map(|m| m.data_offset).min().unwrap_or(0) * SECTOR_BYTES;
    if start < (SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64) as i64 || start as u64 + len > data_start {
        return Err(bad(format!("area at byte {start} of {len} bytes overlaps the superblock or the data")));
    }
    if len < MIN_PARITY_LOG_AREA_BYTES {
        return Err(bad(format!("area of {len} bytes is too small (raidnbd needs {MIN_PARITY_LOG_AREA_BYTES})")));
    }
    Ok(Some(ParityLogConfig {
        area_offset_bytes: start as u64,
        area_bytes: len,
        signature: ppl_signature(meta.uuid.0),
        max_data_crcs: crate::ppl::MAX_DATA_CRCS,
    }))
}

/// The journal device and its ring, when the array has one.
fn journal_config<M: Member + ?Sized>(
    assembly: &Assembly,
    members: &[Arc<M>],
) -> Result<Option<(Device<M>, JournalConfig)>> {
    let meta = &assembly.metadata;
    let Some(candidate) = assembly.journal else { return Ok(None) };
    let index = assembly.member_index_of_candidate(candidate).expect("the journal has a record");
    let record = &meta.members[index];
    let bad = |why: String| RaidError::new(ErrorKind::CannotAssemble, format!("array {}: journal {why}", meta.name()));
    if meta.level.parity_blocks() == 0 {
        return Err(bad(format!("on {} (md's journal is for raid4/5/6)", meta.level)));
    }
    if meta.ppl_area().is_some() || meta.bitmap_offset().is_some() {
        return Err(bad("together with a PPL or a bitmap (md refuses both)".into()));
    }
    let area_sectors = record.data_size / JOURNAL_PAGE_SECTORS * JOURNAL_PAGE_SECTORS;
    let tail = meta.journal_tail;
    let tail_sectors = if tail < area_sectors && tail.is_multiple_of(JOURNAL_PAGE_SECTORS) { tail } else { 0 };
    let device =
        Device { id: index, member: members[candidate].clone(), data_offset_bytes: record.data_offset * SECTOR_BYTES };
    let config = JournalConfig {
        area_offset_bytes: record.data_offset * SECTOR_BYTES,
        area_sectors,
        seed: journal_seed(meta.uuid.0),
        tail_sectors,
    };
    Ok(Some((device, config)))
}

/// Reads the internal write-intent bitmap from the first member that has a valid one.
/// A missing or unreadable bitmap is logged and ignored (a crash then costs a full resync);
/// a kind raidnbd does not keep (md-cluster's, md's lockless one) stops the start.
async fn read_bitmap<M: Member + ?Sized>(assembly: &Assembly, members: &[Arc<M>]) -> Result<Option<Bitmap>> {
    let meta = &assembly.metadata;
    let Some(offset_sectors) = meta.bitmap_offset().map(i64::from) else { return Ok(None) };
    for (role, candidate) in assembly.members.iter().enumerate() {
        let Some(c) = *candidate else { continue };
        let Some(index) = assembly.member_index_of_candidate(c) else { continue };
        let start = (SUPERBLOCK_BYTE_OFFSET as i64 + offset_sectors * 512) as u64;
        let end = meta.members[index].data_offset * SECTOR_BYTES;
        let len = end.saturating_sub(start).min(MAX_BITMAP_BYTES) / 4096 * 4096;
        if len == 0 {
            continue;
        }
        let (res, buf) = members[c].read_at(start, AlignedBuf::zeroed(len as usize)).await;
        if let Err(e) = res {
            tracing::warn!(role, "cannot read the bitmap: {e}");
            continue;
        }
        match Bitmap::decode(buf.as_slice(), meta.uuid) {
            Ok(bitmap) => return Ok(Some(bitmap)),
            // A kind of bitmap raidnbd cannot keep: running without it would leave md's copy
            // behind the data (a later kernel trusts it).
            Err(e) if e.kind == ErrorKind::CannotAssemble => {
                return Err(RaidError::new(ErrorKind::CannotAssemble, format!("array {}: {e}", meta.name())));
            }
            Err(e) => tracing::warn!(role, "{e}"),
        }
    }
    tracing::warn!("the array has an internal bitmap but none could be read: an unclean stop will resync everything");
    Ok(None)
}

/// The bad-block logs of the members that have a non-empty one, as member sectors from
/// each one's data offset. A log that cannot be read or decoded stops the start (md refuses
/// such a device too): without it, sectors known bad could be trusted.
async fn read_bad_blocks<M: Member + ?Sized>(
    assembly: &Assembly,
    members: &[Arc<M>],
) -> Result<Vec<(usize, BadRanges)>> {
    let meta = &assembly.metadata;
    let mut out = Vec::new();
    for (role, candidate) in assembly.members.iter().enumerate() {
        let Some(c) = *candidate else { continue };
        let Some(index) = assembly.member_index_of_candidate(c) else { continue };
        let record = &meta.members[index];
        if !record.features.contains(FeatureMap::BAD_BLOCKS) || record.bblog_size == 0 {
            continue;
        }
        let at = (SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(record.bblog_offset) * 512) as u64;
        let len = usize::from(record.bblog_size) * SECTOR_BYTES as usize;
        let name = members[c].name().to_string();
        let (res, image) = members[c].read_at(at, AlignedBuf::zeroed(len)).await;
        res.map_err(|e| RaidError::io(format!("{name}: cannot read the bad-block log"), e))?;
        let device_sectors = decode_bad_blocks(image.as_slice(), record.bblog_shift)
            .map_err(|e| RaidError::new(ErrorKind::BadMetadata, format!("{name}: {e}")))?;
        let data_offset = record.data_offset;
        let bad = BadRanges::from_ranges(device_sectors.ranges().iter().filter(|&&(s, l)| s + l > data_offset).map(
            |&(s, l)| {
                let start = s.max(data_offset);
                (start - data_offset, s + l - start)
            },
        ));
        if !bad.is_empty() {
            out.push((role, bad));
        }
    }
    Ok(out)
}

/// The engine's builder from an assembly plan and the opened members (by candidate index).
fn builder<M: Member + ?Sized>(
    assembly: &Assembly,
    members: &[Arc<M>],
    bitmap: Option<Bitmap>,
) -> Result<ArrayBuilder<M>> {
    let meta = &assembly.metadata;
    let roles = assembly.members.len();
    let member_index = |role: usize| assembly.members[role].and_then(|c| assembly.member_index_of_candidate(c));
    let member_sectors: Vec<u64> = (0..roles)
        .map(|role| match meta.level {
            Level::Linear | Level::Raid0 => member_index(role).map_or(0, |i| meta.members[i].data_size),
            _ => meta.size,
        })
        .collect();
    let invalid = |e: crate::geometry::GeometryError| {
        RaidError::new(ErrorKind::CannotAssemble, format!("array {}: {e}", meta.name()))
    };
    // Mid-reshape (md/reshape.rs): the new layout and the previous one, from the devices'
    // common origin: the lower of the two data starts (the new one going forward, into the
    // headroom; the old one going backwards, the new layout after it).
    let reshape = meta.reshape_state()?;
    let new_roles = (meta.raid_disks as usize).min(roles);
    let (geometry, origin_shift_sectors) = match &reshape {
        None => (Geometry::new(meta.level, meta.layout, meta.chunk_sectors, &member_sectors).map_err(invalid)?, 0),
        Some(r) => (
            Geometry::new(meta.level, r.new_layout, r.new_chunk_sectors, &member_sectors[..new_roles])
                .map_err(invalid)?,
            if r.is_backwards() { 0 } else { r.offset_delta_sectors.unsigned_abs() },
        ),
    };
    let origin_bytes = |data_offset: u64| (data_offset - origin_shift_sectors) * SECTOR_BYTES;
    let role_members: Vec<Option<RoleMember<M>>> = (0..roles)
        .map(|role| {
            let candidate = assembly.members[role]?;
            let index = member_index(role)?;
            let record = &meta.members[index];
            Some(RoleMember {
                member: members[candidate].clone(),
                data_offset_bytes: origin_bytes(record.data_offset),
                recovery_offset_sectors: record.recovery_offset,
                device_id: index,
            })
        })
        .collect();
    let spares: Vec<Device<M>> = assembly
        .spares
        .iter()
        .filter_map(|&c| {
            let index = assembly.member_index_of_candidate(c)?;
            Some(Device {
                id: index,
                member: members[c].clone(),
                data_offset_bytes: origin_bytes(meta.members[index].data_offset),
            })
        })
        .collect();
    let mut store_meta = meta.clone();
    if store_meta.features.intersects(FeatureMap::ANY_PPL) {
        // raidnbd appends headers in the area, as the kernel's "multiple PPLs" does, and
        // says so the same way.
        store_meta.features.remove(FeatureMap::PPL);
        store_meta.features.insert(FeatureMap::MULTIPLE_PPLS);
    }
    let mut store = MdStore::new(store_meta, vec![true; meta.members.len()]);
    let mut intent = None;
    if let Some(bitmap) = bitmap {
        let chunks = bitmap.chunks();
        // A bitmap older than the superblocks may have missed writes: trust none of it.
        let stale = bitmap.events < meta.events || bitmap.state & BITMAP_STALE != 0;
        let dirty: Vec<u64> = if stale && !meta.is_clean() {
            tracing::warn!("the write-intent bitmap is stale: resyncing the whole array");
            (0..chunks).collect()
        } else {
            (0..chunks).filter(|&c| bitmap.is_set(c)).collect()
        };
        if !meta.is_clean() {
            tracing::info!("unclean stop: {} of {chunks} bitmap chunks to resync", dirty.len());
        }
        intent = Some((bitmap.chunk_sectors(), chunks, dirty));
        store = store.with_bitmap(bitmap);
    }
    let write_mostly: Vec<usize> = (0..roles)
        .filter(|&role| member_index(role).is_some_and(|i| meta.members[i].devflags & DEVFLAG_WRITE_MOSTLY != 0))
        .collect();
    let mut builder =
        ArrayBuilder::new(geometry, role_members).metadata(Box::new(store)).dirty(!meta.is_clean()).spares(spares);
    for role in write_mostly {
        builder = builder.write_mostly(role);
    }
    if let Some((chunk_sectors, chunks, dirty)) = intent {
        builder = builder.write_intent(chunk_sectors, chunks, &dirty);
    }
    if !meta.is_clean() && meta.resync_offset != 0 {
        builder = builder.resync_from(meta.resync_offset);
    }
    if let Some(r) = reshape {
        let previous =
            Geometry::new(meta.level, meta.layout, meta.chunk_sectors, &member_sectors[..r.previous_raid_disks])
                .map_err(invalid)?;
        let (previous_shift, new_shift, direction) = if r.is_backwards() {
            (0, r.offset_delta_sectors as u64, Direction::Backward)
        } else {
            (origin_shift_sectors, 0, Direction::Forward)
        };
        builder = builder.reshaping(Layout::new(previous, previous_shift), new_shift, r.position_sectors, direction);
    }
    Ok(builder)
}
