//! `raidnbd serve`: assemble arrays and serve them over NBD until a signal (see
//! shutdown.rs), then drain in-flight requests, write back the cache, flush, and mark the
//! arrays clean.
//!
//! ```text
//! flags + config ─▶ Settings ─▶ open arrays ─▶ listen (or activated sockets) ─▶ control socket
//!   ─▶ READY=1 ─▶ serve every listener, monitor (events, STATUS=) ─▶ signal ─▶ STOPPING=1
//!   ─▶ drain (a second signal cuts it short) ─▶ write back cache ─▶ flush + clean mark ─▶ exit 0
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use nbd_server::{BlockDevice, Export, Server, ServerConfig};
use raid_core::engine::Array;
use raid_core::write_cache::WriteCache;
use raid_core::{Member, Volume};

use crate::cli::{CacheMode, DEFAULT_LISTEN, ListenAddr, MemberIoArgs, ServeArgs};
use crate::config;
use crate::control::{self, Control, ControlledExport};
use crate::create::describe_layout;
use crate::export::ArrayDevice;
use crate::listen::{self, Bound};
use crate::maintenance;
use crate::monitor::{self, Watched};
use crate::open::{FaultRegistry, MemberOpenOptions, OpenedArray, open_array, scan_members};
use crate::shutdown::Shutdown;
use crate::size::human_bytes;

/// One export to serve, after merging the config file and the flags.
struct ExportPlan {
    name: String,
    /// Member paths, or how to find them by identity.
    members: MemberSource,
    options: MemberOpenOptions,
    /// Served only over TLS (`tls = "require"` on the export).
    tls_required: bool,
    /// With TLS, the only clients it is open to.
    tls_peers: Vec<String>,
}

enum MemberSource {
    Paths(Vec<String>),
    Scan { uuid: String, pattern: String },
}

impl MemberSource {
    fn paths(&self) -> Result<Vec<String>> {
        match self {
            MemberSource::Paths(p) => Ok(p.clone()),
            MemberSource::Scan { uuid, pattern } => scan_members(uuid, pattern),
        }
    }
}

/// What `serve` runs with: flags over config keys over defaults.
struct Settings {
    listen: Vec<ListenAddr>,
    cache: CacheMode,
    cache_size: u64,
    force: bool,
    require_all: bool,
    control: Option<PathBuf>,
    /// Where each array's away record is kept (away_file.rs).
    state_dir: PathBuf,
    metrics: Option<SocketAddr>,
    on_event: Option<String>,
    /// Full-stripe gathering window for raid4/5/6 (zero: off).
    write_gather: Duration,
    /// A background check this often.
    scrub_interval: Option<Duration>,
    /// Background work's speed limits at the start.
    speed_limits: maintenance::SpeedLimits,
    server: ServerConfig,
    tls: Option<nbd_server::Tls>,
    exports: Vec<ExportPlan>,
}

