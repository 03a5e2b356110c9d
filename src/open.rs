//! Opening members and assembling the array they form.
//!
//! ```text
//!  paths ─► open_member (io_uring / threads / inline, O_DIRECT) ─► optional Throttled ─► optional Faulty
//!        ─► optional MeteredMember (serve --metrics) ─► Arc<dyn Member>
//!        ─► read 4 KiB at byte 4096 ─► md::Candidate ─► md::assemble ─► Geometry + RoleMembers
//!        ─► engine::Array (with MdStore: state changes go to the superblocks)
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use member_io::{DirectMode, FaultControl, Faulty, OpenOptions, ThrottleConfig, Throttled};
use raid_core::engine::{Array, Device, RoleMember};
use raid_core::geometry::{Geometry, Level};
use raid_core::md::{
    self, Assembly, BITMAP_STALE, Bitmap, Candidate, MdUuid, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES, Superblock,
};
use raid_core::md_store::MdStore;
use raid_core::{AlignedBuf, Member, SECTOR_BYTES};

use crate::cli::{IoEngine, MemberIoArgs};

/// Fault switches of the members opened with fault injection, by member name.
pub type FaultRegistry = Arc<Mutex<HashMap<String, Arc<FaultControl>>>>;

/// How to open members.
#[derive(Clone)]
pub struct MemberOpenOptions {
    pub io: MemberIoArgs,
    pub read_only: bool,
    /// Wrap every member in a fault injector registered here (testing).
    pub faults: Option<FaultRegistry>,
    /// Record every member's I/O in these export metrics (`serve --metrics`).
    pub metrics: Option<Arc<crate::metrics::ExportMetrics>>,
}

impl MemberOpenOptions {
    fn backend_options(&self) -> OpenOptions {
        OpenOptions {
            engine: match self.io.io {
                IoEngine::Auto => member_io::IoEngine::Auto,
                IoEngine::Uring => member_io::IoEngine::Uring,
                IoEngine::Threads => member_io::IoEngine::Threads,
                IoEngine::Inline => member_io::IoEngine::Inline,
            },
            direct: if self.io.buffered { DirectMode::Off } else { DirectMode::Auto },
            read_only: self.read_only,
        }
    }

    fn throttle(&self) -> ThrottleConfig {
        ThrottleConfig { bytes_per_sec: self.io.member_bw, iops: self.io.member_iops, ..ThrottleConfig::default() }
    }
}

/// Opens one member with the chosen engine, throttled and fault-injectable if asked.
/// Members are named by their canonical path, so `ctl` can name them from anywhere.
pub fn open_member(path: &str, options: &MemberOpenOptions) -> Result<Arc<dyn Member>> {
    let canonical = std::fs::canonicalize(path).with_context(|| format!("cannot open member {path}"))?;
    let name = canonical.to_string_lossy().into_owned();
    let mut member = member_io::open_member(&canonical, &options.backend_options())
        .with_context(|| format!("cannot open member {path}"))?;
    let throttle = options.throttle();
    if throttle.is_active() {
        let throttled = Throttled::new(member, &throttle).with_context(|| format!("cannot throttle member {path}"))?;
        member = Arc::new(throttled);
    }
    if let Some(registry) = &options.faults {
        let control = FaultControl::new();
        registry.lock().expect("fault registry").insert(name, control.clone());
        member = Arc::new(Faulty::new(member, control));
    }
    if let Some(metrics) = &options.metrics {
        member = metrics.meter_member(member);
    }
    Ok(member)
}

/// Reads the 4 KiB superblock area of a member (zeros past its end).
pub async fn read_superblock_area(member: &dyn Member) -> Result<Vec<u8>> {
    let len = member.len_bytes();
    if len < SUPERBLOCK_BYTE_OFFSET + SUPERBLOCK_BYTES as u64 {
        return Ok(vec![0; SUPERBLOCK_BYTES]);
    }
    let (res, buf) = member.read_at(SUPERBLOCK_BYTE_OFFSET, AlignedBuf::zeroed(SUPERBLOCK_BYTES)).await;
    res.with_context(|| format!("{}: cannot read the superblock", member.name()))?;
    Ok(buf.as_slice().to_vec())
}

