//! Opening members and assembling the array they form.
//!
//! ```text
//!  paths ─► open_member (io_uring / threads / inline, O_DIRECT) ─► optional Throttled ─► optional Faulty
//!        ─► IntegrityMember when the member has checksums (create --integrity)
//!        ─► optional MeteredMember (serve --metrics) ─► Arc<dyn Member>
//!        ─► md::read_superblock_area ─► md::Candidate ─► md::assemble ─► md::start ─► engine::Array
//! ```
//!
//! The binary only opens members and names them; how the array comes up (bitmap, write-hole
//! policy, resync) is raid-core's `md::start`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use member_io::{DirectMode, FaultControl, Faulty, NbdMember, OpenOptions, Throttle, ThrottleConfig, Throttled};
use raid_core::Member;
use raid_core::engine::Array;
use raid_core::integrity::IntegrityMember;
use raid_core::md::{self, Assembly, Candidate, MdUuid, SUPERBLOCK_BYTE_OFFSET, SUPERBLOCK_BYTES, Superblock};

use crate::cli::MemberIoArgs;
use crate::link_registry::LinkRegistry;

/// Fault switches of the members opened with fault injection, by member name.
pub type FaultRegistry = Arc<Mutex<HashMap<String, Arc<FaultControl>>>>;

/// How to open members.
#[derive(Clone, Default)]
pub struct MemberOpenOptions {
    pub io: MemberIoArgs,
    pub read_only: bool,
    /// Wrap every member in a fault injector registered here (testing).
    pub faults: Option<FaultRegistry>,
    /// Record every member's I/O in these export metrics (`serve --metrics`).
    pub metrics: Option<Arc<crate::metrics::ExportMetrics>>,
    /// Where NBD members count their reconnects and timeouts.
    pub links: LinkRegistry,
    /// `--export-bw`: one bandwidth bucket for all of the export's members.
    pub shared_throttle: Option<member_io::SharedThrottle>,
    /// Never verify checksums a member holds (`create`, which writes them anew).
    pub plain: bool,
}

impl MemberOpenOptions {
    fn backend_options(&self) -> OpenOptions {
        OpenOptions {
            engine: self.io.io.unwrap_or_default(),
            direct: if self.io.buffered { DirectMode::Off } else { DirectMode::Auto },
            read_only: self.read_only,
        }
    }

    /// How long an NBD member may take to open and to answer.
    pub fn member_timeout(&self) -> Duration {
        self.io.member_timeout.unwrap_or(DEFAULT_MEMBER_TIMEOUT)
    }

    fn throttle(&self) -> ThrottleConfig {
        ThrottleConfig { bytes_per_sec: self.io.member_bw, iops: self.io.member_iops, ..ThrottleConfig::default() }
    }

    /// Sets up `--export-bw`'s shared bucket (call once per export).
    pub fn with_export_bw(mut self) -> Result<Self> {
        if let Some(bw) = self.io.export_bw {
            let config = ThrottleConfig { bytes_per_sec: Some(bw), ..ThrottleConfig::default() };
            let throttle = Throttle::new(&config).context("--export-bw")?;
            self.shared_throttle = Some(member_io::SharedThrottle(Arc::new(throttle)));
        }
        Ok(self)
    }
}

/// `--member-timeout` when not given.
pub const DEFAULT_MEMBER_TIMEOUT: Duration = Duration::from_secs(30);

/// Shortest `--member-timeout` accepted.
const MIN_MEMBER_TIMEOUT: Duration = Duration::from_millis(100);

