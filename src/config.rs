//! `--config FILE`: several exports in one TOML file. Command-line flags override the
//! file's server-wide settings.
//!
//! ```toml
//! listen = "127.0.0.1:10809"
//!
//! [[export]]
//! name = "fast"
//! members = ["/dev/vdb", "/dev/vdc"]
//! read_only = false
//! io = "auto"            # auto | uring | threads
//! member_bw = "20M"      # optional throttle per member (bytes/s)
//! member_iops = 200      # optional
//! ```

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::cli::IoEngine;
use crate::size::parse_size;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub listen: Option<SocketAddr>,
    #[serde(rename = "export", default)]
    pub exports: Vec<ExportConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    pub name: String,
    pub members: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
    pub io: Option<String>,
    pub member_bw: Option<String>,
    pub member_iops: Option<u64>,
    #[serde(default)]
    pub buffered: bool,
}

impl ExportConfig {
    pub fn io_engine(&self) -> Result<Option<IoEngine>> {
        Ok(match self.io.as_deref() {
            None => None,
            Some("auto") => Some(IoEngine::Auto),
            Some("uring") => Some(IoEngine::Uring),
            Some("threads") => Some(IoEngine::Threads),
            Some("inline") => Some(IoEngine::Inline),
            Some(other) => bail!("export {}: io = {other:?}: use auto, uring, threads or inline", self.name),
        })
    }

    pub fn member_bw_bytes(&self) -> Result<Option<u64>> {
        self.member_bw
            .as_deref()
            .map(parse_size)
            .transpose()
            .map_err(|e| anyhow::anyhow!("export {}: member_bw: {e}", self.name))
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
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let config: ConfigFile = toml::from_str(include_str!("../deploy/raidnbd.toml")).expect("example config");
        assert_eq!(config.exports.len(), 2);
        assert_eq!(config.exports[1].member_bw_bytes().unwrap(), Some(20 << 20));
        assert_eq!(config.exports[0].io_engine().unwrap(), Some(IoEngine::Auto));
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(
            toml::from_str::<ConfigFile>("listen = \"127.0.0.1:1\"\n[[export]]\nname=\"a\"\nmembers=[]\ncolour=1")
                .is_err()
        );
    }
}
