//! What a bench run produced: one [`RunRecord`] per (array, cache mode, workload), the
//! settings and the machine, and with `--preset` the published numbers beside ours
//! ([`Comparison`], which the presets fill in). Serialised as is to JSON; CSV, Markdown and
//! SVG are views. The records use no other bench module: `preset`, `report` and the rest
//! use them.
//!
//! Ratios: an array's MB/s divided by "single"'s MB/s for the same workload and cache
//! mode (for fixed block sizes that is also the IOPS ratio).

use serde::Serialize;

/// Outcome of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not run: the server does not offer the feature yet (e.g. writeback cache).
    Skipped,
    Failed,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skipped => "skipped",
            Status::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// `raid5 4x64K`, `single`.
    pub array: String,
    /// `raid5`, `single`.
    pub level: String,
    pub members: usize,
    pub chunk_bytes: Option<u64>,
    /// `writethrough` / `writeback`.
    pub cache: String,
    /// Workload id, e.g. `rnd4k-q32t1-read`.
    pub workload: String,
    pub label: String,
    /// fio's rw.
    pub rw: String,
    pub block_bytes: u64,
    pub iodepth: u32,
    pub status: Status,
    /// Why a run was skipped or failed.
    pub note: Option<String>,
    /// 10^6 bytes per second.
    pub mb_per_s: Option<f64>,
    /// MB/s over the block size, as CrystalDiskMark derives it (every request is one block).
    pub iops: Option<f64>,
    /// fio's own `iops` (requests counted ÷ runtime; differs by the requests at the ramp and end
    /// boundaries, a few % on short runs).
    pub fio_iops: Option<f64>,
    pub lat_mean_us: Option<f64>,
    pub lat_p99_us: Option<f64>,
    /// The server's CPU time per request and per MiB moved (its own counts, cost.rs).
    pub server_cpu_us_per_op: Option<f64>,
    pub server_cpu_us_per_mib: Option<f64>,
    /// fio's CPU time per request.
    pub client_cpu_us_per_op: Option<f64>,
    /// Copies of written data per byte written, its receipt included (1.0: no copy after it).
    pub copies_per_written_byte: Option<f64>,
    /// This MB/s over single's MB/s (same workload and cache mode).
    pub ratio_vs_single: Option<f64>,
    /// 1-minute load average when the run ended (other work on the machine disturbs results).
    pub load_avg_1m: Option<f64>,
    pub wall_seconds: f64,
    /// Round of this sample (1-based); in the summary, how many rounds were measured.
    pub rounds: usize,
    /// Lowest and highest MB/s over the rounds (summary rows of `--rounds` > 1).
    pub mb_per_s_min: Option<f64>,
    pub mb_per_s_max: Option<f64>,
}

/// One row per (array, cache, workload): the run with the median MB/s over the rounds
/// (the lower median for an even count), with the spread. A key measured in no round
/// keeps its first (skipped or failed) sample.
pub fn summarize(samples: &[RunRecord]) -> Vec<RunRecord> {
    let mut keys: Vec<(&str, &str, &str)> = Vec::new();
    for r in samples {
        let key = (r.array.as_str(), r.cache.as_str(), r.workload.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(array, cache, workload)| {
            let all: Vec<&RunRecord> =
                samples.iter().filter(|r| r.array == array && r.cache == cache && r.workload == workload).collect();
            let mut ok: Vec<&RunRecord> =
                all.iter().copied().filter(|r| r.status == Status::Ok && r.mb_per_s.is_some()).collect();
            if ok.is_empty() {
                let mut first = all[0].clone();
                first.rounds = all.len();
                return first;
            }
            ok.sort_by(|a, b| a.mb_per_s.partial_cmp(&b.mb_per_s).unwrap_or(std::cmp::Ordering::Equal));
            let mut median = ok[(ok.len() - 1) / 2].clone();
            median.rounds = ok.len();
            median.mb_per_s_min = ok[0].mb_per_s;
            median.mb_per_s_max = ok[ok.len() - 1].mb_per_s;
            median
        })
        .collect()
}

/// Sets `ratio_vs_single` on every measured run that has a measured single baseline.
pub fn fill_ratios(records: &mut [RunRecord]) {
    let baselines: Vec<(String, String, f64)> = records
        .iter()
        .filter(|r| r.level == "single" && r.status == Status::Ok)
        .filter_map(|r| r.mb_per_s.filter(|&v| v > 0.0).map(|v| (r.cache.clone(), r.workload.clone(), v)))
        .collect();
    for r in records.iter_mut() {
        r.ratio_vs_single = match (r.status, r.mb_per_s) {
            (Status::Ok, Some(v)) => baselines
                .iter()
                .find(|(cache, workload, _)| *cache == r.cache && *workload == r.workload)
                .map(|(_, _, base)| v / base),
            _ => None,
        };
    }
}

/// The machine the bench ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: Option<String>,
    pub mem_total_bytes: Option<u64>,
    pub kernel: Option<String>,
    pub fio_version: String,
    pub load_avg_start: Option<[f64; 3]>,
    pub load_avg_end: Option<[f64; 3]>,
}