fn settings(args: &ServeArgs) -> Result<Settings> {
    let file = match &args.config {
        Some(path) => {
            if !args.members.is_empty() || args.uuid.is_some() {
                bail!("give members either on the command line or in --config, not both");
            }
            config::load(path)?
        }
        None => config::ConfigFile::default(),
    };
    let faults = args.fault_injection.then(FaultRegistry::default);
    let member_options = |keys: &config::MemberKeys| -> Result<MemberOpenOptions> {
        MemberOpenOptions {
            io: MemberIoArgs {
                io: args.io.io.or(keys.io_engine()?),
                member_bw: args.io.member_bw.or(keys.member_bw_bytes()?),
                member_iops: args.io.member_iops.or(keys.member_iops),
                export_bw: args.io.export_bw.or(keys.export_bw_bytes()?),
                member_timeout: args.io.member_timeout.or(keys.member_timeout.map(|d| d.0)),
                buffered: args.io.buffered || keys.buffered.unwrap_or(false),
            },
            read_only: args.read_only || keys.read_only.unwrap_or(false),
            faults: faults.clone(),
            ..MemberOpenOptions::default()
        }
        .with_export_bw()
    };
    let exports = if args.config.is_some() {
        let mut out = Vec::new();
        for e in &file.exports {
            let members = match (&e.uuid, &e.scan) {
                (Some(uuid), Some(pattern)) => MemberSource::Scan { uuid: uuid.clone(), pattern: pattern.clone() },
                _ => MemberSource::Paths(e.members.clone()),
            };
            let options = member_options(&e.keys(&file)).map_err(|err| anyhow!("export {}: {err}", e.name))?;
            let tls_peers = if args.tls_peer.is_empty() { e.tls_peer.clone() } else { args.tls_peer.clone() };
            out.push(ExportPlan { name: e.name.clone(), members, options, tls_required: e.tls_required()?, tls_peers });
        }
        out
    } else {
        let members = match (&args.uuid, &args.scan) {
            (Some(uuid), Some(pattern)) => {
                if !args.members.is_empty() {
                    bail!("give members either by name or with --uuid/--scan, not both");
                }
                MemberSource::Scan { uuid: uuid.clone(), pattern: pattern.clone() }
            }
            _ if args.members.is_empty() => {
                bail!("no members given: raidnbd serve MEMBER... (or --uuid UUID --scan GLOB, or --config FILE)")
            }
            _ => MemberSource::Paths(args.members.clone()),
        };
        let name = args.export.clone().unwrap_or_default();
        let options = member_options(&config::MemberKeys::default())?;
        vec![ExportPlan { name, members, options, tls_required: false, tls_peers: args.tls_peer.clone() }]
    };
    let listen = if !args.listen.is_empty() {
        args.listen.clone()
    } else {
        let from_file = file.listen()?;
        if from_file.is_empty() { vec![DEFAULT_LISTEN.parse().map_err(|e: String| anyhow!(e))?] } else { from_file }
    };
    Ok(Settings {
        listen,
        cache: args.cache.or(file.cache()?).unwrap_or_default(),
        cache_size: args.cache_size.or(file.cache_size_bytes()?).unwrap_or(DEFAULT_CACHE_BYTES),
        force: args.force || file.force.unwrap_or(false),
        require_all: args.require_all || file.require_all.unwrap_or(false),
        control: args.control.clone().or_else(|| file.control.clone()),
        state_dir: crate::away_file::state_dir(args.state_dir.as_deref().or(file.state_dir.as_deref())),
        metrics: args.metrics.or(file.metrics),
        on_event: args.on_event.clone().or_else(|| file.on_event.clone()),
        write_gather: Duration::from_micros(
            args.write_gather_us.or(file.write_gather_us).unwrap_or(DEFAULT_WRITE_GATHER_US).min(1_000_000),
        ),
        scrub_interval: args.scrub_interval.or(file.scrub_interval.map(|d| d.0)),
        speed_limits: {
            let (min, max) = file.speed_limits()?;
            let min = args.speed_limit_min.or(min).unwrap_or(maintenance::DEFAULT_MIN_SPEED);
            let max = args.speed_limit_max.or(max).unwrap_or(maintenance::DEFAULT_MAX_SPEED);
            maintenance::SpeedLimits::new(min, max).map_err(|e| anyhow!("speed limits: {e}"))?
        },
        server: {
            let defaults = ServerConfig::default();
            let handshake = args.handshake_timeout.or(file.handshake_timeout.map(|d| d.0));
            let idle = args.idle_timeout.or(file.idle_timeout.map(|d| d.0));
            let stall = args.stall_timeout.or(file.stall_timeout.map(|d| d.0));
            if [handshake, idle, stall].iter().any(|t| t.is_some_and(|t| t < MIN_CLIENT_TIMEOUT)) {
                bail!(
                    "--handshake-timeout, --idle-timeout and --stall-timeout take at least 100ms (leave --idle-timeout out for never)"
                );
            }
            ServerConfig {
                handshake_timeout: handshake.unwrap_or(defaults.handshake_timeout),
                idle_timeout: idle,
                stall_timeout: stall.unwrap_or(defaults.stall_timeout),
                allowed_addresses: if args.allow.is_empty() { file.allow()? } else { args.allow.clone() },
                ..defaults
            }
        },
        tls: crate::tls::resolve(args, &file)?,
        exports,
    })
}

