//! `create`: the metadata of a new md v1.2 array, with the defaults mdadm 4.6 `--create` chooses
//! (`md-format.md` §1.5, §1.10, §1.11; mdadm `Create.c`, `super1.c` init/write_init).
//!
//! ```text
//!  CreateParams { level, layout?, chunk?, name, homehost?, uuid?, members_bytes: [Some(n) | None] }
//!      │ validate (member count, chunk, layout, names, sizes, survivable missing slots)
//!      │ data_offset from the first present member; size = smallest free space rounded
//!      ▼
//!  ArrayMetadata (events 1, clean, dev_roles[i] = Active(i) per present slot, 0xFFFF otherwise)
//! ```
//!
//! Differences from mdadm, on purpose:
//! - The array is created **clean** (`resync_offset = MaxSector`) at every level: raidnbd zeroes
//!   every member's data area at create, and zeroed members are consistent for mirrors and for
//!   parity alike (the XOR and the RAID6 Q syndrome of zero blocks are zero). mdadm instead
//!   writes 0 (dirty) for raid1/6/10 and builds raid4/5 with the last member as a spare, then
//!   lets the kernel resync or recover.
//! - `events` is 1, as `init_super1` sets it (mdadm then writes 0 to fresh devices and the kernel
//!   bumps it when the array first starts).
//! - Names longer than 31 bytes are refused rather than silently truncated.
//!
//! Same as mdadm: dev_number = slot index; `max_dev` 128 for up to 128 slots; unused roles
//! 0xFFFF; `device_uuid` random; `set_name` is `homehost:name` when that fits in 31 bytes and the
//! name has no `:`; raid0 gets layout 1 (original) and the `RAID0_LAYOUT` feature (mdadm sets it
//! on every kernel ≥ 5.4); component `size` is the smallest member's free space rounded down to
//! the chunk (raid1: to 64 KiB), 0 for linear/raid0; the bad-block log is reserved (8 sectors)
//! but the `BAD_BLOCKS` bit stays clear.
//!
//! Pure: the clock and the random source are parameters, so tests are deterministic.

use crate::SECTOR_BYTES;
use crate::error::{ErrorKind, RaidError};
use crate::geometry::{
    Geometry, Level, MAX_CHUNK_SECTORS, MAX_RAID_DISKS, MIN_CHUNK_SECTORS, ParityLayout, Raid0Layout, Raid10Layout,
};

use super::data_offset::{
    bblog_with_space, bitmap_space_sectors, data_offset_with_space, default_bblog, default_max_dev,
};
use super::dev_role::DevRole;
use super::feature::FeatureMap;
use super::metadata::{ArrayMetadata, MemberMetadata};
use super::superblock::{MIN_DATA_SIZE, RESYNC_CLEAN, SUPER_OFFSET_1_2, TIME_SECS_MASK};
use super::uuid::MdUuid;
use crate::ppl::{PPL_AREA_SECTORS, PPL_OFFSET_SECTORS};

/// mdadm's default chunk: 512 KiB.
pub const DEFAULT_CHUNK_SECTORS: u32 = 1024;

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateParams<'a> {
    pub level: Level,
    /// md layout code; `None` = mdadm's default for the level.
    pub layout: Option<u32>,
    /// Chunk in sectors (linear: rounding); `None` = mdadm's default (512 KiB; linear: none).
    pub chunk_sectors: Option<u32>,
    /// Array name (mdadm `--name`), at most 31 bytes.
    pub name: &'a str,
    /// Prefix `homehost:` when it fits (mdadm `--homehost`).
    pub homehost: Option<&'a str>,
    /// Array UUID (mdadm `--uuid`); `None` = random.
    pub uuid: Option<MdUuid>,
    /// Per slot (= role), the member's size in bytes; `None` = "missing".
    pub members_bytes: &'a [Option<u64>],
    /// A partial parity log (mdadm `--consistency-policy=ppl`; raid5 only): 1 MiB after the
    /// superblock, with the data offset and the bad-block log moved past it as mdadm does.
    pub ppl: bool,
    /// A write journal (mdadm `--write-journal`; raid4/5/6): a device of this many bytes,
    /// after the members (its `dev_number` follows theirs), with the array's data offset.
    pub journal_bytes: Option<u64>,
}

