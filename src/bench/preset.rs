//! `raidnbd bench --preset NAME`: the published experiments this project grew from, each
//! rebuilt with members that behave like the volumes in it, measured the same kind of way,
//! and printed with our ratio beside the published one.
//!
//! A preset sets the levels, members, chunks, cache modes, throttles and workloads; `--size`,
//! `--runtime`, `--ramp`, `--rounds`, `--dir` and `--out` still apply.

use super::args::BenchArgs;
use super::record::{Comparison, RunRecord, Status};
use crate::shared_args::CacheMode;

pub struct Preset {
    pub name: &'static str,
    pub about: &'static str,
    apply: fn(&mut BenchArgs),
    compare: fn(&[RunRecord]) -> Vec<Comparison>,
}

pub const PRESETS: [Preset; 7] = [
    Preset {
        name: "cloud-dd-raid0",
        about: "RAID0 of two block volumes (27.2 MB/s each), dd of 1 MiB blocks: 27.2 MB/s one, 52.7 MB/s striped (1.94x)",
        apply: |a| {
            set(a, &["single", "0"], 2, 512 << 10, &["dd-write"]);
            a.io.member_bw = Some(27_200_000);
        },
        compare: |runs| {
            vec![ratio_row(
                runs,
                "two 27.2 MB/s volumes striped, dd bs=1M",
                "dd-write",
                "raid0",
                1.94,
                "dd's 1 MiB writes split into two 512K chunk writes that run at once; the published \
                 run wrote files through a filesystem (its journal and metadata share the volumes), ours \
                 the block device",
            )]
        },
    },
    Preset {
        name: "cloud-ssd-raid0",
        about: "RAID0 of two 300-IOPS SSD volumes, CrystalDiskMark style: RND4K Q32T1 about 2x, SEQ1M about 1x \
                (the instance's link to its volumes, here --export-bw, was the limit)",
        apply: |a| {
            set(a, &["single", "0"], 2, 512 << 10, &["seq1m-q8t1", "rnd4k-q32t1"]);
            a.io.member_iops = Some(300);
            // 300 IOPS of 256 KiB: 75 MiB/s per volume; the instance link carries the same.
            a.io.export_bw = Some(75 << 20);
        },
        compare: |runs| ssd_rows(runs),
    },
    Preset {
        name: "howto-chunks",
        about: "The Linux Software-RAID HOWTO's tables: RAID0 chunks 4K-32K x block sizes 1K/2K/4K, RAID5 8K/32K, \
                RAID10 32K; large sequential reads and writes. Finding: chunk size barely matters for RAID0, \
                block size does; both matter for RAID5",
        apply: |a| {
            set(a, &["single", "0", "5", "10"], 4, 4 << 10, &["sweep-read", "sweep-write"]);
            a.chunks = vec![4 << 10, 8 << 10, 16 << 10, 32 << 10];
            a.sweep = Some(vec![1 << 10, 2 << 10, 4 << 10]);
            // Disks of the time: ~20 MB/s and a few hundred seeks per second.
            a.io.member_bw = Some(20 << 20);
            a.io.member_iops = Some(200);
        },
        compare: |runs| {
            let mut rows = Vec::new();
            for (level, published) in [
                ("raid0", "chunk size barely matters, block size does"),
                ("raid5", "both chunk size and block size matter"),
            ] {
                let (chunk_spread, block_spread) = spreads(runs, level);
                rows.push(Comparison {
                    experiment: "Software-RAID HOWTO".into(),
                    measure: format!("{level}: MB/s spread across chunk sizes vs across block sizes"),
                    published: published.into(),
                    ours: format!("across chunks x{}, across block sizes x{}", fmt(chunk_spread), fmt(block_spread)),
                    note: "spread = highest / lowest MB/s, the other parameter fixed (the worst case is shown); \
                           requests of the block size, 8 in flight, where the HOWTO's bonnie went through ext2"
                        .into(),
                });
            }
            rows
        },
    },
    Preset {
        name: "raid1-write-cache",
        about: "A RAID1 whose disks' write cache was forced on: writes 3-10x faster, unflushed data at risk \
                (our writethrough vs --cache writeback)",
        apply: |a| {
            set(a, &["single", "1"], 2, 64 << 10, &["rnd4k-q1t1-write", "rnd4k-q32t1-write", "seq1m-q1t1-write"]);
            a.cache = vec![CacheMode::Writethrough, CacheMode::Writeback];
            a.io.member_bw = Some(20 << 20);
            a.io.member_iops = Some(200);
        },
        compare: |runs| {
            ["rnd4k-q1t1-write", "rnd4k-q32t1-write", "seq1m-q1t1-write"]
                .iter()
                .map(|w| {
                    let mb = |cache: &str| {
                        runs.iter()
                            .find(|r| {
                                r.level == "raid1" && r.cache == cache && r.workload == *w && r.status == Status::Ok
                            })
                            .and_then(|r| r.mb_per_s)
                    };
                    let ours = match (mb("writeback"), mb("writethrough")) {
                        (Some(b), Some(t)) if t > 0.0 => format!("{:.2}x", b / t),
                        _ => "not measured".into(),
                    };
                    Comparison {
                        experiment: "RAID1 with the write cache on".into(),
                        measure: format!("{w}: write-back over writethrough"),
                        published: "3-10x".into(),
                        ours,
                        note: "our cache (256 MiB unless --cache-size) answers at memory speed until it fills, \
                               so it absorbs a whole short run of small writes: far above a disk's few MiB of \
                               cache, whose gain came from reordering writes to save seeks (not modelled by the \
                               throttle); a sequential stream at queue depth 1 drains at the members' speed: 1x"
                            .into(),
                    }
                })
                .collect()
        },
    },
    Preset {
        name: "remote-dd-raid0",
        about: "cloud-dd-raid0 over the network: each volume a raidnbd serve export reached over NBD (token \
                bucket, 27.2 MB/s), dd of 1 MiB blocks: one such volume vs two striped (published 1.94x)",
        apply: |a| {
            set(a, &["single", "0"], 2, 512 << 10, &["dd-write"]);
            remote(a, Some(27_200_000), None);
        },
        compare: |runs| {
            vec![ratio_row(
                runs,
                "two 27.2 MB/s volumes on another host striped, dd bs=1M",
                "dd-write",
                "raid0",
                1.94,
                "each member behind its own NBD connection (raidnbd's member client); the published run wrote \
                 files through a filesystem, ours the block device",
            )]
        },
    },
    Preset {
        name: "remote-ssd-raid0",
        about: "cloud-ssd-raid0 over the network: two 300-IOPS volumes, each a raidnbd serve export (token bucket), \
                CrystalDiskMark style: RND4K Q32T1 about 2x, SEQ1M about 1x (one link as fast as one volume)",
        apply: |a| {
            set(a, &["single", "0"], 2, 512 << 10, &["seq1m-q8t1", "rnd4k-q32t1"]);
            remote(a, None, Some(300));
            a.io.export_bw = Some(75 << 20);
        },
        compare: |runs| ssd_rows(runs),
    },
    Preset {
        name: "remote-4-volumes",
        about: "Four cloud-like volumes on other hosts (raidnbd serve exports, 20 MiB/s and 200 IOPS each) as RAID0, \
                RAID5 and RAID10 n2 against one: the seed experiment (striping two doubled dd and RND4K Q32) at \
                four, with md's ceilings for the redundant levels",
        apply: |a| {
            set(a, &["single", "0", "5", "10"], 4, 64 << 10, &["seq1m-q8t1", "rnd4k-q32t1"]);
            remote(a, Some(20 << 20), Some(200));
        },
        compare: |runs| {
            let mut rows = Vec::new();
            for (workload, measure) in [
                ("seq1m-q8t1-read", "SEQ1M Q8T1 read"),
                ("seq1m-q8t1-write", "SEQ1M Q8T1 write"),
                ("rnd4k-q32t1-read", "RND4K Q32T1 read"),
                ("rnd4k-q32t1-write", "RND4K Q32T1 write"),
            ] {
                let write = workload.ends_with("write");
                rows.push(ratio_row(runs, measure, workload, "raid0", 4.0, "two doubled: four volumes, four times"));
                let (raid10, why10) = if write { (2.0, "every byte on two members") } else { (4.0, "any copy") };
                rows.push(ratio_row(runs, measure, workload, "raid10", raid10, why10));
                let (raid5, why5) = match (write, workload.starts_with("seq")) {
                    (true, true) => (3.0, "full stripes: three data members of four"),
                    (true, false) => (1.0, "4 member I/Os per small write: N/4"),
                    (false, _) => (4.0, "reads skip parity (sequential reads of 3 of 4 chunks per row: up to 4x)"),
                };
                rows.push(ratio_row(runs, measure, workload, "raid5", raid5, why5));
            }
            rows
        },
    },
];

