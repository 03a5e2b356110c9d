//! Where an export is: libnbd's URI syntax, `nbd://HOST[:PORT]/EXPORT` (port 10809 by
//! default; IPv6 hosts in brackets) and `nbd+unix:///EXPORT?socket=PATH`, either with
//! `connections=N` (several connections, for exports with CAN_MULTI_CONN); with TLS,
//! `nbds://` and `nbds+unix://` with `tls-certificates=DIR` (X.509: `ca-cert.pem`, and
//! `client-cert.pem` + `client-key.pem` when the server wants a client certificate) or
//! `tls-psk-file=FILE` (psktool's file; the identity is `tls-username=`, the URI's user, or
//! the login name), and `tls-hostname=` for the name the server certificate must carry (by
//! default the host; `localhost` over a Unix socket).

use std::fmt;
use std::path::PathBuf;

use crate::error::{ClientError, Result};

/// The NBD port IANA assigned.
pub const DEFAULT_PORT: u16 = 10809;

/// A parsed export address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportAddress {
    pub endpoint: Endpoint,
    pub export: String,
    /// `nbds://`: TLS is required, with these credentials.
    pub tls: Option<TlsSettings>,
    /// `?connections=N`: how many connections a user of the address may open (1 to
    /// [`MAX_CONNECTIONS`]; only worth it when the export has CAN_MULTI_CONN).
    pub connections: u32,
}

/// Most connections `?connections=` asks for.
pub const MAX_CONNECTIONS: u32 = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix { socket: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub credentials: TlsCredentialFiles,
    /// The name the server's certificate must carry.
    pub hostname: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsCredentialFiles {
    Certificates(PathBuf),
    Psk { file: PathBuf, username: String },
}

/// `?a=b&c=d` → pairs (no percent-decoding: paths are taken as written).
fn query_pairs(query: &str) -> Vec<(&str, &str)> {
    query.split('&').filter(|kv| !kv.is_empty()).map(|kv| kv.split_once('=').unwrap_or((kv, ""))).collect()
}

impl ExportAddress {
    /// Whether `s` looks like an NBD URI rather than a path.
    pub fn is_uri(s: &str) -> bool {
        ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"].iter().any(|p| s.starts_with(p))
    }

    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| ClientError::Address(format!("{s}: {why}"));
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("not an NBD URI"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbd+unix" => (false, true),
            "nbds" => (true, false),
            "nbds+unix" => (true, true),
            _ => return Err(bad("use nbd://, nbd+unix://, nbds:// or nbds+unix://")),
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let pairs = query_pairs(query);
        let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let known: &[&str] = if unix {
            &["socket", "connections", "tls-certificates", "tls-psk-file", "tls-username", "tls-hostname"]
        } else {
            &["connections", "tls-certificates", "tls-psk-file", "tls-username", "tls-hostname"]
        };
        if let Some((k, _)) = pairs.iter().find(|(k, _)| !known.contains(k)) {
            return Err(bad(&format!("unknown query parameter {k:?}")));
        }
        if !tls && pairs.iter().any(|(k, _)| k.starts_with("tls-")) {
            return Err(bad("tls-* parameters need nbds:// or nbds+unix://"));
        }
        let (authority, export) = before_query.split_once('/').unwrap_or((before_query, ""));
        let (user, authority) = match authority.rsplit_once('@') {
            Some((user, host)) => (Some(user), host),
            None => (None, authority),
        };
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(bad("a Unix socket URI has no host"));
            }
            let socket = get("socket").filter(|p| !p.is_empty()).ok_or_else(|| bad("missing ?socket=PATH"))?;
            Endpoint::Unix { socket: socket.to_string() }
        } else {
            let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
                let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
                (host, after.strip_prefix(':'))
            } else {
                match authority.rsplit_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (authority, None),
                }
            };
            if host.is_empty() {
                return Err(bad("no host"));
            }
            let port = match port {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None => DEFAULT_PORT,
            };
            Endpoint::Tcp { host: host.to_string(), port }
        };
        let tls = if tls {
            let credentials = match (get("tls-certificates"), get("tls-psk-file")) {
                (Some(dir), None) if !dir.is_empty() => TlsCredentialFiles::Certificates(dir.into()),
                (None, Some(file)) if !file.is_empty() => {
                    let username = get("tls-username")
                        .or(user)
                        .map(str::to_string)
                        .or_else(|| std::env::var("USER").ok())
                        .ok_or_else(|| bad("tls-psk-file needs tls-username= (or user@host)"))?;
                    TlsCredentialFiles::Psk { file: file.into(), username }
                }
                (Some(_), Some(_)) => return Err(bad("give tls-certificates or tls-psk-file, not both")),
                _ => return Err(bad("nbds:// needs ?tls-certificates=DIR or ?tls-psk-file=FILE")),
            };
            let hostname = get("tls-hostname").map(str::to_string).unwrap_or_else(|| match &endpoint {
                Endpoint::Tcp { host, .. } => host.clone(),
                Endpoint::Unix { .. } => "localhost".to_string(),
            });
            Some(TlsSettings { credentials, hostname })
        } else {
            None
        };
        let connections = match get("connections") {
            None => 1,
            Some(n) => n
                .parse()
                .ok()
                .filter(|n| (1..=MAX_CONNECTIONS).contains(n))
                .ok_or_else(|| bad(&format!("connections= takes 1 to {MAX_CONNECTIONS}")))?,
        };
        Ok(Self { endpoint, export: export.to_string(), tls, connections })
    }
}

