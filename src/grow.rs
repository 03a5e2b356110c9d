//! `raidnbd grow --add MEMBER... MEMBERS...`: grows an array at rest by members (md's
//! reshape, as `mdadm --grow --raid-devices N --add MEMBER` with the array stopped), or
//! `--raid-devices N --array-size BYTES` removes its last members (md's backwards reshape),
//! then moves the data to the end with a progress line. Interrupted (Ctrl-C, a crash), the next
//! `grow`, `serve` or the kernel continues from where the superblocks say; a reshape already
//! in progress is continued (with no `--add`).
//! `raidnbd grow --size max|SIZE MEMBERS...` changes how much of every member the array uses
//! (md's `--grow --size`); the resync of new space is left to the next `serve`.
//! A running array grows with `raidnbd ctl grow` (control.rs), which shares [`check_count`]
//! and the size helpers.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use raid_core::SECTOR_BYTES;
use raid_core::engine::{Array, LevelChanged, MaintenanceWork, Resized, SizeTarget, Step};
use raid_core::geometry::Level;
use raid_core::{Member, integrity};
use serde_json::{Value, json};

use crate::cli::{GrowArgs, MemberIoArgs};
use crate::open::{MemberOpenOptions, open_array, open_member};
use crate::size::{human_bytes, parse_size};

/// Bytes moved per step (one window: a checkpoint each).
const STEP_BYTES: u64 = 16 << 20;

/// `--raid-devices`, when given, must be the members now plus those added, or fewer than
/// now with none added (members removed): `Some(n)` then.
pub fn check_count(array: &Array<dyn Member>, raid_devices: Option<usize>, added: usize) -> Result<Option<usize>> {
    let now = array.geometry().raid_disks();
    match raid_devices {
        Some(n) if n < now && added == 0 => Ok(Some(n)),
        Some(n) if n != now + added => bail!(
            "--raid-devices {n}: the array has {now} members and {added} are added; raidnbd grows onto the members \
             given with --add, or removes the last members (fewer than {now}, no --add)"
        ),
        _ => Ok(None),
    }
}

/// `--layout` and `--chunk` for `array`: md's codes (`None`: unchanged).
pub fn placement(
    array: &Array<dyn Member>,
    layout: Option<&str>,
    chunk_bytes: Option<u64>,
) -> Result<(Option<u32>, Option<u32>)> {
    let layout = crate::create::parse_layout(array.geometry().level(), layout)?;
    let chunk = chunk_bytes.map(crate::create::chunk_sectors).transpose()?;
    Ok((layout, chunk))
}

/// `--level`.
pub fn parse_level(text: &str) -> Result<Level> {
    Level::parse(text).ok_or_else(|| anyhow!("unknown RAID level '{text}': use 0, 1, 4, 5 or 6"))
}

/// A level change, for people.
pub fn level_changed_line(changed: &LevelChanged) -> String {
    let mut line = format!("{} -> {}: {} members", changed.from, changed.to, changed.raid_disks);
    if let Some(role) = changed.missing_role {
        line.push_str(&format!("; role {role} is rebuilt onto the member added (or the next spare)"));
    }
    line
}

/// `--size`: `max`, or a size per member (a bare number is KiB, as mdadm's `--size`).
pub fn parse_size_target(text: &str) -> Result<SizeTarget, String> {
    if text.eq_ignore_ascii_case("max") {
        return Ok(SizeTarget::Max);
    }
    let bytes = if text.trim().bytes().all(|b| b.is_ascii_digit()) {
        parse_size(&format!("{}K", text.trim()))?
    } else {
        parse_size(text)?
    };
    if bytes == 0 || !bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(format!("--size {text}: not a whole number of 512-byte sectors"));
    }
    Ok(SizeTarget::Sectors(bytes / SECTOR_BYTES))
}

/// The reply of `ctl grow --size` (control.rs).
pub fn resized_json(resized: &Resized) -> Value {
    json!({ "resized": {
        "from_component_bytes": resized.from_component_sectors * SECTOR_BYTES,
        "to_component_bytes": resized.to_component_sectors * SECTOR_BYTES,
        "from_bytes": resized.from_bytes,
        "to_bytes": resized.to_bytes,
    }})
}

/// What a resize did, for people (from [`resized_json`]).
pub fn resized_line(reply: &Value) -> Option<String> {
    let r = reply.get("resized")?;
    let bytes = |key: &str| r[key].as_u64().map(human_bytes);
    let (from, to) = (r["from_bytes"].as_u64()?, r["to_bytes"].as_u64()?);
    let verb = match to.cmp(&from) {
        std::cmp::Ordering::Greater => "grew; the new space is resynced in the background",
        std::cmp::Ordering::Less => "shrank",
        std::cmp::Ordering::Equal => "keeps its size (nothing to change)",
    };
    Some(format!(
        "size {} -> {} (each member {} -> {}): {verb}",
        bytes("from_bytes")?,
        bytes("to_bytes")?,
        bytes("from_component_bytes")?,
        bytes("to_component_bytes")?
    ))
}

