//! The control socket of a running server (Unix socket, mode 0600): `raidnbd ctl` sends
//! one JSON request per line and gets one JSON reply per line.
//!
//! ```text
//!  {"command":"status"}                              -> {"ok":true,"exports":[...]}
//!  {"command":"fail","member":"/path"}               -> {"ok":true} | {"ok":false,"error":"..."}
//!  {"command":"remove","member":"/path"}
//!  {"command":"add","path":"/abs/path"}              new spare; rebuild starts if degraded
//!                                                    (a returning member is re-added)
//!  {"command":"re-add","path":"/abs/path"}           a returning member: copy only dirty chunks
//!  {"command":"replace","member":"/old","path":"/abs/new"}
//!  {"command":"check"} {"command":"repair"} {"command":"idle"}
//!  {"command":"rebuild-speed","min":1000000,"max":200000000}
//!  {"command":"fault","member":"/path","ops":"reads|writes|all|corrupt-reads|corrupt-writes|none"}
//!                                                                     (serve --fault-injection only)
//! ```
//! Every request may name `"export"`; it can be left out when the server has one export.
//! Every state change goes through the engine, which records it in the superblocks.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail};
use member_io::{FaultOps, LinkErrorKind, LinkStats};
use raid_core::engine::{Array, MaintenanceWork, RecoveryTally, SizeTarget, SlotState};
use raid_core::integrity::{self, IntegrityMember};
use raid_core::{Member, SECTOR_BYTES};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::create::describe_layout;
use crate::maintenance::Worker;
use crate::open::{MemberOpenOptions, open_member};
use crate::rejoin::returning_role;

/// Longest request line accepted.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The default control socket of a server with these listeners: named by the first TCP
/// port (what `raidnbd ctl --port` finds), else by the first Unix socket's path.
pub fn default_socket_for(listeners: &[crate::listen::Bound]) -> PathBuf {
    if let Some(port) = listeners.iter().find_map(|l| l.tcp_port()) {
        return default_socket(port);
    }
    let name = listeners.first().map(|l| l.describe()).unwrap_or_default();
    // FNV-1a of the socket path: a short, stable file name.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    default_socket(0).with_file_name(format!("control-unix-{hash:016x}.sock"))
}

/// The default control socket for a server listening on `port`.
pub fn default_socket(port: u16) -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let base = if uid == 0 {
        PathBuf::from("/run/raidnbd")
    } else if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(dir).join("raidnbd")
    } else {
        PathBuf::from(format!("/tmp/raidnbd-{uid}"))
    };
    base.join(format!("control-{port}.sock"))
}

/// What the control socket can act on for one export.
pub struct ControlledExport {
    pub name: String,
    pub array: Arc<Array<dyn Member>>,
    pub worker: Worker,
    pub open_options: MemberOpenOptions,
    /// Served through a write-back cache (a shrink is refused: cached writes past the new end
    /// could not be written back).
    pub write_back: bool,
}

pub struct Control {
    pub exports: Vec<ControlledExport>,
}

/// Binds the control socket (replacing a stale one) with mode 0600. Done before the NBD
/// sockets accept, so `raidnbd ctl` works as soon as the server answers NBD (and READY=1).
pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    crate::listen::remove_stale_socket(path, "the control socket is in use by another raidnbd")?;
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!("control socket {}", path.display());
    Ok(listener)
}

/// Serves requests on the bound control socket forever.
pub async fn serve(control: Arc<Control>, listener: UnixListener) -> Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let control = control.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(control, stream).await {
                tracing::debug!(error = %e, "control connection ended");
            }
        });
    }
}

async fn handle(control: Arc<Control>, stream: UnixStream) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut lines).take(MAX_REQUEST_BYTES as u64).read_line(&mut line).await?;
        if n == 0 {
            return Ok(());
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(request) => match execute(&control, &request).await {
                Ok(mut v) => {
                    v["ok"] = json!(true);
                    v
                }
                Err(e) => json!({ "ok": false, "error": format!("{e:#}") }),
            },
            Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
        };
        let mut text = reply.to_string();
        text.push('\n');
        write.write_all(text.as_bytes()).await?;
    }
}

fn str_field<'a>(request: &'a Value, key: &str) -> Result<&'a str> {
    request[key].as_str().ok_or_else(|| anyhow!("missing \"{key}\""))
}

