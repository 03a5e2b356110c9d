//! Graceful shutdown on SIGINT, SIGTERM, SIGHUP and SIGQUIT, as nbdkit does: the first
//! signal stops accepting and lets in-flight requests finish; a second one shortens that
//! drain (connections are dropped), but the write-back cache is still written, the members
//! flushed and the arrays marked clean; a third one exits at once. (SIGHUP is an SSH session
//! closing; SIGQUIT would otherwise dump core.)
//!
//! Whatever the members do, a stop ends within a bounded time: every wait on a member is
//! bounded by the member timeout, and [`arm_deadline`] exits the process (status 1, the
//! arrays left marked dirty, which the next start handles as after a crash) if the stop
//! still has not finished by its deadline, naming the stage it was stuck in.

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
                } else if received == 2 {
                    tracing::warn!(
                        "{name} received again: dropping connections now; cached writes, member flush \
                         and the clean mark are still written (a third signal exits at once)"
                    );
                    tokens.hurry.cancel();
                } else {
                    tracing::error!("{name} received a third time: exiting now; the arrays stay marked dirty");
                    std::process::exit(1);
                }
            }
        });
        Ok(shutdown)
    }
}

/// The stage a stop is in, for the message if it overruns its deadline.
#[derive(Clone)]
pub struct StopStage(std::sync::Arc<std::sync::Mutex<&'static str>>);

impl StopStage {
    pub fn set(&self, stage: &'static str) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = stage;
    }
}

/// Exits the process (status 1) if it is still running `deadline` from now.
pub fn arm_deadline(deadline: std::time::Duration) -> StopStage {
    let stage = StopStage(std::sync::Arc::new(std::sync::Mutex::new("stopping")));
    let watched = stage.clone();
    tokio::spawn(async move {
        tokio::time::sleep(deadline).await;
        let stuck = *watched.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        tracing::error!(
            "the stop did not finish within {} (still {stuck}): exiting; the arrays stay marked dirty",
            crate::duration::format_duration(deadline)
        );
        std::process::exit(1);
    });
    stage
}