/// Builds the metadata of a new array.
///
/// `now_secs` becomes `ctime` and `utime`; `random_uuid` is called for the array UUID (unless
/// given) and then once per present member, in slot order, for the device UUIDs.
///
/// Errors ([`ErrorKind::CannotAssemble`]) name the slot and say what is wrong: too few or too many
/// members, a bad chunk or layout, a bad name, a member too small, or more missing members than
/// the level survives.
pub fn create(
    params: &CreateParams<'_>,
    now_secs: u64,
    random_uuid: &mut dyn FnMut() -> MdUuid,
) -> Result<ArrayMetadata, RaidError> {
    let level = params.level;
    let fail = |why: String| {
        RaidError::new(ErrorKind::CannotAssemble, format!("cannot create {level} array {:?}: {why}", params.name))
    };
    let slots = params.members_bytes;
    let raid_disks = slots.len();
    if raid_disks < level.min_members() {
        return Err(fail(format!("{level} needs at least {} members, got {raid_disks}", level.min_members())));
    }
    if raid_disks > MAX_RAID_DISKS {
        return Err(fail(format!("at most {MAX_RAID_DISKS} members are supported, got {raid_disks}")));
    }
    let missing: Vec<usize> = (0..raid_disks).filter(|&slot| slots[slot].is_none()).collect();
    if missing.len() == raid_disks {
        return Err(fail("every member is missing".into()));
    }
    if matches!(level, Level::Linear | Level::Raid0) && !missing.is_empty() {
        return Err(fail(format!("{level} has no redundancy, so no member may be missing (slots {})", list(&missing))));
    }
    let set_name = set_name(params.name, params.homehost).map_err(&fail)?;
    let chunk_sectors = choose_chunk(level, params.chunk_sectors).map_err(&fail)?;
    let layout = choose_layout(level, params.layout, raid_disks).map_err(&fail)?;

    // mdadm computes the data offset from the first member it validates and uses it for all.
    let first_sectors = slots.iter().flatten().next().map(|bytes| bytes / SECTOR_BYTES).expect("a present member");
    let chunk_kib = if level == Level::Raid1 { 0 } else { chunk_sectors / 2 };
    if params.ppl && level != Level::Raid5 {
        return Err(fail("a partial parity log (ppl) is for raid5 only, as in md".into()));
    }
    if params.journal_bytes.is_some() && (level.parity_blocks() == 0 || params.ppl) {
        return Err(fail("a write journal is for raid4/5/6 without a partial parity log, as in md".into()));
    }
    let bm_space = if params.ppl { u64::from(PPL_AREA_SECTORS) } else { bitmap_space_sectors(first_sectors) };
    let data_offset = data_offset_with_space(first_sectors, chunk_kib, bm_space);

    // Usable space per present slot, rounded as the component size will be.
    let mut data_sizes = vec![0u64; raid_disks];
    let mut smallest_rounded = u64::MAX;
    for (slot, bytes) in slots.iter().enumerate() {
        let Some(bytes) = bytes else { continue };
        let sectors = bytes / SECTOR_BYTES;
        let rounding = Geometry::component_rounding_sectors(level, chunk_sectors);
        let free = sectors.saturating_sub(data_offset);
        let rounded = free / rounding * rounding;
        if rounded == 0 || free < MIN_DATA_SIZE {
            return Err(fail(format!(
                "member in slot {slot} is too small: {bytes} bytes ({sectors} sectors) but the data starts at sector \
                 {data_offset} and needs at least {} more sectors",
                rounding.max(MIN_DATA_SIZE)
            )));
        }
        data_sizes[slot] = free;
        smallest_rounded = smallest_rounded.min(rounded);
    }
    let size = match level {
        Level::Linear | Level::Raid0 => 0,
        _ => smallest_rounded,
    };

    // The geometry is the final judge of layout/chunk/count, and of which missing slots survive.
    let member_sectors: Vec<u64> = match level {
        Level::Linear | Level::Raid0 => data_sizes.clone(),
        _ => vec![size; raid_disks],
    };
    let geometry = Geometry::new(level, layout, chunk_sectors, &member_sectors)
        .map_err(|e| fail(format!("invalid geometry: {e}")))?;
    if !missing.is_empty() && !geometry.survives(&missing) {
        return Err(fail(format!(
            "{} of {raid_disks} members missing (slots {}) but {level} survives at most {}",
            missing.len(),
            list(&missing),
            geometry.max_failures()
        )));
    }

    let uuid = params.uuid.unwrap_or_else(&mut *random_uuid);
    let time = now_secs & TIME_SECS_MASK;
    let max_dev = default_max_dev(raid_disks as u32 + u32::from(params.journal_bytes.is_some()));
    let mut dev_roles = vec![DevRole::Spare; max_dev as usize];
    let bblog = if params.ppl { bblog_with_space(data_offset, bm_space) } else { default_bblog(data_offset, size) };
    let mut record = |dev_number: usize, data_size: u64| MemberMetadata {
        dev_number: dev_number as u32,
        device_uuid: random_uuid(),
        data_offset,
        data_size,
        super_offset: SUPER_OFFSET_1_2,
        recovery_offset: None,
        features: FeatureMap::empty(),
        devflags: 0,
        bblog_shift: bblog.map_or(0, |b| b.bblog_shift),
        bblog_size: bblog.map_or(0, |b| b.bblog_size),
        bblog_offset: bblog.map_or(0, |b| b.bblog_offset),
        cnt_corrected_read: 0,
        new_offset: 0,
    };
    let mut members = Vec::with_capacity(raid_disks - missing.len() + 1);
    for (slot, bytes) in slots.iter().enumerate() {
        if bytes.is_none() {
            continue;
        }
        dev_roles[slot] = DevRole::Active(slot as u16);
        members.push(record(slot, data_sizes[slot]));
    }
    let mut features = if level == Level::Raid0 { FeatureMap::RAID0_LAYOUT } else { FeatureMap::empty() };
    if let Some(bytes) = params.journal_bytes {
        let data_size = (bytes / SECTOR_BYTES).saturating_sub(data_offset);
        if data_size * SECTOR_BYTES < crate::engine::MIN_JOURNAL_BYTES {
            return Err(fail(format!(
                "the journal device of {bytes} bytes leaves {} bytes after the data offset; the journal needs at \
                 least {}",
                data_size * SECTOR_BYTES,
                crate::engine::MIN_JOURNAL_BYTES
            )));
        }
        dev_roles[raid_disks] = DevRole::Journal;
        members.push(record(raid_disks, data_size));
        features.insert(FeatureMap::JOURNAL);
    }
    let mut meta = ArrayMetadata {
        uuid,
        set_name,
        ctime: time,
        level,
        layout,
        chunk_sectors,
        raid_disks: raid_disks as u32,
        size,
        events: 1,
        resync_offset: RESYNC_CLEAN,
        utime: time,
        features,
        bitmap_offset: 0,
        journal_tail: 0,
        new_level: 0,
        reshape_position: 0,
        delta_disks: 0,
        new_layout: 0,
        new_chunk: 0,
        // As mdadm: not recorded, so Linux 6.18 and older still assemble the array.
        logical_block_size: 0,
        dev_roles,
        members,
    };
    if params.ppl {
        meta.set_ppl_area(PPL_OFFSET_SECTORS, PPL_AREA_SECTORS);
    }
    Ok(meta)
}

