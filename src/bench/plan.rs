//! What a bench run measures: the arrays (level × chunk size), the cache modes, and the
//! settings after `--quick` defaults are applied. Pure: no I/O, so it is unit-tested.
//!
//! "single" is one member served exactly like the arrays (same binary, same throttle, same
//! engine path: an md `linear` array of one member), so ratios compare like with like.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use raid_core::geometry::Level;

use super::args::BenchArgs;
use crate::shared_args::{CacheMode, MemberIoArgs};
use crate::size::format_size;

/// One array to build and measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArraySpec {
    /// `None` = "single": one member, the baseline.
    pub level: Option<Level>,
    pub members: usize,
    /// `None` for levels without chunks (single, linear, raid1).
    pub chunk_bytes: Option<u64>,
}

impl ArraySpec {
    pub fn single() -> Self {
        Self { level: None, members: 1, chunk_bytes: None }
    }

    pub fn is_single(&self) -> bool {
        self.level.is_none()
    }

    /// `single`, `raid5`.
    pub fn level_name(&self) -> String {
        self.level.map_or("single".to_string(), |l| l.to_string())
    }

    /// `single`, `raid5 4x64K`, `raid1 2x`: what tables and charts show.
    pub fn label(&self) -> String {
        match (self.level, self.chunk_bytes) {
            (None, _) => "single".to_string(),
            (Some(level), Some(chunk)) => format!("{level} {}x{}", self.members, format_size(chunk)),
            (Some(level), None) => format!("{level} {}x", self.members),
        }
    }

    /// File-name safe: `single`, `raid5-4x64K`.
    pub fn id(&self) -> String {
        self.label().replace(' ', "-")
    }

    /// Members that hold distinct data in one stripe (for full-stripe block sizes).
    pub fn data_disks(&self) -> usize {
        match self.level {
            None | Some(Level::Linear | Level::Raid1) => 1,
            Some(Level::Raid0) => self.members,
            Some(Level::Raid4 | Level::Raid5) => self.members - 1,
            Some(Level::Raid6) => self.members - 2,
            // The default n2 layout keeps two copies of every chunk.
            Some(Level::Raid10) => (self.members / 2).max(1),
        }
    }

    /// Data bytes of one full stripe, when the level stripes.
    pub fn stripe_data_bytes(&self) -> Option<u64> {
        self.chunk_bytes.map(|c| c * self.data_disks() as u64)
    }

    /// Arguments for `raidnbd create` (before the members).
    pub fn create_args(&self) -> Vec<String> {
        let Some(level) = self.level else { return vec!["--level".into(), "linear".into()] };
        let mut args = vec!["--level".into(), level.to_md().to_string()];
        if level == Level::Linear {
            args[1] = "linear".into();
        }
        if let Some(chunk) = self.chunk_bytes {
            args.extend(["--chunk".into(), format_size(chunk)]);
        }
        args
    }
}

/// Every setting of a bench run, resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub arrays: Vec<ArraySpec>,
    pub caches: Vec<CacheMode>,
    pub member_bytes: u64,
    pub runtime: Duration,
    pub ramp: Duration,
    pub sweep_bytes: Vec<u64>,
    pub workload_filter: Vec<String>,
    pub fill: bool,
    pub dir: Option<PathBuf>,
    pub devices: Vec<String>,
    pub keep: bool,
    pub out: PathBuf,
    pub rounds: usize,
    pub cache_bytes: Option<u64>,
    pub io: MemberIoArgs,
    /// Members served by nbdkit, reached over NBD.
    pub remote: Option<RemoteMembers>,
    pub write_gather_us: Option<u64>,
    /// `create --consistency-policy` for RAID5 arrays (`None`: create's default).
    pub consistency_policy: Option<String>,
    pub preset: Option<&'static super::preset::Preset>,
}

/// How `--remote-members` members behave: who serves them, with which limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMembers {
    pub server: RemoteServer,
    pub bytes_per_sec: Option<u64>,
    pub iops: Option<u64>,
    pub delay: Option<Duration>,
}