/// One line saying what an array is: "3.0 GiB raid5, 64K chunk, left-symmetric, 4 members, clean".
pub fn describe(opened: &OpenedArray) -> String {
    let array = &opened.array;
    let a = &opened.assembly;
    let mut state = if a.dirty { "active (not cleanly stopped)".to_string() } else { "clean".to_string() };
    if a.degraded {
        state.push_str(&format!(", DEGRADED (missing roles {:?})", a.missing_roles));
    }
    let members: Vec<String> =
        a.members.iter().map(|m| m.map_or("missing".to_string(), |c| opened.paths[c].clone())).collect();
    if !opened.absent.is_empty() {
        state.push_str(&format!(", absent: {}", opened.absent.join(", ")));
    }
    format!(
        "{} {}, {}, {} members [{}], {state}",
        human_bytes(array.size_bytes()),
        array.geometry().level(),
        describe_layout(&array.geometry()),
        a.members.len(),
        members.join(", ")
    )
}

pub async fn run(args: ServeArgs) -> Result<()> {
    let settings = settings(&args)?;
    if settings.cache == CacheMode::Writeback && settings.cache_size < MIN_CACHE_BYTES {
        bail!("--cache-size must be at least 1M (got {})", human_bytes(settings.cache_size));
    }
    // Signals are caught from here on: one during start-up stops it (every wait on a member
    // there is bounded too, by --member-timeout).
    let shutdown = Shutdown::install()?;
    let stop_deadline = stop_deadline(&settings.exports);
    let started = tokio::select! {
        started = start(settings) => started?,
        () = shutdown.stop.cancelled() => {
            tracing::warn!("stopped during start-up, before serving");
            return Ok(());
        }
    };
    serve(started, shutdown, stop_deadline).await
}

/// How long a stop may take before the process exits anyway: the drain and the final
/// flush each wait on members for at most twice the member timeout (a request's own
/// timeout, then reconnecting), plus time for the write-back cache.
fn stop_deadline(exports: &[ExportPlan]) -> Duration {
    let member_timeout = exports.iter().map(|e| e.options.member_timeout()).max().unwrap_or_default();
    member_timeout * 2 + STOP_SLACK
}

/// Added to the stop deadline.
const STOP_SLACK: Duration = Duration::from_secs(10);

type CacheTask = (Arc<WriteCache<dyn Member>>, tokio::task::JoinHandle<()>);

/// What `start` opened: arrays, listeners and the tasks around them, ready to serve.
struct Started {
    server: Server,
    listeners: Vec<Bound>,
    activated: bool,
    socket: PathBuf,
    control: Arc<Control>,
    arrays: Vec<Arc<Array<dyn Member>>>,
    /// Each write-back cache and its background task.
    caches: Vec<CacheTask>,
    watched: Vec<Watched>,
    lines: Vec<String>,
    on_event: Option<String>,
}