impl Machine {
    pub fn probe(fio_version: String) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string()),
            mem_total_bytes: meminfo
                .lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
                .map(|kib| kib * 1024),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string()),
            fio_version,
            load_avg_start: load_avg(),
            load_avg_end: None,
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn load_avg() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The settings that shaped the numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub member_bytes: u64,
    /// Where the members were: a directory of sparse files, or devices.
    pub member_location: String,
    pub member_bw_bytes_per_sec: Option<u64>,
    pub member_iops: Option<u64>,
    /// `--export-bw`: all members of an array together.
    pub export_bw_bytes_per_sec: Option<u64>,
    pub io_engine: String,
    pub buffered: bool,
    pub runtime_seconds: f64,
    pub ramp_seconds: f64,
    pub fill: bool,
    pub caches: Vec<String>,
    /// `serve --cache-size` for write-back runs (`None` = serve's default).
    pub cache_bytes: Option<u64>,
    pub rounds: usize,
    /// `serve --write-gather-us` (`None`: serve's default).
    pub write_gather_us: Option<u64>,
    /// `create --consistency-policy` of the RAID5 arrays (`None`: create's default, ppl).
    #[serde(default)]
    pub consistency_policy: Option<String>,
}

/// One published number (or finding) and ours.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub experiment: String,
    pub measure: String,
    pub published: String,
    pub ours: String,
    /// Why they differ, where they do.
    pub note: String,
}

/// Everything, as written to results.json.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub tool: String,
    pub version: String,
    /// The command line, for reproducing the run.
    pub command: String,
    pub started_unix: u64,
    pub finished_unix: u64,
    pub machine: Machine,
    pub settings: Settings,
    /// `--preset`: what it rebuilds, and the published numbers beside ours.
    pub preset: Option<String>,
    pub published: Vec<Comparison>,
    /// One row per (array, cache mode, workload); the median run with `--rounds`.
    pub runs: Vec<RunRecord>,
    /// Every round's runs when `--rounds` > 1 (empty otherwise).
    pub samples: Vec<RunRecord>,
    pub notes: Vec<String>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn record(array: &str, cache: &str, workload: &str, mb: Option<f64>) -> RunRecord {
        RunRecord {
            array: array.into(),
            level: array.split(' ').next().unwrap_or(array).into(),
            members: 4,
            chunk_bytes: Some(65536),
            cache: cache.into(),
            workload: workload.into(),
            label: workload.to_uppercase(),
            rw: "read".into(),
            block_bytes: 4096,
            iodepth: 1,
            status: if mb.is_some() { Status::Ok } else { Status::Skipped },
            note: mb.is_none().then(|| "skipped: not available".to_string()),
            mb_per_s: mb,
            iops: mb.map(|m| m * 1e6 / 4096.0),
            fio_iops: mb.map(|m| m * 1e6 / 4096.0),
            lat_mean_us: mb.map(|_| 100.0),
            lat_p99_us: None,
            server_cpu_us_per_op: None,
            server_cpu_us_per_mib: None,
            client_cpu_us_per_op: None,
            copies_per_written_byte: None,
            ratio_vs_single: None,
            load_avg_1m: Some(1.0),
            wall_seconds: 1.0,
            rounds: 1,
            mb_per_s_min: None,
            mb_per_s_max: None,
        }
    }

    #[test]
    fn summary_takes_the_median_run() {
        let mut samples = Vec::new();
        for (round, mb) in [(1, Some(30.0)), (2, Some(10.0)), (3, Some(20.0)), (4, None)] {
            let mut r = record("raid0 4x64K", "writethrough", "a", mb);
            r.rounds = round;
            r.lat_mean_us = mb.map(|m| m * 10.0);
            if mb.is_none() {
                r.status = Status::Failed;
            }
            samples.push(r);
        }
        samples.push(record("raid0 4x64K", "writeback", "a", None));
        let summary = summarize(&samples);
        assert_eq!(summary.len(), 2);
        assert_eq!(summary[0].mb_per_s, Some(20.0));
        assert_eq!(summary[0].lat_mean_us, Some(200.0), "the median run's own latency");
        assert_eq!((summary[0].mb_per_s_min, summary[0].mb_per_s_max), (Some(10.0), Some(30.0)));
        assert_eq!(summary[0].rounds, 3, "three measured rounds");
        assert_eq!(summary[1].status, Status::Skipped);
    }

    #[test]
    fn ratios_use_the_same_workload_and_cache() {
        let mut rs = vec![
            record("single", "writethrough", "a", Some(20.0)),
            record("raid0 4x64K", "writethrough", "a", Some(78.0)),
            record("raid0 4x64K", "writethrough", "b", Some(50.0)),
            record("raid0 4x64K", "writeback", "a", None),
        ];
        fill_ratios(&mut rs);
        assert_eq!(rs[0].ratio_vs_single, Some(1.0));
        assert_eq!(rs[1].ratio_vs_single, Some(3.9));
        assert_eq!(rs[2].ratio_vs_single, None, "no baseline for b");
        assert_eq!(rs[3].ratio_vs_single, None, "skipped");
    }

    #[test]
    fn reads_load_average() {
        let l = load_avg().expect("/proc/loadavg on Linux");
        assert!(l.iter().all(|v| *v >= 0.0));
    }
}
