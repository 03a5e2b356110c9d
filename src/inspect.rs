//! `raidnbd examine` and `raidnbd detail`: what `mdadm --examine` / `--detail` tell a
//! person, as text or JSON. Nothing is written to the members.

use std::process::ExitCode;

use anyhow::{Result, bail};
use raid_core::SECTOR_BYTES;
use raid_core::geometry::{Geometry, Level};
use raid_core::integrity::IntegrityReport;
use raid_core::md::{self, ArrayMetadata, Assembly, Candidate, FeatureMap, Superblock};
use serde_json::{Value, json};

use crate::cli::{DetailArgs, InspectArgs, MemberIoArgs};
use crate::create::describe_layout;
use crate::open::{MemberOpenOptions, open_member, read_superblock_area};
use crate::size::human_bytes;
use crate::timefmt::{ctime, rfc3339};

fn read_only_options() -> MemberOpenOptions {
    MemberOpenOptions {
        io: MemberIoArgs { io: Some(member_io::IoEngine::Threads), buffered: true, ..MemberIoArgs::default() },
        read_only: true,
        ..MemberOpenOptions::default()
    }
}

/// Reads and decodes the superblock of every path (errors kept per member), and whether
/// the member has checksums (`create --integrity`).
async fn candidates(paths: &[String]) -> Result<Vec<(Candidate, Option<IntegrityReport>)>> {
    let options = read_only_options();
    let mut out = Vec::new();
    for path in paths {
        let member = open_member(path, &options).await?;
        let area = read_superblock_area(member.as_ref()).await?;
        out.push((Candidate::from_bytes(path.clone(), member.len_bytes(), &area), member.integrity()));
    }
    Ok(out)
}

/// What `examine` says of a member's checksums.
fn checksums_json(report: Option<IntegrityReport>) -> Value {
    report.map_or(
        Value::Null,
        |r| json!({ "algorithm": "crc32c", "block_bytes": 4096, "covered_bytes": r.covered_bytes }),
    )
}

fn level_name(level: Level) -> String {
    level.to_string()
}

/// md's "layout" line for the level.
fn layout_name(level: Level, layout: u32) -> Option<String> {
    use raid_core::geometry::{ParityLayout, Raid10Layout};
    match level {
        Level::Raid5 | Level::Raid6 => ParityLayout::from_md(layout).map(|l| l.name().to_string()),
        Level::Raid4 => Some("parity-last".into()),
        Level::Raid10 => Raid10Layout::from_md(layout).map(|l| l.name()),
        Level::Raid0 => Some(if layout == 2 { "alternate" } else { "original" }.into()),
        _ => None,
    }
}

fn geometry_of(meta: &ArrayMetadata, data_sizes: &[u64]) -> Option<Geometry> {
    let sizes: Vec<u64> = (0..meta.raid_disks as usize)
        .map(|role| match meta.level {
            Level::Linear | Level::Raid0 => data_sizes.get(role).copied().unwrap_or(0),
            _ => meta.size,
        })
        .collect();
    Geometry::new(meta.level, meta.layout, meta.chunk_sectors, &sizes).ok()
}

fn array_state_chars(sb: &Superblock) -> String {
    (0..sb.raid_disks as usize)
        .map(|role| if sb.dev_roles.iter().any(|r| r.active() == Some(role)) { 'A' } else { '.' })
        .collect()
}

/// Entries md's bad-block log has room for (8 bytes each).
fn bad_block_log_entries(sb: &Superblock) -> u64 {
    u64::from(sb.bblog_size) * SECTOR_BYTES / 8
}

fn examine_json(path: &str, sb: &Superblock, device_bytes: u64) -> Value {
    json!({
        "path": path,
        "version": "1.2",
        "feature_map": format!("{:#x}", sb.feature_map.0),
        "array_uuid": sb.set_uuid.to_string(),
        "name": sb.name(),
        "creation_time": rfc3339(sb.ctime_secs()),
        "raid_level": level_name(sb.level),
        "raid_devices": sb.raid_disks,
        "device_bytes": device_bytes,
        "avail_dev_sectors": sb.data_size,
        "used_dev_sectors": sb.size,
        "data_offset_sectors": sb.data_offset,
        "super_offset_sectors": sb.super_offset,
        "recovery_offset_sectors": sb.recovery_offset(),
        "state": if sb.is_clean() { "clean" } else { "active" },
        "device_uuid": sb.device_uuid.to_string(),
        "update_time": rfc3339(sb.utime_secs()),
        "events": sb.events,
        "layout": layout_name(sb.level, sb.layout),
        "chunk_bytes": u64::from(sb.chunksize) * SECTOR_BYTES,
        "device_role": sb.role().to_string(),
        "write_mostly": sb.devflags & raid_core::md::DEVFLAG_WRITE_MOSTLY != 0,
        "bad_block_log": (sb.bblog_offset != 0).then(|| json!({
            "entries": bad_block_log_entries(sb),
            "offset_sectors": sb.bblog_offset,
            "bad_blocks_present": sb.feature_map.contains(FeatureMap::BAD_BLOCKS),
        })),
        "array_state": array_state_chars(sb),
        "reshape": sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE).then(|| json!({
            "position_sectors": sb.reshape_position,
            "delta_disks": sb.delta_disks,
            "new_layout": layout_name(sb.level, sb.new_layout),
            "new_chunk_bytes": u64::from(sb.new_chunk) * SECTOR_BYTES,
            "new_data_offset_sectors": sb.feature_map.contains(FeatureMap::NEW_OFFSET)
                .then(|| sb.data_offset.saturating_add_signed(i64::from(sb.new_offset))),
        })),
    })
}