/// Opens every export's array, binds the listeners and the control socket.
async fn start(settings: Settings) -> Result<Started> {
    let metrics = crate::metrics::start(settings.metrics).await?;
    let mut arrays: Vec<Arc<Array<dyn Member>>> = Vec::new();
    let mut exports = Vec::new();
    let mut controlled = Vec::new();
    let mut watched = Vec::new();
    let mut lines = Vec::new();
    let mut caches = Vec::new();
    for mut plan in settings.exports {
        plan.options.metrics = metrics.as_ref().map(|m| m.export(&plan.name));
        if let Some(m) = &plan.options.metrics {
            let _ = m.links.set(plan.options.links.clone());
        }
        let paths = plan.members.paths()?;
        let opened = open_array(&paths, &plan.options, settings.force, settings.require_all).await?;
        let read_only = plan.options.read_only || opened.forced_read_only;
        if !read_only {
            let meta = &opened.assembly.metadata;
            let uuid = meta.uuid.to_string().replace(':', "");
            crate::away_file::track(&opened.array, &settings.state_dir, &uuid, meta.events, !opened.assembly.dirty)
                .await;
        }
        if !read_only {
            stamp_untrusted_checksums(&opened.array, &plan.name);
        }
        if settings.cache == CacheMode::Writethrough {
            // (The write-back cache gathers stripes itself.)
            opened.array.enable_write_gathering(settings.write_gather, Arc::new(TokioTimer));
        }
        let description = describe(&opened);
        let mut volume: Arc<dyn Volume> = opened.array.clone();
        let mut cache_text = "cache writethrough".to_string();
        if settings.cache == CacheMode::Writeback && !read_only {
            let cache = Arc::new(WriteCache::new(opened.array.clone(), settings.cache_size));
            volume = cache.clone();
            cache_text = format!(
                "cache writeback ({}; writes not yet flushed are LOST if raidnbd dies)",
                cache_size_text(settings.cache_size)
            );
            caches.push((cache.clone(), tokio::spawn(write_back_loop(cache, plan.name.clone()))));
        }
        let block_bytes = opened.assembly.metadata.logical_block_bytes();
        let device = ArrayDevice::new(volume, &opened.array.geometry(), block_bytes, read_only, description.clone());
        let device: Arc<dyn BlockDevice> = Arc::new(device);
        lines.push(format!(
            "serving export '{}': {description}{}; {cache_text}",
            plan.name,
            if read_only { ", READ-ONLY" } else { "" }
        ));
        let device = crate::metrics::instrument(metrics.as_ref(), &plan.name, &opened.array, device);
        exports.push(
            Export::new(plan.name.clone(), device).require_tls(plan.tls_required).tls_peers(plan.tls_peers.clone()),
        );
        let worker = maintenance::spawn(
            opened.array.clone(),
            plan.name.clone(),
            settings.scrub_interval,
            settings.speed_limits.clone(),
        );
        crate::rejoin::spawn(opened.array.clone(), plan.options.clone(), opened.returnable(), worker.wake.clone());
        watched.push(Watched { export: plan.name.clone(), array: opened.array.clone() });
        controlled.push(ControlledExport {
            name: plan.name,
            array: opened.array.clone(),
            worker,
            open_options: plan.options,
            write_back: settings.cache == CacheMode::Writeback && !read_only,
        });
        arrays.push(opened.array);
    }
    let server = Server::with_tls(exports, settings.server.clone(), settings.tls).map_err(|e| anyhow!("{e}"))?;
    let (listeners, activated) = listen::listeners(&settings.listen).await?;
    let socket = settings.control.clone().unwrap_or_else(|| control::default_socket_for(&listeners));
    let control = Arc::new(Control { exports: controlled });
    Ok(Started {
        server,
        listeners,
        activated,
        socket,
        control,
        arrays,
        caches,
        watched,
        lines,
        on_event: settings.on_event,
    })
}