/// The preset named `name`.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

impl std::fmt::Debug for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Preset {
    pub fn apply(&self, args: &mut BenchArgs) {
        (self.apply)(args);
    }

    pub fn compare(&self, runs: &[RunRecord]) -> Vec<Comparison> {
        (self.compare)(runs)
    }
}

fn set(a: &mut BenchArgs, levels: &[&str], members: usize, chunk: u64, workloads: &[&str]) {
    a.levels = levels.iter().map(|s| s.to_string()).collect();
    a.members = members;
    a.chunks = vec![chunk];
    a.workloads = workloads.iter().map(|s| s.to_string()).collect();
    a.cache = vec![CacheMode::Writethrough];
}

/// Members on "other hosts": `raidnbd serve` exports throttled like cloud volumes (token
/// buckets for bytes/s and IOPS, as `--member-bw`/`--member-iops` throttle local members).
fn remote(a: &mut BenchArgs, bytes_per_sec: Option<u64>, iops: Option<u64>) {
    a.remote_members = true;
    a.remote_server = super::plan::RemoteServer::Raidnbd;
    a.remote_bw = bytes_per_sec;
    a.remote_iops = iops;
}

/// The cloud-ssd-raid0 experiment's rows (two 300-IOPS volumes behind one link).
fn ssd_rows(runs: &[RunRecord]) -> Vec<Comparison> {
    let link = "both volumes share one link as fast as one volume (--export-bw), so striping cannot widen \
                sequential transfers";
    vec![
        ratio_row(runs, "RND4K Q32T1 read", "rnd4k-q32t1-read", "raid0", 2.0, "IOPS add up: 2 x 300"),
        ratio_row(runs, "RND4K Q32T1 write", "rnd4k-q32t1-write", "raid0", 2.0, "IOPS add up: 2 x 300"),
        ratio_row(runs, "SEQ1M Q8T1 read", "seq1m-q8t1-read", "raid0", 1.0, link),
        ratio_row(runs, "SEQ1M Q8T1 write", "seq1m-q8t1-write", "raid0", 1.0, link),
    ]
}

