//! `raidnbd check [--repair]`: offline scrub. Reads every stripe (or mirror block),
//! counts parity/mirror mismatches in md's `mismatch_cnt` units, and with `--repair`
//! rewrites them. Exit status 1 when mismatches were found (even if repaired).

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::{Result, anyhow};
use indicatif::{ProgressBar, ProgressStyle};
use raid_core::engine::ScrubCounts;
use serde_json::json;

use crate::cli::{CheckArgs, MemberIoArgs};
use crate::open::{MemberOpenOptions, open_array};
use crate::size::human_bytes;

/// Units scrubbed between progress updates.
const UNITS_PER_STEP: u64 = 16;

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
                "mismatch_cnt": total.mismatch_sectors,
                "repaired_sectors": total.repaired_sectors,
                "seconds": secs,
            }))?
        );
    } else {
        println!(
            "{} {name}: {} checked in {secs:.1}s, mismatch_cnt {} sectors{}",
            if args.repair { "repaired" } else { "checked" },
            human_bytes(total.scrubbed_bytes),
            total.mismatch_sectors,
            if args.repair { format!(", {} sectors rewritten", total.repaired_sectors) } else { String::new() }
        );
    }
    array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
    Ok(total.mismatch_sectors > 0)
}
