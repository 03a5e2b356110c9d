//! `raidnbd check [--repair]`: offline scrub. Reads every stripe (or mirror block),
//! counts parity/mirror mismatches in md's `mismatch_cnt` units, and with `--repair`
//! rewrites them. Each mismatch is listed with the member whose bytes are wrong where
//! redundancy names it (raid6, mirrors of three or more; `engine/maintenance/scrub.rs`), and
//! repair rewrites that member. Exit status 1 when mismatches were found (even if repaired).

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{Result, anyhow};
use indicatif::{ProgressBar, ProgressStyle};
use raid_core::Member;
use raid_core::engine::{Array, Mismatch, ScrubCounts};
use serde_json::{Value, json};

use crate::cli::{CheckArgs, MemberIoArgs};
use crate::open::{MemberOpenOptions, open_array};
use crate::size::human_bytes;

/// Units scrubbed between progress updates.
const UNITS_PER_STEP: u64 = 16;

/// The scrub's mismatch log for people and scripts: where, and which member is wrong.
pub fn mismatches_json(array: &Array<dyn Member>, mismatches: &[Mismatch]) -> Value {
    let names = array.admin().role_status();
    let name = |role: usize| names.iter().find(|r| r.role == role).and_then(|r| r.name.clone());
    mismatches
        .iter()
        .map(|m| {
            json!({
                "stripe": m.stripe,
                "member_sector": m.member_sector,
                "sectors": m.sectors,
                "role": m.role,
                "member": m.role.and_then(name),
                "repaired": m.repaired,
            })
        })
        .collect()
}

/// Returns whether mismatches were found.
pub async fn run(args: CheckArgs) -> Result<bool> {
    let options =
        MemberOpenOptions { io: MemberIoArgs::default(), read_only: !args.repair, ..MemberOpenOptions::default() };
    let opened = open_array(&args.members, &options, false, true).await?;
    let array = opened.array;
    let units = array.maintenance().scrub_units();
    let size = array.size_bytes();
    let name = opened.assembly.metadata.name();
    let tty = std::io::stderr().is_terminal() && !args.json;
    let bar = if tty {
        let bar = ProgressBar::new(size);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(if args.repair { "repair" } else { "check" });
        Some(bar)
    } else {
        None
    };
    let started = Instant::now();
    let mut total = ScrubCounts::default();
    let mut next_line_percent = 10;
    let mut unit = 0;
    while unit < units {
        let step = UNITS_PER_STEP.min(units - unit);
        total += array.maintenance().scrub(unit, step, args.repair).await.map_err(|e| anyhow!("{e}"))?;
        unit += step;
        if let Some(bar) = &bar {
            bar.set_position(total.scrubbed_bytes);
        } else if !args.json && total.scrubbed_bytes * 100 / size.max(1) >= next_line_percent {
            eprintln!("check: {next_line_percent}% ({} of {})", human_bytes(total.scrubbed_bytes), human_bytes(size));
            next_line_percent += 10;
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let secs = started.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "array": name,
                "checked_bytes": total.scrubbed_bytes,
                "hole_bytes": total.hole_bytes,
                "mismatch_cnt": total.mismatch_sectors,
                "located_sectors": total.located_sectors,
                "mismatches": mismatches_json(&array, &array.maintenance().mismatches()),
                "repaired_sectors": total.repaired_sectors,
                "seconds": secs,
            }))?
        );
    } else {
        for m in mismatches_json(&array, &array.maintenance().mismatches()).as_array().into_iter().flatten() {
            let place = match m["stripe"].as_u64() {
                Some(stripe) => format!("stripe {stripe}, "),
                None => String::new(),
            };
            let who = match m["member"].as_str() {
                Some(member) => format!("wrong on {member} (role {})", m["role"]),
                None => "which member is wrong is not known".to_string(),
            };
            println!(
                "mismatch: {place}member sectors {}+{}: {who}{}",
                m["member_sector"],
                m["sectors"],
                if m["repaired"] == true { ", repaired" } else { "" }
            );
        }
        println!(
            "{} {name}: {} checked in {secs:.1}s ({} of it holes on every member, not read), mismatch_cnt {} sectors{}",
            if args.repair { "repaired" } else { "checked" },
            human_bytes(total.scrubbed_bytes),
            human_bytes(total.hole_bytes),
            total.mismatch_sectors,
            if args.repair { format!(", {} sectors rewritten", total.repaired_sectors) } else { String::new() }
        );
    }
    array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
    Ok(total.mismatch_sectors > 0)
}
