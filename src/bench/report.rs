//! The views of a [`BenchReport`]: Markdown for people (a summary matrix per cache mode
//! with ratios to single, every run in detail, and notes explaining the workloads),
//! CSV and JSON for scripts.

use std::fmt::Write as _;

use super::record::{BenchReport, RunRecord, Status};
use crate::size::format_size;

/// `83.0`, `0.82`, `312`: three significant-ish digits, as disk tools print.
pub fn format_mb(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn format_iops(v: f64) -> String {
    if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") }
}

fn format_us(v: f64) -> String {
    if v >= 10_000.0 { format!("{:.1} ms", v / 1000.0) } else { format!("{v:.0} µs") }
}

/// CPU time: `12.3 µs`, `315 µs`, `1.2 ms`.
fn format_cpu_us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

/// Arrays in the order they were run, and workloads likewise.
pub fn distinct<'a>(runs: &'a [RunRecord], key: impl Fn(&'a RunRecord) -> &'a str) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for r in runs {
        let k = key(r);
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

fn find<'a>(runs: &'a [RunRecord], array: &str, cache: &str, workload: &str) -> Option<&'a RunRecord> {
    runs.iter().find(|r| r.array == array && r.cache == cache && r.workload == workload)
}

fn cell_text(r: Option<&RunRecord>, value: impl Fn(&RunRecord) -> Option<String>) -> String {
    match r {
        None => "–".to_string(),
        Some(r) if r.status == Status::Ok => value(r).unwrap_or_else(|| "–".into()),
        Some(r) if r.status == Status::Skipped => "skipped".to_string(),
        Some(_) => "failed".to_string(),
    }
}

