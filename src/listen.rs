//! The sockets `serve` accepts NBD connections on: TCP addresses and Unix socket paths from
//! `--listen` (repeatable), or the sockets systemd (or `systemd-socket-activate`, or libnbd's
//! `nbdinfo [ raidnbd serve ... ]`) passed in by socket activation (LISTEN_PID/LISTEN_FDS,
//! sd_listen_fds(3)); those take the place of `--listen`.

use std::os::fd::{FromRawFd, RawFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tokio::net::{TcpListener, UnixListener};

use crate::cli::ListenAddr;

/// One listening socket.
pub enum Bound {
    Tcp(TcpListener),
    /// `remove` is the path to unlink at shutdown (sockets we bound; not activated ones).
    Unix {
        listener: UnixListener,
        path: PathBuf,
        remove: bool,
    },
}

impl Bound {
    /// What to log and show: "127.0.0.1:10809" or "unix:/run/raidnbd/nbd.sock".
    pub fn describe(&self) -> String {
        match self {
            Bound::Tcp(l) => l.local_addr().map_or_else(|_| "tcp:?".into(), |a| a.to_string()),
            Bound::Unix { path, .. } => format!("unix:{}", path.display()),
        }
    }

    pub fn tcp_port(&self) -> Option<u16> {
        match self {
            Bound::Tcp(l) => l.local_addr().ok().map(|a| a.port()),
            Bound::Unix { .. } => None,
        }
    }
}

/// The activated sockets if there are any, else binds `addrs`.
pub async fn listeners(addrs: &[ListenAddr]) -> Result<(Vec<Bound>, bool)> {
    let activated = activated()?;
    if !activated.is_empty() {
        return Ok((activated, true));
    }
    let mut out = Vec::with_capacity(addrs.len());
    for addr in addrs {
        out.push(bind(addr).await?);
    }
    Ok((out, false))
}

async fn bind(addr: &ListenAddr) -> Result<Bound> {
    match addr {
        ListenAddr::Tcp(a) => {
            Ok(Bound::Tcp(TcpListener::bind(a).await.with_context(|| format!("cannot listen on {a}"))?))
        }
        ListenAddr::Unix(path) => {
            remove_stale_socket(path, "another server answers there")?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let listener =
                UnixListener::bind(path).with_context(|| format!("cannot listen on unix:{}", path.display()))?;
            Ok(Bound::Unix { listener, path: path.clone(), remove: true })
        }
    }
}

/// Makes way for binding a Unix socket at `path`: nothing there is fine; a socket nobody
/// answers on (left by a server that died) is removed; a live socket (`in_use` says whose) or
/// anything that is not a socket is an error, and is left alone.
pub fn remove_stale_socket(path: &Path, in_use: &str) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_socket() {
        bail!("{} exists and is not a socket: not removing it", path.display());
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!("{}: {in_use}", path.display());
    }
    std::fs::remove_file(path).with_context(|| format!("cannot remove stale socket {}", path.display()))
}

/// The sockets passed by socket activation (none when LISTEN_PID is not ours).
fn activated() -> Result<Vec<Bound>> {
    let fds: Vec<RawFd> = sd_notify::listen_fds().context("socket activation (LISTEN_FDS)")?.collect();
    fds.into_iter().map(from_fd).collect()
}

fn from_fd(fd: RawFd) -> Result<Bound> {
    // SAFETY: an all-zero sockaddr_storage is valid; getsockname writes at most `len` bytes.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr` and `len` are valid for writing; a bad fd only makes the call fail.
    let rc = unsafe { libc::getsockname(fd, (&raw mut addr).cast(), &mut len) };
    if rc != 0 {
        bail!("socket activation: fd {fd} is not a socket: {}", std::io::Error::last_os_error());
    }
    match i32::from(addr.ss_family) {
        libc::AF_INET | libc::AF_INET6 => {
            // SAFETY: systemd passed us this listening socket and nothing else owns it.
            let std_listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            std_listener.set_nonblocking(true)?;
            Ok(Bound::Tcp(TcpListener::from_std(std_listener)?))
        }
        libc::AF_UNIX => {
            // SAFETY: as above.
            let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
            std_listener.set_nonblocking(true)?;
            let path = std_listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(format!("fd{fd}")));
            Ok(Bound::Unix { listener: UnixListener::from_std(std_listener)?, path, remove: false })
        }
        family => bail!("socket activation: fd {fd} has address family {family}, not TCP or Unix"),
    }
}
