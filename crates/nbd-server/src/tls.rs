//! TLS after `NBD_OPT_STARTTLS`: the credentials a server offers and the stream they make.
//!
//! Two kinds of credentials, with the file layouts nbdkit, qemu and nbd-server use:
//! - X.509 ([`TlsCredentials::from_certificates_dir`]): `server-cert.pem` (the chain),
//!   `server-key.pem`, and `ca-cert.pem` when client certificates are verified. Served with
//!   rustls.
//! - PSK ([`TlsCredentials::from_psk_file`]): psktool's `identity:hexkey` lines, as qemu's
//!   `tls-creds-psk` and libnbd's `tls-psk-file` read them. rustls has no external PSKs, so
//!   these are served with OpenSSL's PSK callback (TLS 1.3 and 1.2 PSK suites).
//!
//! On TCP, an X.509 session is handed to the kernel after the handshake when the kernel
//! can take it (`kernel_tls`), and the connection continues as a plain TCP stream.
//!
//! What a connection proved about its peer ([`PeerIdentity`]) is kept for per-export access
//! rules: the DNS names of a verified client certificate, or the PSK identity.
//!
//! The handshake's own time is bounded by the caller (the NBD handshake deadline).

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use openssl::ssl::{SslAcceptor, SslMethod, SslVersion};
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::error::{Error, Result};

/// Longest PSK accepted, in bytes (psktool makes 32; OpenSSL's buffer is 256).
const MAX_PSK_BYTES: usize = 256;

/// TLS as a server offers it: the credentials, and whether clients must use them.
#[derive(Clone)]
pub struct Tls {
    /// Every option before STARTTLS but ABORT is refused with `ERR_TLS_REQD` (the spec's
    /// FORCEDTLS). Otherwise TLS is offered (SELECTIVETLS): only exports that
    /// [require](crate::Export::require_tls) it need it.
    pub require: bool,
    pub credentials: TlsCredentials,
}

/// Server credentials for the TLS handshake. Cheap to clone.
#[derive(Clone)]
pub struct TlsCredentials {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    X509 { acceptor: tokio_rustls::TlsAcceptor, verifies_peer: bool },
    Psk(Arc<SslAcceptor>),
}

impl std::fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::X509 { verifies_peer, .. } => write!(f, "X.509 (verify peer: {verifies_peer})"),
            Kind::Psk(_) => f.write_str("PSK"),
        }
    }
}

fn config_error(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {what}", path.display()))
}

impl TlsCredentials {
    /// Loads `server-cert.pem` and `server-key.pem` from `dir`; with `verify_peer`, clients
    /// must present a certificate that chains to `ca-cert.pem` there.
    pub fn from_certificates_dir(dir: &Path, verify_peer: bool) -> Result<Self> {
        let cert_path = dir.join("server-cert.pem");
        let key_path = dir.join("server-key.pem");
        let chain = CertificateDer::pem_file_iter(&cert_path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| config_error(&cert_path, e))?;
        if chain.is_empty() {
            return Err(config_error(&cert_path, "no certificate in the file"));
        }
        let key = load_private_key(&key_path)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?;
        let builder = if verify_peer {
            let ca_path = dir.join("ca-cert.pem");
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&ca_path).map_err(|e| config_error(&ca_path, e))? {
                roots.add(cert.map_err(|e| config_error(&ca_path, e))?).map_err(|e| config_error(&ca_path, e))?;
            }
            if roots.is_empty() {
                return Err(config_error(&ca_path, "no CA certificate in the file"));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| config_error(&ca_path, e))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| config_error(&key_path, e))?;
        // For the hand-over to kernel TLS; no session tickets (nothing resumes sessions, and
        // none may be in flight at the hand-over).
        config.enable_secret_extraction = true;
        config.send_tls13_tickets = 0;
        Ok(Self {
            kind: Kind::X509 {
                acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
                verifies_peer: verify_peer,
            },
        })
    }

    /// Loads pre-shared keys from psktool's format: one `identity:hexkey` per line.
    pub fn from_psk_file(path: &Path) -> Result<Self> {
        let keys = read_psk_file(path)?;
        let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| Error::Config(format!("TLS (OpenSSL): {e}")))?;
        builder.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(|e| Error::Config(format!("TLS: {e}")))?;
        // TLS 1.2 PSK suites (TLS 1.3 uses the same callback with its default suites).
        builder
            .set_cipher_list("ECDHE-PSK-AES256-CBC-SHA384:ECDHE-PSK-AES128-CBC-SHA256:DHE-PSK-AES256-GCM-SHA384:DHE-PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256")
            .map_err(|e| Error::Config(format!("TLS: {e}")))?;
        builder.set_psk_server_callback(move |ssl, identity, out| {
            let key = identity.and_then(|id| std::str::from_utf8(id).ok()).and_then(|id| keys.get(id));
            match key {
                Some(key) if key.len() <= out.len() => {
                    out[..key.len()].copy_from_slice(key);
                    // Kept for per-export access rules (read back in `accept`).
                    ssl.set_ex_data(
                        psk_identity_index(),
                        PskIdentity(String::from_utf8_lossy(identity.unwrap_or_default()).into_owned()),
                    );
                    Ok(key.len())
                }
                // 0: no such identity; the handshake fails.
                _ => Ok(0),
            }
        });
        Ok(Self { kind: Kind::Psk(Arc::new(builder.build())) })
    }

    /// Runs the server side of the TLS handshake on `stream`.
    pub(crate) async fn accept<S>(&self, stream: S) -> Result<(TlsStream<S>, PeerIdentity)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let handshake = |e: &dyn std::fmt::Display| Error::Tls(e.to_string());
        match &self.kind {
            Kind::X509 { acceptor, verifies_peer } => {
                let tls = acceptor.accept(stream).await.map_err(|e| handshake(&e))?;
                let peer = PeerIdentity::of_rustls(tls.get_ref().1, *verifies_peer);
                Ok((TlsStream::Rustls(Box::new(tls)), peer))
            }
            Kind::Psk(acceptor) => {
                let ssl = openssl::ssl::Ssl::new(acceptor.context()).map_err(|e| handshake(&e))?;
                let mut tls = tokio_openssl::SslStream::new(ssl, stream).map_err(|e| handshake(&e))?;
                Pin::new(&mut tls).accept().await.map_err(|e| handshake(&e))?;
                let identity = tls.ssl().ex_data(psk_identity_index()).map(|id| id.0.clone());
                Ok((TlsStream::Openssl(Box::new(tls)), PeerIdentity::Psk(identity)))
            }
        }
    }
}

