//! TLS at the byte level: every reply before STARTTLS in each mode, the TLS handshake with
//! a rustls client, the reset of negotiated state across STARTTLS, per-export rules, and the
//! address allow list. Credentials come from `tests/make-pki.sh` (certtool, psktool).
//! Real GnuTLS clients (nbdinfo, qemu, libnbd, the kernel's nbd-client) are tested against
//! the raidnbd binary in the workspace's `tests/tls.rs` and the VM rig.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nbd_server::protocol::consts::{cmd, errno, opt, rep};
use nbd_server::{AddressRange, Export, MemoryDevice, ServerConfig, Tls, TlsCredentials};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::raw::{Raw, go_data, meta_query};
use crate::util::{ServerHandle, require_tool};

/// Fresh credentials in a temporary directory (see make-pki.sh for the layout).
pub fn make_pki() -> tempfile::TempDir {
    require_tool("certtool", "gnutls-bin");
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/make-pki.sh");
    crate::util::run_ok(std::process::Command::new(script).arg(dir.path()));
    dir
}

fn exports() -> Vec<Export> {
    vec![
        Export::new("mem", Arc::new(MemoryDevice::new(1 << 20))),
        Export::new("secret", Arc::new(MemoryDevice::new(2 << 20))).require_tls(true),
        Export::new("mine", Arc::new(MemoryDevice::new(3 << 20))).tls_peers(vec!["client1.test".into()]),
        Export::new("theirs", Arc::new(MemoryDevice::new(4 << 20))).tls_peers(vec!["client2.test".into()]),
    ]
}

fn config() -> ServerConfig {
    ServerConfig { handshake_timeout: Duration::from_secs(5), ..ServerConfig::default() }
}

async fn server(pki: &Path, require: bool, verify_peer: bool) -> ServerHandle {
    let credentials = TlsCredentials::from_certificates_dir(&pki.join("pki"), verify_peer).expect("credentials");
    ServerHandle::start_with_tls(exports(), config(), Some(Tls { require, credentials })).await
}

