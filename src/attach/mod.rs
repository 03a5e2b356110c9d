//! `raidnbd attach`: the kernel's NBD client, made to ride through a restart of the server.
//!
//! Debian 12's nbd-client hands the sockets to the kernel and exits, with no dead-connection
//! timeout, so a restart of the server fails every request in the gap with EIO (a mounted
//! filesystem goes read-only). This command negotiates the connections itself (simple
//! replies, what the driver speaks), attaches them over netlink with a request timeout and a
//! dead-connection timeout, then stays, listening for the driver's link-dead events: for each
//! dead connection it connects again (backing off, 100 ms to 2 s) and hands the new socket to
//! the driver (`NBD_CMD_RECONFIGURE`). Meanwhile the driver holds the I/O: requests sent on a
//! dead connection are requeued when their request timeout expires, new ones wait up to the
//! dead-connection timeout for a live connection. A server that comes back with a different
//! export size is not reattached. SIGTERM or SIGINT detach the device and exit.

mod nbd_family;
mod netlink;

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use nbd_client::{ExportAddress, ExportDetails, handoff};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::{info, warn};

use crate::duration::parse_duration;
use crate::shutdown::Shutdown;
use nbd_family::{DeviceSetup, NbdFamily};
use netlink::GenlSocket;

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The export: `nbd://HOST[:PORT]/NAME` or `nbd+unix:///NAME?socket=PATH` (plaintext: the
    /// kernel's driver cannot speak TLS).
    pub export: String,
    /// The kernel device: /dev/nbd0, nbd0 or 0 (`modprobe nbd` first).
    pub device: String,
    /// Connections to open (more than one needs a server with multi-conn; raidnbd has it).
    /// Default: the URI's ?connections=, else 1.
    #[arg(short = 'C', long)]
    pub connections: Option<u32>,
    /// Logical block size of the device (512, 1024, 2048 or 4096).
    #[arg(short = 'b', long, default_value_t = 4096)]
    pub block_size: u32,
    /// A request unanswered this long is sent again, on a new connection (10s, 1m, ...).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// How long I/O waits for the server to come back (a restart) before it fails.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub dead_conn_timeout: Duration,
    /// Each connection attempt (connect and handshake) must finish within this.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
}

/// The device's number in `/dev/nbdN`, `nbdN` or `N`.
fn device_index(device: &str) -> anyhow::Result<u32> {
    let name = device.strip_prefix("/dev/").unwrap_or(device);
    let digits = name.strip_prefix("nbd").unwrap_or(name);
    digits.parse().with_context(|| format!("{device:?} is not an NBD device (expected /dev/nbdN)"))
}

pub async fn run(args: AttachArgs) -> anyhow::Result<()> {
    let address = ExportAddress::parse(&args.export)?;
    if address.tls.is_some() {
        bail!("{address}: the kernel's NBD driver cannot speak TLS: attach a plaintext nbd:// or nbd+unix:// address");
    }
    let index = device_index(&args.device)?;
    let connections = args.connections.unwrap_or(address.connections);
    if !(1..=nbd_client::MAX_CONNECTIONS).contains(&connections) {
        bail!("--connections must be 1 to {}", nbd_client::MAX_CONNECTIONS);
    }
    if !(512..=4096).contains(&args.block_size) || !args.block_size.is_power_of_two() {
        bail!("--block-size must be 512, 1024, 2048 or 4096 (the kernel's limits)");
    }
    if args.dead_conn_timeout.as_secs() == 0 {
        bail!("--dead-conn-timeout must be at least 1s (the driver counts whole seconds)");
    }
    let shutdown = Shutdown::install()?;
    let events = GenlSocket::open(true).context("cannot open a generic netlink socket")?;
    let mut family = NbdFamily::open(&events).context("cannot reach the kernel's NBD driver")?;

    let mut sockets: Vec<OwnedFd> = Vec::new();
    let mut details: Option<ExportDetails> = None;
    for _ in 0..connections {
        let h = handoff(&address, args.connect_timeout).await?;
        check_export(&h.details, details.as_ref(), connections, args.block_size)?;
        details = Some(h.details);
        sockets.push(h.socket);
    }
    let details = details.expect("at least one connection");
    let setup = DeviceSetup {
        index,
        size_bytes: details.size_bytes,
        block_size_bytes: args.block_size.into(),
        server_flags: details.transmission_flags.into(),
        request_timeout: args.request_timeout,
        dead_conn_timeout: args.dead_conn_timeout,
    };
    family.connect(&setup, &sockets).map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => anyhow::anyhow!("/dev/nbd{index} is in use (detach it first: nbd-client -d)"),
        _ => anyhow::Error::new(e).context(format!("the kernel refused to attach /dev/nbd{index}")),
    })?;
    // The driver holds its own references to the sockets.
    drop(sockets);
    info!(
        device = %format!("/dev/nbd{index}"),
        export = %address,
        size_bytes = details.size_bytes,
        connections,
        request_timeout = ?args.request_timeout,
        dead_conn_timeout = ?args.dead_conn_timeout,
        "attached; reconnecting any connection that dies"
    );
    crate::notify::ready(&format!("/dev/nbd{index} attached to {address}"));

    // SAFETY: the AsyncFd owns the GenlSocket, whose OwnedFd stays open and is the same
    // descriptor until the AsyncFd drops it.
    let events = unsafe { AsyncFd::register_with_interest(events, Interest::READABLE) }
        .map_err(std::io::Error::from)
        .context("cannot watch the netlink socket")?;
    loop {
        let dead = tokio::select! {
            _ = shutdown.stop.cancelled() => break,
            dead = dead_links(&events, &family, index, connections) => dead?,
        };
        for _ in 0..dead {
            tokio::select! {
                _ = shutdown.stop.cancelled() => break,
                replaced = replace_connection(&address, &args, &details, &mut family, index) => replaced?,
            }
        }
    }
    crate::notify::stopping();
    family.disconnect(index).with_context(|| format!("cannot detach /dev/nbd{index}"))?;
    info!(device = %format!("/dev/nbd{index}"), "detached");
    Ok(())
}

