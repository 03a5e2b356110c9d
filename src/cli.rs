//! Command-line interface: what a person types, with help that explains it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::size::parse_size;

#[derive(Parser, Debug)]
#[command(
    name = "raidnbd",
    version,
    about = "Software RAID over files and block devices, served over NBD",
    long_about = "raidnbd composes member volumes (files or block devices) into a RAID array \
                  (linear, 0, 1, 4, 5, 6, 10) using Linux md's v1.2 on-disk format, and exports it \
                  over the NBD protocol: attach it with nbd-client as /dev/nbd0, or use it from qemu \
                  (nbd://127.0.0.1:10809/NAME). Arrays move between raidnbd and mdadm both ways.\n\n\
                  First time? Run `raidnbd quickstart`.",
    after_help = "Log verbosity: RUST_LOG=debug raidnbd ... (default: info)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a new array: write md v1.2 superblocks on the members.
    Create(CreateArgs),
    /// Assemble an array from its members and serve it over NBD.
    Serve(ServeArgs),
    /// Show the superblock of each member (like `mdadm --examine`).
    Examine(InspectArgs),
    /// Show the array assembled from the members (like `mdadm --detail`).
    Detail(InspectArgs),
    /// Scrub an array offline: compare parity/mirrors on every stripe.
    Check(CheckArgs),
    /// First run: create four 1 GiB sparse members, a RAID5 over them, and serve it.
    Quickstart(QuickstartArgs),
    /// Control a running server: status, fail/remove/add/replace members, check, repair.
    Ctl(CtlArgs),
    /// Measure arrays against a single member with fio (dd-style, CrystalDiskMark-style, block-size sweep).
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Control socket of the server (default: the one for --port).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// NBD port of the server, to find its default control socket.
    #[arg(long, default_value_t = 10809)]
    pub port: u16,
    /// Which export, when the server has several.
    #[arg(short, long)]
    pub export: Option<String>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Arrays, members, and rebuild/check progress (like /proc/mdstat).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Mark a member faulty (the array continues degraded).
    Fail { member: String },
    /// Remove a faulty member or a spare from the array.
    Remove { member: String },
    /// Add a spare; a degraded array starts rebuilding onto it.
    Add { path: String },
    /// Copy a member onto a new one while it stays in service, then swap them.
    Replace { member: String, path: String },
    /// Start a background check (counts mismatches, like md's mismatch_cnt).
    Check,
    /// Start a background repair (rewrites mismatching parity/mirrors).
    Repair,
    /// Stop a running check or repair.
    Idle,
    /// Rebuild/check speed limits in bytes/s (e.g. 1M 200M).
    RebuildSpeed {
        #[arg(value_parser = parse_size)]
        min: u64,
        #[arg(value_parser = parse_size)]
        max: u64,
    },
    /// Testing: make a member fail its reads, writes, all I/O, or none (serve --fault-injection).
    #[command(hide = true)]
    Fault { member: String, ops: String },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// RAID level: linear, 0, 1, 4, 5, 6, 10 (also raid0, raid5, mirror, stripe...).
    #[arg(short, long)]
    pub level: String,
    /// Layout: raid5/6 left-symmetric (default), left-asymmetric, right-symmetric,
    /// right-asymmetric, parity-first, parity-last; raid10 n2 (default), n3, f2, o2, ...;
    /// raid0 original (default) or alternate.
    #[arg(long)]
    pub layout: Option<String>,
    /// Chunk size, a power of two from 4K (default 512K, like mdadm).
    #[arg(short, long, value_parser = parse_size)]
    pub chunk: Option<u64>,
    /// Create member files of this size (sparse) if they do not exist, e.g. 1G.
    #[arg(short, long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Array name stored in the superblock (default: "raidnbd").
    #[arg(short, long)]
    pub name: Option<String>,
    /// Overwrite members that already hold a superblock or a filesystem.
    #[arg(short, long)]
    pub force: bool,
    /// Write-intent bitmap: `internal` (md's format; after a crash only recently written
    /// regions are resynced) or `none`. Default: internal for redundant arrays of 4 GiB or more.
    #[arg(long, value_name = "internal|none")]
    pub bitmap: Option<String>,
    /// Member files or block devices, in role order; `missing` leaves a slot empty.
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// Acknowledge writes once they are on the members (safe; default).
    Writethrough,
    /// Acknowledge writes from memory and write them back later: faster, but writes not
    /// yet flushed are LOST if raidnbd dies.
    Writeback,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    /// Inline for member files on tmpfs/ramfs; else io_uring when the kernel allows it, else
    /// a thread pool (the reason is logged).
    Auto,
    /// io_uring only; fail if unavailable.
    Uring,
    /// Thread pool with pread/pwrite.
    Threads,
    /// pread/pwrite in the serving task: for members in memory (a disk would stall serving).
    Inline,
}

