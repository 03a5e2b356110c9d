//! raidnbd: software RAID over files and block devices, served over NBD.
//!
//! The binary ties the crates together: `raid-core` (md geometry, parity, metadata and
//! the array engine), `member-io` (io_uring / thread-pool member backends, throttling),
//! `nbd-server` (the protocol). Errors end as one line on stderr and exit status 2;
//! `check` exits 1 when it found mismatches.

mod bench;
mod check;
mod cli;
mod config;
mod control;
mod create;
mod ctl;
mod export;
mod inspect;
mod maintenance;
mod metrics;
mod open;
mod quickstart;
mod serve;
mod signature;
mod size;
mod timefmt;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_) | Command::Quickstart(_));
    if !serving {
        // Die quietly when the reader of our output goes away (`raidnbd detail | head`), like
        // other command-line tools. Servers keep ignoring SIGPIPE: a client hanging up must
        // not kill them.
        // SAFETY: setting a signal disposition to SIG_DFL before any threads are started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let default_level = if serving { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)))
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("raidnbd: error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("raidnbd: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Create(args) => create::run(args).await?,
        Command::Serve(args) => serve::run(args).await?,
        Command::Examine(args) => inspect::examine(args).await?,
        Command::Detail(args) => inspect::detail(args).await?,
        Command::Check(args) => {
            if check::run(args).await? {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Quickstart(args) => quickstart::run(args).await?,
        Command::Bench(args) => bench::run(args).await?,
        Command::Ctl(args) => ctl::run(args).await?,
    }
    Ok(ExitCode::SUCCESS)
}
