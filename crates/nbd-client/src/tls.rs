//! The client side of `NBD_OPT_STARTTLS` (`nbds://`): X.509 with rustls (the server's
//! certificate must chain to `ca-cert.pem` and name the host; `client-cert.pem` and
//! `client-key.pem` are presented when present), PSK with OpenSSL (rustls has no external
//! PSKs). The files are those libnbd, qemu and nbdkit use.
//!
//! Kernel TLS: an X.509 session over TCP with an AES-GCM suite is handed to the kernel after
//! the handshake when the server's probe finds it available (`nbd_server::kernel_tls`), so a
//! member's payloads are encrypted and decrypted by the socket, not copied through rustls.
//! Reads go through `ktls::KtlsStream`, which skips the session tickets a TLS 1.3 server
//! sends after the handshake and ends the stream at its close_notify. A hand-over the kernel
//! refuses fails that connection (the caller connects again, in user space: the refusal turns
//! kernel TLS off for the process). A record `KtlsStream` does not handle (a server's
//! ChangeCipherSpec after the handshake) panics the connection's reader task: its requests
//! then time out and the member reconnects, like a member that stops answering.

use std::pin::Pin;
use std::sync::Arc;

use openssl::ssl::{SslConnector, SslMethod, SslVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::address::{TlsCredentialFiles, TlsSettings};
use crate::error::{ClientError, Result};

/// A byte stream after the TLS handshake.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// How a connection's bytes are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plaintext (`nbd://`).
    None,
    /// TLS in user space (rustls or OpenSSL).
    User,
    /// TLS in the kernel (kTLS): the socket encrypts and decrypts.
    Kernel,
}

impl TlsMode {
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::None => "none",
            TlsMode::User => "user space",
            TlsMode::Kernel => "kernel",
        }
    }
}

/// A connected socket a session can start on.
pub(crate) trait Socket: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// The TCP socket itself, for the kernel to take the TLS session.
    fn into_tcp(self) -> std::result::Result<TcpStream, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

impl Socket for TcpStream {
    fn into_tcp(self) -> std::result::Result<TcpStream, Self> {
        Ok(self)
    }
}

impl Socket for UnixStream {}

/// Runs the TLS handshake on `stream` (after the server accepted STARTTLS); says whether the
/// kernel took the session.
pub(crate) async fn connect<S: Socket>(
    settings: &TlsSettings,
    stream: S,
    address: &str,
) -> Result<(Box<dyn Stream>, TlsMode)> {
    let tls = |what: String| ClientError::Tls { address: address.to_string(), what };
    match &settings.credentials {
        TlsCredentialFiles::Certificates(dir) => {
            let ca = dir.join("ca-cert.pem");
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(&ca).map_err(|e| tls(format!("{}: {e}", ca.display())))?;
            for cert in certs {
                let cert = cert.map_err(|e| tls(format!("{}: {e}", ca.display())))?;
                roots.add(cert).map_err(|e| tls(format!("{}: {e}", ca.display())))?;
            }
            if roots.is_empty() {
                return Err(tls(format!("{}: no CA certificate", ca.display())));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| tls(e.to_string()))?
                .with_root_certificates(roots);
            let (cert_path, key_path) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
            let mut config = if cert_path.exists() {
                let chain = CertificateDer::pem_file_iter(&cert_path)
                    .and_then(|c| c.collect::<std::result::Result<Vec<_>, _>>())
                    .map_err(|e| tls(format!("{}: {e}", cert_path.display())))?;
                let key = nbd_server::tls_files::load_private_key(&key_path).map_err(|e| tls(e.to_string()))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| tls(e.to_string()))?
            } else {
                builder.with_no_client_auth()
            };
            // The session's keys may go to the kernel (kTLS) after the handshake.
            config.enable_secret_extraction = true;
            let name = ServerName::try_from(settings.hostname.clone())
                .map_err(|e| tls(format!("server name {:?}: {e}", settings.hostname)))?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let handshake = |e: std::io::Error| tls(format!("handshake: {e}"));
            let socket: Box<dyn Stream> = match stream.into_tcp() {
                Ok(tcp) if nbd_server::kernel_tls::available() => {
                    let session = connector.connect(name, ktls::CorkStream::new(tcp)).await.map_err(handshake)?;
                    if !nbd_server::kernel_tls::suits(session.get_ref().1.negotiated_cipher_suite()) {
                        return Ok((Box::new(session), TlsMode::User));
                    }
                    return match ktls::config_ktls_client(session).await {
                        Ok(kernel) => Ok((Box::new(kernel), TlsMode::Kernel)),
                        Err(e) => {
                            nbd_server::kernel_tls::disable(&e);
                            Err(tls(format!("kernel TLS hand-over: {e}")))
                        }
                    };
                }
                Ok(tcp) => Box::new(tcp),
                Err(other) => Box::new(other),
            };
            Ok((Box::new(connector.connect(name, socket).await.map_err(handshake)?), TlsMode::User))
        }
        TlsCredentialFiles::Psk { file, username } => {
            let keys = nbd_server::tls_files::read_psk_file(file).map_err(|e| tls(e.to_string()))?;
            let key = keys
                .get(username)
                .cloned()
                .ok_or_else(|| tls(format!("{}: no key for identity {username:?}", file.display())))?;
            let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(|e| tls(e.to_string()))?;
            builder.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(|e| tls(e.to_string()))?;
            builder
                .set_cipher_list("ECDHE-PSK-AES256-CBC-SHA384:ECDHE-PSK-AES128-CBC-SHA256:DHE-PSK-AES256-GCM-SHA384:DHE-PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256")
                .map_err(|e| tls(e.to_string()))?;
            let identity = username.clone();
            builder.set_psk_client_callback(move |_, _hint, identity_out, key_out| {
                let id = identity.as_bytes();
                // OpenSSL wants the identity NUL-terminated.
                if id.len() >= identity_out.len() || key.len() > key_out.len() {
                    return Ok(0);
                }
                identity_out[..id.len()].copy_from_slice(id);
                identity_out[id.len()] = 0;
                key_out[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
            let connector = builder.build();
            let mut config = connector.configure().map_err(|e| tls(e.to_string()))?;
            // A PSK proves the server: there is no certificate to check.
            config.set_verify_hostname(false);
            config.set_verify(openssl::ssl::SslVerifyMode::NONE);
            let ssl = config.into_ssl(&settings.hostname).map_err(|e| tls(e.to_string()))?;
            let mut stream = tokio_openssl::SslStream::new(ssl, stream).map_err(|e| tls(e.to_string()))?;
            Pin::new(&mut stream).connect().await.map_err(|e| tls(format!("handshake: {e}")))?;
            Ok((Box::new(stream), TlsMode::User))
        }
    }
}