fn fmt(x: Option<f64>) -> String {
    x.map_or("?".into(), |x| format!("{x:.2}"))
}

/// The `level` array's ratio to single on `workload` (writethrough) beside `published`.
fn ratio_row(runs: &[RunRecord], measure: &str, workload: &str, level: &str, published: f64, note: &str) -> Comparison {
    let ours = runs
        .iter()
        .find(|r| r.level == level && r.workload == workload && r.cache == "writethrough")
        .and_then(|r| r.ratio_vs_single);
    Comparison {
        experiment: format!("{level} over single"),
        measure: measure.into(),
        published: format!("{published:.2}x"),
        ours: ours.map_or("not measured".into(), |x| format!("{x:.2}x")),
        note: note.into(),
    }
}

/// For `level`: the largest spread of MB/s across chunk sizes (block size fixed) and across
/// block sizes (chunk fixed), over the sequential sweep runs.
fn spreads(runs: &[RunRecord], level: &str) -> (Option<f64>, Option<f64>) {
    let ok: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.level == level && r.status == Status::Ok && r.workload.starts_with("sweep-"))
        .collect();
    let spread = |group: &dyn Fn(&RunRecord) -> (String, u64)| -> Option<f64> {
        let mut by: std::collections::BTreeMap<(String, u64), Vec<f64>> = Default::default();
        for r in &ok {
            by.entry(group(r)).or_default().extend(r.mb_per_s);
        }
        by.values()
            .filter(|v| v.len() > 1)
            .map(|v| v.iter().cloned().fold(f64::MIN, f64::max) / v.iter().cloned().fold(f64::MAX, f64::min))
            .fold(None, |acc: Option<f64>, x| Some(acc.map_or(x, |a| a.max(x))))
    };
    // Across chunks: group by (rw, block size); across block sizes: group by (rw, chunk).
    let across_chunks = spread(&|r| (r.rw.clone(), r.block_bytes));
    let across_blocks = spread(&|r| (r.rw.clone(), r.chunk_bytes.unwrap_or(0)));
    (across_chunks, across_blocks)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::bench::plan::Plan;
    use crate::bench::workloads;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn every_preset_makes_a_valid_plan_and_says_what_it_compares() {
        for preset in &PRESETS {
            let mut args = Wrapper::parse_from(["bench"]).args;
            preset.apply(&mut args);
            let plan = Plan::from_args(&args).unwrap_or_else(|e| panic!("{}: {e}", preset.name));
            let chosen = workloads::select(workloads::all(&plan.sweep_bytes), &plan.workload_filter).unwrap();
            assert!(!chosen.is_empty(), "{}", preset.name);
            assert!(plan.arrays.iter().any(|a| a.is_single()), "{}: ratios need single", preset.name);
            let rows = preset.compare(&[]);
            assert!(!rows.is_empty() && rows.iter().all(|r| !r.published.is_empty()), "{}", preset.name);
            assert!(find(preset.name).is_some());
        }
        assert!(find("nonsense").is_none());
    }
}