/// mdadm's `set_name`: `homehost:name` when the name has no `:` and the whole fits in 31 bytes,
/// otherwise just the name.
fn set_name(name: &str, homehost: Option<&str>) -> Result<[u8; 32], String> {
    if name.is_empty() {
        return Err("the array name is empty".into());
    }
    if name.len() > 31 {
        return Err(format!("the array name is {} bytes long, md stores at most 31", name.len()));
    }
    if name.contains('\0') || homehost.is_some_and(|h| h.contains('\0')) {
        return Err("names must not contain NUL bytes".into());
    }
    let full = match homehost {
        Some(host) if !host.is_empty() && !name.contains(':') && host.len() + 1 + name.len() < 32 => {
            format!("{host}:{name}")
        }
        _ => name.to_string(),
    };
    let mut bytes = [0u8; 32];
    bytes[..full.len()].copy_from_slice(full.as_bytes());
    Ok(bytes)
}

fn choose_chunk(level: Level, chunk_sectors: Option<u32>) -> Result<u32, String> {
    match level {
        Level::Raid1 => match chunk_sectors {
            None | Some(0) => Ok(0),
            Some(_) => Err("raid1 has no chunk size".into()),
        },
        // Linear: an optional rounding of each member's size.
        Level::Linear => match chunk_sectors.unwrap_or(0) {
            0 => Ok(0),
            c if valid_chunk(c) => Ok(c),
            c => Err(format!("rounding of {c} sectors is not a power of two between 4 KiB and 64 MiB")),
        },
        _ => match chunk_sectors.unwrap_or(DEFAULT_CHUNK_SECTORS) {
            c if valid_chunk(c) => Ok(c),
            c => Err(format!("chunk of {c} sectors is not a power of two between 4 KiB and 64 MiB")),
        },
    }
}

