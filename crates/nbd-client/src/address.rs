//! Where an export is: libnbd's URI syntax, `nbd://HOST[:PORT]/EXPORT` (port 10809 by
//! default; IPv6 hosts in brackets) and `nbd+unix:///EXPORT?socket=PATH`.

use std::fmt;

use crate::error::{ClientError, Result};

/// The NBD port IANA assigned.
pub const DEFAULT_PORT: u16 = 10809;

/// A parsed export address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportAddress {
    pub endpoint: Endpoint,
    pub export: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix { socket: String },
}

impl ExportAddress {
    /// Whether `s` looks like an NBD URI rather than a path.
    pub fn is_uri(s: &str) -> bool {
        s.starts_with("nbd://") || s.starts_with("nbd+unix://") || s.starts_with("nbds://")
    }

    pub fn parse(s: &str) -> Result<Self> {
        let bad = || ClientError::Address(s.to_string());
        if s.starts_with("nbds://") || s.starts_with("nbds+unix://") {
            return Err(ClientError::Address(format!("{s}: TLS members (nbds://) are not supported yet")));
        }
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').ok_or_else(bad)?;
            let export = path.strip_prefix('/').ok_or_else(bad)?;
            let socket = query.split('&').find_map(|kv| kv.strip_prefix("socket=")).ok_or_else(bad)?;
            if socket.is_empty() {
                return Err(bad());
            }
            return Ok(Self { endpoint: Endpoint::Unix { socket: socket.to_string() }, export: export.to_string() });
        }
        let rest = s.strip_prefix("nbd://").ok_or_else(bad)?;
        if rest.contains('?') {
            return Err(bad());
        }
        let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(bad)?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad());
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad())?,
            None => DEFAULT_PORT,
        };
        Ok(Self { endpoint: Endpoint::Tcp { host: host.to_string(), port }, export: export.to_string() })
    }
}

impl fmt::Display for ExportAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.endpoint {
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "nbd://[{host}]:{port}/{}", self.export),
            Endpoint::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            Endpoint::Unix { socket } => write!(f, "nbd+unix:///{}?socket={socket}", self.export),
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
        ] {
            assert!(ExportAddress::parse(bad).is_err(), "{bad}");
        }
        assert!(ExportAddress::is_uri("nbd://h/x") && !ExportAddress::is_uri("/srv/m0.img"));
    }
}