impl fmt::Display for ExportAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        match &self.endpoint {
            Endpoint::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)
            }
            Endpoint::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export),
            Endpoint::Unix { socket } => write!(f, "nbd{s}+unix:///{}?socket={socket}", self.export),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_like_libnbd() {
        let a = ExportAddress::parse("nbd://127.0.0.1:10900/disk").unwrap();
        assert_eq!(a.endpoint, Endpoint::Tcp { host: "127.0.0.1".into(), port: 10900 });
        assert_eq!(a.export, "disk");
        assert_eq!(a.to_string(), "nbd://127.0.0.1:10900/disk");
        let a = ExportAddress::parse("nbd://server").unwrap();
        assert_eq!((a.endpoint, a.export), (Endpoint::Tcp { host: "server".into(), port: 10809 }, String::new()));
        let a = ExportAddress::parse("nbd://[::1]:9/x").unwrap();
        assert_eq!(a.endpoint, Endpoint::Tcp { host: "::1".into(), port: 9 });
        assert_eq!(a.to_string(), "nbd://[::1]:9/x");
        let a = ExportAddress::parse("nbd+unix:///m0?socket=/run/m0.sock").unwrap();
        assert_eq!(a.endpoint, Endpoint::Unix { socket: "/run/m0.sock".into() });
        assert_eq!(a.export, "m0");
        for bad in [
            "nbd://",
            "nbd://:1/x",
            "nbd://h:port/x",
            "nbd+unix:///x",
            "nbd+unix:///x?socket=",
            "/dev/sda",
            "nbds://h/x",
            "nbd://h/x?tls-certificates=/d",
            "nbds://h/x?tls-certificates=/d&tls-psk-file=/k",
            "nbd://h/x?bogus=1",
        ] {
            assert!(ExportAddress::parse(bad).is_err(), "{bad}");
        }
        let a = ExportAddress::parse("nbds://h:7/x?tls-certificates=/pki").unwrap();
        let tls = a.tls.clone().unwrap();
        assert_eq!(tls.credentials, TlsCredentialFiles::Certificates("/pki".into()));
        assert_eq!(tls.hostname, "h");
        assert_eq!(a.to_string(), "nbds://h:7/x");
        let a = ExportAddress::parse("nbds+unix://alice@/x?socket=/s&tls-psk-file=/k.psk").unwrap();
        let tls = a.tls.unwrap();
        assert_eq!(tls.credentials, TlsCredentialFiles::Psk { file: "/k.psk".into(), username: "alice".into() });
        assert_eq!(tls.hostname, "localhost");
        assert_eq!(a.endpoint, Endpoint::Unix { socket: "/s".into() });
        assert_eq!(ExportAddress::parse("nbd://h/x?connections=4").unwrap().connections, 4);
        assert_eq!(ExportAddress::parse("nbd://h/x").unwrap().connections, 1);
        for bad in ["nbd://h/x?connections=0", "nbd://h/x?connections=99", "nbd://h/x?connections=x"] {
            assert!(ExportAddress::parse(bad).is_err(), "{bad}");
        }
        assert!(ExportAddress::is_uri("nbd://h/x") && !ExportAddress::is_uri("/srv/m0.img"));
    }
}