/// A rustls client that trusts `dir/ca-cert.pem` and shows `dir/client-cert.pem` if `with_cert`.
fn connector(dir: &Path, with_cert: bool) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca-cert.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if with_cert {
        let chain = CertificateDer::pem_file_iter(dir.join("client-cert.pem")).unwrap().map(|c| c.unwrap()).collect();
        // Through OpenSSL, as the server does: ring refuses some of certtool's ECDSA keys.
        let pem = std::fs::read(dir.join("client-key.pem")).unwrap();
        let pkcs8 = openssl::pkey::PKey::private_key_from_pem(&pem).unwrap().private_key_to_pkcs8().unwrap();
        let key = PrivateKeyDer::Pkcs8(pkcs8.into());
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// STARTTLS, ACK, then the TLS handshake.
async fn start_tls(
    mut c: Raw<TcpStream>,
    connector: &tokio_rustls::TlsConnector,
) -> std::io::Result<Raw<TlsStream<TcpStream>>> {
    c.option(opt::STARTTLS, &[]).await;
    assert_eq!(c.option_reply().await, (opt::STARTTLS, rep::ACK, vec![]));
    let stream = connector.connect(ServerName::try_from("localhost").unwrap(), c.stream).await?;
    Ok(Raw { stream })
}

/// GO for `name`: the final reply type (ACK when the export was entered).
async fn go_reply<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(c: &mut Raw<S>, name: &str) -> u32 {
    c.option(opt::GO, &go_data(name, &[])).await;
    c.option_replies().await.last().unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_refuses_everything_before_starttls_but_abort() {
    let pki = make_pki();
    let server = server(pki.path(), true, false).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    for (code, data) in [
        (opt::LIST, vec![]),
        (opt::STRUCTURED_REPLY, vec![]),
        (opt::INFO, go_data("mem", &[])),
        (opt::GO, go_data("mem", &[])),
        (opt::SET_META_CONTEXT, meta_query("mem", &["base:allocation"])),
        (opt::LIST_META_CONTEXT, meta_query("mem", &[])),
        (opt::EXTENDED_HEADERS, vec![]),
        (0x0765_4321, b"unknown".to_vec()),
    ] {
        c.option(code, &data).await;
        let (option, reply, _) = c.option_reply().await;
        assert_eq!((option, reply), (code, rep::ERR_TLS_REQD), "option {code}");
    }
    // STARTTLS with data is still malformed.
    c.option(opt::STARTTLS, b"x").await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    // ABORT is answered.
    c.option(opt::ABORT, &[]).await;
    assert_eq!(c.option_reply().await, (opt::ABORT, rep::ACK, vec![]));
    c.expect_closed().await;

    // EXPORT_NAME before STARTTLS closes the connection (it has no way to report an error).
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    c.option(opt::EXPORT_NAME, b"mem").await;
    c.expect_closed().await;

    // After STARTTLS: a second STARTTLS is invalid; then the export is served.
    let c = Raw::connect(&server).await;
    let mut c = Raw { stream: c.stream };
    c.start(3).await;
    let mut c = start_tls(c, &connector(&pki.path().join("pki"), false)).await.expect("TLS handshake");
    c.option(opt::STARTTLS, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::LIST, &[]).await;
    assert_eq!(c.option_replies().await.len(), 5, "4 exports + ACK");
    assert_eq!(go_reply(&mut c, "mem").await, rep::ACK);
    assert_eq!(c.read_ok(0, 4096).await, vec![0u8; 4096]);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_negotiated_before_starttls_survives_it() {
    let pki = make_pki();
    let server = server(pki.path(), false, false).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    // Plaintext is allowed (TLS only offered) for exports that do not require it.
    c.option(opt::STRUCTURED_REPLY, &[]).await;
    assert_eq!(c.option_reply().await.1, rep::ACK);
    c.option(opt::SET_META_CONTEXT, &meta_query("mem", &["base:allocation"])).await;
    let replies = c.option_replies().await;
    assert_eq!(replies[0].1, rep::META_CONTEXT, "{replies:?}");
    // The export that requires TLS is refused without it.
    c.option(opt::INFO, &go_data("secret", &[])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_TLS_REQD);
    let mut c = start_tls(c, &connector(&pki.path().join("pki"), false)).await.expect("TLS handshake");
    // Structured replies were forgotten: meta contexts need them again, and asking again is
    // not "already negotiated".
    c.option(opt::SET_META_CONTEXT, &meta_query("mem", &["base:allocation"])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_INVALID);
    c.option(opt::GO, &go_data("secret", &[])).await;
    assert_eq!(c.option_replies().await.last().unwrap().1, rep::ACK, "secret is served over TLS");
    // Simple replies (no structured replies negotiated after TLS), and no meta context: a
    // BLOCK_STATUS is refused.
    c.request(0, cmd::BLOCK_STATUS, 7, 0, 4096, &[]).await;
    let (error, cookie, _) = c.simple_reply(0).await;
    assert_eq!((error, cookie), (errno::EINVAL, 7));
    assert_eq!(c.read_ok(0, 512).await.len(), 512);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_sent_after_starttls_before_the_handshake_close_the_connection() {
    let pki = make_pki();
    let server = server(pki.path(), true, false).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    // STARTTLS and, in the same write, a plaintext option that would be smuggled past the upgrade.
    let mut two = Vec::new();
    for code in [opt::STARTTLS, opt::LIST] {
        two.extend_from_slice(&nbd_server::protocol::consts::IHAVEOPT.to_be_bytes());
        two.extend_from_slice(&code.to_be_bytes());
        two.extend_from_slice(&0u32.to_be_bytes());
    }
    c.send(&two).await;
    assert_eq!(c.option_reply().await.1, rep::ACK);
    c.expect_closed().await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_verified_and_name_the_exports_open_to_them() {
    let pki = make_pki();
    let server = server(pki.path(), true, true).await;
    // Our client certificate: the exports open to client1.test and to everyone; not theirs.
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    let mut c = start_tls(c, &connector(&pki.path().join("pki"), true)).await.expect("TLS handshake");
    c.option(opt::INFO, &go_data("theirs", &[])).await;
    assert_eq!(c.option_reply().await.1, rep::ERR_POLICY);
    c.option(opt::INFO, &go_data("mem", &[])).await;
    assert_eq!(c.option_replies().await.last().unwrap().1, rep::ACK);
    assert_eq!(go_reply(&mut c, "mine").await, rep::ACK);
    assert_eq!(c.read_ok(0, 512).await.len(), 512);

    // No client certificate, or one from another CA: the TLS handshake fails.
    for (dir, with_cert) in [("pki", false), ("foreign-client", true)] {
        let mut c = Raw::connect(&server).await;
        c.start(3).await;
        let tls = start_tls(c, &connector(&pki.path().join(dir), with_cert)).await;
        match tls {
            Err(_) => {}
            // TLS 1.3: the client may finish before the server rejects its certificate; the
            // first read then fails.
            Ok(mut c) => {
                c.option(opt::LIST, &[]).await;
                let mut buf = [0u8; 1];
                let read = tokio::io::AsyncReadExt::read(&mut c.stream, &mut buf).await;
                assert!(matches!(read, Ok(0) | Err(_)), "{dir}: served without a valid client certificate");
            }
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_trusts_another_ca_refuses_the_server() {
    let pki = make_pki();
    let server = server(pki.path(), true, false).await;
    let mut c = Raw::connect(&server).await;
    c.start(3).await;
    let err = start_tls(c, &connector(&pki.path().join("foreign-ca"), false)).await.err().expect("handshake fails");
    assert!(err.to_string().contains("certificate"), "{err}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_that_cannot_be_loaded_are_clear_errors() {
    let pki = make_pki();
    let empty = tempfile::tempdir().unwrap();
    let e = TlsCredentials::from_certificates_dir(empty.path(), false).unwrap_err().to_string();
    assert!(e.contains("server-cert.pem"), "{e}");
    // foreign-ca has no server certificate; pki with verify_peer needs ca-cert.pem (present).
    assert!(TlsCredentials::from_certificates_dir(&pki.path().join("foreign-ca"), false).is_err());
    assert!(TlsCredentials::from_certificates_dir(&pki.path().join("pki"), true).is_ok());
    std::fs::write(empty.path().join("bad.psk"), "alice:nothex\n").unwrap();
    let e = TlsCredentials::from_psk_file(&empty.path().join("bad.psk")).unwrap_err().to_string();
    assert!(e.contains("line 1"), "{e}");
    assert!(TlsCredentials::from_psk_file(&pki.path().join("keys.psk")).is_ok());
    // TLS rules on exports of a server without TLS.
    let export = Export::new("x", Arc::new(MemoryDevice::new(4096))).require_tls(true);
    assert!(nbd_server::Server::new(vec![export], config()).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_outside_the_allowed_addresses_are_closed_at_accept() {
    let range = |s: &str| s.parse::<AddressRange>().unwrap();
    let refused = ServerConfig { allowed_addresses: vec![range("10.0.0.0/8"), range("::1")], ..config() };
    let server = ServerHandle::start(exports_plain(), refused).await;
    let mut c = Raw::connect(&server).await;
    c.expect_closed().await;
    server.stop().await.unwrap();

    let allowed = ServerConfig { allowed_addresses: vec![range("10.0.0.0/8"), range("127.0.0.0/8")], ..config() };
    let server = ServerHandle::start(exports_plain(), allowed).await;
    let mut c = Raw::connect(&server).await;
    assert_eq!(c.go("mem", false, None).await.0, 1 << 20);
    server.stop().await.unwrap();
}

fn exports_plain() -> Vec<Export> {
    vec![Export::new("mem", Arc::new(MemoryDevice::new(1 << 20)))]
}