/// An assembled, running array and how it was put together.
pub struct OpenedArray {
    pub array: Arc<Array<dyn Member>>,
    pub assembly: Assembly,
    /// Paths by candidate index (the members that could be opened, in the order given).
    pub paths: Vec<String>,
    /// Named members that could not be opened, counted as absent.
    pub absent: Vec<String>,
    /// The array was dirty and degraded (parity untrusted) and is served read-only.
    pub forced_read_only: bool,
}

/// Opens `paths`, assembles the array they form, and starts it.
///
/// A named member that does not exist or cannot be opened (a dead disk whose device node
/// vanished) counts as absent, with a warning: the array starts degraded if redundancy
/// allows, so one dead disk is not an outage at the next start. `require_all` refuses instead.
/// A dirty, degraded raid4/5/6 (the write hole) is opened read-only unless `force`.
pub async fn open_array(
    paths: &[String],
    options: &MemberOpenOptions,
    force: bool,
    require_all: bool,
) -> Result<OpenedArray> {
    if paths.is_empty() {
        bail!("no members given");
    }
    let mut members = Vec::with_capacity(paths.len());
    let mut candidates = Vec::with_capacity(paths.len());
    let mut opened_paths = Vec::with_capacity(paths.len());
    let mut absent = Vec::new();
    for path in paths {
        let member = match open_member(path, options) {
            Ok(m) => m,
            Err(e) if !require_all => {
                tracing::warn!("member {path} is absent ({e:#}): assembling without it");
                absent.push(path.clone());
                continue;
            }
            Err(e) => return Err(e.context("--require-all: every member must open")),
        };
        let area = read_superblock_area(member.as_ref()).await?;
        candidates.push(Candidate::from_bytes(path.clone(), member.len_bytes(), &area));
        members.push(member);
        opened_paths.push(path.clone());
    }
    if members.is_empty() {
        bail!("none of the members could be opened: {}", absent.join(", "));
    }
    let assembly = md::assemble(&candidates)
        .map_err(|e| if absent.is_empty() { anyhow!("{e}") } else { anyhow!("{e} (absent: {})", absent.join(", ")) })?;
    for notice in &assembly.notices {
        tracing::warn!("{notice}");
    }
    let mut forced_read_only = false;
    if assembly.parity_untrusted() && !force && !options.read_only {
        tracing::warn!(
            "array {} was not shut down cleanly and is degraded: parity of stripes being written at the \
             crash may be stale (the RAID write hole), so rebuilding missing data from it could return \
             wrong bytes. Serving READ-ONLY; restart with --force to accept the risk and allow writes.",
            assembly.metadata.name()
        );
        forced_read_only = true;
    }
    let bitmap = read_bitmap(&assembly, &members).await;
    let array = start_array(&assembly, &members, bitmap)?;
    // A read-only array writes nothing at all: no superblocks, no resync.
    array.set_read_only(options.read_only || forced_read_only);
    Ok(OpenedArray { array: Arc::new(array), assembly, paths: opened_paths, absent, forced_read_only })
}

/// Members by identity (`serve --uuid UUID --scan GLOB`): the paths matching `pattern` whose
/// md superblock carries array UUID `uuid`, in path order. Paths that cannot be read, or hold
/// no superblock or another array's, are passed over (logged at debug level).
pub fn scan_members(uuid: &str, pattern: &str) -> Result<Vec<String>> {
    let want: MdUuid = uuid.parse().map_err(|e| anyhow!("--uuid {uuid:?}: {e}"))?;
    let mut found = Vec::new();
    for entry in glob::glob(pattern).map_err(|e| anyhow!("--scan {pattern:?}: {e}"))? {
        let Ok(path) = entry else { continue };
        match superblock_uuid(&path) {
            Ok(Some(u)) if u == want => found.push(path.to_string_lossy().into_owned()),
            Ok(_) => tracing::debug!("{}: not a member of {want}", path.display()),
            Err(e) => tracing::debug!("{}: {e}", path.display()),
        }
    }
    if found.is_empty() {
        bail!("--scan {pattern:?} found no member of array {want}");
    }
    tracing::info!("array {want}: found {} members: {}", found.len(), found.join(", "));
    Ok(found)
}