/// What serves a remote member (`--remote-server`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RemoteServer {
    /// nbdkit's file plugin with its rate and delay filters.
    #[default]
    Nbdkit,
    /// `raidnbd serve` of the file, with its own token-bucket throttle.
    Raidnbd,
}

/// Request threads of each nbdkit member when its IOPS are capped: at most this many
/// requests are in the delay at once.
pub const REMOTE_THREADS: u64 = 4;

impl RemoteMembers {
    /// Delay of every read and write: the latency asked for plus REMOTE_THREADS/iops.
    pub fn request_delay(&self) -> Duration {
        let iops = self.iops.map_or(Duration::ZERO, |n| Duration::from_secs_f64(REMOTE_THREADS as f64 / n as f64));
        self.delay.unwrap_or(Duration::ZERO) + iops
    }

    /// "nbdkit file, 20.0 MiB/s, 200 IOPS, +2 ms": for tables and notes.
    pub fn describe(&self) -> String {
        let nbdkit = self.server == RemoteServer::Nbdkit;
        let server = if nbdkit { "nbdkit file" } else { "raidnbd serve" };
        let mut parts = vec![format!("{server} over NBD (127.0.0.1 TCP)")];
        if let Some(bw) = self.bytes_per_sec {
            parts.push(format!("{}/s ({})", format_size(bw), if nbdkit { "rate filter" } else { "token bucket" }));
        }
        if let Some(iops) = self.iops {
            parts.push(match nbdkit {
                true => format!("{iops} IOPS ({REMOTE_THREADS} threads, delay filter)"),
                false => format!("{iops} IOPS (token bucket)"),
            });
        }
        if let Some(d) = self.delay {
            parts.push(format!("+{} ms per request", d.as_secs_f64() * 1e3));
        }
        parts.join(", ")
    }
}

/// Levels with a chunk size.
fn has_chunk(level: Level) -> bool {
    !matches!(level, Level::Linear | Level::Raid1)
}

/// Parses `--levels` × `--chunks` into arrays, in the order given (single first if asked).
pub fn arrays(levels: &[String], members: usize, chunks: &[u64]) -> Result<Vec<ArraySpec>> {
    if levels.is_empty() {
        bail!("--levels is empty: give e.g. single,0,5");
    }
    if chunks.is_empty() {
        bail!("--chunks is empty: give e.g. 64K");
    }
    for &chunk in chunks {
        if chunk < 4096 || !chunk.is_power_of_two() || chunk > 64 << 20 {
            bail!("chunk size {} must be a power of two between 4K and 64M", format_size(chunk));
        }
    }
    let mut out: Vec<ArraySpec> = Vec::new();
    for text in levels {
        let text = text.trim();
        if text.eq_ignore_ascii_case("single") {
            out.push(ArraySpec::single());
            continue;
        }
        let level = Level::parse(text)
            .ok_or_else(|| anyhow!("unknown level '{text}' in --levels: use single, linear, 0, 1, 4, 5, 6 or 10"))?;
        if members < level.min_members() {
            bail!("{level} needs at least {} members, --members is {members}", level.min_members());
        }
        if has_chunk(level) {
            out.extend(chunks.iter().map(|&c| ArraySpec { level: Some(level), members, chunk_bytes: Some(c) }));
        } else {
            out.push(ArraySpec { level: Some(level), members, chunk_bytes: None });
        }
    }
    let mut seen = Vec::new();
    out.retain(|a| {
        let new = !seen.contains(a);
        seen.push(a.clone());
        new
    });
    Ok(out)
}