fn valid_chunk(chunk_sectors: u32) -> bool {
    chunk_sectors.is_power_of_two() && (MIN_CHUNK_SECTORS..=MAX_CHUNK_SECTORS).contains(&chunk_sectors)
}

fn choose_layout(level: Level, layout: Option<u32>, raid_disks: usize) -> Result<u32, String> {
    let layout = layout.unwrap_or_else(|| level.default_layout());
    let ok = match level {
        Level::Linear | Level::Raid1 => layout == 0,
        Level::Raid0 => matches!(Raid0Layout::from_md(layout), Some(Raid0Layout::Original | Raid0Layout::Alternate)),
        Level::Raid4 => layout == 0 || layout == ParityLayout::ParityLast as u32,
        Level::Raid5 | Level::Raid6 => ParityLayout::from_md(layout).is_some_and(|l| l.valid_for(level)),
        Level::Raid10 => match Raid10Layout::from_md(layout) {
            Some(l) if l.copies() as usize > raid_disks => {
                return Err(format!(
                    "layout {} keeps {} copies but there are {raid_disks} members",
                    l.name(),
                    l.copies()
                ));
            }
            Some(_) => true,
            None => false,
        },
    };
    if ok { Ok(layout) } else { Err(format!("layout {layout:#x} is not valid for {level}")) }
}

fn list(items: &[usize]) -> String {
    items.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_name_follows_mdadm() {
        let name = |n, h| set_name(n, h).map(|b| super::super::superblock::name_from_bytes(&b));
        assert_eq!(name("data", Some("host")).unwrap(), "host:data");
        assert_eq!(name("data", None).unwrap(), "data");
        assert_eq!(name("a:b", Some("host")).unwrap(), "a:b");
        // host(20) + ':' + name(11) = 32 bytes: too long for the prefix, name alone is kept.
        assert_eq!(name("abcdefghijk", Some("hhhhhhhhhhhhhhhhhhhh")).unwrap(), "abcdefghijk");
        // 31 bytes exactly fits.
        assert_eq!(name("abcdefghij", Some("hhhhhhhhhhhhhhhhhhhh")).unwrap(), "hhhhhhhhhhhhhhhhhhhh:abcdefghij");
        assert!(name("", None).is_err());
        assert!(name(&"x".repeat(32), None).is_err());
    }

    #[test]
    fn chunk_and_layout_defaults() {
        assert_eq!(choose_chunk(Level::Raid5, None), Ok(1024));
        assert_eq!(choose_chunk(Level::Raid1, None), Ok(0));
        assert_eq!(choose_chunk(Level::Linear, None), Ok(0));
        assert!(choose_chunk(Level::Raid1, Some(128)).is_err());
        assert!(choose_chunk(Level::Raid0, Some(24)).is_err());
        assert!(choose_chunk(Level::Raid0, Some(4)).is_err());
        assert_eq!(choose_layout(Level::Raid5, None, 3), Ok(2));
        assert_eq!(choose_layout(Level::Raid10, None, 2), Ok(0x102));
        assert_eq!(choose_layout(Level::Raid0, None, 2), Ok(1));
        assert!(choose_layout(Level::Raid5, Some(8), 3).is_err());
        assert_eq!(choose_layout(Level::Raid6, Some(8), 4), Ok(8));
        assert!(choose_layout(Level::Raid10, Some(0x103), 2).is_err());
        assert!(choose_layout(Level::Raid0, Some(0), 2).is_err());
    }
}
