//! `raidnbd create`: write md v1.2 superblocks that make members an array.
//!
//! Members are zeroed (data area deallocated: instant on files) so that parity and
//! mirrors are consistent from the start and the array is created clean, with no initial
//! resync. Existing data is protected: a member that already holds a superblock or a
//! filesystem signature is refused unless `--force`.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use futures::future::try_join_all;
use raid_core::geometry::{Geometry, Level, ParityLayout, Raid0Layout, Raid10Layout};
use raid_core::md::journal::{MetaBlock, journal_seed};
use raid_core::md::ppl::{PplHeader, ppl_signature};
use raid_core::md::{
    self, BITMAP_OFFSET_SECTORS, Bitmap, CreateParams, FeatureMap, MdUuid, SUPERBLOCK_BYTE_OFFSET, bitmap_space_sectors,
};
use raid_core::{AlignedBuf, Member, SECTOR_BYTES, integrity};

use crate::cli::{CreateArgs, MemberIoArgs};
use crate::open::{MemberOpenOptions, open_member};
use crate::signature::find_signature;
use crate::size::{format_size, human_bytes};

/// Parses `--layout` for `level` into md's layout code (`None` = md's default).
pub fn parse_layout(level: Level, text: Option<&str>) -> Result<Option<u32>> {
    let Some(text) = text else { return Ok(None) };
    let code = match level {
        Level::Raid4 | Level::Raid5 | Level::Raid6 => {
            let layout = ParityLayout::parse(text).ok_or_else(|| {
                anyhow!("unknown {level} layout '{text}': use left-symmetric, left-asymmetric, right-symmetric, right-asymmetric, parity-first or parity-last")
            })?;
            if !layout.valid_for(level) {
                bail!("layout {} is not valid for {level}", layout.name());
            }
            layout as u32
        }
        Level::Raid10 => Raid10Layout::parse(text)
            .ok_or_else(|| anyhow!("unknown raid10 layout '{text}': use n2, n3, f2, o2 ..."))?
            .to_md(),
        Level::Raid0 => match text.to_ascii_lowercase().as_str() {
            "original" => Raid0Layout::Original as u32,
            "alternate" => Raid0Layout::Alternate as u32,
            _ => bail!("unknown raid0 layout '{text}': use original or alternate"),
        },
        Level::Linear | Level::Raid1 => bail!("{level} has no layout"),
    };
    Ok(Some(code))
}

/// Checks a chunk size and converts it to sectors.
pub fn chunk_sectors(chunk_bytes: u64) -> Result<u32> {
    if chunk_bytes < 4096 || !chunk_bytes.is_power_of_two() || chunk_bytes > 64 << 20 {
        bail!("chunk size {} must be a power of two between 4K and 64M", format_size(chunk_bytes));
    }
    Ok((chunk_bytes / SECTOR_BYTES) as u32)
}

fn random_uuid() -> MdUuid {
    MdUuid(rand::random())
}

