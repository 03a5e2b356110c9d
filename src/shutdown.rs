//! Graceful shutdown on SIGINT, SIGTERM, SIGHUP and SIGQUIT, as nbdkit does: the first
//! signal stops accepting and lets in-flight requests finish; a second one shortens that
//! drain (connections are dropped), but the write-back cache is still written, the members
//! flushed and the arrays marked clean. (SIGHUP is an SSH session closing; SIGQUIT would
//! otherwise dump core.)

use nbd_server::CancellationToken;
use tokio::signal::unix::{SignalKind, signal};

/// Tokens the signal task cancels: `stop` on the first signal, `hurry` on the second.
#[derive(Clone, Default)]
pub struct Shutdown {
    pub stop: CancellationToken,
    pub hurry: CancellationToken,
}

impl Shutdown {
    /// Installs the handlers now (so no signal is lost between here and serving) and starts
    /// the task that waits for them.
    pub fn install() -> std::io::Result<Self> {
        let shutdown = Shutdown::default();
        let mut streams = Vec::new();
        for (kind, name) in [
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::hangup(), "SIGHUP"),
            (SignalKind::quit(), "SIGQUIT"),
        ] {
            streams.push((signal(kind)?, name));
        }
        let tokens = shutdown.clone();
        tokio::spawn(async move {
            let mut received = 0;
            loop {
                let next = futures::future::select_all(streams.iter_mut().map(|(s, name)| {
                    Box::pin(async move {
                        s.recv().await;
                        *name
                    })
                }));
                let (name, _, _) = next.await;
                received += 1;
                if received == 1 {
                    tracing::info!("{name} received: shutting down (finishing in-flight requests)");
                    tokens.stop.cancel();
                } else {
                    tracing::warn!(
                        "{name} received again: dropping connections now; cached writes, member flush \
                         and the clean mark are still written"
                    );
                    tokens.hurry.cancel();
                }
            }
        });
        Ok(shutdown)
    }
}