fn find_export<'a>(control: &'a Control, request: &Value) -> Result<&'a ControlledExport> {
    match request["export"].as_str() {
        Some(name) => {
            control.exports.iter().find(|e| e.name == name).ok_or_else(|| anyhow!("no export named {name:?}"))
        }
        None if control.exports.len() == 1 => Ok(&control.exports[0]),
        None => bail!("several exports are served: name one with --export"),
    }
}

async fn execute(control: &Control, request: &Value) -> Result<Value> {
    let command = str_field(request, "command")?;
    if command == "status" {
        let exports: Vec<Value> = control.exports.iter().map(status).collect();
        return Ok(json!({ "exports": exports }));
    }
    let export = find_export(control, request)?;
    let array = &export.array;
    let err = |e: raid_core::RaidError| anyhow!("{e}");
    match command {
        "fail" => array.admin().fail_member(str_field(request, "member")?).await.map_err(err)?,
        "remove" => array.admin().remove_device(str_field(request, "member")?).await.map_err(err)?,
        "add" => {
            let member = open_for_array(export, str_field(request, "path")?).await?;
            match returning_role(array, member.as_ref()).await {
                Ok(role) => array.admin().re_add(role, member).await.map_err(err)?,
                Err(_) => {
                    array.admin().add_spare(member).await.map_err(err)?;
                }
            }
        }
        "re-add" => {
            let path = str_field(request, "path")?;
            let member = open_for_array(export, path).await?;
            let role = returning_role(array, member.as_ref())
                .await
                .map_err(|why| anyhow!("{path} cannot be re-added: {why}"))?;
            array.admin().re_add(role, member).await.map_err(err)?;
        }
        "replace" => {
            let old = str_field(request, "member")?;
            let role = array
                .admin()
                .role_status()
                .iter()
                .find(|s| s.name.as_deref() == Some(old))
                .map(|s| s.role)
                .ok_or_else(|| anyhow!("{old} is not an active member"))?;
            let member = open_for_array(export, str_field(request, "path")?).await?;
            array.admin().replace(role, member).await.map_err(err)?;
        }
        "grow" if !request["level"].is_null() => {
            let level = crate::grow::parse_level(str_field(request, "level")?)?;
            let paths: Vec<&str> =
                request["paths"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            if paths.len() > 1 {
                bail!("a level change adds at most one member (the role the new level adds)");
            }
            let spare = match paths.first() {
                Some(path) => Some(open_for_array(export, path).await?),
                None => None,
            };
            let changed = array.admin().change_level(level, spare).await.map_err(err)?;
            export.worker.wake.notify_one();
            return Ok(json!({ "level_changed": crate::grow::level_changed_line(&changed) }));
        }
        "grow" if !request["size"].is_null() => {
            let target = crate::grow::parse_size_target(str_field(request, "size")?).map_err(|e| anyhow!(e))?;
            if export.write_back && matches!(target, SizeTarget::Sectors(s) if s < array.geometry().component_sectors())
            {
                bail!(
                    "{} is served with a write-back cache: a shrink is refused (cached writes past the new end \
                     could not be written back); shrink it at rest (raidnbd grow --size)",
                    export.name
                );
            }
            let resized = array.admin().resize(target).await.map_err(err)?;
            export.worker.wake.notify_one();
            return Ok(crate::grow::resized_json(&resized));
        }
        "grow" => {
            let paths: Vec<&str> =
                request["paths"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let removing =
                crate::grow::check_count(array, request["raid_devices"].as_u64().map(|n| n as usize), paths.len())?;
            let (layout, chunk) =
                crate::grow::placement(array, request["layout"].as_str(), request["chunk_bytes"].as_u64())?;
            if let Some(n) = removing {
                if export.write_back {
                    bail!(
                        "{} is served with a write-back cache: removing members is refused (it shrinks the array, and \
                         cached writes past the new end could not be written back); do it at rest (raidnbd grow)",
                        export.name
                    );
                }
                let size = request["array_size_bytes"].as_u64();
                array.admin().remove_members(n, layout, chunk, size).await.map_err(err)?;
            } else {
                let mut members = Vec::with_capacity(paths.len());
                for path in paths {
                    members.push(open_for_array(export, path).await?);
                }
                array.admin().reshape(members, layout, chunk).await.map_err(err)?;
            }
        }
        "check" | "repair" => array.maintenance().start_scrub(command == "repair").map_err(err)?,
        "idle" => {
            array.maintenance().stop_scrub();
        }
        "rebuild-speed" => {
            let min = request["min"].as_u64().ok_or_else(|| anyhow!("missing \"min\""))?;
            let max = request["max"].as_u64().ok_or_else(|| anyhow!("missing \"max\""))?;
            export.worker.limits.set(min, max)?;
        }
        "fault" => {
            let faults = export
                .open_options
                .faults
                .as_ref()
                .ok_or_else(|| anyhow!("fault injection is off (serve --fault-injection)"))?;
            let member = str_field(request, "member")?;
            let control = faults
                .lock()
                .expect("faults lock")
                .get(member)
                .cloned()
                .ok_or_else(|| anyhow!("no member {member}"))?;
            match str_field(request, "ops")? {
                "none" => control.disarm(),
                "reads" => control.fail_after(FaultOps::Reads, 0),
                "writes" => control.fail_after(FaultOps::Writes, 0),
                "all" => control.fail_after(FaultOps::All, 0),
                "corrupt-reads" => control.corrupt_range(FaultOps::Reads, 0..u64::MAX),
                "corrupt-writes" => control.corrupt_range(FaultOps::Writes, 0..u64::MAX),
                other => bail!("ops {other:?}: use reads, writes, all, corrupt-reads, corrupt-writes or none"),
            }
        }
        other => bail!("unknown command {other:?}"),
    }
    export.worker.wake.notify_one();
    Ok(json!({}))
}

/// Opens a new member for `export` the way its members were opened.
/// A device joining an array whose members have checksums gets them too.
async fn open_for_array(export: &ControlledExport, path: &str) -> Result<Arc<dyn Member>> {
    let member = open_member(path, &export.open_options).await?;
    let roles = export.array.admin().role_status();
    let Some(first_data_bytes) =
        roles.iter().filter(|r| r.integrity.is_some()).filter_map(|r| r.data_offset_bytes).min()
    else {
        return Ok(member);
    };
    if member.integrity().is_some() {
        return Ok(member); // a member coming back with its own
    }
    let checked = IntegrityMember::fresh(member, first_data_bytes / integrity::BLOCK_BYTES)
        .with_context(|| format!("cannot keep checksums on {path}"))?;
    Ok(Arc::new(checked))
}

fn status(export: &ControlledExport) -> Value {
    let array = &export.array;
    // One reading that never misses a spare taking a role (`ctl wait` would read that as idle).
    let (roles, spares) = array.admin().membership_status();
    let corruption = array.maintenance().corruption();
    let spares: Vec<String> = spares.into_iter().map(|(n, _)| n).collect();
    let maintenance = array.maintenance().status();
    let failed = roles.iter().filter(|r| r.state != SlotState::InSync).count();
    let mut state = if failed > 0 { "active, degraded".to_string() } else { "active".to_string() };
    if let Some(work) = maintenance.current {
        state.push_str(&format!(", {}", work.name()));
    }
    let speed = export.worker.progress.speed_bytes_per_sec.load(Ordering::Relaxed);
    let work = maintenance.current.map(|work| {
        let unit_bytes = match work {
            MaintenanceWork::Recovery { .. } | MaintenanceWork::Replace { .. } | MaintenanceWork::Reshape => {
                SECTOR_BYTES
            }
            _ => array.size_bytes() / maintenance.total.max(1),
        };
        let remaining = maintenance.total.saturating_sub(maintenance.done) * unit_bytes;
        json!({
            "kind": work.name(),
            "role": match work { MaintenanceWork::Recovery { role } | MaintenanceWork::Replace { role } => Some(role), _ => None },
            "done": maintenance.done,
            "total": maintenance.total,
            "percent": if maintenance.total > 0 { maintenance.done as f64 * 100.0 / maintenance.total as f64 } else { 0.0 },
            "speed_bytes_per_sec": speed,
            "eta_seconds": (speed > 0).then(|| remaining / speed),
        })
    });
    let tally = |t: Option<RecoveryTally>| {
        t.map(|t| {
            json!({
                "role": t.role,
                "from_bitmap": t.from_bitmap,
                "dirty_chunks": t.dirty_chunks,
                "copied_bytes": t.copied_bytes,
                "hole_bytes": t.hole_bytes,
            })
        })
    };
    let links: Vec<Value> = export
        .open_options
        .links
        .all()
        .into_iter()
        .map(|(uri, l)| {
            let state = l.state();
            let errors: serde_json::Map<String, Value> =
                LinkErrorKind::ALL.into_iter().map(|k| (k.label().to_string(), json!(l.errors(k)))).collect();
            json!({
                "member": uri,
                "state": state.name(),
                "reason": state.reason(),
                "framing": l.framing(),
                "disconnects": LinkStats::get(&l.disconnects),
                "reconnects": LinkStats::get(&l.reconnects),
                "timeouts": LinkStats::get(&l.timeouts),
                "retries": LinkStats::get(&l.retries),
                "errors": errors,
                "last_error": l.last_error().map(|e| json!({
                    "kind": e.kind.label(),
                    "kind_name": e.kind.name(),
                    "what": e.what,
                    "seconds_ago": e.at.elapsed().map_or(0, |d| d.as_secs()),
                })),
                "log_lines_suppressed": LinkStats::get(&l.log_lines_suppressed),
            })
        })
        .collect();
    json!({
        "name": export.name,
        "level": array.geometry().level().to_string(),
        "layout": describe_layout(&array.geometry()),
        "size_bytes": array.size_bytes(),
        "state": state,
        "read_only": array.is_read_only(),
        "roles": roles.iter().map(|r| json!({
            "role": r.role,
            "member": r.name,
            "state": r.state.name(),
            "recovery_offset_sectors": r.recovery_offset_sectors,
            "write_mostly": array.admin().is_write_mostly(r.role),
            "bad_sectors": array.admin().bad_blocks(r.role).sectors(),
            "read_latency_us": array.admin().read_latency(r.role).map(|l| l.as_micros() as u64),
            "replacement": r.replacement.as_ref().map(|(n, _, done)| json!({"member": n, "done_sectors": done})),
            "integrity": r.integrity.map(|i| {
                let c = corruption.get(r.role).copied().unwrap_or_default();
                json!({
                    "covered_bytes": i.covered_bytes,
                    "verified_blocks": i.verified_blocks,
                    "corrupt_blocks": i.corrupt_blocks,
                    "restamped_blocks": i.restamped_blocks,
                    "untrusted_bytes": i.untrusted_bytes,
                    "reports": c.reports,
                    "found_sectors": c.found_sectors,
                    "healed_sectors": c.healed_sectors,
                })
            }),
        })).collect::<Vec<_>>(),
        "spares": spares,
        "work": work,
        "recovery": tally(maintenance.recovery),
        "last_recovery": tally(maintenance.last_recovery),
        "links": links,
        "gathered_writes": array.gathered_writes(),
        "reshape": array.shape().reshape().map(|r| json!({
            "from_raid_devices": r.previous.geometry().raid_disks(),
            "to_raid_devices": array.geometry().raid_disks(),
            "front_bytes": r.front_sectors * SECTOR_BYTES,
            "backwards": r.direction == raid_core::engine::Direction::Backward,
        })),
        "away": array.admin().away_status().map(|a| json!({
            "since_events": a.since_events,
            "chunks_written": a.chunks_written,
            "chunks": a.chunks,
            "chunk_bytes": a.chunk_sectors * 512,
            "persisted": a.persisted,
        })),
        "parity_log": array.write_hole_stats().parity_log().map(|l| json!({
            "entries_logged": l.entries_logged,
            "headers_written": l.headers_written,
            "drains": l.drains,
            "retires": l.retires,
        })),
        "journal": array.write_hole_stats().journal().map(|j| json!({
            "units_written": j.units_written,
            "pages_logged": j.pages_logged,
            "tail_moves": j.reclaims,
            "waits_for_room": j.waits_for_room,
            "ring_bytes": j.ring_sectors * 512,
            "used_bytes": j.used_sectors * 512,
        })),
        "resync_pending": maintenance.resync_pending,
        "mismatch_cnt": maintenance.mismatch_sectors,
        "last_check": maintenance.last_scrub.map(|(w, c)| json!({
            "kind": w.name(),
            "mismatch_cnt": c.mismatch_sectors,
            "located_sectors": c.located_sectors,
            "checked_bytes": c.scrubbed_bytes,
            "hole_bytes": c.hole_bytes,
        })),
        "mismatches": crate::check::mismatches_json(array, &array.maintenance().mismatches()),
        "speed_limits": {
            "min_bytes_per_sec": export.worker.limits.min_bytes_per_sec.load(Ordering::Relaxed),
            "max_bytes_per_sec": export.worker.limits.max_bytes_per_sec.load(Ordering::Relaxed),
        },
    })
}
