//! The notes under the tables: what each workload is, how ratios and the throttle are
//! counted, and why parity levels look the way they do — written from the actual plan
//! (block sizes per array, the throttle given), so they never describe another run.

use raid_core::geometry::Level;

use super::plan::{ArraySpec, Plan};
use super::record::{RunRecord, Status};
use super::workloads::{Block, Workload, full_stripe_block_bytes};
use crate::size::format_size;

pub fn notes(plan: &Plan, workloads: &[Workload], runs: &[RunRecord]) -> Vec<String> {
    let mut notes = vec![
        "MB/s = 10^6 bytes/s (as CrystalDiskMark shows it); IOPS = MB/s ÷ block size, as CrystalDiskMark derives \
         it (fio's own count, fio_iops in the CSV/JSON, differs by the requests in flight at the ramp and end \
         boundaries). \
         × single = the array's MB/s over single's for the same workload and cache mode; \"single\" is one \
         member served the same way (same binary, flags and throttle; a one-member md linear array)."
            .to_string(),
    ];
    match plan.remote {
        Some(remote) if remote.server == super::plan::RemoteServer::Raidnbd => notes.push(format!(
            "Remote members (`--remote-members --remote-server raidnbd`): each member is a file served by its own \
             `raidnbd serve` on 127.0.0.1 and reached over NBD ({}). Its token buckets meter requests as \
             `--member-bw`/`--member-iops` do (a request of n bytes costs ceil(n / 256 KiB) I/Os), however many are \
             in flight, as a cloud volume's budget does.",
            remote.describe()
        )),
        Some(remote) => notes.push(format!(
            "Remote members (`--remote-members`): each member is a file served by its own nbdkit on 127.0.0.1 and \
             reached over NBD ({}). The delay filter holds each request for {:.1} ms on one of nbdkit's request \
             threads, so a member answers at most threads ÷ delay requests per second; the rate filter meters the \
             bytes of all its connections together. A large request pays the delay once, a throttled cloud volume \
             counts it by size: these members favour large requests a little more than `--member-iops` does.",
            remote.describe(),
            remote.request_delay().as_secs_f64() * 1e3
        )),
        None => {}
    }
    if plan.io.member_bw.is_some() || plan.io.member_iops.is_some() {
        let mut limits = Vec::new();
        if let Some(bw) = plan.io.member_bw {
            limits.push(format!("{}/s ({:.2} MB/s)", format_size(bw), bw as f64 / 1e6));
        }
        if let Some(iops) = plan.io.member_iops {
            limits.push(format!("{iops} IOPS"));
        }
        notes.push(format!(
            "Throttle (`--member-bw`/`--member-iops`): every member is limited to {} like a cloud volume; a member \
             read or write of n bytes costs ceil(n / 256 KiB) I/Os. N members can therefore give at most N× a \
             single member, and only when the array spreads the work evenly without adding member I/Os.",
            limits.join(" and ")
        ));
    }
    let has = |id: &str| workloads.iter().any(|w| w.id == id || w.id.starts_with(&format!("{id}-")));
    if has("dd-write") {
        notes.push(
            "dd-style write: fio rw=write bs=1M iodepth=1 end_fsync=1, time based, no warm-up; the final flush \
             is inside the timing, as with `dd bs=1M oflag=direct conv=fdatasync`."
                .into(),
        );
    }
    if has("seq1m") || has("rnd4k") {
        notes.push(
            "CrystalDiskMark's set: SEQ1M = sequential 1 MiB, RND4K = random 4 KiB; Qn = n requests in flight, \
             T1 = one job (one NBD connection)."
                .into(),
        );
    }
    if workloads.iter().any(|w| w.block == Block::FullStripe) {
        let sizes: Vec<String> = plan
            .arrays
            .iter()
            .map(|a| match a.stripe_data_bytes() {
                Some(stripe) => {
                    let bs = full_stripe_block_bytes(a);
                    let stripes = bs / stripe;
                    format!(
                        "{}: {} = {stripes} stripe{} of {} × {}",
                        a.label(),
                        format_size(bs),
                        if stripes == 1 { "" } else { "s" },
                        a.data_disks(),
                        format_size(a.chunk_bytes.unwrap_or(0))
                    )
                }
                None => format!("{}: 1M", a.label()),
            })
            .collect();
        notes.push(format!(
            "SEQ full-stripe write: sequential writes of whole stripes, Q8T1, bs = chunk × data disks × k (the \
             smallest k giving ≥ 1 MiB; fio starts at offset 0, so every request is stripe-aligned): {}. On \
             RAID4/5/6 each stripe is then overwritten entirely and parity is computed from the new data without \
             reading anything. SEQ1M writes are generally not stripe-aligned{} and pay reads of old data or \
             parity for the partial stripes at both ends of each request.",
            sizes.join("; "),
            example_misalignment(&plan.arrays)
        ));
    }
    let levels: Vec<Level> = plan.arrays.iter().filter_map(|a| a.level).collect();
    if levels.iter().any(|l| matches!(l, Level::Raid4 | Level::Raid5 | Level::Raid6)) {
        notes.push(
            "Parity cost: a small random write on RAID4/5 reads the old data and parity and writes both back (4 \
             member I/Os); on RAID6 read-modify-write also handles Q (6), unless a reconstruct-write needs fewer \
             (4-member RAID6: read the other data block, write data, P and Q = 4). With N members that allows \
             about N/4 (N/6) of a single member's write IOPS: RND4K write ratios near or below 1× on parity \
             levels are that cost, not a defect. Reads do not pay it."
                .into(),
        );
    }
    if levels.contains(&Level::Raid10) || levels.contains(&Level::Raid1) {
        notes.push(
            "Mirrors (RAID1, RAID10 n2) write every block to each copy, so writes reach at most N/copies × a single \
             member; reads may use any copy."
                .into(),
        );
    }
    if has("sweep") {
        let sizes: Vec<String> = plan.sweep_bytes.iter().map(|&b| format_size(b)).collect();
        notes.push(format!(
            "Block-size sweep: random read and random write at {}, Q8T1 — small blocks are IOPS-bound, large \
             blocks bandwidth-bound; the crossover shows where the array's chunk size starts to matter.",
            sizes.join(", ")
        ));
    }
    notes.push(if plan.fill {
        "Before its first run every array is written once in full (sequential, whole stripes, Q8), so reads \
         return written data and writes overwrite allocated space, as on a disk in use."
            .into()
    } else {
        "Arrays were not written before measuring (--no-fill): reads of never-written sparse space can be faster \
         than real data."
            .into()
    });
    if runs.iter().any(|r| r.cache == "writeback" && r.status == Status::Ok) {
        notes.push(format!(
            "Write-back runs: before each one the server is flushed (untimed), so every run starts with an empty \
             cache of {}. Writes then complete at memory speed until the cache holds that much dirty data and at \
             the members' speed after; the dd-style run includes its final flush and so shows what is durable.",
            plan.cache_bytes.map_or("serve's default size".to_string(), format_size)
        ));
    }
    let mut skipped: Vec<(String, String)> = Vec::new();
    for r in runs.iter().filter(|r| r.status == Status::Skipped) {
        let note = r.note.clone().unwrap_or_default();
        if !skipped.iter().any(|(c, n)| *c == r.cache && *n == note) {
            skipped.push((r.cache.clone(), note));
        }
    }
    for (cache, note) in skipped {
        notes.push(format!(
            "{cache}: {note}. These rows fill in by themselves once `raidnbd serve --cache {cache}` works; rerun \
             the same command."
        ));
    }
    let failed = runs.iter().filter(|r| r.status == Status::Failed).count();
    if failed > 0 {
        notes.push(format!("{failed} run(s) failed; their error is in the note column of results.csv/json."));
    }
    notes.push(
        "The load average is recorded per run (load 1m): on a shared machine, compare runs made under similar \
         load, and rerun when it was clearly disturbed."
            .into(),
    );
    notes
}

/// ` (e.g. raid5 4x64K: 1M = 5.33 stripes of 192K)` for the first array where 1 MiB is not whole stripes.
fn example_misalignment(arrays: &[ArraySpec]) -> String {
    arrays
        .iter()
        .filter(|a| matches!(a.level, Some(Level::Raid4 | Level::Raid5 | Level::Raid6)))
        .find_map(|a| {
            let stripe = a.stripe_data_bytes()?;
            (!(1u64 << 20).is_multiple_of(stripe)).then(|| {
                format!(
                    " (e.g. {}: 1M = {:.2} stripes of {})",
                    a.label(),
                    (1u64 << 20) as f64 / stripe as f64,
                    format_size(stripe)
                )
            })
        })
        .unwrap_or_default()
}