/// Reads a PEM private key of any kind OpenSSL reads, as PKCS#8 for rustls. (Read through
/// OpenSSL because ring refuses the ECDSA keys certtool writes: GnuTLS pads the SEC1 scalar
/// with a leading zero byte when its top bit is set.)
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path).map_err(|e| config_error(path, e))?;
    let pkcs8 = openssl::pkey::PKey::private_key_from_pem(&pem)
        .and_then(|key| key.private_key_to_pkcs8())
        .map_err(|e| config_error(path, format!("not a usable PEM private key: {e}")))?;
    Ok(PrivateKeyDer::Pkcs8(pkcs8.into()))
}

/// A TLS session on a TCP socket: in the kernel (the socket now carries plaintext for us,
/// `plaintext` being what rustls had already decrypted), or in user space.
pub(crate) enum TcpSession {
    Kernel { tcp: TcpStream, plaintext: Vec<u8> },
    User(TlsStream<ktls::CorkStream<TcpStream>>),
}

impl TlsCredentials {
    /// Whether [`accept_tcp`](Self::accept_tcp) may hand sessions to the kernel.
    pub(crate) fn may_use_kernel_tls(&self) -> bool {
        matches!(self.kind, Kind::X509 { .. }) && crate::kernel_tls::available()
    }

    /// The TLS handshake on a TCP socket, then the hand-over to the kernel when the session's
    /// cipher suits it. Only when [`may_use_kernel_tls`](Self::may_use_kernel_tls).
    pub(crate) async fn accept_tcp(&self, tcp: TcpStream) -> Result<(TcpSession, PeerIdentity)> {
        let Kind::X509 { acceptor, verifies_peer } = &self.kind else {
            unreachable!("kernel TLS is offered for X.509 only")
        };
        let tls = acceptor.accept(ktls::CorkStream::new(tcp)).await.map_err(|e| Error::Tls(e.to_string()))?;
        let (_, connection) = tls.get_ref();
        let peer = PeerIdentity::of_rustls(connection, *verifies_peer);
        if !crate::kernel_tls::suits(connection.negotiated_cipher_suite()) {
            return Ok((TcpSession::User(TlsStream::Rustls(Box::new(tls))), peer));
        }
        match ktls::config_ktls_server(tls).await {
            Ok(kernel) => {
                let (plaintext, tcp) = kernel.into_raw();
                Ok((TcpSession::Kernel { tcp, plaintext: plaintext.unwrap_or_default() }, peer))
            }
            Err(e) => {
                crate::kernel_tls::disable(&e);
                Err(Error::Tls(format!("kernel TLS hand-over: {e}")))
            }
        }
    }
}

/// Reads a psktool key file: identity → key.
pub fn read_psk_file(path: &Path) -> Result<HashMap<String, Vec<u8>>> {
    let text = std::fs::read_to_string(path).map_err(|e| config_error(path, e))?;
    parse_psk_file(&text).map_err(|e| config_error(path, e))
}

/// Parses psktool's `identity:hexkey` lines (blank lines ignored).
fn parse_psk_file(text: &str) -> std::result::Result<HashMap<String, Vec<u8>>, String> {
    let mut keys = HashMap::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
        if line.is_empty() {
            continue;
        }
        let Some((identity, hex)) = line.rsplit_once(':') else {
            return Err(format!("line {number}: expected identity:hexkey"));
        };
        if identity.is_empty() {
            return Err(format!("line {number}: empty identity"));
        }
        let key = decode_hex(hex).ok_or_else(|| format!("line {number}: the key is not hexadecimal"))?;
        if key.is_empty() || key.len() > MAX_PSK_BYTES {
            return Err(format!("line {number}: the key must be 1 to {MAX_PSK_BYTES} bytes"));
        }
        keys.insert(identity.to_string(), key);
    }
    if keys.is_empty() {
        return Err("no keys in the file".into());
    }
    Ok(keys)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