fn examine_text(path: &str, sb: &Superblock) -> String {
    let mut t = String::new();
    let mut line = |k: &str, v: String| t.push_str(&format!("{k:>15} : {v}\n"));
    line("Magic", "a92b4efc".into());
    line("Version", "1.2".into());
    line("Feature Map", format!("{:#x}", sb.feature_map.0));
    line("Array UUID", sb.set_uuid.to_string());
    line("Name", sb.name());
    line("Creation Time", ctime(sb.ctime_secs()));
    line("Raid Level", level_name(sb.level));
    line("Raid Devices", sb.raid_disks.to_string());
    line("Avail Dev Size", format!("{} sectors ({})", sb.data_size, human_bytes(sb.data_size * SECTOR_BYTES)));
    if sb.size > 0 {
        line("Used Dev Size", format!("{} sectors ({})", sb.size, human_bytes(sb.size * SECTOR_BYTES)));
    }
    line("Data Offset", format!("{} sectors", sb.data_offset));
    if sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE | FeatureMap::NEW_OFFSET) {
        line("New Offset", format!("{} sectors", sb.data_offset.saturating_add_signed(i64::from(sb.new_offset))));
    }
    line("Super Offset", format!("{} sectors", sb.super_offset));
    if let Some(r) = sb.recovery_offset() {
        line("Recovery Offset", format!("{r} sectors"));
    }
    line("State", if sb.is_clean() { "clean".into() } else { "active".into() });
    line("Device UUID", sb.device_uuid.to_string());
    if sb.feature_map.intersects(FeatureMap::ANY_PPL) {
        let raw = sb.bitmap_offset as u32;
        line("PPL", format!("{} sectors at offset {} sectors from superblock", raw >> 16, raw as u16 as i16));
    }
    if sb.devflags & raid_core::md::DEVFLAG_WRITE_MOSTLY != 0 {
        line("Flags", "write-mostly".into());
    }
    line("Update Time", ctime(sb.utime_secs()));
    if sb.bblog_offset != 0 {
        // mdadm's wording; the list itself: `mdadm --examine-badblocks`.
        let present = if sb.feature_map.contains(FeatureMap::BAD_BLOCKS) { " - bad blocks present." } else { "" };
        let entries = bad_block_log_entries(sb);
        line("Bad Block Log", format!("{entries} entries available at offset {} sectors{present}", sb.bblog_offset));
    }
    line("Events", sb.events.to_string());
    if sb.feature_map.contains(FeatureMap::RESHAPE_ACTIVE) {
        // mdadm's wording.
        let (pos, old) = (sb.reshape_position, i64::from(sb.raid_disks) - i64::from(sb.delta_disks));
        line("Reshape pos'n", format!("{} ({})", pos / 2, human_bytes(pos * SECTOR_BYTES)));
        line("Delta Devices", format!("{} ({old}->{})", sb.delta_disks, sb.raid_disks));
    }
    if let Some(layout) = layout_name(sb.level, sb.layout) {
        line("Layout", layout);
    }
    if sb.level.has_chunk() {
        line("Chunk Size", format!("{}K", u64::from(sb.chunksize) / 2));
    }
    line("Device Role", sb.role().to_string());
    line("Array State", format!("{} ('A' == active, '.' == missing)", array_state_chars(sb)));
    format!("{path}:\n{t}")
}

