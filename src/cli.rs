//! Command-line interface: what a person types, with help that explains it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::size::parse_size;

pub use crate::bench::BenchArgs;
pub use crate::shared_args::{CacheMode, MemberIoArgs};

#[derive(Parser, Debug)]
#[command(
    name = "raidnbd",
    version,
    about = "Software RAID over files and block devices, served over NBD",
    long_about = "raidnbd composes member volumes (files or block devices) into a RAID array \
                  (linear, 0, 1, 4, 5, 6, 10) using Linux md's v1.2 on-disk format, and exports it \
                  over the NBD protocol: attach it as /dev/nbd0 (`raidnbd attach`, or nbd-client), or use it from qemu \
                  (nbd://127.0.0.1:10809/NAME). Arrays move between raidnbd and mdadm both ways.\n\n\
                  First time? Run `raidnbd quickstart`.",
    after_help = "Logs go to stderr: -v/-q (or RUST_LOG=debug, which -v/-q override) set the level \
                  (default: info for serve, warn otherwise); colour only on a terminal without \
                  NO_COLOR; no timestamps when stderr is the journal (JOURNAL_STREAM)."
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

#[derive(Args, Debug)]
pub struct LogArgs {
    /// More log detail (-v debug, -vv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Less log detail (-q warnings and errors only, -qq errors only).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub quiet: u8,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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
    Detail(DetailArgs),
    /// Scrub an array offline: compare parity/mirrors on every stripe.
    Check(CheckArgs),
    /// Grow or change an array at rest, as `mdadm --grow` (by members, `--size`, `--level`);
    /// a running one with `raidnbd ctl grow`.
    Grow(GrowArgs),
    /// First run: create four 1 GiB sparse members, a RAID5 over them, and serve it.
    Quickstart(QuickstartArgs),
    /// Control a running server: status, fail/remove/add/replace members, check, repair, wait.
    Ctl(CtlArgs),
    /// Attach an export as a kernel NBD device (/dev/nbdN) that rides through server restarts.
    Attach(crate::attach::AttachArgs),
    /// Measure arrays against a single member with fio (dd-style, CrystalDiskMark-style, block-size sweep).
    Bench(BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (raidnbd.1, raidnbd-serve.1, ...) generated from this CLI into DIR.
    Man {
        #[arg(long, value_name = "DIR", default_value = "man")]
        out_dir: PathBuf,
    },
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
    /// Add a spare; a degraded array starts rebuilding onto it. A member returning to its
    /// failed role is re-added instead.
    Add { path: String },
    /// Bring a member back to its failed role, copying only the chunks the write-intent
    /// bitmap says were written while it was away (refused if that cannot be done).
    #[command(name = "re-add")]
    ReAdd { path: String },
    /// Copy a member onto a new one while it stays in service, then swap them.
    Replace { member: String, path: String },
    /// Grow or change the array while it serves, as `mdadm --grow`: by members (`--add`,
    /// raid0/4/5/6/10, a reshape; the export has its new size when it ends), to the members'
    /// room (`--size max|SIZE`), or to another level without moving data (`--level`).
    Grow(GrowOptions),
    /// Start a background check (counts mismatches, like md's mismatch_cnt).
    Check,
    /// Start a background repair (rewrites mismatching parity/mirrors).
    Repair,
    /// Stop a running check or repair.
    Idle,
    /// Block until rebuild, resync, replace, reshape and check have ended (like mdadm --wait).
    Wait {
        /// Give up after this long (`90s`, `5m`; a plain number is seconds), exit 1
        /// [default: wait forever].
        #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
        timeout: Option<std::time::Duration>,
    },
    /// Rebuild/check speed limits in bytes/s (e.g. 1M 200M).
    RebuildSpeed {
        #[arg(value_parser = parse_size)]
        min: u64,
        #[arg(value_parser = parse_size)]
        max: u64,
    },
    /// Testing: make a member fail its reads, writes, all I/O, return or store wrong bytes
    /// (corrupt-reads, corrupt-writes: one byte per 4 KiB inverted), or none
    /// (serve --fault-injection).
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
    /// What keeps redundancy right across a crash (mdadm's names): `ppl` (raid5: md's
    /// partial parity log; closes the write hole, no resync after a crash), `bitmap` (a
    /// write-intent bitmap: only recently written regions are resynced), `resync` (the
    /// whole array is resynced), `journal` (needs --write-journal). Default: journal with
    /// --write-journal, else ppl for raid5; bitmap for other redundant arrays
    /// of 4 GiB or more; resync otherwise.
    #[arg(long, value_name = "ppl|journal|bitmap|resync")]
    pub consistency_policy: Option<String>,
    /// Per-block checksums: `crc32c` keeps one for every 4 KiB of every member (about 1/1024
    /// of it, past md's data area, where mdadm and the kernel do not look). Every read is
    /// verified; wrong bytes are served right from redundancy and healed on the member.
    #[arg(long, value_name = "crc32c")]
    pub integrity: Option<String>,
    /// Write-intent bitmap: `internal` (md's format; after a crash only recently written
    /// regions are resynced) or `none` (same as --consistency-policy bitmap / resync).
    #[arg(long, value_name = "internal|none")]
    pub bitmap: Option<String>,
    /// Bytes of array data per bitmap bit (mdadm's --bitmap-chunk; default 64M, doubled
    /// until the bits fit). Smaller: a re-add or a resync after a crash copies less.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub bitmap_chunk: Option<u64>,
    /// RAID1: write this member like the others but read it only when no other copy can be
    /// (md's write-mostly: a slow or distant mirror). Repeatable.
    #[arg(long, value_name = "MEMBER")]
    pub write_mostly: Vec<String>,
    /// raid4/5/6: md's write journal on this device (mdadm --write-journal): every write
    /// goes to it first, so a crash cannot leave a stripe half written and the array needs
    /// no resync (consistency policy `journal`). Serve it with the members.
    #[arg(long, value_name = "DEVICE")]
    pub write_journal: Option<String>,
    /// Member files or block devices, in role order; `missing` leaves a slot empty.
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
}

/// Where `serve` listens: a TCP address or a Unix socket path (`unix:PATH`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/raidnbd/nbd.sock".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("{s:?} is neither HOST:PORT (e.g. 127.0.0.1:10809, [::1]:10809) nor unix:PATH"))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `--tls`: nbdkit's modes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// Plaintext only: STARTTLS is refused.
    #[default]
    Off,
    /// TLS offered; clients may stay plaintext (exports with `tls = "require"` excepted).
    On,
    /// Every client must start TLS before anything else.
    Require,
}