struct PskIdentity(String);

fn psk_identity_index() -> openssl::ex_data::Index<openssl::ssl::Ssl, PskIdentity> {
    static INDEX: std::sync::OnceLock<openssl::ex_data::Index<openssl::ssl::Ssl, PskIdentity>> =
        std::sync::OnceLock::new();
    *INDEX.get_or_init(|| openssl::ssl::Ssl::new_ex_index().expect("OpenSSL allocates an ex_data index"))
}

/// What the TLS handshake proved about the client.
#[derive(Debug, Clone)]
pub(crate) enum PeerIdentity {
    /// The client's verified end-entity certificate (`None` unless peers are verified).
    Certificate(Option<CertificateDer<'static>>),
    /// The PSK identity the client used.
    Psk(Option<String>),
}

impl PeerIdentity {
    fn of_rustls(connection: &rustls::ServerConnection, verifies_peer: bool) -> Self {
        let certificate = match connection.peer_certificates() {
            Some([end_entity, ..]) if verifies_peer => Some(end_entity.clone().into_owned()),
            _ => None,
        };
        PeerIdentity::Certificate(certificate)
    }

    /// Whether the peer is `name`: a DNS name its verified certificate is valid for, or its
    /// PSK identity.
    pub(crate) fn is(&self, name: &str) -> bool {
        match self {
            PeerIdentity::Certificate(Some(der)) => {
                let (Ok(cert), Ok(name)) = (webpki::EndEntityCert::try_from(der), ServerName::try_from(name)) else {
                    return false;
                };
                cert.verify_is_valid_for_subject_name(&name).is_ok()
            }
            PeerIdentity::Psk(Some(identity)) => identity == name,
            _ => false,
        }
    }
}

/// A server-side TLS stream over `S`, from either library.
pub(crate) enum TlsStream<S> {
    Rustls(Box<tokio_rustls::server::TlsStream<S>>),
    Openssl(Box<tokio_openssl::SslStream<S>>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TlsStream::Rustls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            TlsStream::Openssl(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            TlsStream::Rustls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            TlsStream::Openssl(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            TlsStream::Rustls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            TlsStream::Openssl(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            TlsStream::Rustls(s) => s.is_write_vectored(),
            TlsStream::Openssl(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TlsStream::Rustls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            TlsStream::Openssl(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TlsStream::Rustls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            TlsStream::Openssl(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A user-space TLS session on a TCP socket, split like any other stream, whose read half
/// still tells the socket how much to wait for (`SO_RCVLOWAT`, see `RequestSource`): whole
/// WRITE payloads arrive with few wake-ups, which on loopback is work saved for the client.
pub(crate) struct TcpTls(pub(crate) TlsStream<TcpStream>);

/// Plaintext the TLS library may hold decrypted or half-received: at most a record or two
/// (16 KiB each), with room to spare. A wake threshold is lowered by this much, so it never
/// exceeds the ciphertext still to arrive for the bytes the caller waits for.
const TLS_BUFFERED_MAX_BYTES: usize = 64 * 1024;

/// The read half of a [`TcpTls`], with the socket's descriptor for the wake threshold.
pub(crate) struct TcpTlsReadHalf {
    half: tokio::io::ReadHalf<TlsStream<TcpStream>>,
    fd: std::os::fd::RawFd,
}

impl AsyncRead for TcpTlsReadHalf {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.half).poll_read(cx, buf)
    }
}

impl crate::request_source::RequestSource for TcpTlsReadHalf {
    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()> {
        crate::request_source::set_receive_low_water(self.fd, bytes.saturating_sub(TLS_BUFFERED_MAX_BYTES))
    }
}

impl AsyncRead for TcpTls {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpTls {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl crate::stream::NbdStream for TcpTls {
    type ReadHalf = TcpTlsReadHalf;
    type WriteHalf = tokio::io::WriteHalf<TlsStream<TcpStream>>;
    fn into_halves(self) -> (Self::ReadHalf, Self::WriteHalf) {
        use std::os::fd::AsRawFd;
        let fd = match &self.0 {
            TlsStream::Rustls(s) => s.get_ref().0.as_raw_fd(),
            TlsStream::Openssl(s) => s.get_ref().as_raw_fd(),
        };
        let (half, write) = tokio::io::split(self.0);
        // The descriptor stays open while either half lives (they share the stream).
        (TcpTlsReadHalf { half, fd }, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_parse_as_psktool_writes_them() {
        let keys = parse_psk_file("alice:0123456789abcdef\n\nbob:ff00\n").unwrap();
        assert_eq!(keys["alice"], vec![0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
        assert_eq!(keys["bob"], vec![0xff, 0x00]);
        for bad in ["", "alice", "alice:xyz", "alice:abc", ":00", "alice:"] {
            assert!(parse_psk_file(bad).is_err(), "{bad:?}");
        }
    }
}
