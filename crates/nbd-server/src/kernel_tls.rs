//! Kernel TLS (kTLS): after the rustls handshake the session keys go to the kernel, which
//! then encrypts and decrypts on the socket itself, so the connection goes on as a plain
//! TCP stream: file ranges sent without a copy through the server, WRITE payloads received into file mappings,
//! exactly as without TLS (the `ktls` crate does the hand-over).
//!
//! Probe with a logged fallback: once per process, a connected loopback TCP socket must
//! accept `TCP_ULP "tls"` and then AES-GCM transmit keys (128 and 256 bits, tried on fresh
//! sockets; the kernel needs its `tls` and `gcm` crypto); without them TLS stays in user
//! space (rustls). Only sessions with a probed AES-GCM suite go to the kernel; others stay
//! in user space. A hand-over the kernel refuses after all loses that connection and turns
//! kTLS off for the process (logged).
//!
//! What the kernel cannot do: TLS 1.3 KeyUpdate from the client, and control records on
//! reads (a client's close_notify ends the connection with an error instead of EOF). Both
//! only end a connection; data is never misread (a non-data record fails the read).
//!
//! The member client (nbd-client) uses the same probe for its connections to `nbds://`
//! members; it reads through `ktls::KtlsStream`, which skips the session tickets a TLS 1.3
//! server sends after the handshake.

use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::{CipherSuite, SupportedCipherSuite};
use tracing::{info, warn};

/// AES-GCM key sizes the kernel takes.
#[derive(Debug, Clone, Copy)]
struct Ciphers {
    aes_128_gcm: bool,
    aes_256_gcm: bool,
}

static PROBED: OnceLock<Option<Ciphers>> = OnceLock::new();
static DISABLED: AtomicBool = AtomicBool::new(false);

fn probed() -> Option<Ciphers> {
    *PROBED.get_or_init(|| match probe() {
        Ok(c) if c.aes_128_gcm || c.aes_256_gcm => {
            info!(
                aes_128_gcm = c.aes_128_gcm,
                aes_256_gcm = c.aes_256_gcm,
                "kernel TLS available: TLS sessions keep copy-free send and in-place receive"
            );
            Some(c)
        }
        Ok(_) => {
            info!("kernel TLS unavailable (the kernel takes no AES-GCM keys): TLS runs in user space (rustls)");
            None
        }
        Err(e) => {
            info!("kernel TLS unavailable ({e}): TLS runs in user space (rustls)");
            None
        }
    })
}

/// Whether sessions may be handed to the kernel (probed once, logged once).
pub fn available() -> bool {
    probed().is_some() && !DISABLED.load(Ordering::Relaxed)
}

/// Whether a session with this cipher suite is handed to the kernel.
pub fn suits(suite: Option<SupportedCipherSuite>) -> bool {
    let Some(c) = probed() else { return false };
    match suite.map(|s| s.suite()) {
        Some(
            CipherSuite::TLS13_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ) => c.aes_128_gcm,
        Some(
            CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ) => c.aes_256_gcm,
        _ => false,
    }
}

/// The kernel refused a hand-over the probe promised: later sessions stay in user space.
pub fn disable(why: &dyn std::fmt::Display) {
    if !DISABLED.swap(true, Ordering::Relaxed) {
        warn!("kernel TLS hand-over failed ({why}): TLS runs in user space from now on");
    }
}

/// Which AES-GCM transmit keys loopback TCP sockets with the `tls` upper-layer protocol take.
fn probe() -> std::io::Result<Ciphers> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let try_cipher = |cipher_type: u16, info_len: usize| -> std::io::Result<bool> {
        let client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let _server = listener.accept()?;
        let fd = client.as_raw_fd();
        // SAFETY: the descriptor is open (borrowed from `client`); the option value is the
        // 3-byte name, passed with its length.
        let r = unsafe { libc::setsockopt(fd, libc::SOL_TCP, libc::TCP_ULP, b"tls".as_ptr().cast(), 3) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Zero keys are fine for a probe: nothing is sent on this socket.
        let mut info = [0u8; 56];
        assert!(info_len <= info.len(), "crypto info of {info_len} bytes");
        info[..2].copy_from_slice(&libc::TLS_1_3_VERSION.to_ne_bytes());
        info[2..4].copy_from_slice(&cipher_type.to_ne_bytes());
        // SAFETY: as above; `info` is a zeroed tls12_crypto_info_aes_gcm_{128,256} of
        // `info_len` bytes (header, then iv, key, salt and record sequence).
        let r = unsafe { libc::setsockopt(fd, libc::SOL_TLS, libc::TLS_TX, info.as_ptr().cast(), info_len as u32) };
        Ok(r == 0)
    };
    Ok(Ciphers {
        aes_128_gcm: try_cipher(
            libc::TLS_CIPHER_AES_GCM_128,
            std::mem::size_of::<libc::tls12_crypto_info_aes_gcm_128>(),
        )?,
        aes_256_gcm: try_cipher(
            libc::TLS_CIPHER_AES_GCM_256,
            std::mem::size_of::<libc::tls12_crypto_info_aes_gcm_256>(),
        )?,
    })
}