/// The address `serve` listens on when neither the flags nor the config name one.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// `serve`'s options. Every one is optional here: the flags override the config file's keys
/// (see config.rs), which override the defaults documented in each flag's help.
#[derive(Args, Debug, Default)]
#[command(after_help = "Socket activation: started with LISTEN_FDS/LISTEN_PID (systemd's raidnbd.socket, \
                        systemd-socket-activate, nbdinfo [ raidnbd serve ... ]), serve takes the \
                        sockets it is given and ignores --listen.\n\n\
                        Events (--on-event CMD): CMD runs as `CMD EVENT EXPORT [MEMBER]` (like \
                        mdadm --monitor --program) for Fail, DegradedArray, RebuildStarted and \
                        RebuildFinished (also for resync, check and repair, as mdadm), SpareActive.")]
pub struct ServeArgs {
    /// Where to listen: HOST:PORT or unix:PATH; repeat for several [default: 127.0.0.1:10809].
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<ListenAddr>,
    /// Export name clients ask for (the default export "" also reaches it).
    #[arg(short, long)]
    pub export: Option<String>,
    /// Refuse writes.
    #[arg(long)]
    pub read_only: bool,
    /// Write cache mode [default: writethrough].
    #[arg(long, value_enum)]
    pub cache: Option<CacheMode>,
    /// Size of the write-back cache (with --cache writeback) [default: 256M].
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    #[command(flatten)]
    pub io: MemberIoArgs,
    /// TOML file describing one or more exports (see deploy/raidnbd.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Start even if the array is dirty and degraded (parity may be stale: the RAID5/6 write hole).
    #[arg(long)]
    pub force: bool,
    /// Refuse to start unless every named member can be opened (default: a member that is
    /// missing or cannot be opened counts as absent, and the array starts degraded if it can).
    #[arg(long)]
    pub require_all: bool,
    /// Assemble the array whose superblocks carry this UUID from the devices --scan finds.
    #[arg(long, value_name = "UUID", requires = "scan")]
    pub uuid: Option<String>,
    /// With --uuid: where to look for members, a glob such as '/dev/disk/by-id/*' or '/srv/*.img'.
    #[arg(long, value_name = "GLOB", requires = "uuid")]
    pub scan: Option<String>,
    /// Control socket for `raidnbd ctl` (default: /run/raidnbd/control-PORT.sock as root).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Where to keep what was written while a member was away, for arrays without a
    /// write-intent bitmap (default: $STATE_DIRECTORY, else /var/lib/raidnbd).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Run CMD on array events: `CMD EVENT EXPORT [MEMBER]` (see below).
    #[arg(long, value_name = "CMD")]
    pub on_event: Option<String>,
    /// Testing: wrap members so `raidnbd ctl fault` can make them fail.
    #[arg(long, hide = true)]
    pub fault_injection: bool,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. 127.0.0.1:9109 (off by default).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// A client must finish the NBD handshake within this (`10s`, `500ms`; a plain number is
    /// seconds) [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub handshake_timeout: Option<std::time::Duration>,
    /// Close connections with no request in flight and none arriving for this long
    /// [default: never; the kernel client keeps idle connections open].
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub idle_timeout: Option<std::time::Duration>,
    /// Close a connection that holds the server's byte budget for a request and makes no
    /// progress for this long (a WRITE payload that stops arriving, replies it does not read)
    /// [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub stall_timeout: Option<std::time::Duration>,
    /// RAID4/5/6: a sequential write that ends inside a stripe may wait this many
    /// microseconds for the writes that complete the stripe, which then go to the members as
    /// one full-stripe write (no read-modify-write); 0 turns it off [default: 1000].
    #[arg(long, value_name = "MICROSECONDS")]
    pub write_gather_us: Option<u64>,
    /// Start a background check (scrub) this often, e.g. `7d`: it reads every block of every
    /// member, at the rebuild speed limits; with checksums it heals what it finds
    /// [default: never].
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub scrub_interval: Option<std::time::Duration>,
    /// Background work (rebuild, resync, check, reshape) keeps at least this speed while
    /// clients are busy, in bytes/s (md's speed_limit_min; `ctl rebuild-speed` changes it
    /// while serving) [default: 1M].
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    pub speed_limit_min: Option<u64>,
    /// ... and at most this speed while they are quiet (md's speed_limit_max) [default: 200M].
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    pub speed_limit_max: Option<u64>,
    /// TLS: off, on (offered) or require (before anything else) [default: off].
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsMode>,
    /// X.509: a directory with server-cert.pem and server-key.pem (and ca-cert.pem for
    /// --tls-verify-peer), the layout nbdkit, qemu and nbd-server use.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Require a client certificate that chains to ca-cert.pem.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Pre-shared keys instead of certificates: psktool's `identity:hexkey` lines.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// With TLS: serve the export only to this client (a DNS name of its verified certificate,
    /// or its PSK identity); repeat for several.
    #[arg(long, value_name = "NAME")]
    pub tls_peer: Vec<String>,
    /// Accept TCP connections only from ADDRESS or ADDRESS/PREFIX (e.g. 10.0.0.0/8); repeat
    /// for several. Others are closed at accept and logged. Unix sockets are not affected.
    #[arg(long, value_name = "ADDRESS/PREFIX")]
    pub allow: Vec<nbd_server::AddressRange>,
    /// Member files or block devices, in any order.
    #[arg(value_name = "MEMBER")]
    pub members: Vec<String>,
}

