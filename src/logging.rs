//! Logs on stderr, fit for a terminal, a file or the journal:
//! - colour only when stderr is a terminal and NO_COLOR is unset;
//! - no timestamp when stderr is the journal (JOURNAL_STREAM names stderr's device and inode,
//!   systemd.exec(5)): journald stamps every line itself;
//! - `--log-format json`: one JSON object per line;
//! - level: `-v`/`-q` if given, else RUST_LOG, else `default_level`.

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

pub fn init(args: &LogArgs, default_level: &str) {
    let filter = if args.verbose > 0 || args.quiet > 0 {
        let base = LEVELS.iter().position(|l| *l == default_level).unwrap_or(2) as i32;
        let index = (base + i32::from(args.verbose) - i32::from(args.quiet)).clamp(0, LEVELS.len() as i32 - 1);
        EnvFilter::new(LEVELS[index as usize])
    } else {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level))
    };
    let journal = stderr_is_journal();
    let colour = !journal && std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(colour);
    match (args.log_format, journal) {
        (LogFormat::Json, _) => builder.json().init(),
        (LogFormat::Text, true) => builder.without_time().init(),
        (LogFormat::Text, false) => builder.init(),
    }
}

/// JOURNAL_STREAM is "DEV:INODE" of the journal's stream; it is inherited, so it counts only
/// when it is stderr itself.
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else { return false };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else { return false };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}
