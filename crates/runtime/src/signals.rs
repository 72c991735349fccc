//! Shutdown on SIGINT, SIGTERM and SIGHUP, for frontends.

use std::future::Future;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::Runtime;

/// Which signal started the shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownSignal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGHUP.
    Hangup,
}

impl ShutdownSignal {
    /// The conventional exit code of a process ended by this signal (128 + n).
    pub fn exit_code(self) -> i32 {
        match self {
            ShutdownSignal::Interrupt => 130,
            ShutdownSignal::Terminate => 143,
            ShutdownSignal::Hangup => 129,
        }
    }
}

/// Installs handlers for SIGINT, SIGTERM and SIGHUP now, and returns a future
/// that waits for the first of them and starts the graceful shutdown (G9)
/// with `drain`; a second signal skips the rest of the drain. The future
/// yields the first signal once it has started the shutdown; the second is
/// watched in the background for as long as the runtime lives.
///
/// The handlers are in place when this returns, so a signal that arrives
/// before the future is first polled (say, while the frontend is still
/// spawning its agents) still starts a graceful shutdown instead of killing
/// the process. Call it inside a tokio runtime.
///
/// # Errors
/// When the signal handlers cannot be installed.
pub fn shutdown_on_signals(
    runtime: Runtime,
    drain: Duration,
) -> std::io::Result<impl Future<Output = ShutdownSignal> + Send + 'static> {
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        let first = tokio::select! {
            _ = int.recv() => ShutdownSignal::Interrupt,
            _ = term.recv() => ShutdownSignal::Terminate,
            _ = hup.recv() => ShutdownSignal::Hangup,
        };
        tracing::info!(signal = ?first, "shutdown requested; a second signal skips the drain");
        runtime.begin_shutdown(drain);
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
                _ = hup.recv() => {},
            }
            tracing::warn!("second signal: skipping the rest of the drain");
            runtime.skip_drain();
        });
        first
    })
}
