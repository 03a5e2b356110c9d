//! `raidnbd bench`'s command line.

use std::path::PathBuf;

use clap::Args;

use crate::shared_args::{CacheMode, MemberIoArgs};
use crate::size::parse_size;

#[derive(Args, Debug)]
#[command(after_help = "Workloads (for --workloads): dd-write, seq1m-q8t1-read, seq1m-q8t1-write, \
                        seq1m-q1t1-read, seq1m-q1t1-write, seq128k-q32t1-read, seq128k-q32t1-write, rnd4k-q32t1-read, rnd4k-q32t1-write, \
                        rnd4k-q1t1-read, rnd4k-q1t1-write, seq-fullstripe-write, sweep-randread-SIZE, \
                        sweep-randwrite-SIZE, sweep-read-SIZE, sweep-write-SIZE (sequential); a prefix ending before a dash selects several (rnd4k, \
                        seq1m-q8t1, sweep, sweep-randread).\n\n\
                        Example (cloud-volume emulation): raidnbd bench --member-bw 20M --member-iops 200 \\\n\
                        \x20   --levels single,0,5,6,10 --members 4 --chunks 64K --out bench-results")]
pub struct BenchArgs {
    /// Rebuild a published experiment and print our ratio beside the published one:
    /// cloud-dd-raid0, cloud-ssd-raid0, howto-chunks, raid1-write-cache (sets the levels,
    /// members, chunks, cache modes, throttles and workloads).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
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
    #[arg(long, value_parser = super::parse_duration)]
    pub runtime: Option<std::time::Duration>,
    /// Warm-up before measuring, per workload [default: 2s; 0.5s with --quick].
    #[arg(long, value_parser = super::parse_duration)]
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
    /// Passed to `serve --write-gather-us` (raid4/5/6 full-stripe gathering; 0 = off)
    /// [default: serve's].
    #[arg(long, value_name = "MICROSECONDS")]
    pub write_gather_us: Option<u64>,
    /// Passed to `create --consistency-policy` for the RAID5 arrays (ppl, bitmap, resync)
    /// [default: create's: ppl]; `journal` gives raid4/5/6 md's write journal on one more
    /// file like the members (throttled like them).
    #[arg(long, value_name = "POLICY")]
    pub consistency_policy: Option<String>,
    /// Serve every member from its own nbdkit (file plugin on 127.0.0.1 TCP) and build the
    /// arrays over their nbd:// URIs: network RAID, members on "other hosts".
    #[arg(long)]
    pub remote_members: bool,
    /// With --remote-members: each member's bandwidth in bytes/s (nbdkit's rate filter).
    #[arg(long, value_parser = parse_size, requires = "remote_members")]
    pub remote_bw: Option<u64>,
    /// With --remote-members: each member's IOPS ceiling (nbdkit's delay filter on
    /// REMOTE_THREADS request threads: each request takes REMOTE_THREADS/N seconds).
    #[arg(long, requires = "remote_members")]
    pub remote_iops: Option<u64>,
    /// With --remote-members: what serves each member. `nbdkit`: the file plugin, its rate
    /// filter for --remote-bw and for --remote-iops a delay on REMOTE_THREADS request threads
    /// (so at most that many requests in service at once). `raidnbd`: `raidnbd serve` of the
    /// file, throttled by its token buckets (--member-bw, --member-iops): a cloud volume's
    /// budget, whatever the queue depth; no --remote-delay.
    #[arg(long, value_enum, default_value_t, requires = "remote_members")]
    pub remote_server: super::plan::RemoteServer,
    /// With --remote-members: latency added to every member read and write (nbdkit's delay
    /// filter), e.g. 2ms.
    #[arg(long, value_parser = super::parse_duration, requires = "remote_members")]
    pub remote_delay: Option<std::time::Duration>,
    #[command(flatten)]
    pub io: MemberIoArgs,
}
