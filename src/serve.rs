//! `raidnbd serve`: assemble arrays and serve them over NBD until SIGTERM/SIGINT, then
//! drain in-flight requests, flush, and mark the arrays clean.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use nbd_server::{BlockDevice, Export, Server, ServerConfig};
use raid_core::Member;
use raid_core::engine::Array;
use raid_core::write_cache::WriteCache;

use crate::cli::{CacheMode, MemberIoArgs, ServeArgs};
use crate::config;
use crate::control::{self, Control, ControlledExport};
use crate::create::describe_layout;
use crate::export::ArrayDevice;
use crate::maintenance;
use crate::open::{FaultRegistry, MemberOpenOptions, OpenedArray, open_array};
use crate::size::human_bytes;

/// One export to serve, after merging the config file and the flags.
struct ExportPlan {
    name: String,
    members: Vec<String>,
    options: MemberOpenOptions,
}

fn plans(args: &ServeArgs) -> Result<(SocketAddr, Vec<ExportPlan>)> {
    let Some(path) = &args.config else {
        if args.members.is_empty() {
            bail!("no members given: raidnbd serve MEMBER... (or --config FILE)");
        }
        let name = args.export.clone().unwrap_or_default();
        let options =
            MemberOpenOptions { io: args.io.clone(), read_only: args.read_only, faults: faults(args), metrics: None };
        return Ok((args.listen, vec![ExportPlan { name, members: args.members.clone(), options }]));
    };
    if !args.members.is_empty() {
        bail!("give members either on the command line or in --config, not both");
    }
    let file = config::load(path)?;
    let listen = if args.listen != default_listen() { args.listen } else { file.listen.unwrap_or(args.listen) };
    let mut out = Vec::new();
    for e in file.exports {
        let io = MemberIoArgs {
            io: if args.io.io != crate::cli::IoEngine::Auto {
                args.io.io
            } else {
                e.io_engine()?.unwrap_or(args.io.io)
            },
            member_bw: args.io.member_bw.or(e.member_bw_bytes()?),
            member_iops: args.io.member_iops.or(e.member_iops),
            buffered: args.io.buffered || e.buffered,
        };
        let options =
            MemberOpenOptions { io, read_only: args.read_only || e.read_only, faults: faults(args), metrics: None };
        out.push(ExportPlan { name: e.name, members: e.members, options });
    }
    Ok((listen, out))
}

fn faults(args: &ServeArgs) -> Option<FaultRegistry> {
    args.fault_injection.then(FaultRegistry::default)
}

fn default_listen() -> SocketAddr {
    "127.0.0.1:10809".parse().expect("valid address")
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
    format!(
        "{} {}, {}, {} members [{}], {state}",
        human_bytes(array.size_bytes()),
        array.geometry().level(),
        describe_layout(array.geometry()),
        a.members.len(),
        members.join(", ")
    )
}

pub async fn run(args: ServeArgs) -> Result<()> {
    if args.cache == CacheMode::Writeback && args.cache_size < MIN_CACHE_BYTES {
        bail!("--cache-size must be at least 1M (got {})", human_bytes(args.cache_size));
    }
    let (listen, plans) = plans(&args)?;
    let metrics = crate::metrics::start(args.metrics).await?;
    let mut arrays: Vec<Arc<Array<dyn Member>>> = Vec::new();
    let mut exports = Vec::new();
    let mut controlled = Vec::new();
    let mut lines = Vec::new();
    let mut caches = Vec::new();
    for mut plan in plans {
        plan.options.metrics = metrics.as_ref().map(|m| m.export(&plan.name));
        let opened = open_array(&plan.members, &plan.options, args.force).await?;
        let read_only = plan.options.read_only || opened.forced_read_only;
        let description = describe(&opened);
        let mut device = ArrayDevice::new(opened.array.clone(), read_only, description.clone());
        let mut cache_text = "cache writethrough".to_string();
        if args.cache == CacheMode::Writeback && !read_only {
            let cache = Arc::new(WriteCache::new(opened.array.clone(), args.cache_size));
            device = device.with_cache(cache.clone());
            cache_text = format!(
                "cache writeback ({}; writes not yet flushed are LOST if raidnbd dies)",
                cache_size_text(args.cache_size)
            );
            caches.push((cache.clone(), tokio::spawn(write_back_loop(cache, plan.name.clone()))));
        }
        let device: Arc<dyn BlockDevice> = Arc::new(device);
        lines.push(format!(
            "serving export '{}' on {listen}: {description}{}; {cache_text}",
            plan.name,
            if read_only { ", READ-ONLY" } else { "" }
        ));
        let device = crate::metrics::instrument(metrics.as_ref(), &plan.name, &opened.array, device);
        exports.push(Export::new(plan.name.clone(), device));
        let worker = maintenance::spawn(opened.array.clone(), plan.name.clone());
        controlled.push(ControlledExport {
            name: plan.name,
            array: opened.array.clone(),
            worker,
            open_options: plan.options,
        });
        arrays.push(opened.array);
    }
    let server = Server::new(exports, ServerConfig::default()).map_err(|e| anyhow!("{e}"))?;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let socket = args.control.clone().unwrap_or_else(|| control::default_socket(listen.port()));
    let control = Arc::new(Control { exports: controlled });
    let control_task = {
        let socket = socket.clone();
        tokio::spawn(async move {
            if let Err(e) = control::serve(control, &socket).await {
                tracing::error!("control socket: {e:#}");
            }
        })
    };
    for line in &lines {
        tracing::info!("{line}");
    }
    let served = server.serve(listener, shutdown_signal()).await;
    tracing::info!("shutting down: flushing and marking arrays clean");
    control_task.abort();
    let _ = std::fs::remove_file(&socket);
    // Cached writes reach the members before the arrays are marked clean.
    let mut cache_error = None;
    for (cache, task) in caches {
        if let Err(e) = cache.flush().await {
            tracing::error!("write-back cache flush at shutdown failed: {e}");
            cache_error.get_or_insert(e);
        }
        task.abort();
    }
    for array in &arrays {
        array.shutdown().await.map_err(|e| anyhow!("{e}"))?;
    }
    if let Some(e) = cache_error {
        bail!("cached writes could not be written to the members: {e}");
    }
    served.map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

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

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