/// Refuses an export the device cannot use, or one that differs from the first connection's.
fn check_export(
    details: &ExportDetails,
    first: Option<&ExportDetails>,
    connections: u32,
    block_size: u32,
) -> anyhow::Result<()> {
    if connections > 1 && !details.can_multi_conn() {
        bail!("the server does not offer multi-conn: attach with --connections 1");
    }
    if details.min_block_bytes > block_size {
        bail!("the export needs blocks of at least {} bytes: raise --block-size", details.min_block_bytes);
    }
    if let Some(first) = first
        && (first.size_bytes != details.size_bytes || first.transmission_flags != details.transmission_flags)
    {
        bail!(
            "the export changed between connections: {} bytes, flags {:#x}, then {} bytes, flags {:#x}",
            first.size_bytes,
            first.transmission_flags,
            details.size_bytes,
            details.transmission_flags
        );
    }
    Ok(())
}

/// Waits for link-dead events and returns how many of device `index`'s connections died
/// (all of them when the kernel dropped events for a full socket buffer).
async fn dead_links(
    events: &AsyncFd<GenlSocket>,
    family: &NbdFamily,
    index: u32,
    connections: u32,
) -> anyhow::Result<u32> {
    loop {
        let mut ready = events.readable().await?;
        match ready.try_io(|fd| fd.get_ref().receive()) {
            Ok(Ok(messages)) => {
                let dead = messages.iter().filter(|m| family.link_dead(m) == Some(index)).count() as u32;
                if dead > 0 {
                    warn!(device = %format!("/dev/nbd{index}"), dead, "connection to the server lost; reconnecting");
                    return Ok(dead);
                }
            }
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                warn!("netlink events were dropped; replacing every connection that is dead");
                return Ok(connections);
            }
            Ok(Err(e)) => return Err(anyhow::Error::new(e).context("reading netlink events")),
            Err(_would_block) => continue,
        }
    }
}

/// Connects again until it succeeds and gives the socket to the driver.
async fn replace_connection(
    address: &ExportAddress,
    args: &AttachArgs,
    attached: &ExportDetails,
    family: &mut NbdFamily,
    index: u32,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match handoff(address, args.connect_timeout).await {
            Ok(h) if h.details.size_bytes == attached.size_bytes => {
                family
                    .reconfigure(index, &h.socket)
                    .with_context(|| format!("the kernel refused a new connection for /dev/nbd{index}"))?;
                info!(
                    device = %format!("/dev/nbd{index}"),
                    attempts,
                    after = ?started.elapsed(),
                    "connection replaced"
                );
                return Ok(());
            }
            Ok(h) => warn!(
                was = attached.size_bytes,
                now = h.details.size_bytes,
                "the export's size changed: not reattaching it (retrying, in case the server is the wrong one)"
            ),
            Err(e) if attempts == 1 || attempts.is_power_of_two() => {
                warn!(attempts, error = %e, "cannot reconnect yet; retrying")
            }
            Err(_) => {}
        }
        if started.elapsed() > args.dead_conn_timeout {
            warn!(
                device = %format!("/dev/nbd{index}"),
                "the server has been away longer than --dead-conn-timeout: the kernel fails the waiting I/O; still retrying"
            );
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::device_index;

    #[test]
    fn device_names_give_their_index() {
        assert_eq!(device_index("/dev/nbd0").unwrap(), 0);
        assert_eq!(device_index("nbd12").unwrap(), 12);
        assert_eq!(device_index("3").unwrap(), 3);
        assert!(device_index("/dev/sda").is_err());
    }
}