/// The Markdown report.
pub fn markdown(report: &BenchReport) -> String {
    let runs = &report.runs;
    let mut md = String::new();
    let _ = writeln!(md, "# raidnbd bench\n");
    let _ = writeln!(md, "Command: `{}`\n", report.command);
    let _ = writeln!(md, "{}\n", setup_lines(report).join("\n"));
    if let Some(preset) = &report.preset {
        let _ = writeln!(md, "## Published vs ours\n\nPreset {preset}.\n");
        let _ = writeln!(md, "| Experiment | Measure | Published | Ours | Why they differ |\n|---|---|---|---|---|");
        for c in &report.published {
            let _ = writeln!(md, "| {} | {} | {} | {} | {} |", c.experiment, c.measure, c.published, c.ours, c.note);
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "![MB/s per workload](results.svg)\n\n![Ratio to a single member](results-ratio.svg)\n");
    let arrays = distinct(runs, |r| &r.array);
    let workloads = distinct(runs, |r| &r.workload);
    for cache in distinct(runs, |r| &r.cache) {
        let in_cache: Vec<&RunRecord> = runs.iter().filter(|r| r.cache == cache).collect();
        if in_cache.iter().all(|r| r.status == Status::Skipped) {
            let note = in_cache.first().and_then(|r| r.note.clone()).unwrap_or_default();
            let _ = writeln!(md, "## {cache}\n\n**{note}** (every array and workload)\n");
            continue;
        }
        let header = |md: &mut String, title: &str| {
            let _ = writeln!(md, "## {cache}: {title}\n");
            let _ = writeln!(md, "| Workload | {} |", arrays.join(" | "));
            let _ = writeln!(md, "|---|{}", "---:|".repeat(arrays.len()));
        };
        header(&mut md, "MB/s (× single)");
        for &w in &workloads {
            let label = runs.iter().find(|r| r.workload == w).map_or(w, |r| r.label.as_str());
            let cells: Vec<String> = arrays
                .iter()
                .map(|a| {
                    cell_text(find(runs, a, cache, w), |r| {
                        let mb = format_mb(r.mb_per_s?);
                        Some(match r.ratio_vs_single {
                            Some(x) if r.level != "single" => format!("{mb} ({x:.2}×)"),
                            _ => mb,
                        })
                    })
                })
                .collect();
            let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
        }
        md.push('\n');
        header(&mut md, "IOPS");
        for &w in &workloads {
            let label = runs.iter().find(|r| r.workload == w).map_or(w, |r| r.label.as_str());
            let cells: Vec<String> =
                arrays.iter().map(|a| cell_text(find(runs, a, cache, w), |r| r.iops.map(format_iops))).collect();
            let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
        }
        md.push('\n');
    }
    let _ = writeln!(md, "## Every run\n");
    let _ = writeln!(
        md,
        "| Array | Cache | Workload | bs | QD | MB/s | IOPS | × single | mean lat | p99 lat | server CPU/op | server \
         CPU/MiB | client CPU/op | copies/B written | load 1m |"
    );
    let _ = writeln!(md, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut collapsed: Vec<(&str, &str)> = Vec::new();
    for r in runs {
        if r.status == Status::Skipped {
            let all_skipped =
                runs.iter().filter(|o| o.array == r.array && o.cache == r.cache).all(|o| o.status == Status::Skipped);
            if all_skipped {
                if !collapsed.contains(&(r.array.as_str(), r.cache.as_str())) {
                    collapsed.push((&r.array, &r.cache));
                    let note = r.note.as_deref().unwrap_or("skipped");
                    let _ = writeln!(md, "| {} | {} | all | | | {note} | | | | | | | | | |", r.array, r.cache);
                }
                continue;
            }
        }
        let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or(String::new(), f);
        let measured = match r.status {
            Status::Ok => match (r.mb_per_s, r.mb_per_s_min, r.mb_per_s_max) {
                (Some(mb), Some(lo), Some(hi)) if r.rounds > 1 => {
                    format!("{} ({}–{})", format_mb(mb), format_mb(lo), format_mb(hi))
                }
                (mb, _, _) => opt(mb, format_mb),
            },
            _ => r.note.clone().unwrap_or_else(|| r.status.name().to_string()),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {measured} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.array,
            r.cache,
            r.label,
            format_size(r.block_bytes),
            r.iodepth,
            opt(r.iops, format_iops),
            opt(r.ratio_vs_single, |x| format!("{x:.2}×")),
            opt(r.lat_mean_us, format_us),
            opt(r.lat_p99_us, format_us),
            opt(r.server_cpu_us_per_op, format_cpu_us),
            opt(r.server_cpu_us_per_mib, format_cpu_us),
            opt(r.client_cpu_us_per_op, format_cpu_us),
            opt(r.copies_per_written_byte, |c| format!("{c:.2}")),
            opt(r.load_avg_1m, |l| format!("{l:.1}")),
        );
    }
    let _ = writeln!(md, "\n## Notes\n");
    for note in &report.notes {
        let _ = writeln!(md, "- {note}");
    }
    md
}

/// Bullet lines describing the machine and the setup.
fn setup_lines(report: &BenchReport) -> Vec<String> {
    let m = &report.machine;
    let s = &report.settings;
    let load = |l: Option<[f64; 3]>| l.map_or("?".to_string(), |l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]));
    let max_load = report.runs.iter().filter_map(|r| r.load_avg_1m).fold(f64::NAN, f64::max);
    let mut lines = vec![format!(
        "- Machine: {} CPUs{}, {} RAM, Linux {}, {}; load average {} at start, {} at end{}",
        m.cpus,
        m.cpu_model.as_ref().map_or(String::new(), |c| format!(" ({c})")),
        m.mem_total_bytes.map_or("?".to_string(), crate::size::human_bytes),
        m.kernel.as_deref().unwrap_or("?"),
        m.fio_version,
        load(m.load_avg_start),
        load(m.load_avg_end),
        if max_load.is_nan() { String::new() } else { format!(" (1-minute maximum during runs {max_load:.2})") },
    )];
    let mut throttle = Vec::new();
    if let Some(bw) = s.member_bw_bytes_per_sec {
        throttle.push(format!("{}/s ({:.1} MB/s)", format_size(bw), bw as f64 / 1e6));
    }
    if let Some(iops) = s.member_iops {
        throttle.push(format!("{iops} IOPS (one I/O per started 256 KiB)"));
    }
    if let Some(bw) = s.export_bw_bytes_per_sec {
        throttle.push(format!("all members together {}/s ({:.1} MB/s, --export-bw)", format_size(bw), bw as f64 / 1e6));
    }
    lines.push(format!(
        "- Members: {} each, {}; {}; io engine {}{}",
        format_size(s.member_bytes),
        s.member_location,
        if throttle.is_empty() {
            "not throttled by raidnbd".to_string()
        } else {
            format!("each throttled to {}", throttle.join(" and "))
        },
        s.io_engine,
        if s.buffered { ", buffered" } else { ", O_DIRECT where the filesystem allows" },
    ));
    lines.push(match s.consistency_policy.as_deref() {
        Some("journal") => "- RAID4/5/6 consistency policy: journal (md's write journal on one more file)".to_string(),
        other => {
            format!("- RAID5 consistency policy: {}", other.unwrap_or("create's default (ppl: partial parity log)"))
        }
    });
    lines.push(format!(
        "- RAID4/5/6 full-stripe gathering: {}",
        match s.write_gather_us {
            None => "serve's default window".to_string(),
            Some(0) => "off (--write-gather-us 0)".to_string(),
            Some(us) => format!("{us} µs window"),
        }
    ));
    lines.push(format!(
        "- Each run: {} s warm-up, then {} s measured (dd-style: no warm-up); {}",
        s.ramp_seconds,
        s.runtime_seconds,
        if s.fill { "every array written once in full before measuring" } else { "arrays not pre-written (--no-fill)" }
    ));
    if s.rounds > 1 {
        lines.push(format!(
            "- {} rounds, arrays interleaved (each round builds every array afresh): tables show the run with the \
             median MB/s; the detail table adds the (lowest–highest) MB/s over the rounds",
            s.rounds
        ));
    }
    lines
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_string() }
}

