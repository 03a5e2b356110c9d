//! Options for opening a member: which I/O engine, whether to use O_DIRECT, read-only.
//!
//! `IoEngine` is what the user asks for (`--io auto|uring|threads|inline`, or the `RAIDNBD_IO`
//! environment variable when the option is left at `auto`); `EngineKind` is what the
//! factory actually chose after probing. Explicit options win over the environment.

use std::fmt;
use std::str::FromStr;

use crate::error::MemberIoError;

/// Environment variable that forces an engine when the option is `Auto` (`uring`, `threads`
/// or `inline`).
pub const IO_ENGINE_ENV: &str = "RAIDNBD_IO";

/// Requested I/O engine: the one definition, which the binary's `--io` and `io = ...` also
/// parse (with the `clap` feature it is a `clap::ValueEnum`; the variants' docs are the
/// option's help). [`FromStr`] is more lenient (any case, aliases such as `io_uring`), for
/// [`IO_ENGINE_ENV`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum IoEngine {
    /// Inline for member files on tmpfs/ramfs; else io_uring when the kernel allows it, else
    /// a thread pool (the reason is logged).
    #[default]
    Auto,
    /// io_uring only; fail if unavailable.
    Uring,
    /// Thread pool with pread/pwrite.
    Threads,
    /// pread/pwrite in the serving task: for members in memory (a disk would stall serving).
    Inline,
}

/// The engine a member actually runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Uring,
    Threads,
    Inline,
}

/// O_DIRECT policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectMode {
    /// O_DIRECT unless the filesystem refuses it (then buffered, logged).
    #[default]
    Auto,
    /// O_DIRECT or fail.
    On,
    /// Buffered I/O through the page cache (flush still means fdatasync).
    Off,
}

/// Options for [`crate::open_member`].
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub engine: IoEngine,
    pub direct: DirectMode,
    /// Open O_RDONLY; writes, discards and zeroing fail with EROFS.
    pub read_only: bool,
}

impl IoEngine {
    /// The engine named by [`IO_ENGINE_ENV`], if set.
    pub fn from_env() -> Result<Option<IoEngine>, MemberIoError> {
        match std::env::var(IO_ENGINE_ENV) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => v.parse().map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(MemberIoError::InvalidOption(format!("{IO_ENGINE_ENV}: {e}"))),
        }
    }
}

impl FromStr for IoEngine {
    type Err = MemberIoError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(Self::Uring),
            "threads" | "threadpool" | "thread-pool" | "thread_pool" => Ok(Self::Threads),
            "inline" => Ok(Self::Inline),
            other => Err(MemberIoError::InvalidOption(format!(
                "io engine {other:?}: expected auto, uring, threads or inline"
            ))),
        }
    }
}

impl FromStr for DirectMode {
    type Err = MemberIoError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" | "true" | "yes" | "direct" => Ok(Self::On),
            "off" | "false" | "no" | "buffered" => Ok(Self::Off),
            other => Err(MemberIoError::InvalidOption(format!("direct mode {other:?}: expected auto, on or off"))),
        }
    }
}

impl fmt::Display for IoEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Uring => "uring",
            Self::Threads => "threads",
            Self::Inline => "inline",
        })
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Uring => "io_uring",
            Self::Threads => "thread pool",
            Self::Inline => "inline",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_engine_and_direct() {
        assert_eq!("Uring".parse::<IoEngine>().unwrap(), IoEngine::Uring);
        assert_eq!("threads".parse::<IoEngine>().unwrap(), IoEngine::Threads);
        assert_eq!(" auto ".parse::<IoEngine>().unwrap(), IoEngine::Auto);
        assert_eq!("inline".parse::<IoEngine>().unwrap(), IoEngine::Inline);
        assert!("epoll".parse::<IoEngine>().is_err());
        assert_eq!("off".parse::<DirectMode>().unwrap(), DirectMode::Off);
        assert_eq!("on".parse::<DirectMode>().unwrap(), DirectMode::On);
        assert!("maybe".parse::<DirectMode>().is_err());
    }
}