/// The array UUID in the superblock of the file or device at `path`, if it has one.
fn superblock_uuid(path: &std::path::Path) -> std::io::Result<Option<MdUuid>> {
    use std::os::unix::fs::FileExt;
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        return Ok(None);
    }
    let file = std::fs::File::open(path)?;
    let mut area = vec![0u8; SUPERBLOCK_BYTES];
    let n = file.read_at(&mut area, SUPERBLOCK_BYTE_OFFSET)?;
    if n < SUPERBLOCK_BYTES {
        return Ok(None);
    }
    Ok(Superblock::decode(&area).ok().map(|sb| sb.set_uuid))
}

/// Reads the internal write-intent bitmap from the first member that has a valid one.
/// A missing or unreadable bitmap is logged and ignored (a crash then costs a full resync).
async fn read_bitmap(assembly: &Assembly, members: &[Arc<dyn Member>]) -> Option<Bitmap> {
    let meta = &assembly.metadata;
    let offset_sectors = i64::from(meta.bitmap_offset()?);
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
            Ok(bitmap) => return Some(bitmap),
            Err(e) => tracing::warn!(role, "{e}"),
        }
    }
    tracing::warn!("the array has an internal bitmap but none could be read: an unclean stop will resync everything");
    None
}

/// Bitmaps are at most this large (mdadm reserves up to 128 KiB).
const MAX_BITMAP_BYTES: u64 = 128 << 10;

/// Builds the engine from an assembly plan and the opened members (by candidate index).
fn start_array(assembly: &Assembly, members: &[Arc<dyn Member>], bitmap: Option<Bitmap>) -> Result<Array<dyn Member>> {
    let meta = &assembly.metadata;
    let roles = assembly.members.len();
    let member_index = |role: usize| assembly.members[role].and_then(|c| assembly.member_index_of_candidate(c));
    let member_sectors: Vec<u64> = (0..roles)
        .map(|role| match meta.level {
            Level::Linear | Level::Raid0 => member_index(role).map_or(0, |i| meta.members[i].data_size),
            _ => meta.size,
        })
        .collect();
    let geometry = Geometry::new(meta.level, meta.layout, meta.chunk_sectors, &member_sectors)
        .map_err(|e| anyhow!("array {}: {e}", meta.name()))?;
    let role_members: Vec<Option<RoleMember<dyn Member>>> = (0..roles)
        .map(|role| {
            let candidate = assembly.members[role]?;
            let index = member_index(role)?;
            let record = &meta.members[index];
            Some(RoleMember {
                member: members[candidate].clone(),
                data_offset_bytes: record.data_offset * SECTOR_BYTES,
                recovery_offset_sectors: record.recovery_offset,
                device_id: index,
            })
        })
        .collect();
    let spares: Vec<Device<dyn Member>> = assembly
        .spares
        .iter()
        .filter_map(|&c| {
            let index = assembly.member_index_of_candidate(c)?;
            Some(Device {
                id: index,
                member: members[c].clone(),
                data_offset_bytes: meta.members[index].data_offset * SECTOR_BYTES,
            })
        })
        .collect();
    let mut store = MdStore::new(meta.clone(), vec![true; meta.members.len()]);
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
    let mut array = Array::new(geometry, role_members, Some(Box::new(store)), !meta.is_clean())
        .map_err(|e| anyhow!("{e}"))?
        .with_spares(spares);
    if let Some((chunk_sectors, chunks, dirty)) = intent {
        array = array.with_write_intent(chunk_sectors, chunks, &dirty);
    }
    if !meta.is_clean() && meta.resync_offset != 0 {
        array.resume_resync_from(meta.resync_offset);
    }
    Ok(array)
}