#[derive(Args, Debug)]
pub struct DetailArgs {
    /// Exit status says the array's health, as mdadm --detail --test: 0 healthy, 1 degraded,
    /// 2 unusable (too few members to run), 4 error (members that cannot be read or assembled).
    #[arg(long)]
    pub test: bool,
    #[command(flatten)]
    pub inspect: InspectArgs,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
}

/// What `grow` changes.
#[derive(Args, Debug)]
pub struct GrowOptions {
    /// The number of members afterwards: the current count plus the members added, or fewer
    /// to remove the last members of a raid0/4/5/6/10 (md's backwards reshape; with
    /// `--array-size`; they become spares when it ends).
    #[arg(short = 'n', long, value_name = "N")]
    pub raid_devices: Option<usize>,
    /// The array's size once members are removed, in bytes (`--raid-devices` fewer than now):
    /// the refusal without it names the size. What lies past it is lost, as with md's
    /// `--grow --array-size`, which mdadm wants before removing members.
    #[arg(long, value_parser = parse_size, value_name = "BYTES", requires = "raid_devices", conflicts_with_all = ["size", "level", "add"])]
    pub array_size: Option<u64>,
    /// A new member (path or URI, as `ctl add` takes them); repeat for several. With
    /// `--level`, one member rebuilt into the role the new level adds.
    #[arg(
        short,
        long = "add",
        value_name = "MEMBER",
        required_unless_present_any = ["size", "level", "layout", "chunk", "integrity", "raid_devices"],
        conflicts_with = "size"
    )]
    pub add: Vec<String>,
    /// A new layout for a raid5/6 (`left-symmetric`, `right-asymmetric`, ...; a raid6 taken
    /// over from raid5 moves Q into the rotation with `left-symmetric`): md's reshape.
    #[arg(long, value_name = "LAYOUT", conflicts_with_all = ["size", "level"])]
    pub layout: Option<String>,
    /// A new chunk for a raid4/5/6/10 (a power of two from 4K; the members' data must be a
    /// multiple of it): md's reshape.
    #[arg(short, long, value_parser = parse_size, value_name = "CHUNK", conflicts_with_all = ["size", "level"])]
    pub chunk: Option<u64>,
    /// Change the level without moving data (md's takeover): raid1 of 2 <-> raid5, raid4 <->
    /// raid5 (parity-last), raid5 -> raid6 (with --add: Q on the new member) and back, raid0
    /// -> raid4/5 (with --add: the parity member) and back (its parity member failed first).
    #[arg(short, long, value_name = "LEVEL", conflicts_with_all = ["size", "raid_devices"])]
    pub level: Option<String>,
    /// Use this much of every member: `max` (all there is now: the members grew) or a size
    /// per member (`512M`, `2G`; a bare number is KiB, as mdadm's `--size`). Raid1/4/5/6/10;
    /// new space is resynced in the background, a smaller size gives the end back.
    #[arg(short = 'z', long, value_name = "max|SIZE", conflicts_with = "raid_devices")]
    pub size: Option<String>,
    /// Add per-block checksums (`crc32c`, as `create --integrity`) to an array at rest whose
    /// members have room for them after md's data area (about 1/1024 of each: members that
    /// grew since). Not with `ctl grow`.
    #[arg(long, value_name = "crc32c", conflicts_with_all = ["size", "level", "layout", "chunk", "raid_devices", "add"])]
    pub integrity: Option<String>,
}

#[derive(Args, Debug)]
pub struct GrowArgs {
    #[command(flatten)]
    pub grow: GrowOptions,
    /// The array's members now.
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
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
}
