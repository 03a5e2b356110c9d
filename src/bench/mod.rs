//! `raidnbd bench`: single volume vs arrays, measured the way people measure disks.
//!
//! ```text
//!  Plan (levels × chunks × cache modes, workloads)
//!   for each array:  fresh members ─► `raidnbd create` (child of current_exe)
//!     for each cache mode: `raidnbd serve` on a free 127.0.0.1 port (child)
//!        ├─ refused with "not available" ─► "skipped: not available" rows
//!        └─ fill once ─► fio --ioengine=nbd per workload ─► JSON ─► RunRecord
//!  RunRecords ─► ratios to "single" ─► results.md / .csv / .json / .svg / -ratio.svg
//! ```
//!
//! Contract: every number comes from fio's JSON for a run against the served export; a
//! run that could not be made is a row saying so (skipped or failed, with the reason),
//! never a made-up value. Progress goes to stderr, one line per run with an ETA. Ctrl-C
//! stops the current fio, writes what was measured so far and removes the temporary
//! members (unless `--keep`).

mod args;
mod cost;
mod fio;
mod notes;
mod plan;
mod preset;
mod progress;
mod record;
mod report;
mod server;
mod svg;
mod workloads;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

pub use crate::duration::parse_duration;
pub use args::BenchArgs;

use crate::shared_args::CacheMode;
use crate::size::format_size;
use fio::FioJob;
use plan::{ArraySpec, Plan};
use progress::Progress;
use record::{BenchReport, Machine, RunRecord, Settings, Status};
use server::{Served, ServedArray, Workspace};
use workloads::{Rw, Workload};

/// Set by Ctrl-C / SIGTERM; checked between and during runs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub async fn run(mut args: BenchArgs) -> Result<()> {
    let preset = match args.preset.as_deref() {
        Some(name) => {
            let names: Vec<&str> = preset::PRESETS.iter().map(|p| p.name).collect();
            let p = preset::find(name)
                .ok_or_else(|| anyhow::anyhow!("unknown --preset {name:?}: use {}", names.join(", ")))?;
            p.apply(&mut args);
            eprintln!("raidnbd bench: preset {}: {}", p.name, p.about);
            Some(p)
        }
        None => None,
    };
    let mut plan = Plan::from_args(&args)?;
    plan.preset = preset;
    let command = command_line();
    tokio::spawn(async {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else { return };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        INTERRUPTED.store(true, Ordering::SeqCst);
    });
    tokio::task::spawn_blocking(move || run_blocking(&plan, command)).await.context("the bench task died")?
}

/// The command line as typed (quoted where needed), for reproducing the run.
fn command_line() -> String {
    let mut args = std::env::args();
    let _exe = args.next();
    let quoted: Vec<String> = args
        .map(|a| if a.contains([' ', '"', '\'', '$']) { format!("'{}'", a.replace('\'', "'\\''")) } else { a })
        .collect();
    format!("raidnbd {}", quoted.join(" "))
}

