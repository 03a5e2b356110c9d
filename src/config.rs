//! `--config FILE`: the server's settings and one or more exports in a TOML file.
//!
//! Every `serve` option has a key. Precedence, highest first: the command-line flag, the
//! export's own key (for the per-export ones), the file's top-level key, the default.
//!
//! ```toml
//! listen = ["127.0.0.1:10809", "unix:/run/raidnbd/nbd.sock"]   # or one string
//! cache = "writethrough"   # writethrough | writeback
//! cache_size = "256M"
//! force = false
//! require_all = false
//! control = "/run/raidnbd/control.sock"
//! state_dir = "/var/lib/raidnbd"   # away records (arrays without a bitmap)
//! metrics = "127.0.0.1:9109"
//! on_event = "/usr/local/sbin/raidnbd-event"
//! handshake_timeout = "10s"   # durations: "500ms", "30s", "2m", or a number of seconds
//! idle_timeout = "10m"     # default: never
//! stall_timeout = 60
//! write_gather_us = 1000   # raid4/5/6: wait for the rest of a stripe; 0 = off
//! scrub_interval = "7d"   # a background check this often (default: none)
//! speed_limit_min = "1M"   # background work while clients are busy, bytes/s
//! speed_limit_max = "200M" # ... and while they are quiet
//! tls = "require"          # off | on | require (per export: on | require)
//! tls_certificates = "/etc/raidnbd/pki"   # server-cert.pem, server-key.pem, ca-cert.pem
//! tls_verify_peer = true
//! tls_psk = "/etc/raidnbd/keys.psk"       # instead of tls_certificates
//! allow = ["10.0.0.0/8", "::1"]
//! io = "auto"              # auto | uring | threads | inline (also per export)
//! member_bw = "20M"        # optional throttle per member, bytes/s (also per export)
//! export_bw = "60M"        # optional throttle of all members together (also per export)
//! member_iops = 200        # (also per export)
//! member_timeout = "30s"   # NBD members: open and answer within, reconnect for up to (also per export)
//! buffered = false         # (also per export)
//! read_only = false        # (also per export)
//!
//! [[export]]
//! name = "fast"
//! members = ["/dev/vdb", "/dev/vdc"]   # or: uuid = "..." with scan = "/dev/disk/by-id/*"
//! tls_peer = ["client1.example"]       # with TLS: only these clients (also --tls-peer)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use serde::Deserialize;

use member_io::IoEngine;
use nbd_server::AddressRange;

use crate::cli::{CacheMode, ListenAddr, TlsMode};
use crate::duration::ConfigDuration;
use crate::size::parse_size;

/// The one list of the keys that may stand at the top (defaults for every export) or in an
/// export: `member_keys!(then! { ... })` calls `then!` with the tokens given, then `;` and
/// the keys as `name: Type,`. [`ConfigFile`], [`ExportConfig`] and [`MemberKeys`] are built
/// from it, and so is [`ExportConfig::keys`]. (serde's `flatten` does not work with
/// `deny_unknown_fields`, so the keys cannot be one struct inside the other two.)
macro_rules! member_keys {
    ($then:ident! { $($given:tt)* }) => {
        $then! { $($given)* ;
            read_only: Option<bool>,
            io: Option<String>,
            member_bw: Option<String>,
            export_bw: Option<String>,
            member_iops: Option<u64>,
            member_timeout: Option<ConfigDuration>,
            buffered: Option<bool>,
        }
    };
}