/// Opens one member with the chosen engine, throttled and fault-injectable if asked.
/// Members are named by their canonical path, so `ctl` can name them from anywhere; a member
/// that is an NBD export (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`) by its
/// URI.
pub async fn open_member(path: &str, options: &MemberOpenOptions) -> Result<Arc<dyn Member>> {
    let (name, mut member): (String, Arc<dyn Member>) = if nbd_client::ExportAddress::is_uri(path) {
        let timeout = options.member_timeout();
        if timeout < MIN_MEMBER_TIMEOUT {
            bail!("--member-timeout must be at least 100ms");
        }
        let member = NbdMember::connect(path, timeout, options.links.get(path))
            .await
            .with_context(|| format!("cannot open member {path}"))?;
        (path.to_string(), Arc::new(member))
    } else {
        let canonical = std::fs::canonicalize(path).with_context(|| format!("cannot open member {path}"))?;
        let member = member_io::open_member(&canonical, &options.backend_options())
            .with_context(|| format!("cannot open member {path}"))?;
        (canonical.to_string_lossy().into_owned(), member)
    };
    let throttle = options.throttle();
    if throttle.is_active() {
        let throttle = Throttle::new(&throttle).with_context(|| format!("cannot throttle member {path}"))?;
        let throttled = Throttled::new(member, throttle);
        member = Arc::new(throttled);
    }
    if let Some(shared) = &options.shared_throttle {
        member = Arc::new(raid_core::decorator::Decorated::<_, member_io::SharedThrottle>::new(member, shared.clone()));
    }
    if let Some(registry) = &options.faults {
        let control = FaultControl::new();
        registry.lock().expect("fault registry").insert(name, control.clone());
        member = Arc::new(Faulty::new(member, control));
    }
    // Outside the fault injector, so the checksums see what it does to the bytes.
    if !options.plain {
        member = match IntegrityMember::open(member).await.with_context(|| format!("cannot open member {path}"))? {
            Ok(checked) => Arc::new(checked),
            Err(plain) => plain,
        };
    }
    if let Some(metrics) = &options.metrics {
        member = metrics.meter_member(member);
    }
    Ok(member)
}

/// Reads the 4 KiB superblock area of a member (zeros past its end).
pub async fn read_superblock_area(member: &dyn Member) -> Result<Vec<u8>> {
    md::read_superblock_area(member).await.map_err(anyhow::Error::new)
}

/// An assembled, running array and how it was put together.
pub struct OpenedArray {
    pub array: Arc<Array<dyn Member>>,
    pub assembly: Assembly,
    /// Paths by candidate index (the members that could be opened, in the order given).
    pub paths: Vec<String>,
    /// Named members that could not be opened, counted as absent.
    pub absent: Vec<String>,
    /// The array was dirty and degraded (parity untrusted) and is served read-only.
    pub forced_read_only: bool,
}

impl OpenedArray {
    /// Named members not in the array now that may come back: absent ones, and those the
    /// array recorded as failed or that fell behind (they left while it ran).
    pub fn returnable(&self) -> Vec<String> {
        let faulty = self.assembly.faulty.iter().filter_map(|&c| self.paths.get(c).cloned());
        let stale = self.assembly.stale.iter().map(|(name, _)| name.clone());
        self.absent.iter().cloned().chain(faulty).chain(stale).collect()
    }
}

