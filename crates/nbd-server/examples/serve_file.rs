//! Serves one file (or a RAM disk) over NBD; used by `bench/vs-nbdkit.sh` and handy for
//! manual testing.
//!
//! ```text
//! cargo run --release -p nbd-server --example serve_file -- --file /dev/shm/disk.img --listen 127.0.0.1:10809
//! cargo run --release -p nbd-server --example serve_file -- --memory 1073741824 --unix /tmp/nbd.sock
//! ```
//!
//! Prints `listening on ADDR` once bound. SIGINT/SIGTERM shut down cleanly (finish
//! in-flight requests, flush, exit).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use nbd_server::{BlockDevice, Export, FileDevice, MemoryDevice, Server, ServerConfig};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
struct Args {
    /// File or block device to serve.
    #[arg(long, conflicts_with = "memory")]
    file: Option<PathBuf>,
    /// Serve a sparse RAM disk of this many bytes instead of a file.
    #[arg(long)]
    memory: Option<u64>,
    /// Export name (the empty default export reaches it too).
    #[arg(long, default_value = "")]
    name: String,
    /// TCP address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    /// Listen on this Unix socket instead of TCP.
    #[arg(long)]
    unix: Option<PathBuf>,
    #[arg(long)]
    read_only: bool,
    /// Tokio worker threads (default: number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Read large requests with `pread` even from tmpfs (default there: sent from a mapping).
    #[arg(long)]
    no_send_file: bool,
    /// Send large reads from tmpfs with `sendfile` rather than from a mapping of the file.
    #[arg(long)]
    no_send_from_mapping: bool,
    /// Receive large writes into buffers even on tmpfs (default there: into a mapping).
    #[arg(long)]
    no_receive_in_place: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads);
    }
    runtime.enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let device: Arc<dyn BlockDevice> = match (&args.file, args.memory) {
        (Some(path), None) => {
            let mut file =
                FileDevice::open(path, args.read_only).with_context(|| format!("opening {}", path.display()))?;
            if args.no_send_file {
                file.set_send_file_reads(false);
            }
            if args.no_send_from_mapping {
                file.set_send_reads_from_mapping(false);
            }
            if args.no_receive_in_place {
                file.set_receive_writes_in_place(false);
            }
            Arc::new(file)
        }
        (None, Some(size)) => Arc::new(MemoryDevice::new(size).read_only(args.read_only)),
        _ => bail!("give exactly one of --file or --memory"),
    };
    let server = Server::new(vec![Export::new(args.name.clone(), device)], ServerConfig::default())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    };
    match &args.unix {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            let listener = tokio::net::UnixListener::bind(path)?;
            println!("listening on {}", path.display());
            server.serve(listener, shutdown).await?;
            let _ = std::fs::remove_file(path);
        }
        None => {
            let listener = tokio::net::TcpListener::bind(&args.listen).await?;
            println!("listening on {}", listener.local_addr()?);
            server.serve(listener, shutdown).await?;
        }
    }
    Ok(())
}