/// `struct Name { fields before } { fields after }` with the member keys between them (where
/// they stand in the file's documented order, and in serde's list of expected keys).
macro_rules! with_member_keys {
    (
        $(#[$attr:meta])* pub struct $name:ident { $($before:tt)* } { $($after:tt)* }
        ; $($key:ident: $ty:ty,)*
    ) => {
        $(#[$attr])*
        pub struct $name {
            $($before)*
            $(pub $key: $ty,)*
            $($after)*
        }
    };
}

member_keys!(with_member_keys! {
    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    pub struct ConfigFile {
        #[serde(default)]
        pub listen: Option<OneOrMany>,
        pub cache: Option<String>,
        pub cache_size: Option<String>,
        pub force: Option<bool>,
        pub require_all: Option<bool>,
        pub control: Option<PathBuf>,
        pub state_dir: Option<PathBuf>,
        pub metrics: Option<SocketAddr>,
        pub on_event: Option<String>,
        pub handshake_timeout: Option<ConfigDuration>,
        pub idle_timeout: Option<ConfigDuration>,
        pub stall_timeout: Option<ConfigDuration>,
        pub write_gather_us: Option<u64>,
        pub scrub_interval: Option<ConfigDuration>,
        pub speed_limit_min: Option<String>,
        pub speed_limit_max: Option<String>,
    } {
        pub tls: Option<String>,
        pub tls_certificates: Option<PathBuf>,
        pub tls_verify_peer: Option<bool>,
        pub tls_psk: Option<PathBuf>,
        pub allow: Option<Vec<String>>,
        #[serde(rename = "export", default)]
        pub exports: Vec<ExportConfig>,
    }
});

/// `listen = "ADDR"` or `listen = ["ADDR", ...]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

member_keys!(with_member_keys! {
    /// The keys that may stand at the top (defaults for every export) or in an export: one
    /// export's, with the unset ones from the top ([`ExportConfig::keys`]).
    #[derive(Debug, Default, Clone)]
    pub struct MemberKeys {} {}
});

member_keys!(with_member_keys! {
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ExportConfig {
        pub name: String,
        #[serde(default)]
        pub members: Vec<String>,
        pub uuid: Option<String>,
        pub scan: Option<String>,
    } {
        /// `on` (the default) or `require`: this export only over TLS.
        pub tls: Option<String>,
        #[serde(default)]
        pub tls_peer: Vec<String>,
    }
});

/// `fn keys`: each member key of the export, else the file's.
macro_rules! inherit_member_keys {
    (; $($key:ident: $ty:ty,)*) => {
        /// This export's member keys, the unset ones from the file's top level.
        pub fn keys(&self, file: &ConfigFile) -> MemberKeys {
            MemberKeys { $($key: self.$key.clone().or_else(|| file.$key.clone()),)* }
        }
    };
}

impl ExportConfig {
    /// Whether `tls = "require"` is set on this export.
    pub fn tls_required(&self) -> Result<bool> {
        match self.tls.as_deref() {
            None | Some("on") => Ok(false),
            Some("require") => Ok(true),
            Some(other) => bail!("export {}: tls = {other:?}: per export use on or require", self.name),
        }
    }

    member_keys!(inherit_member_keys! {});
}

impl ConfigFile {
    pub fn listen(&self) -> Result<Vec<ListenAddr>> {
        let list = match &self.listen {
            None => return Ok(Vec::new()),
            Some(OneOrMany::One(a)) => vec![a.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        list.iter().map(|a| a.parse().map_err(|e: String| anyhow::anyhow!("listen: {e}"))).collect()
    }

    pub fn cache(&self) -> Result<Option<CacheMode>> {
        self.cache
            .as_deref()
            .map(|v| {
                CacheMode::from_str(v, false)
                    .map_err(|_| anyhow::anyhow!("cache = {v:?}: use writethrough or writeback"))
            })
            .transpose()
    }

    pub fn tls(&self) -> Result<Option<TlsMode>> {
        self.tls
            .as_deref()
            .map(|v| TlsMode::from_str(v, false).map_err(|_| anyhow::anyhow!("tls = {v:?}: use off, on or require")))
            .transpose()
    }

    pub fn allow(&self) -> Result<Vec<AddressRange>> {
        let list = self.allow.as_deref().unwrap_or_default();
        list.iter().map(|a| a.parse().map_err(|e: String| anyhow::anyhow!("allow: {e}"))).collect()
    }

    pub fn cache_size_bytes(&self) -> Result<Option<u64>> {
        self.cache_size.as_deref().map(parse_size).transpose().map_err(|e| anyhow::anyhow!("cache_size: {e}"))
    }

    /// `speed_limit_min` and `speed_limit_max`, bytes/s.
    pub fn speed_limits(&self) -> Result<(Option<u64>, Option<u64>)> {
        let parse = |key: &str, v: &Option<String>| {
            v.as_deref().map(parse_size).transpose().map_err(|e| anyhow::anyhow!("{key}: {e}"))
        };
        Ok((parse("speed_limit_min", &self.speed_limit_min)?, parse("speed_limit_max", &self.speed_limit_max)?))
    }
}

impl MemberKeys {
    pub fn io_engine(&self) -> Result<Option<IoEngine>> {
        self.io
            .as_deref()
            .map(|v| {
                <IoEngine as ValueEnum>::from_str(v, false)
                    .map_err(|_| anyhow::anyhow!("io = {v:?}: use auto, uring, threads or inline"))
            })
            .transpose()
    }

    pub fn member_bw_bytes(&self) -> Result<Option<u64>> {
        self.member_bw.as_deref().map(parse_size).transpose().map_err(|e| anyhow::anyhow!("member_bw: {e}"))
    }

    pub fn export_bw_bytes(&self) -> Result<Option<u64>> {
        self.export_bw.as_deref().map(parse_size).transpose().map_err(|e| anyhow::anyhow!("export_bw: {e}"))
    }
}

pub fn load(path: &Path) -> Result<ConfigFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
    let config: ConfigFile = toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))?;
    if config.exports.is_empty() {
        bail!("config {} defines no [[export]]", path.display());
    }
    let mut names: Vec<&str> = config.exports.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        bail!("config {}: export name {:?} is used twice", path.display(), w[0]);
    }
    for e in &config.exports {
        match (e.members.is_empty(), &e.uuid, &e.scan) {
            (false, None, None) | (true, Some(_), Some(_)) => {}
            _ => bail!(
                "config {}: export {:?} needs either members = [...] or both uuid and scan",
                path.display(),
                e.name
            ),
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let config: ConfigFile = toml::from_str(include_str!("../deploy/raidnbd.toml")).expect("example config");
        assert_eq!(config.exports.len(), 2);
        assert_eq!(config.exports[1].keys(&config).member_bw_bytes().unwrap(), Some(20 << 20));
        assert_eq!(config.exports[0].keys(&config).io_engine().unwrap(), Some(IoEngine::Auto));
        assert_eq!(config.listen().unwrap(), vec!["127.0.0.1:10809".parse::<ListenAddr>().unwrap()]);
    }

    #[test]
    fn every_key_parses_and_exports_inherit_top_level_keys() {
        let config: ConfigFile = toml::from_str(
            r#"
            listen = ["127.0.0.1:1", "unix:/tmp/x.sock"]
            cache = "writeback"
            cache_size = "64M"
            force = true
            require_all = true
            control = "/tmp/c.sock"
            metrics = "127.0.0.1:9"
            on_event = "/bin/true"
            io = "threads"
            member_bw = "1M"
            member_iops = 5
            buffered = true
            read_only = true
            [[export]]
            name = "a"
            members = ["/x"]
            io = "uring"
            [[export]]
            name = "b"
            uuid = "01234567:89abcdef:01234567:89abcdef"
            scan = "/dev/*"
            "#,
        )
        .expect("config");
        assert_eq!(config.listen().unwrap().len(), 2);
        assert_eq!(config.cache().unwrap(), Some(CacheMode::Writeback));
        assert_eq!(config.cache_size_bytes().unwrap(), Some(64 << 20));
        let a = config.exports[0].keys(&config);
        assert_eq!(a.io_engine().unwrap(), Some(IoEngine::Uring));
        assert_eq!(a.member_bw_bytes().unwrap(), Some(1 << 20));
        assert_eq!((a.member_iops, a.buffered, a.read_only), (Some(5), Some(true), Some(true)));
        let b = config.exports[1].keys(&config);
        assert_eq!(b.io_engine().unwrap(), Some(IoEngine::Threads));
    }

    /// Every `serve` flag has a key: at the top level, or per export where it names the export's
    /// members. Keys are flags with `_` for `-`.
    #[test]
    fn every_serve_flag_has_a_config_key() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            serve: crate::cli::ServeArgs,
        }
        let per_export = ["export", "members", "uuid", "scan", "tls_peer"];
        // Not settings: the file itself, and the hidden testing switch.
        let not_keys = ["config", "fault_injection", "help"];
        let command = Wrapper::command();
        for arg in command.get_arguments() {
            let key = arg.get_id().as_str().replace('-', "_");
            if not_keys.contains(&key.as_str()) {
                continue;
            }
            let (top, export) = if per_export.contains(&key.as_str()) {
                let name = if key == "export" { "name".to_string() } else { key.clone() };
                (String::new(), format!("{name} = {}\n", sample_value(&name)))
            } else {
                (format!("{key} = {}\n", sample_value(&key)), String::new())
            };
            let text =
                format!("{top}[[export]]\n{}{export}", if export.starts_with("name") { "" } else { "name = \"a\"\n" });
            if let Err(e) = toml::from_str::<ConfigFile>(&text) {
                panic!("serve --{} has no config key {key:?}: {e}\n{text}", arg.get_id());
            }
        }
    }

    /// The member keys' names, from the one list.
    macro_rules! member_key_names {
        (; $($key:ident: $ty:ty,)*) => { [$(stringify!($key)),*] };
    }

    /// Each member key stands at the top and in an export, and the export's wins.
    #[test]
    fn member_keys_stand_at_the_top_and_in_an_export() {
        for key in member_keys!(member_key_names! {}) {
            let value = sample_value(key);
            let text = format!("{key} = {value}\n[[export]]\nname = \"a\"\nmembers = []\n{key} = {value}\n");
            if let Err(e) = toml::from_str::<ConfigFile>(&text) {
                panic!("member key {key:?}: {e}\n{text}");
            }
        }
        let config: ConfigFile =
            toml::from_str("member_iops = 1\n[[export]]\nname = \"a\"\nmembers = []\nmember_iops = 2\n").unwrap();
        assert_eq!(config.exports[0].keys(&config).member_iops, Some(2));
    }

    fn sample_value(key: &str) -> &'static str {
        match key {
            "read_only" | "force" | "require_all" | "buffered" | "tls_verify_peer" => "true",
            "member_iops" | "write_gather_us" => "5",
            "member_timeout" | "handshake_timeout" | "idle_timeout" | "stall_timeout" | "scrub_interval" => "\"5s\"",
            "listen" | "members" | "tls_peer" | "allow" => "[\"127.0.0.1:1\"]",
            "metrics" => "\"127.0.0.1:9\"",
            _ => "\"x\"",
        }
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(
            toml::from_str::<ConfigFile>("listen = \"127.0.0.1:1\"\n[[export]]\nname=\"a\"\nmembers=[]\ncolour=1")
                .is_err()
        );
        assert!(toml::from_str::<ConfigFile>("colour = 1\n[[export]]\nname=\"a\"\nmembers=[]").is_err());
    }
}