pub async fn examine(args: InspectArgs) -> Result<()> {
    let candidates = candidates(&args.members).await?;
    let mut json_out = Vec::new();
    let mut bad = Vec::new();
    for (c, checksums) in &candidates {
        match &c.superblock {
            Ok(sb) => {
                if args.json {
                    let mut e = examine_json(&c.name, sb, c.device_bytes);
                    e["checksums"] = checksums_json(*checksums);
                    json_out.push(e);
                } else {
                    let mut text = examine_text(&c.name, sb);
                    if let Some(r) = checksums {
                        text.push_str(&format!(
                            "{:>15} : crc32c of every 4 KiB, {} covered (raidnbd; md ignores them)\n",
                            "Checksums",
                            human_bytes(r.covered_bytes)
                        ));
                    }
                    println!("{text}");
                }
            }
            Err(e) => {
                if args.json {
                    json_out.push(json!({ "path": c.name, "error": e.to_string() }));
                } else {
                    println!("{}: no valid md superblock: {e}\n", c.name);
                }
                bad.push(c.name.clone());
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Array(json_out))?);
    }
    if !bad.is_empty() {
        bail!("no valid md superblock on {}", bad.join(", "));
    }
    Ok(())
}

fn state_words(a: &Assembly) -> String {
    let mut s = if a.dirty { "active".to_string() } else { "clean".to_string() };
    if a.degraded {
        s.push_str(", degraded");
    }
    if !a.recovering_roles.is_empty() {
        s.push_str(", recovering");
    }
    s
}

/// md's consistency policy of an array (`mdadm --detail`'s "Consistency Policy").
fn consistency_policy(meta: &ArrayMetadata) -> &'static str {
    if meta.has_journal() {
        "journal"
    } else if meta.ppl_area().is_some() {
        "ppl"
    } else if meta.bitmap_offset().is_some() {
        "bitmap"
    } else if meta.level.parity_blocks() > 0 || matches!(meta.level, Level::Raid1 | Level::Raid10) {
        "resync"
    } else {
        "none"
    }
}

fn detail_json(a: &Assembly, candidates: &[Candidate], geometry: Option<&Geometry>) -> Value {
    let meta = &a.metadata;
    let members: Vec<Value> = (0..meta.raid_disks as usize)
        .map(|role| match a.members[role] {
            Some(c) => json!({
                "role": role,
                "path": candidates[c].name,
                "state": if a.recovering_roles.contains(&role) { "rebuilding" } else { "active sync" },
            }),
            None => json!({ "role": role, "path": null, "state": "removed" }),
        })
        .collect();
    json!({
        "name": meta.name(),
        "uuid": meta.uuid.to_string(),
        "raid_level": level_name(meta.level),
        "layout": layout_name(meta.level, meta.layout),
        "chunk_bytes": u64::from(meta.chunk_sectors) * SECTOR_BYTES,
        "raid_devices": meta.raid_disks,
        "array_size_bytes": geometry.map(|g| g.array_sectors() * SECTOR_BYTES),
        "used_dev_size_bytes": meta.size * SECTOR_BYTES,
        "state": state_words(a),
        "consistency_policy": consistency_policy(meta),
        "logical_block_bytes": meta.logical_block_bytes(),
        "reshape": meta.reshape_state().ok().flatten().map(|r| json!({
            "from_raid_devices": r.previous_raid_disks,
            "to_raid_devices": meta.raid_disks,
            "position_bytes": r.position_sectors * SECTOR_BYTES,
            "done_bytes": r.done_sectors() * SECTOR_BYTES,
            "backwards": r.is_backwards(),
        })),
        "degraded": a.degraded,
        "clean": !a.dirty,
        "events": meta.events,
        "creation_time": rfc3339(meta.ctime_secs()),
        "update_time": rfc3339(meta.utime_secs()),
        "members": members,
        "spares": a.spares.iter().map(|&c| candidates[c].name.clone()).collect::<Vec<_>>(),
        "journal": a.journal.map(|c| candidates[c].name.clone()),
        "faulty": a.faulty.iter().map(|&c| candidates[c].name.clone()).collect::<Vec<_>>(),
        "stale": a.stale.iter().map(|(n, e)| json!({"path": n, "events": e})).collect::<Vec<_>>(),
        "notices": a.notices,
    })
}

/// `raidnbd detail`; with `--test` the exit status tells the array's health as
/// `mdadm --detail --test` does: 0 healthy, 1 degraded, 2 unusable, 4 error.
pub async fn detail(args: DetailArgs) -> Result<ExitCode> {
    let shown = show_detail(&args.inspect).await;
    if !args.test {
        shown?;
        return Ok(ExitCode::SUCCESS);
    }
    Ok(ExitCode::from(match shown {
        Ok(a) if a.degraded || !a.recovering_roles.is_empty() => 1,
        Ok(_) => 0,
        Err(e) => {
            eprintln!("raidnbd: error: {e:#}");
            match e.downcast_ref::<raid_core::RaidError>() {
                Some(r) if r.kind == raid_core::ErrorKind::ArrayFailed => 2,
                _ => 4,
            }
        }
    }))
}

