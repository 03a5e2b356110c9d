//! `serve`'s TLS settings: `--tls`, `--tls-certificates`, `--tls-verify-peer`, `--tls-psk`
//! (nbdkit's names) and their config keys, resolved into the server's [`Tls`].
//!
//! Rules: `on`/`require` need exactly one kind of credentials; `--tls-verify-peer` is for
//! certificates only; per-export rules (`tls = "require"`, `tls_peer`) need TLS on.

use anyhow::{Result, bail};
use nbd_server::{Tls, TlsCredentials};

use crate::cli::{ServeArgs, TlsMode};
use crate::config::ConfigFile;

/// The server's TLS from flags over config keys; `None` for plaintext only.
pub fn resolve(args: &ServeArgs, file: &ConfigFile) -> Result<Option<Tls>> {
    let mode = args.tls.or(file.tls()?).unwrap_or_default();
    let certificates = args.tls_certificates.clone().or_else(|| file.tls_certificates.clone());
    let psk = args.tls_psk.clone().or_else(|| file.tls_psk.clone());
    let verify_peer = args.tls_verify_peer || file.tls_verify_peer.unwrap_or(false);
    let per_export_rules = !args.tls_peer.is_empty()
        || file.exports.iter().any(|e| !e.tls_peer.is_empty() || e.tls.as_deref() == Some("require"));
    if mode == TlsMode::Off {
        if verify_peer || per_export_rules {
            bail!("--tls-verify-peer, --tls-peer and per-export tls keys need --tls on or --tls require");
        }
        if certificates.is_some() || psk.is_some() {
            tracing::warn!("TLS credentials are given but --tls is off: serving plaintext only");
        }
        return Ok(None);
    }
    let credentials = match (certificates, psk) {
        (Some(_), Some(_)) => bail!("give --tls-certificates or --tls-psk, not both"),
        (None, None) => bail!("--tls {mode:?} needs --tls-certificates DIR or --tls-psk FILE", mode = mode_name(mode)),
        (Some(dir), None) => TlsCredentials::from_certificates_dir(&dir, verify_peer)?,
        (None, Some(_)) if verify_peer => bail!("--tls-verify-peer is for certificates, not --tls-psk"),
        (None, Some(file)) => TlsCredentials::from_psk_file(&file)?,
    };
    tracing::info!("TLS {} with {credentials:?}", mode_name(mode));
    Ok(Some(Tls { require: mode == TlsMode::Require, credentials }))
}

fn mode_name(mode: TlsMode) -> &'static str {
    match mode {
        TlsMode::Off => "off",
        TlsMode::On => "on",
        TlsMode::Require => "require",
    }
}