/// Serves until a signal, then stops in order; gives up (exit 1) after `stop_deadline`.
async fn serve(started: Started, shutdown: Shutdown, stop_deadline: Duration) -> Result<()> {
    let Started { server, listeners, activated, socket, control, arrays, caches, watched, lines, on_event } = started;
    let control_listener = control::bind(&socket)?;
    let control_task = tokio::spawn(async move {
        if let Err(e) = control::serve(control, control_listener).await {
            tracing::error!("control socket: {e:#}");
        }
    });
    let names: Vec<String> = listeners.iter().map(Bound::describe).collect();
    tracing::info!("listening on {}{}", names.join(", "), if activated { " (socket activation)" } else { "" });
    for line in &lines {
        tracing::info!("{line}");
    }
    let mut unix_paths = Vec::new();
    let mut serving = tokio::task::JoinSet::new();
    for bound in listeners {
        let server = server.clone();
        let stop = shutdown.stop.clone();
        match bound {
            Bound::Tcp(l) => {
                serving.spawn(async move { server.serve(l, stop.cancelled_owned()).await });
            }
            Bound::Unix { listener, path, remove } => {
                if remove {
                    unix_paths.push(path);
                }
                serving.spawn(async move { server.serve(listener, stop.cancelled_owned()).await });
            }
        }
    }
    let monitor = monitor::spawn(watched, on_event, shutdown.stop.clone());
    crate::notify::ready(&format!("serving on {}", names.join(", ")));
    shutdown.stop.cancelled().await;
    crate::notify::stopping();
    let stage = crate::shutdown::arm_deadline(stop_deadline);
    stage.set("draining connections");
    let drained = tokio::select! {
        r = join_servers(&mut serving) => Some(r),
        _ = shutdown.hurry.cancelled() => None,
    };
    let served = match drained {
        Some(r) => r,
        None => {
            serving.shutdown().await;
            // The drain was cut short: flush what the connections had written.
            server.flush_all().await
        }
    };
    let _ = monitor.await;
    control_task.abort();
    let _ = std::fs::remove_file(&socket);
    for path in &unix_paths {
        let _ = std::fs::remove_file(path);
    }
    stage.set("writing back the cache, flushing the members and marking the arrays clean");
    tracing::info!("writing back the cache, flushing and marking arrays clean");
    // Cached writes reach the members before the arrays are marked clean.
    let mut cache_error = None;
    for (cache, task) in caches {
        if let Err(e) = cache.flush().await {
            tracing::error!("write-back cache flush at shutdown failed: {e}");
            cache_error.get_or_insert(e);
        }
        task.abort();
    }
    // Every array is shut down even if one fails; the first error is reported.
    let mut shutdown_error = None;
    for array in &arrays {
        if let Err(e) = array.shutdown().await {
            tracing::error!("shutdown: {e}");
            shutdown_error.get_or_insert(e);
        }
    }
    if let Some(e) = cache_error {
        bail!("cached writes could not be written to the members: {e}");
    }
    if let Some(e) = shutdown_error {
        bail!("{e}");
    }
    served.map_err(|e| anyhow!("{e}"))?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Waits for every listener's serve loop; the first error wins.
async fn join_servers(serving: &mut tokio::task::JoinSet<nbd_server::Result<()>>) -> nbd_server::Result<()> {
    let mut result = Ok(());
    while let Some(joined) = serving.join_next().await {
        let served = joined.unwrap_or_else(|e| Err(nbd_server::Error::Io(std::io::Error::other(e))));
        if let Err(e) = served {
            result = result.and(Err(e));
        }
    }
    result
}

/// Shortest client timeout accepted (shorter would cut off a client on loopback).
const MIN_CLIENT_TIMEOUT: Duration = Duration::from_millis(100);

/// Default `--write-gather-us`: md's stripe cache holds a partial stripe about as long.
const DEFAULT_WRITE_GATHER_US: u64 = 1000;

/// tokio's sleep, for the engine's write gathering.
struct TokioTimer;

impl raid_core::engine::Timer for TokioTimer {
    fn sleep(&self, duration: Duration) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Default `--cache-size`.
const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// Smallest `--cache-size` accepted.
const MIN_CACHE_BYTES: u64 = 1 << 20;

/// Dirty data below this share of the cache waits [`WRITE_BACK_DELAY`] before write-back
/// starts, so that neighbouring small writes can merge into full stripes.
const WRITE_BACK_EAGER_DIVISOR: u64 = 4;
const WRITE_BACK_DELAY: std::time::Duration = std::time::Duration::from_millis(20);

/// Bytes written back per background step.
const WRITE_BACK_STEP_BYTES: u64 = 8 << 20;

/// "256 MiB" for whole mebibytes, else the usual human form.
fn cache_size_text(bytes: u64) -> String {
    match bytes {
        b if b.is_multiple_of(1 << 30) => format!("{} GiB", b >> 30),
        b if b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b => human_bytes(b),
    }
}

/// Background write-back of one export's cache: whenever there is dirty data nobody is
/// writing, write it back oldest first (after a short delay while the cache is mostly
/// empty). Failures keep the data cached; FLUSH reports them to clients.
async fn write_back_loop(cache: Arc<WriteCache<dyn Member>>, export: String) {
    loop {
        cache.wait_for_work().await;
        if cache.dirty_bytes() < cache.capacity_bytes() / WRITE_BACK_EAGER_DIVISOR {
            tokio::time::sleep(WRITE_BACK_DELAY).await;
        }
        loop {
            match cache.write_back_some(WRITE_BACK_STEP_BYTES).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(export, "write-back failed, data stays cached and FLUSH reports it: {e}");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    break;
                }
            }
        }
    }
}

/// Members whose checksums are untrusted (md wrote the array since raidnbd did, or an unclean
/// stop without a resync to read them: a partial parity log) are read whole by a check,
/// which stamps them again; a resync due first reads what it covers.
fn stamp_untrusted_checksums(array: &raid_core::engine::Array<dyn raid_core::Member>, export: &str) {
    let untrusted: u64 =
        array.admin().role_status().iter().filter_map(|r| r.integrity).map(|i| i.untrusted_bytes).sum();
    if untrusted == 0 || array.maintenance().status().resync_pending {
        return;
    }
    match array.maintenance().start_scrub(false) {
        Ok(()) => tracing::info!(
            export,
            untrusted_bytes = untrusted,
            "checksums untrusted since the last stop: a check reads them and stamps them again"
        ),
        Err(e) => tracing::warn!(export, "checksums stay untrusted until read: {e}"),
    }
}