pub const CSV_HEADER: &str = "array,level,members,chunk_bytes,cache,workload,label,rw,block_bytes,iodepth,status,note,\
                              mb_per_s,iops,fio_iops,lat_mean_us,lat_p99_us,ratio_vs_single,load_avg_1m,wall_seconds,rounds,\
                              mb_per_s_min,mb_per_s_max,server_cpu_us_per_op,server_cpu_us_per_mib,client_cpu_us_per_op,\
                              copies_per_written_byte";

/// One line per run, numbers unformatted.
pub fn csv(runs: &[RunRecord]) -> String {
    let num = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
    let mut out = format!("{CSV_HEADER}\n");
    for r in runs {
        let fields = [
            csv_field(&r.array),
            csv_field(&r.level),
            r.members.to_string(),
            r.chunk_bytes.map_or(String::new(), |c| c.to_string()),
            csv_field(&r.cache),
            csv_field(&r.workload),
            csv_field(&r.label),
            csv_field(&r.rw),
            r.block_bytes.to_string(),
            r.iodepth.to_string(),
            r.status.name().to_string(),
            csv_field(r.note.as_deref().unwrap_or("")),
            num(r.mb_per_s),
            num(r.iops),
            num(r.fio_iops),
            num(r.lat_mean_us),
            num(r.lat_p99_us),
            num(r.ratio_vs_single),
            num(r.load_avg_1m),
            format!("{:.3}", r.wall_seconds),
            r.rounds.to_string(),
            num(r.mb_per_s_min),
            num(r.mb_per_s_max),
            num(r.server_cpu_us_per_op),
            num(r.server_cpu_us_per_mib),
            num(r.client_cpu_us_per_op),
            num(r.copies_per_written_byte),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

pub fn json(report: &BenchReport) -> String {
    serde_json::to_string_pretty(report).expect("a report always serialises") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::tests::record;

    #[test]
    fn csv_quotes_and_counts_fields() {
        let mut r = record("raid5 4x64K", "writeback", "a", None);
        r.note = Some("skipped: not available, \"yet\"".into());
        let text = csv(&[r, record("single", "writethrough", "a", Some(20.0))]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].contains("\"skipped: not available, \"\"yet\"\"\""), "{}", lines[1]);
        assert_eq!(lines[2].split(',').count(), CSV_HEADER.split(',').count());
        assert!(lines[2].contains(",20.000000,"));
    }

    #[test]
    fn numbers_read_like_disk_tools() {
        assert_eq!(format_mb(83.04), "83.0");
        assert_eq!(format_mb(0.8192), "0.82");
        assert_eq!(format_mb(312.4), "312");
        assert_eq!(format_iops(199.7), "200");
        assert_eq!(format_iops(20.04), "20.0");
    }
}