pub async fn run(args: CreateArgs) -> Result<()> {
    let level = Level::parse(&args.level)
        .ok_or_else(|| anyhow!("unknown RAID level '{}': use linear, 0, 1, 4, 5, 6 or 10", args.level))?;
    let layout = parse_layout(level, args.layout.as_deref())?;
    let chunk = args.chunk.map(chunk_sectors).transpose()?;
    if level == Level::Raid1 && chunk.is_some() {
        bail!("raid1 has no chunk size; drop --chunk");
    }
    let name = args.name.clone().unwrap_or_else(|| "raidnbd".to_string());
    let options = MemberOpenOptions {
        io: MemberIoArgs { buffered: true, ..default_io() },
        plain: true,
        ..MemberOpenOptions::default()
    };

    let mut slots: Vec<Option<(String, Arc<dyn Member>)>> = Vec::new();
    for (i, arg) in args.members.iter().enumerate() {
        if arg == "missing" {
            slots.push(None);
            continue;
        }
        if args.members[..i].contains(arg) {
            bail!("member {arg} is given twice");
        }
        slots.push(Some((arg.clone(), open_new_member(arg, &args, &options).await?)));
    }
    match args.integrity.as_deref() {
        None | Some("crc32c") => {}
        Some(other) => bail!("--integrity {other}: the one algorithm is crc32c"),
    }
    // With checksums, md's data area ends before each member's checksum area.
    let reserve = |len: u64| if args.integrity.is_some() { integrity::reserve_bytes(len) } else { 0 };
    let members_bytes: Vec<Option<u64>> =
        slots.iter().map(|s| s.as_ref().map(|(_, m)| m.len_bytes() - reserve(m.len_bytes()))).collect();
    let policy = choose_policy(&args, level)?;
    let journal = match &args.write_journal {
        Some(arg) => {
            if args.members.contains(arg) {
                bail!("--write-journal {arg} is one of the members");
            }
            Some((arg.clone(), open_new_member(arg, &args, &options).await?))
        }
        None => None,
    };
    let params = CreateParams {
        level,
        layout,
        chunk_sectors: chunk,
        name: &name,
        homehost: None,
        uuid: None,
        members_bytes: &members_bytes,
        ppl: policy == Policy::Ppl,
        journal_bytes: journal.as_ref().map(|(_, m)| m.len_bytes()),
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut meta = md::create(&params, now, &mut random_uuid).map_err(|e| anyhow!("{e}"))?;
    let sizes: Vec<u64> = (0..slots.len())
        .map(|role| match level {
            Level::Linear | Level::Raid0 => meta.members[role].data_size,
            _ => meta.size,
        })
        .collect();
    let geometry = Geometry::new(level, meta.layout, meta.chunk_sectors, &sizes).map_err(|e| anyhow!("{e}"))?;
    let bitmap = match policy {
        Policy::Ppl | Policy::Journal => None,
        _ => choose_bitmap(&args, policy, &geometry, &mut meta, &members_bytes)?,
    };
    let ppl_header = meta.ppl_area().map(|(offset_sectors, _)| {
        let empty = PplHeader { signature: ppl_signature(meta.uuid.0), generation: 0, entries: Vec::new() };
        (SUPERBLOCK_BYTE_OFFSET as i64 + i64::from(offset_sectors) * 512, empty.encode())
    });
    mark_write_mostly(&args, &mut meta)?;

    let present: Vec<&(String, Arc<dyn Member>)> = slots.iter().flatten().chain(&journal).collect();
    assert_eq!(present.len(), meta.members.len(), "one metadata record per present member and the journal");
    let journal_index = journal.as_ref().map(|_| present.len() - 1);
    let journal_meta_block = MetaBlock { seq: u64::from(rand::random::<u32>()), position: 0, payloads: Vec::new() }
        .encode(journal_seed(meta.uuid.0));
    let bitmap_image = bitmap.as_ref().map(Bitmap::encode);
    try_join_all(present.iter().zip(&meta.members).enumerate().map(|(index, ((path, member), record))| {
        let (meta, bitmap_image, ppl_header, journal_meta_block) =
            (&meta, &bitmap_image, &ppl_header, &journal_meta_block);
        async move {
            if Some(index) == journal_index {
                // As mdadm: one empty meta block at the ring's start (a random seq); the rest
                // of the ring is never read before it is written.
                member
                    .write_at(record.data_offset * SECTOR_BYTES, AlignedBuf::from_slice(journal_meta_block), false)
                    .await
                    .0
                    .with_context(|| format!("cannot write the journal of {path}"))?;
            } else {
                wipe_member(member.as_ref(), record.data_offset, record.data_size)
                    .await
                    .with_context(|| format!("cannot zero member {path}"))?;
            }
            if let Some(image) = bitmap_image {
                let at = SUPERBLOCK_BYTE_OFFSET + BITMAP_OFFSET_SECTORS as u64 * SECTOR_BYTES;
                member
                    .write_at(at, AlignedBuf::from_slice(image), false)
                    .await
                    .0
                    .with_context(|| format!("cannot write the bitmap of {path}"))?;
            }
            if let Some((at, header)) = ppl_header {
                member
                    .write_at(*at as u64, AlignedBuf::from_slice(header), false)
                    .await
                    .0
                    .with_context(|| format!("cannot write the partial parity log of {path}"))?;
            }
            let image = AlignedBuf::from_slice(&meta.superblock_for(index).encode());
            member
                .write_at(SUPERBLOCK_BYTE_OFFSET, image, true)
                .await
                .0
                .with_context(|| format!("cannot write the superblock of {path}"))?;
            member.flush().await.with_context(|| format!("cannot flush {path}"))
        }
    }))
    .await?;
    if args.integrity.is_some() {
        try_join_all(slots.iter().flatten().map(|(path, member)| async move {
            integrity::format(member.as_ref()).await.with_context(|| format!("cannot write the checksums of {path}"))
        }))
        .await?;
    }

    println!(
        "created {level} array '{name}': {} members, {}, size {} ({} bytes), UUID {}",
        slots.len(),
        describe_layout(&geometry),
        human_bytes(geometry.array_sectors() * SECTOR_BYTES),
        geometry.array_sectors() * SECTOR_BYTES,
        meta.uuid
    );
    match (&bitmap, policy) {
        (_, Policy::Journal) => println!(
            "consistency policy: journal (md's write journal on {}: every write is logged there first, so a crash \
             cannot leave a stripe half written; no resync after a crash, and the array survives losing a member \
             right after one; serve the journal with the members)",
            args.write_journal.as_deref().unwrap_or("?")
        ),
        (_, Policy::Ppl) => println!(
            "consistency policy: ppl (md's partial parity log, 1 MiB per member: a crash cannot leave parity \
             stale, so the array needs no resync and survives losing a member right after a crash)"
        ),
        (Some(b), _) => println!(
            "consistency policy: bitmap ({} chunks of {}: after a crash only recently written chunks resync)",
            b.chunks(),
            format_size(u64::from(b.chunk_bytes))
        ),
        (None, _) if geometry.max_failures() > 0 => {
            println!("consistency policy: resync (after a crash the whole array resyncs)")
        }
        (None, _) => {}
    }
    if let Some((_, member)) = slots.iter().flatten().next().filter(|_| args.integrity.is_some()) {
        println!(
            "integrity: crc32c of every 4 KiB, {} per member after md's data area (mdadm and the kernel ignore it); \
             reads are verified{}",
            human_bytes(integrity::reserve_bytes(member.len_bytes())),
            if geometry.max_failures() > 0 {
                ", wrong bytes healed from redundancy"
            } else {
                " (no redundancy: wrong bytes fail the read)"
            }
        );
    }
    if matches!(level, Level::Raid4 | Level::Raid6) && policy != Policy::Journal {
        println!(
            "note: the write hole is open: a {level} that crashes and then loses a member before its resync \
             ends may rebuild stale parity (it starts read-only then, unless --force). md's partial parity log \
             is raid5-only; a write journal (--write-journal DEVICE, a device besides the members, at least \
             (data + parity) / data times as fast as one) closes the hole"
        );
    }
    let missing = slots.iter().filter(|s| s.is_none()).count();
    if missing > 0 {
        println!("note: {missing} slot(s) left empty: the array starts degraded");
    }
    Ok(())
}

/// Opens a device `create` will write (making the file when `--size` is given), refusing
/// one that holds data unless `--force`.
async fn open_new_member(arg: &str, args: &CreateArgs, options: &MemberOpenOptions) -> Result<Arc<dyn Member>> {
    prepare_member_file(arg, args.size)?;
    let member = open_member(arg, options).await?;
    if !args.force
        && let Some(what) = find_signature(member.as_ref()).await?
    {
        bail!("{arg} already holds {what}; use --force to overwrite it");
    }
    Ok(member)
}

/// Sets md's write-mostly devflag on the members named by `--write-mostly`.
fn mark_write_mostly(args: &CreateArgs, meta: &mut md::ArrayMetadata) -> Result<()> {
    for name in &args.write_mostly {
        if Level::parse(&args.level) != Some(Level::Raid1) {
            bail!("--write-mostly is for raid1 (as in md)");
        }
        let slot = args
            .members
            .iter()
            .position(|m| m == name && m != "missing")
            .ok_or_else(|| anyhow!("--write-mostly {name}: not one of the members"))?;
        // Records are in slot order, one per present member.
        let present_before = args.members[..slot].iter().filter(|m| *m != "missing").count();
        meta.members[present_before].devflags |= md::DEVFLAG_WRITE_MOSTLY;
    }
    if args.write_mostly.len() >= args.members.iter().filter(|m| *m != "missing").count()
        && !args.write_mostly.is_empty()
    {
        bail!("--write-mostly on every member leaves none to read from");
    }
    Ok(())
}

/// `--consistency-policy`, as mdadm names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Ppl,
    Journal,
    Bitmap,
    Resync,
    /// Not given: ppl for raid5, else the bitmap rule below.
    Default,
}

