//! raidnbd: software RAID over files and block devices, served over NBD.
//!
//! The binary ties the crates together: `raid-core` (md geometry, parity, metadata and
//! the array engine), `member-io` (io_uring / thread-pool member backends, throttling),
//! `nbd-server` (the protocol). Errors end as one line on stderr and exit status 2;
//! `check` exits 1 when it found mismatches.

mod attach;
mod away_file;
mod bench;
mod check;
mod cli;
mod config;
mod control;
mod create;
mod ctl;
mod duration;
mod export;
mod grow;
mod inspect;
mod link_registry;
mod listen;
mod logging;
mod maintenance;
mod metrics;
mod monitor;
mod notify;
mod open;
mod quickstart;
mod rejoin;
mod serve;
mod shared_args;
mod shutdown;
mod signature;
mod size;
mod timefmt;
mod tls;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_) | Command::Quickstart(_) | Command::Attach(_));
    if !serving {
        // Die quietly when the reader of our output goes away (`raidnbd detail | head`), like
        // other command-line tools. Servers keep ignoring SIGPIPE: a client hanging up must
        // not kill them.
        // SAFETY: setting a signal disposition to SIG_DFL before any threads are started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    logging::init(&cli.log, if serving { "info" } else { "warn" });
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
        Command::Detail(args) => return inspect::detail(args).await,
        Command::Grow(args) => grow::run(args).await?,
        Command::Check(args) => {
            if check::run(args).await? {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Quickstart(args) => quickstart::run(args).await?,
        Command::Bench(args) => bench::run(args).await?,
        Command::Ctl(args) => return ctl::run(args).await,
        Command::Attach(args) => attach::run(args).await?,
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "raidnbd",
                &mut std::io::stdout(),
            );
        }
        Command::Man { out_dir } => man_pages(&out_dir)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes raidnbd.1 and one page per subcommand (raidnbd-serve.1, ...), generated from the CLI.
fn man_pages(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let command = <Cli as clap::CommandFactory>::command();
    let mut pages = vec![("raidnbd".to_string(), command.clone())];
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = format!("raidnbd-{}", sub.get_name());
        // clap names are &'static str; this command runs once and exits.
        let static_name: &'static str = Box::leak(name.clone().into_boxed_str());
        pages.push((name, sub.clone().name(static_name)));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}