/// Opens `paths`, assembles the array they form, and starts it.
///
/// A named member that is not there (no such file or device node, a disk that is gone) counts
/// as absent, with a warning: the array starts degraded if redundancy allows, so one dead
/// disk is not an outage at the next start. Other open errors (permissions, busy) fail.
/// `require_all` refuses any degraded start instead (also for members found by `--scan`).
/// A dirty, degraded raid4/5/6 (the write hole) is opened read-only unless `force`.
pub async fn open_array(
    paths: &[String],
    options: &MemberOpenOptions,
    force: bool,
    require_all: bool,
) -> Result<OpenedArray> {
    if paths.is_empty() {
        bail!("no members given");
    }
    let mut members = Vec::with_capacity(paths.len());
    let mut candidates = Vec::with_capacity(paths.len());
    let mut opened_paths = Vec::with_capacity(paths.len());
    let mut absent = Vec::new();
    for path in paths {
        let member = match open_member(path, options).await {
            Ok(m) => m,
            Err(e) if !require_all && is_gone(&e) => {
                tracing::warn!("member {path} is absent ({e:#}): assembling without it");
                absent.push(path.clone());
                continue;
            }
            Err(e) if is_gone(&e) => return Err(e.context("--require-all: every member must be there")),
            // Anything else (permissions, busy, too many files) is a problem to fix, not a dead
            // disk: starting degraded would put a healthy member out of date.
            Err(e) => return Err(e),
        };
        let area = read_superblock_area(member.as_ref()).await?;
        candidates.push(Candidate::from_bytes(path.clone(), member.len_bytes(), &area));
        members.push(member);
        opened_paths.push(path.clone());
    }
    if members.is_empty() {
        bail!("none of the members could be opened: {}", absent.join(", "));
    }
    let assembly = md::assemble(&candidates)
        .map_err(|e| if absent.is_empty() { anyhow!("{e}") } else { anyhow!("{e} (absent: {})", absent.join(", ")) })?;
    for notice in &assembly.notices {
        tracing::warn!("{notice}");
    }
    if require_all && assembly.degraded {
        bail!("--require-all: array {} is missing roles {:?}", assembly.metadata.name(), assembly.missing_roles);
    }
    let start_options = md::StartOptions { read_only: options.read_only, force };
    let started = md::start(&assembly, &members, start_options).await.map_err(anyhow::Error::new)?;
    Ok(OpenedArray {
        array: Arc::new(started.array),
        assembly,
        paths: opened_paths,
        absent,
        forced_read_only: started.forced_read_only,
    })
}

/// Whether an open failed because the member is not there at all (no such file or device,
/// a device node whose disk is gone): the cases a dead disk causes. An NBD member whose
/// server is not there (refused, no socket), does not answer in time, drops the connection
/// or breaks the protocol counts the same: its host or its server is down, not misconfigured
/// (a refused export or TLS, which are, still fail).
fn is_gone(error: &anyhow::Error) -> bool {
    use nbd_client::ClientError;
    let io_gone = |io: &std::io::Error| {
        matches!(io.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused)
            || matches!(io.raw_os_error(), Some(libc::ENXIO | libc::ENODEV | libc::ENOENT))
    };
    error.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(io_gone)
            || matches!(
                c.downcast_ref::<ClientError>(),
                Some(
                    ClientError::Io { .. }
                        | ClientError::Timeout { .. }
                        | ClientError::ConnectionLost { .. }
                        | ClientError::Protocol { .. }
                )
            )
    })
}

/// Members by identity (`serve --uuid UUID --scan GLOB`): the paths matching `pattern` whose
/// md superblock carries array UUID `uuid`, in path order. Paths that cannot be read, or hold
/// no superblock or another array's, are passed over (logged at debug level).
pub fn scan_members(uuid: &str, pattern: &str) -> Result<Vec<String>> {
    let want: MdUuid = uuid.parse().map_err(|e| anyhow!("--uuid {uuid:?}: {e}"))?;
    let mut found = Vec::new();
    for entry in glob::glob(pattern).map_err(|e| anyhow!("--scan {pattern:?}: {e}"))? {
        let Ok(path) = entry else { continue };
        match superblock_uuid(&path) {
            Ok(Some(u)) if u == want => found.push(path.to_string_lossy().into_owned()),
            Ok(_) => tracing::debug!("{}: not a member of {want}", path.display()),
            Err(e) => tracing::debug!("{}: {e}", path.display()),
        }
    }
    if found.is_empty() {
        bail!("--scan {pattern:?} found no member of array {want}");
    }
    tracing::info!("array {want}: found {} members: {}", found.len(), found.join(", "));
    Ok(found)
}

/// The array UUID in the superblock of the file or device at `path`, if it has one.
fn superblock_uuid(path: &std::path::Path) -> std::io::Result<Option<MdUuid>> {
    use std::os::unix::fs::FileExt;
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        return Ok(None);
    }
    let file = std::fs::File::open(path)?;
    let mut area = vec![0u8; SUPERBLOCK_BYTES];
    let n = file.read_at(&mut area, SUPERBLOCK_BYTE_OFFSET)?;
    if n < SUPERBLOCK_BYTES {
        return Ok(None);
    }
    Ok(Superblock::decode(&area).ok().map(|sb| sb.set_uuid))
}