fn choose_policy(args: &CreateArgs, level: Level) -> Result<Policy> {
    let policy = match args.consistency_policy.as_deref() {
        None if args.write_journal.is_some() => Policy::Journal,
        None => match (level, args.bitmap.as_deref()) {
            (Level::Raid5, None) => Policy::Ppl,
            _ => Policy::Default,
        },
        Some("ppl") => Policy::Ppl,
        Some("journal") => Policy::Journal,
        Some("bitmap") => Policy::Bitmap,
        Some("resync") => Policy::Resync,
        Some(other) => bail!("--consistency-policy {other}: use ppl, journal, bitmap or resync"),
    };
    if args.write_journal.is_some() && policy != Policy::Journal {
        bail!("--write-journal makes the consistency policy journal (md allows no other with a journal)");
    }
    match policy {
        Policy::Journal if args.write_journal.is_none() => {
            bail!("--consistency-policy journal needs --write-journal DEVICE")
        }
        Policy::Journal if !matches!(level, Level::Raid4 | Level::Raid5 | Level::Raid6) => {
            bail!("a write journal is for raid4, raid5 and raid6 (as in md)")
        }
        Policy::Journal if args.bitmap.as_deref() == Some("internal") => {
            bail!("a write journal and a write-intent bitmap exclude each other (as in md)")
        }
        Policy::Ppl if level != Level::Raid5 => {
            bail!("--consistency-policy ppl is for raid5 (md's partial parity log is raid5-only); use bitmap or resync")
        }
        Policy::Ppl if args.bitmap.as_deref() == Some("internal") => {
            bail!("a partial parity log and a write-intent bitmap exclude each other (as in md)")
        }
        Policy::Bitmap if args.bitmap.as_deref() == Some("none") => {
            bail!("--consistency-policy bitmap with --bitmap none")
        }
        Policy::Resync if args.bitmap.as_deref() == Some("internal") => {
            bail!("--consistency-policy resync with --bitmap internal")
        }
        _ => Ok(policy),
    }
}