fn cache_name(cache: CacheMode) -> String {
    cache.to_possible_value().map_or_else(|| format!("{cache:?}"), |v| v.get_name().to_string())
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn run_blocking(plan: &Plan, command: String) -> Result<()> {
    let workloads = workloads::select(workloads::all(&plan.sweep_bytes), &plan.workload_filter)?;
    let fio_version = fio::check_installed()?;
    std::fs::create_dir_all(&plan.out).with_context(|| format!("cannot create {}", plan.out.display()))?;
    let workspace = Workspace::new(plan.dir.as_deref(), plan.keep)?;
    let mut machine = Machine::probe(fio_version);
    let started_unix = unix_now();

    let runs_total = plan.rounds * plan.arrays.len() * plan.caches.len() * workloads.len();
    let per_run_guess = plan.ramp + plan.runtime + Duration::from_millis(500);
    let fills: Vec<(u64, usize)> = if plan.fill {
        let per_round = plan.arrays.iter().map(|a| (plan.member_bytes * a.data_disks() as u64, a.data_disks()));
        per_round.cycle().take(plan.rounds * plan.arrays.len()).collect()
    } else {
        Vec::new()
    };
    let fill_rate_guess = plan.io.member_bw.map_or(300e6, |bw| bw as f64);
    let mut progress = Progress::new(runs_total, per_run_guess, fills, fill_rate_guess);
    eprintln!(
        "raidnbd bench: {}{} array(s) × {} cache mode(s) × {} workload(s) = {runs_total} runs of {} + {} s warm-up; \
         members in {}; results to {}",
        if plan.rounds > 1 { format!("{} rounds × ", plan.rounds) } else { String::new() },
        plan.arrays.len(),
        plan.caches.len(),
        workloads.len(),
        plan.runtime.as_secs_f64(),
        plan.ramp.as_secs_f64(),
        if plan.devices.is_empty() { workspace.root.display().to_string() } else { plan.devices.join(",") },
        plan.out.display()
    );

    let mut samples: Vec<RunRecord> = Vec::new();
    let outcome = measure_all(plan, &workloads, &workspace, &mut progress, &mut samples);

    machine.load_avg_end = record::load_avg();
    let mut records = record::summarize(&samples);
    record::fill_ratios(&mut records);
    if plan.rounds > 1 {
        record::fill_ratios(&mut samples);
    } else {
        samples.clear();
    }
    let report = BenchReport {
        tool: "raidnbd bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        command,
        started_unix,
        finished_unix: unix_now(),
        machine,
        settings: settings(plan, &workspace),
        notes: notes::notes(plan, &workloads, &records),
        published: plan.preset.map(|p| p.compare(&records)).unwrap_or_default(),
        preset: plan.preset.map(|p| format!("{}: {}", p.name, p.about)),
        runs: records,
        samples,
    };
    if !report.runs.is_empty() {
        write_outputs(&plan.out, &report)?;
    }
    for c in &report.published {
        eprintln!("  {} · {}: published {}, ours {}", c.experiment, c.measure, c.published, c.ours);
    }
    outcome?;
    eprintln!("raidnbd bench: done");
    Ok(())
}

fn settings(plan: &Plan, workspace: &Workspace) -> Settings {
    Settings {
        member_bytes: plan.member_bytes,
        member_location: if let Some(remote) = &plan.remote {
            format!("sparse files in {}, each served by {}", workspace.root.display(), remote.describe())
        } else if plan.devices.is_empty() {
            format!("sparse files in {}", workspace.root.display())
        } else {
            format!("devices {}", plan.devices.join(", "))
        },
        member_bw_bytes_per_sec: plan.io.member_bw,
        member_iops: plan.io.member_iops,
        export_bw_bytes_per_sec: plan.io.export_bw,
        io_engine: server::member_io_flags(&plan.io)[1].clone(),
        buffered: plan.io.buffered,
        runtime_seconds: plan.runtime.as_secs_f64(),
        ramp_seconds: plan.ramp.as_secs_f64(),
        fill: plan.fill,
        caches: plan.caches.iter().map(|&c| cache_name(c)).collect(),
        cache_bytes: plan.cache_bytes,
        rounds: plan.rounds,
        write_gather_us: plan.write_gather_us,
        consistency_policy: plan.consistency_policy.clone(),
    }
}

fn write_outputs(out: &Path, report: &BenchReport) -> Result<()> {
    let files = [
        ("results.md", report::markdown(report)),
        ("results.csv", report::csv(&report.runs)),
        ("results.json", report::json(report)),
        ("results.svg", svg::throughput_chart(report)),
        ("results-ratio.svg", svg::ratio_chart(report)),
    ];
    for (name, text) in files {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!(
        "raidnbd bench: wrote results.md, results.csv, results.json, results.svg, results-ratio.svg in {}",
        out.display()
    );
    Ok(())
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; the runs finished so far are in the results");
    }
    Ok(())
}

/// Builds, serves and measures every array; records go to `records` even on error.
fn measure_all(
    plan: &Plan,
    workloads: &[Workload],
    workspace: &Workspace,
    progress: &mut Progress,
    records: &mut Vec<RunRecord>,
) -> Result<()> {
    for round in 1..=plan.rounds {
        for array_index in 0..plan.arrays.len() {
            measure_array(plan, workloads, workspace, progress, records, array_index, round)?;
        }
    }
    Ok(())
}

/// One round of one array: fresh members, then every cache mode and workload.
fn measure_array(
    plan: &Plan,
    workloads: &[Workload],
    workspace: &Workspace,
    progress: &mut Progress,
    records: &mut Vec<RunRecord>,
    array_index: usize,
    round: usize,
) -> Result<()> {
    check_interrupted()?;
    let array = &plan.arrays[array_index];
    let members = server::create_array(array, workspace, plan, plan.remote.as_ref())?;
    let mut filled = !plan.fill;
    for &cache in &plan.caches {
        check_interrupted()?;
        let cache_text = cache_name(cache);
        let log = workspace.root.join(format!("serve-{}-{cache_text}.log", array.id()));
        match server::serve(&members.paths, cache, plan.cache_bytes, &plan.io, plan.write_gather_us, &log)? {
            Served::Unavailable(reason) => {
                eprintln!("{} {cache_text}: skipped: not available ({reason})", array.label());
                let arrays_left = (plan.rounds - round) * plan.arrays.len() + plan.arrays.len() - array_index;
                progress.cache_unavailable(&cache_text, arrays_left * workloads.len());
                for w in workloads {
                    let note = Some(format!("skipped: not available ({reason})"));
                    records.push(new_record(array, &cache_text, w, Status::Skipped, note, round));
                }
            }
            Served::Running(mut served) => {
                if !filled {
                    fill(array, &served, members.array_bytes, workspace, progress)?;
                    filled = true;
                }
                for w in workloads {
                    check_interrupted()?;
                    if cache == CacheMode::Writeback {
                        drain(array, &served, workspace)?;
                    }
                    let mut record = measure(array, &cache_text, w, &mut served, plan, workspace, progress, records)?;
                    record.rounds = round;
                    records.push(record);
                }
                served.stop()?;
            }
        }
    }
    if !filled {
        progress.fill_skipped();
    }
    Ok(())
}

fn new_record(
    array: &ArraySpec,
    cache: &str,
    w: &Workload,
    status: Status,
    note: Option<String>,
    round: usize,
) -> RunRecord {
    RunRecord {
        array: array.label(),
        level: array.level_name(),
        members: array.members,
        chunk_bytes: array.chunk_bytes,
        cache: cache.to_string(),
        workload: w.id.clone(),
        label: w.label.clone(),
        rw: w.rw.fio_name().to_string(),
        block_bytes: w.block_bytes(array),
        iodepth: w.iodepth,
        status,
        note,
        mb_per_s: None,
        iops: None,
        fio_iops: None,
        lat_mean_us: None,
        lat_p99_us: None,
        server_cpu_us_per_op: None,
        server_cpu_us_per_mib: None,
        client_cpu_us_per_op: None,
        copies_per_written_byte: None,
        ratio_vs_single: None,
        load_avg_1m: None,
        wall_seconds: 0.0,
        rounds: round,
        mb_per_s_min: None,
        mb_per_s_max: None,
    }
}

/// Writes the whole export once (whole stripes, Q8) so later reads see written data.
fn fill(
    array: &ArraySpec,
    served: &ServedArray,
    array_bytes: Option<u64>,
    workspace: &Workspace,
    progress: &mut Progress,
) -> Result<()> {
    let bytes = array_bytes.unwrap_or(0);
    progress.fill_started(&array.label(), bytes);
    let job = FioJob {
        name: format!("fill-{}", array.id()),
        uri: served.uri(),
        rw: Rw::Write,
        block_bytes: workloads::full_stripe_block_bytes(array),
        iodepth: 8,
        timing: None,
        end_fsync: true,
    };
    let started = Instant::now();
    let json = workspace.root.join(format!("fio-fill-{}.json", array.id()));
    let m = fio::run(&job, &json, &INTERRUPTED).with_context(|| format!("filling {}", array.label()))?;
    let took = started.elapsed();
    progress.fill_done(
        m.io_bytes,
        array.data_disks(),
        took,
        &format!("{:.1} MB/s, {:.0} s", m.bytes_per_sec / 1e6, took.as_secs_f64()),
    );
    Ok(())
}

/// Flushes the server (an NBD FLUSH after one 4 KiB write, untimed) so that each write-back
/// run starts with an empty cache instead of draining the previous run's dirty data.
fn drain(array: &ArraySpec, served: &ServedArray, workspace: &Workspace) -> Result<()> {
    let job = FioJob {
        name: "drain".into(),
        uri: served.uri(),
        rw: Rw::Write,
        block_bytes: 4096,
        iodepth: 1,
        timing: None,
        end_fsync: true,
    };
    let started = Instant::now();
    let json = workspace.root.join("fio-drain.json");
    fio::run_bytes(&job, 4096, &json, &INTERRUPTED).with_context(|| format!("flushing {}", array.label()))?;
    let took = started.elapsed();
    if took > Duration::from_secs(2) {
        eprintln!(
            "  (flushed the write-back cache of {} before the next run: {:.0} s)",
            array.label(),
            took.as_secs_f64()
        );
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    array: &ArraySpec,
    cache: &str,
    w: &Workload,
    served: &mut ServedArray,
    plan: &Plan,
    workspace: &Workspace,
    progress: &mut Progress,
    earlier: &[RunRecord],
) -> Result<RunRecord> {
    let block_bytes = w.block_bytes(array);
    progress.run_started(&format!(
        "{} {cache} · {} (bs {}, QD{})",
        array.label(),
        w.label,
        format_size(block_bytes),
        w.iodepth
    ));
    let job = FioJob {
        name: w.id.clone(),
        uri: served.uri(),
        rw: w.rw,
        block_bytes,
        iodepth: w.iodepth,
        timing: Some((if w.ramp { plan.ramp } else { Duration::ZERO }, plan.runtime)),
        end_fsync: w.end_fsync,
    };
    let json = workspace.root.join(format!("fio-{}-{cache}-{}.json", array.id(), w.id));
    let started = Instant::now();
    let before = cost::scrape(served.metrics_port);
    let result = fio::run(&job, &json, &INTERRUPTED);
    let spent = match (before, cost::scrape(served.metrics_port)) {
        (Ok(before), Ok(after)) => cost::between(&before, &after),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{} {cache} · {}: no server cost: {e:#}", array.label(), w.label);
            None
        }
    };
    let took = started.elapsed();
    let mut record = new_record(array, cache, w, Status::Ok, None, 0);
    record.wall_seconds = took.as_secs_f64();
    record.load_avg_1m = record::load_avg().map(|l| l[0]);
    match result {
        Ok(m) => {
            let mb = m.bytes_per_sec / 1e6;
            record.mb_per_s = Some(mb);
            let iops = m.bytes_per_sec / block_bytes as f64;
            record.iops = Some(iops);
            record.fio_iops = Some(m.iops);
            record.lat_mean_us = Some(m.lat_mean_us);
            record.lat_p99_us = m.lat_p99_us;
            record.client_cpu_us_per_op = m.client_cpu_us_per_op;
            if let Some(c) = spent {
                record.server_cpu_us_per_op = Some(c.cpu_us_per_op);
                record.server_cpu_us_per_mib = Some(c.cpu_us_per_mib);
                record.copies_per_written_byte = c.copies_per_written_byte;
            }
            let baseline = earlier
                .iter()
                .rev()
                .find(|r| r.level == "single" && r.cache == cache && r.workload == w.id && r.status == Status::Ok)
                .and_then(|r| r.mb_per_s)
                .filter(|_| !array.is_single());
            let ratio = baseline.map_or(String::new(), |b| format!(", {:.2}× single", mb / b));
            let cpu = spent.map_or(String::new(), |c| format!(", server {:.1} µs CPU/op", c.cpu_us_per_op));
            progress.run_done(
                took,
                &format!("{} MB/s, {} IOPS{ratio}{cpu}", report::format_mb(mb), report::format_iops(iops)),
            );
        }
        Err(e) => {
            check_interrupted()?;
            if !served.is_running() {
                bail!("raidnbd serve died during {} on {}; its log:\n{}", w.label, array.label(), served.log_text());
            }
            progress.run_done(took, &format!("FAILED: {e:#}"));
            record.status = Status::Failed;
            record.note = Some(format!("failed: {e:#}"));
        }
    }
    Ok(record)
}