pub async fn run(args: GrowArgs) -> Result<()> {
    if let Some(algorithm) = &args.grow.integrity {
        return add_integrity(&args.members, algorithm).await;
    }
    let options = MemberOpenOptions { io: MemberIoArgs::default(), ..MemberOpenOptions::default() };
    let opened = open_array(&args.members, &options, false, false).await?;
    let array = opened.array;
    let name = opened.assembly.metadata.name();
    if array.is_read_only() {
        bail!("{name} can only be served read-only now (see the log): it is not grown");
    }
    if let Some(level) = &args.grow.level {
        let level = parse_level(level)?;
        if args.grow.add.len() > 1 {
            bail!("a level change adds at most one member (the role the new level adds)");
        }
        let spare = match args.grow.add.first() {
            Some(path) => Some(open_member(path, &options).await?),
            None => None,
        };
        let changed = array.admin().change_level(level, spare).await.map_err(|e| anyhow!("{name}: {e}"));
        array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
        println!("{name}: {} (a rebuild is left to the next serve)", level_changed_line(&changed?));
        return Ok(());
    }
    if let Some(size) = &args.grow.size {
        let target = parse_size_target(size).map_err(|e| anyhow!(e))?;
        let resized = array.admin().resize(target).await.map_err(|e| anyhow!("{name}: {e}"));
        // Records where the new space's resync stands (the next serve runs it).
        array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
        let reply = resized_json(&resized?);
        println!("{name}: {}", resized_line(&reply).unwrap_or_default());
        return Ok(());
    }
    if array.shape().reshape().is_none() {
        let removing = check_count(&array, args.grow.raid_devices, args.grow.add.len())?;
        let (layout, chunk) = placement(&array, args.grow.layout.as_deref(), args.grow.chunk)?;
        let started = if let Some(n) = removing {
            array.admin().remove_members(n, layout, chunk, args.grow.array_size).await
        } else {
            let mut members: Vec<Arc<dyn Member>> = Vec::with_capacity(args.grow.add.len());
            for path in &args.grow.add {
                members.push(open_member(path, &options).await?);
            }
            array.admin().reshape(members, layout, chunk).await
        };
        if let Err(e) = started {
            array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
            bail!("{name}: {e}");
        }
    } else {
        eprintln!("{name}: a reshape is in progress: continuing it");
    }
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_percent = None;
    let result = loop {
        if array.shape().reshape().is_none() {
            break Ok(()); // a linear array grows at once (nothing moves)
        }
        match array.maintenance().step(STEP_BYTES).await {
            Ok(Step::Finished(MaintenanceWork::Reshape)) => break Ok(()),
            Ok(Step::Worked { work: MaintenanceWork::Reshape, .. }) => {}
            Ok(other) => break Err(anyhow!("unexpected background work while growing: {other:?}")),
            Err(e) => break Err(anyhow!("{e}")),
        }
        let status = array.maintenance().status();
        let percent = status.done * 100 / status.total.max(1);
        if last_percent != Some(percent) && (tty || percent % 10 == 0) {
            eprint!(
                "{}grow: {percent}% ({} of {})",
                if tty { "\r" } else { "" },
                human_bytes(status.done * 512),
                human_bytes(status.total * 512)
            );
            if !tty {
                eprintln!();
            }
            last_percent = Some(percent);
        }
    };
    if tty {
        eprintln!();
    }
    // Whatever else is due (a resync after an unclean stop) is left to the next serve.
    array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
    result?;
    println!(
        "reshaped {name}: {} members, {} in {:.1}s",
        array.geometry().raid_disks(),
        human_bytes(array.size_bytes()),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `raidnbd grow --integrity crc32c MEMBERS`: checksum areas written after md's data area of
/// every member of an array at rest (all of them there), stamped from what the members hold.
async fn add_integrity(paths: &[String], algorithm: &str) -> Result<()> {
    if algorithm != "crc32c" {
        bail!("--integrity {algorithm}: the one algorithm is crc32c");
    }
    let options = MemberOpenOptions { io: MemberIoArgs::default(), ..MemberOpenOptions::default() };
    let opened = open_array(paths, &options, false, true).await?;
    let name = opened.assembly.metadata.name();
    if opened.array.admin().role_status().iter().any(|r| r.integrity.is_some()) {
        bail!("{name} has checksums already");
    }
    if opened.array.shape().reshape().is_some() {
        bail!("{name} is being reshaped: serve it until the reshape ends, then add checksums");
    }
    opened.array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
    drop(opened);
    let plain = MemberOpenOptions { plain: true, ..options };
    let mut members = Vec::with_capacity(paths.len());
    for path in paths {
        let member = open_member(path, &plain).await?;
        // Every member is checked before any is written.
        integrity::area_with_room(member.as_ref())
            .await
            .map_err(|e| anyhow!("{e} (use larger members, or create the array with --integrity)"))?;
        members.push((path, member));
    }
    for (path, member) in &members {
        integrity::format(member.as_ref()).await.map_err(|e| anyhow!("{path}: cannot write checksums: {e}"))?;
    }
    println!(
        "{name}: crc32c checksums of every 4 KiB written on {} members; reads are verified from the next serve",
        members.len()
    );
    Ok(())
}