/// Arrays at least this large get a write-intent bitmap unless `--bitmap none`.
const AUTO_BITMAP_BYTES: u64 = 4 << 30;

/// Decides on a write-intent bitmap (md's internal format, 4 KiB after the superblock)
/// and records it in the metadata.
fn choose_bitmap(
    args: &CreateArgs,
    policy: Policy,
    geometry: &Geometry,
    meta: &mut md::ArrayMetadata,
    members_bytes: &[Option<u64>],
) -> Result<Option<Bitmap>> {
    let redundant = geometry.max_failures() > 0;
    let wanted = match (policy, args.bitmap.as_deref()) {
        (Policy::Resync, _) => false,
        (Policy::Bitmap, _) | (_, Some("internal")) => {
            if !redundant {
                bail!("{} has no redundancy: a bitmap has nothing to protect", geometry.level());
            }
            true
        }
        (_, Some("none")) => false,
        (_, Some(other)) => bail!("--bitmap {other}: use internal or none"),
        (_, None) => redundant && geometry.array_sectors() * SECTOR_BYTES >= AUTO_BITMAP_BYTES,
    };
    if !wanted {
        return Ok(None);
    }
    let smallest = members_bytes.iter().flatten().min().copied().unwrap_or(0) / SECTOR_BYTES;
    let space_bytes = bitmap_space_sectors(smallest) * SECTOR_BYTES;
    let bitmap = Bitmap::new(meta.uuid, geometry.resync_sectors(), space_bytes, meta.events, args.bitmap_chunk)
        .map_err(|e| anyhow!("--bitmap-chunk: {e}"))?;
    meta.features.insert(FeatureMap::BITMAP_OFFSET);
    meta.bitmap_offset = BITMAP_OFFSET_SECTORS;
    Ok(Some(bitmap))
}

fn default_io() -> MemberIoArgs {
    MemberIoArgs::default()
}

/// Creates a sparse member file of `size` when it does not exist.
fn prepare_member_file(path: &str, size: Option<u64>) -> Result<()> {
    if nbd_client::ExportAddress::is_uri(path) {
        return Ok(());
    }
    if Path::new(path).exists() {
        return Ok(());
    }
    match size {
        Some(size) => {
            member_io::create_sparse_file(path, size).with_context(|| format!("cannot create member file {path}"))
        }
        None => bail!("member {path} does not exist (give --size to create member files)"),
    }
}

/// Zeroes what could confuse later readers: the first 4 KiB (old boot sectors and
/// filesystem signatures), the area between the superblock and the data, and the data.
async fn wipe_member(member: &dyn Member, data_offset_sectors: u64, data_size_sectors: u64) -> Result<()> {
    member.write_at(0, AlignedBuf::zeroed(4096), false).await.0?;
    let start = SUPERBLOCK_BYTE_OFFSET + 4096;
    let end = (data_offset_sectors + data_size_sectors) * SECTOR_BYTES;
    member.discard(start, end - start).await?;
    Ok(())
}

/// "64K chunk, left-symmetric" and the like.
pub fn describe_layout(geometry: &Geometry) -> String {
    let chunk = format_size(u64::from(geometry.chunk_sectors()) * SECTOR_BYTES);
    match geometry.level() {
        Level::Raid1 => "mirrored".to_string(),
        Level::Linear => "concatenated".to_string(),
        Level::Raid0 => format!("{chunk} chunk"),
        Level::Raid10 => {
            let name = Raid10Layout::from_md(geometry.layout()).map_or("?".to_string(), |l| l.name());
            format!("{chunk} chunk, {name}")
        }
        Level::Raid4 => format!("{chunk} chunk, parity-last"),
        Level::Raid5 | Level::Raid6 => {
            let name = ParityLayout::from_md(geometry.layout()).map_or("?", |l| l.name());
            format!("{chunk} chunk, {name}")
        }
    }
}
