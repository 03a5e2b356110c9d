//! `raidnbd ctl`: talk to a running server through its control socket.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::cli::{CtlArgs, CtlCommand};
use crate::control::default_socket;
use crate::size::human_bytes;

/// Absolute form of a path the server should open (it may run elsewhere); an NBD member's
/// URI as it is.
fn absolute(path: &str) -> Result<String> {
    if nbd_client::ExportAddress::is_uri(path) {
        return Ok(path.to_string());
    }
    let p = PathBuf::from(path);
    let abs = if p.exists() { std::fs::canonicalize(&p)? } else { bail!("{path} does not exist") };
    Ok(abs.to_string_lossy().into_owned())
}

/// Member names as the server knows them (canonical paths when the file exists here).
fn member_name(path: &str) -> String {
    std::fs::canonicalize(path).map_or_else(|_| path.to_string(), |p| p.to_string_lossy().into_owned())
}

async fn request(socket: &PathBuf, request: Value) -> Result<Value> {
    let stream = UnixStream::connect(socket)
        .await
        .with_context(|| format!("cannot connect to {} (is raidnbd serve running?)", socket.display()))?;
    let (read, mut write) = stream.into_split();
    let mut text = request.to_string();
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let reply: Value = serde_json::from_str(&line).context("bad reply from the server")?;
    if reply["ok"] != json!(true) {
        bail!("{}", reply["error"].as_str().unwrap_or("request failed"));
    }
    Ok(reply)
}

/// How often `ctl wait` asks.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// True while an export has background work running or about to run: a resync still to do,
/// a role recovering (assigned a spare, its first step not taken yet), or a degraded array
/// with a spare (the worker assigns it at its next step): so `ctl add` followed at once by
/// `ctl wait` waits for that rebuild. Read-only arrays never count (they run nothing).
fn busy(exports: &Value, only: Option<&str>) -> bool {
    exports.as_array().into_iter().flatten().filter(|e| only.is_none_or(|n| e["name"] == json!(n))).any(|e| {
        let states: Vec<&Value> = e["roles"].as_array().into_iter().flatten().map(|r| &r["state"]).collect();
        let degraded = states.iter().any(|s| **s != json!("in_sync"));
        let recovering = states.iter().any(|s| **s == json!("recovering"));
        let has_spare = e["spares"].as_array().is_some_and(|s| !s.is_empty());
        // A read-only array runs no background work: nothing to wait for.
        let read_only = e["read_only"] == json!(true);
        !read_only
            && (!e["work"].is_null()
                || !e["reshape"].is_null()
                || e["resync_pending"] == json!(true)
                || recovering
                || (degraded && has_spare))
    })
}