impl Plan {
    pub fn from_args(args: &BenchArgs) -> Result<Self> {
        if args.members == 0 || args.members > 64 {
            bail!("--members must be between 1 and 64");
        }
        let arrays = arrays(&args.levels, args.members, &args.chunks)?;
        let mut caches = args.cache.clone();
        caches.dedup();
        if caches.is_empty() {
            bail!("--cache is empty: give writethrough and/or writeback");
        }
        let quick = args.quick;
        let member_bytes = args.size.unwrap_or(if quick { 64 << 20 } else { 1 << 30 });
        if member_bytes < 16 << 20 {
            bail!("--size {} is too small: members need at least 16M", format_size(member_bytes));
        }
        let runtime = args.runtime.unwrap_or(Duration::from_secs(if quick { 1 } else { 10 }));
        if runtime < Duration::from_millis(200) {
            bail!("--runtime must be at least 200ms");
        }
        let ramp = args.ramp.unwrap_or(if quick { Duration::from_millis(500) } else { Duration::from_secs(2) });
        let sweep_bytes = match &args.sweep {
            Some(list) => list.clone(),
            None if quick => vec![4 << 10, 1 << 20],
            None => vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20],
        };
        for &bs in &sweep_bytes {
            if bs < 512 || bs % 512 != 0 || bs > 32 << 20 {
                bail!("--sweep block size {bs} must be a multiple of 512 up to 32M");
            }
        }
        if args.rounds == 0 || args.rounds > 100 {
            bail!("--rounds must be between 1 and 100");
        }
        if args.remote_members && !args.devices.is_empty() {
            bail!("--remote-members serves member files it makes; drop --devices");
        }
        if args.remote_server == RemoteServer::Raidnbd && args.remote_delay.is_some() {
            bail!("--remote-delay needs --remote-server nbdkit (its delay filter)");
        }
        if args.remote_iops == Some(0) || args.remote_bw == Some(0) {
            bail!("--remote-iops and --remote-bw must be above 0");
        }
        if !args.devices.is_empty() {
            if !args.force {
                bail!("--devices are overwritten by every array the bench builds; add --force to confirm");
            }
            if args.devices.len() < args.members {
                bail!("--members {} needs as many --devices, got {}", args.members, args.devices.len());
            }
            if args.dir.is_some() {
                bail!("give either --devices or --dir, not both");
            }
        }
        Ok(Self {
            arrays,
            caches,
            member_bytes,
            runtime,
            ramp,
            sweep_bytes,
            workload_filter: args.workloads.iter().map(|w| w.trim().to_ascii_lowercase()).collect(),
            fill: !args.no_fill,
            dir: args.dir.clone(),
            devices: args.devices.clone(),
            keep: args.keep,
            out: args.out.clone(),
            rounds: args.rounds,
            cache_bytes: args.cache_size,
            io: args.io.clone(),
            remote: args.remote_members.then_some(RemoteMembers {
                server: args.remote_server,
                bytes_per_sec: args.remote_bw,
                iops: args.remote_iops,
                delay: args.remote_delay,
            }),
            write_gather_us: args.write_gather_us,
            consistency_policy: args.consistency_policy.clone(),
            preset: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arrays_cross_levels_and_chunks() {
        let a = arrays(&levels(&["single", "0", "raid5", "1"]), 4, &[4096, 65536]).unwrap();
        let labels: Vec<String> = a.iter().map(ArraySpec::label).collect();
        assert_eq!(labels, ["single", "raid0 4x4K", "raid0 4x64K", "raid5 4x4K", "raid5 4x64K", "raid1 4x"]);
        assert_eq!(a[4].id(), "raid5-4x64K");
        assert_eq!(a[4].create_args(), ["--level", "5", "--chunk", "64K"]);
        assert_eq!(a[0].create_args(), ["--level", "linear"]);
        assert_eq!(a[5].create_args(), ["--level", "1"]);
    }

    #[test]
    fn stripe_widths() {
        let a = arrays(&levels(&["0", "5", "6", "10", "single"]), 4, &[65536]).unwrap();
        let widths: Vec<Option<u64>> = a.iter().map(ArraySpec::stripe_data_bytes).collect();
        assert_eq!(widths, [Some(4 * 65536), Some(3 * 65536), Some(2 * 65536), Some(2 * 65536), None]);
    }

    #[test]
    fn rejects_bad_levels() {
        assert!(arrays(&levels(&["7"]), 4, &[65536]).is_err());
        assert!(arrays(&levels(&["6"]), 3, &[65536]).is_err());
        assert!(arrays(&levels(&["0"]), 4, &[3000]).is_err());
        assert!(arrays(&[], 4, &[65536]).is_err());
        // Duplicates collapse.
        assert_eq!(arrays(&levels(&["0", "raid0", "single", "single"]), 2, &[65536]).unwrap().len(), 2);
    }
}