async fn show_detail(args: &InspectArgs) -> Result<Assembly> {
    let (candidates, checksums): (Vec<Candidate>, Vec<Option<IntegrityReport>>) =
        candidates(&args.members).await?.into_iter().unzip();
    let with_checksums = checksums.iter().filter(|c| c.is_some()).count();
    let assembly = md::assemble(&candidates).map_err(anyhow::Error::new)?;
    let meta = &assembly.metadata;
    let data_sizes: Vec<u64> = (0..meta.raid_disks as usize)
        .map(|role| {
            assembly.members[role]
                .and_then(|c| assembly.member_index_of_candidate(c))
                .map_or(0, |i| meta.members[i].data_size)
        })
        .collect();
    let geometry = geometry_of(meta, &data_sizes);
    if args.json {
        let mut detail = detail_json(&assembly, &candidates, geometry.as_ref());
        detail["members_with_checksums"] = json!(with_checksums);
        println!("{}", serde_json::to_string_pretty(&detail)?);
        return Ok(assembly);
    }
    let mut t = String::new();
    let mut line = |k: &str, v: String| t.push_str(&format!("{k:>18} : {v}\n"));
    line("Version", "1.2".into());
    line("Creation Time", ctime(meta.ctime_secs()));
    line("Raid Level", level_name(meta.level));
    if let Some(g) = &geometry {
        let bytes = g.array_sectors() * SECTOR_BYTES;
        line("Array Size", format!("{} bytes ({})", bytes, human_bytes(bytes)));
    }
    if meta.size > 0 {
        line("Used Dev Size", format!("{} sectors ({})", meta.size, human_bytes(meta.size * SECTOR_BYTES)));
    }
    line("Raid Devices", meta.raid_disks.to_string());
    let journal = usize::from(assembly.journal.is_some());
    line("Total Devices", (assembly.members.iter().flatten().count() + assembly.spares.len() + journal).to_string());
    line("Persistence", "Superblock is persistent".into());
    line("Update Time", ctime(meta.utime_secs()));
    line("State", state_words(&assembly));
    line("Active Devices", assembly.members.iter().flatten().count().to_string());
    line("Failed Devices", assembly.faulty.len().to_string());
    line("Spare Devices", assembly.spares.len().to_string());
    if let Some(g) = &geometry {
        line("Layout", describe_layout(g));
    }
    line("Consistency Policy", consistency_policy(meta).into());
    if with_checksums > 0 {
        line(
            "Checksums",
            format!("crc32c of every 4 KiB on {with_checksums} of {} members (raidnbd)", candidates.len()),
        );
    }
    if let Ok(Some(r)) = meta.reshape_state() {
        let done = r.done_sectors() * SECTOR_BYTES;
        line("Reshape Status", format!("{} of the new layout written", human_bytes(done)));
        line("Delta Devices", format!("{}, ({}->{})", meta.delta_disks, r.previous_raid_disks, meta.raid_disks));
    }
    if meta.logical_block_size != 0 {
        line("Logical Block Size", format!("{} bytes (recorded by Linux 6.19+)", meta.logical_block_size));
    }
    line("Name", meta.name());
    line("UUID", meta.uuid.to_string());
    line("Events", meta.events.to_string());
    println!("{t}");
    println!("    Number   RaidDevice State");
    for role in 0..assembly.members.len() {
        match assembly.members[role] {
            Some(c) => {
                let index = assembly.member_index_of_candidate(c).expect("used member");
                let state = if assembly.recovering_roles.contains(&role) { "spare rebuilding" } else { "active sync" };
                println!("    {:>6}   {role:>10} {state:<17} {}", meta.members[index].dev_number, candidates[c].name);
            }
            None => println!("    {:>6}   {role:>10} removed", "-"),
        }
    }
    if let Some(c) = assembly.journal {
        println!("    {:>6}   {:>10} journal           {}", "-", "-", candidates[c].name);
    }
    for &c in &assembly.spares {
        println!("    {:>6}   {:>10} spare             {}", "-", "-", candidates[c].name);
    }
    for &c in &assembly.faulty {
        println!("    {:>6}   {:>10} faulty            {}", "-", "-", candidates[c].name);
    }
    for (name, events) in &assembly.stale {
        println!("    {:>6}   {:>10} stale (events {events}) {name}", "-", "-");
    }
    for notice in &assembly.notices {
        println!("note: {notice}");
    }
    Ok(assembly)
}