#[derive(Args, Debug, Clone)]
pub struct MemberIoArgs {
    /// I/O engine for the members.
    #[arg(long, value_enum, default_value_t = IoEngine::Auto)]
    pub io: IoEngine,
    /// Throttle each member to this bandwidth, bytes/s (e.g. 20M), like a cloud volume.
    #[arg(long, value_parser = parse_size, value_name = "RATE")]
    pub member_bw: Option<u64>,
    /// Throttle each member to this many I/O operations per second (e.g. 200).
    #[arg(long, value_name = "N")]
    pub member_iops: Option<u64>,
    /// Open members with buffered I/O instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: SocketAddr,
    /// Export name clients ask for (the default export "" also reaches it).
    #[arg(short, long)]
    pub export: Option<String>,
    /// Refuse writes.
    #[arg(long)]
    pub read_only: bool,
    /// Write cache mode.
    #[arg(long, value_enum, default_value_t = CacheMode::Writethrough)]
    pub cache: CacheMode,
    /// Size of the write-back cache (with --cache writeback).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub cache_size: u64,
    #[command(flatten)]
    pub io: MemberIoArgs,
    /// TOML file describing one or more exports (see deploy/raidnbd.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Start even if the array is dirty and degraded (parity may be stale: the RAID5/6 write hole).
    #[arg(long)]
    pub force: bool,
    /// Control socket for `raidnbd ctl` (default: /run/raidnbd/control-PORT.sock as root).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Testing: wrap members so `raidnbd ctl fault` can make them fail.
    #[arg(long, hide = true)]
    pub fault_injection: bool,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. 127.0.0.1:9109 (off by default).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Member files or block devices, in any order.
    #[arg(value_name = "MEMBER")]
    pub members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Rewrite parity (or the other mirrors) where it disagrees with the data.
    #[arg(long)]
    pub repair: bool,
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct QuickstartArgs {
    /// Directory for the member files (created if missing, reused if present).
    #[arg(long, default_value = "raidnbd-quickstart")]
    pub dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: SocketAddr,
}

#[derive(Args, Debug)]
#[command(after_help = "Workloads (for --workloads): dd-write, seq1m-q8t1-read, seq1m-q8t1-write, \
                        seq1m-q1t1-read, seq1m-q1t1-write, rnd4k-q32t1-read, rnd4k-q32t1-write, \
                        rnd4k-q1t1-read, rnd4k-q1t1-write, seq-fullstripe-write, sweep-randread-SIZE, \
                        sweep-randwrite-SIZE; a prefix ending before a dash selects several (rnd4k, \
                        seq1m-q8t1, sweep, sweep-randread).\n\n\
                        Example (cloud-volume emulation): raidnbd bench --member-bw 20M --member-iops 200 \\\n\
                        \x20   --levels single,0,5,6,10 --members 4 --chunks 64K --out bench-results")]
pub struct BenchArgs {
    /// Arrays to measure: single (one member served the same way: the baseline for ratios),
    /// linear, 0, 1, 4, 5, 6, 10.
    #[arg(long, value_delimiter = ',', default_value = "single,0,5,6,10")]
    pub levels: Vec<String>,
    /// Members per array.
    #[arg(long, default_value_t = 4)]
    pub members: usize,
    /// Chunk sizes; every striped level is built once per chunk size.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "64K")]
    pub chunks: Vec<u64>,
    /// Cache modes to measure (writeback rows read "skipped" while it is not available).
    #[arg(long, value_delimiter = ',', value_enum, default_value = "writethrough")]
    pub cache: Vec<CacheMode>,
    /// Size of each member file [default: 1G; 64M with --quick].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Measured time per workload [default: 10s; 1s with --quick].
    #[arg(long, value_parser = crate::bench::parse_duration)]
    pub runtime: Option<std::time::Duration>,
    /// Warm-up before measuring, per workload [default: 2s; 0.5s with --quick].
    #[arg(long, value_parser = crate::bench::parse_duration)]
    pub ramp: Option<std::time::Duration>,
    /// Smoke-test preset: small members, short runs, a two-point sweep.
    #[arg(long)]
    pub quick: bool,
    /// Run only these workloads (see below) [default: all].
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Block sizes of the block-size sweep [default: 4K,16K,64K,256K,1M; 4K,1M with --quick].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sweep: Option<Vec<u64>>,
    /// Do not write the whole array once before measuring (reads then hit unwritten space).
    #[arg(long)]
    pub no_fill: bool,
    /// Where the member files go: a fresh directory is made inside [default: /var/tmp, else .].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Use these files or block devices as members instead of temporary files (needs --force:
    /// their contents are destroyed).
    #[arg(long, value_delimiter = ',', value_name = "DEV")]
    pub devices: Vec<String>,
    /// Allow overwriting --devices.
    #[arg(long)]
    pub force: bool,
    /// Keep the member files and server logs.
    #[arg(long)]
    pub keep: bool,
    /// Directory for the results (results.md, .csv, .json, .svg, -ratio.svg).
    #[arg(long, default_value = "raidnbd-bench")]
    pub out: PathBuf,
    /// Write-back cache size given to `serve --cache-size` (with --cache writeback) [default: serve's].
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// Measure everything this many times, arrays interleaved, and report the median run
    /// (with the spread): for noisy or shared machines.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    #[command(flatten)]
    pub io: MemberIoArgs,
}