/// `ctl wait`: like mdadm --wait, returns once no rebuild, resync, replace, reshape or check runs
/// (exit 0), or after `timeout` seconds (exit 1).
async fn wait(socket: &PathBuf, export: Option<&str>, timeout: Option<std::time::Duration>) -> Result<ExitCode> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    loop {
        let reply = request(socket, json!({ "command": "status" })).await?;
        if let Some(name) = export
            && !reply["exports"].as_array().into_iter().flatten().any(|e| e["name"] == json!(name))
        {
            bail!("no export named {name:?}");
        }
        if !busy(&reply["exports"], export) {
            return Ok(ExitCode::SUCCESS);
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            let waited = crate::duration::format_duration(timeout.unwrap_or_default());
            eprintln!("raidnbd: still busy after {waited}");
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

pub async fn run(args: CtlArgs) -> Result<ExitCode> {
    let socket = args.socket.clone().unwrap_or_else(|| default_socket(args.port));
    let mut req = match &args.command {
        CtlCommand::Wait { timeout } => return wait(&socket, args.export.as_deref(), *timeout).await,
        CtlCommand::Status { .. } => json!({ "command": "status" }),
        CtlCommand::Fail { member } => json!({ "command": "fail", "member": member_name(member) }),
        CtlCommand::Remove { member } => json!({ "command": "remove", "member": member_name(member) }),
        CtlCommand::Add { path } => json!({ "command": "add", "path": absolute(path)? }),
        CtlCommand::ReAdd { path } => json!({ "command": "re-add", "path": absolute(path)? }),
        CtlCommand::Replace { member, path } => {
            json!({ "command": "replace", "member": member_name(member), "path": absolute(path)? })
        }
        CtlCommand::Grow(g) if g.integrity.is_some() => {
            bail!("checksums are added to an array at rest: stop it, then raidnbd grow --integrity crc32c MEMBER...")
        }
        CtlCommand::Grow(g) => match &g.size {
            None if g.level.is_some() => json!({
                "command": "grow",
                "level": g.level,
                "paths": g.add.iter().map(|p| absolute(p)).collect::<Result<Vec<_>>>()?,
            }),
            Some(size) => {
                crate::grow::parse_size_target(size).map_err(|e| anyhow!(e))?;
                json!({ "command": "grow", "size": size })
            }
            None => json!({
                "command": "grow",
                "raid_devices": g.raid_devices,
                "paths": g.add.iter().map(|p| absolute(p)).collect::<Result<Vec<_>>>()?,
                "layout": g.layout,
                "chunk_bytes": g.chunk,
                "array_size_bytes": g.array_size,
            }),
        },
        CtlCommand::Check => json!({ "command": "check" }),
        CtlCommand::Repair => json!({ "command": "repair" }),
        CtlCommand::Idle => json!({ "command": "idle" }),
        CtlCommand::RebuildSpeed { min, max } => json!({ "command": "rebuild-speed", "min": min, "max": max }),
        CtlCommand::Fault { member, ops } => json!({ "command": "fault", "member": member_name(member), "ops": ops }),
    };
    if let Some(export) = &args.export {
        req["export"] = json!(export);
    }
    let reply = request(&socket, req).await?;
    if let Some(line) = crate::grow::resized_line(&reply) {
        println!("{line}");
    }
    if let Some(line) = reply["level_changed"].as_str() {
        println!("{line}");
    }
    if let CtlCommand::Status { json } = args.command {
        if json {
            println!("{}", serde_json::to_string_pretty(&reply["exports"])?);
        } else {
            print!("{}", mdstat(&reply["exports"]).ok_or_else(|| anyhow!("bad status reply"))?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A /proc/mdstat-like view.
fn mdstat(exports: &Value) -> Option<String> {
    let mut out = String::new();
    for e in exports.as_array()? {
        let roles = e["roles"].as_array()?;
        let members: Vec<String> = roles
            .iter()
            .map(|r| {
                let name = r["member"].as_str().unwrap_or("-");
                let flag = match r["state"].as_str() {
                    Some("faulty") => "(F)",
                    Some("recovering") => "(R)",
                    _ => "",
                };
                let write_mostly = if r["write_mostly"] == json!(true) { "(W)" } else { "" };
                let bad = match r["bad_sectors"].as_u64() {
                    Some(n) if n > 0 => format!("(bad: {n} sectors)"),
                    _ => String::new(),
                };
                format!("{name}[{}]{write_mostly}{flag}{bad}", r["role"])
            })
            .chain(e["spares"].as_array()?.iter().map(|s| format!("{}(S)", s.as_str().unwrap_or("?"))))
            .collect();
        let up: String = roles.iter().map(|r| if r["state"] == "in_sync" { 'U' } else { '_' }).collect();
        let working = up.chars().filter(|&c| c == 'U').count();
        out.push_str(&format!(
            "{} : {} {} {}\n",
            e["name"].as_str()?,
            e["state"].as_str()?,
            e["level"].as_str()?,
            members.join(" ")
        ));
        out.push_str(&format!(
            "      {} {} [{}/{working}] [{up}]\n",
            human_bytes(e["size_bytes"].as_u64()?),
            e["layout"].as_str()?,
            roles.len()
        ));
        if let Some(w) = e["work"].as_object() {
            let pct = w["percent"].as_f64().unwrap_or(0.0);
            let filled = ((pct / 5.0) as usize).min(20);
            let bar = format!("{}>{}", "=".repeat(filled), ".".repeat(20 - filled));
            let eta = w["eta_seconds"].as_u64().map_or("?".to_string(), |s| format!("{:.1}min", s as f64 / 60.0));
            out.push_str(&format!(
                "      [{bar}]  {} = {pct:.1}% ({}/{}) finish={eta} speed={}/s\n",
                w["kind"].as_str()?,
                w["done"],
                w["total"],
                human_bytes(w["speed_bytes_per_sec"].as_u64().unwrap_or(0))
            ));
        }
        if let Some(a) = e["away"].as_object() {
            out.push_str(&format!(
                "      away record: {} of {} chunks written since event {}{}\n",
                a["chunks_written"],
                a["chunks"],
                a["since_events"],
                if a["persisted"] == json!(true) { "" } else { " (in memory only)" }
            ));
        }
        if let Some(t) = e["last_recovery"].as_object() {
            let copied = human_bytes(t["copied_bytes"].as_u64().unwrap_or(0));
            let holes = human_bytes(t["hole_bytes"].as_u64().unwrap_or(0));
            if t["from_bitmap"] == json!(true) {
                out.push_str(&format!(
                    "      last re-add of role {}: {} chunks written while away, {copied} copied, {holes} left holes\n",
                    t["role"], t["dirty_chunks"],
                ));
            } else {
                out.push_str(&format!(
                    "      last recovery of role {}: {copied} copied, {holes} holes on every source left holes\n",
                    t["role"]
                ));
            }
        }
        for r in roles {
            let Some(i) = r["integrity"].as_object() else { continue };
            out.push_str(&format!(
                "      checksums of {}: {} blocks verified, {} wrong ({} reports, {} sectors healed){}\n",
                r["member"].as_str().unwrap_or("-"),
                i["verified_blocks"],
                i["corrupt_blocks"],
                i["reports"],
                i["healed_sectors"],
                match i["untrusted_bytes"].as_u64() {
                    Some(n) if n > 0 => format!(", {} untrusted until read", human_bytes(n)),
                    _ => String::new(),
                }
            ));
        }
        for l in e["links"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "      link {}: {}{}{} ({} lost, {} reconnects, {} timeouts, {} retries)\n",
                l["member"].as_str()?,
                l["state"].as_str()?,
                l["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default(),
                l["framing"].as_str().map(|f| format!(", {f} framing")).unwrap_or_default(),
                l["disconnects"],
                l["reconnects"],
                l["timeouts"],
                l["retries"]
            ));
        }
        if let Some(last) = e["last_check"].as_object() {
            out.push_str(&format!("      last {}: mismatch_cnt {}\n", last["kind"].as_str()?, last["mismatch_cnt"]));
        }
        if let Some(l) = e["parity_log"].as_object() {
            out.push_str(&format!(
                "      partial parity log: {} entries in {} headers, {} flushes to make room\n",
                l["entries_logged"], l["headers_written"], l["drains"]
            ));
        }
        if let Some(j) = e["journal"].as_object() {
            out.push_str(&format!(
                "      write journal: {} units ({} pages) logged, {} of {} bytes in use, {} tail moves\n",
                j["units_written"], j["pages_logged"], j["used_bytes"], j["ring_bytes"], j["tail_moves"]
            ));
        }
        if e["resync_pending"] == json!(true) {
            out.push_str("      resync pending (unclean stop)\n");
        }
    }
    Some(out)
}
