//! Shutdown on SIGINT, SIGTERM and SIGHUP, for frontends.
//!
//! Once a process installs a handler for a signal, that signal no longer
//! kills it: a frontend that stops listening after the first signal ignores
//! every later one (the review of the first wave found `settle run` hanging
//! that way). So the handlers here are kept while the kernel runs, and every
//! signal after the first skips the rest of the drain. Once the kernel has
//! stopped, the signals get their default action back: a program that hangs
//! after its shutdown is still ended by SIGINT or SIGTERM. (tokio cannot
//! remove a handler it installed; the watcher gives each later signal its
//! default action, which ends the process as the signal would have.)

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::kernel::{Kernel, WeakKernel};

/// Which signal arrived.
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
    /// The signal's number.
    pub fn number(self) -> i32 {
        match self {
            ShutdownSignal::Interrupt => signal_hook::consts::SIGINT,
            ShutdownSignal::Terminate => signal_hook::consts::SIGTERM,
            ShutdownSignal::Hangup => signal_hook::consts::SIGHUP,
        }
    }

    /// The conventional exit code of a process ended by this signal (128 + n).
    pub fn exit_code(self) -> i32 {
        match self {
            ShutdownSignal::Interrupt => 130,
            ShutdownSignal::Terminate => 143,
            ShutdownSignal::Hangup => 129,
        }
    }
}

/// The first signal a [`Signals::drive`] of this process received.
static FIRST: OnceLock<ShutdownSignal> = OnceLock::new();

/// The first shutdown signal this process received through
/// [`shutdown_on_signals`] (or [`Signals::drive`]), if any: a program that
/// shuts down on it exits with its [`exit_code`](ShutdownSignal::exit_code)
/// (130 for SIGINT, 143 for SIGTERM), as a process the signal ended would.
///
/// ```ignore
/// kernel.shutdown(drain).await;
/// if let Some(signal) = signals::received() {
///     std::process::exit(signal.exit_code());
/// }
/// ```
pub fn received() -> Option<ShutdownSignal> {
    FIRST.get().copied()
}

/// The handlers of SIGINT, SIGTERM and SIGHUP, installed for as long as this
/// value lives (keep it until the process exits).
#[derive(Debug)]
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers now: from here on these signals are delivered
    /// to [`recv`](Self::recv) instead of killing the process. Call it inside
    /// a tokio runtime, before anything a signal should be able to stop.
    ///
    /// # Errors
    /// When the handlers cannot be installed.
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> ShutdownSignal {
        tokio::select! {
            _ = self.int.recv() => ShutdownSignal::Interrupt,
            _ = self.term.recv() => ShutdownSignal::Terminate,
            _ = self.hup.recv() => ShutdownSignal::Hangup,
        }
    }

    /// Drives `kernel`'s shutdown from these signals: the first starts the
    /// graceful shutdown (G9) with `drain`, every later one skips the rest of
    /// the drain. Returns a future that yields the first signal once it has
    /// started the shutdown; the later ones are watched by a task that holds
    /// the handlers (and only a [`WeakKernel`]). Once the kernel has stopped,
    /// every signal that arrives gets its default action (it ends the
    /// process).
    pub fn drive(
        self,
        kernel: &Kernel,
        drain: Duration,
    ) -> impl Future<Output = ShutdownSignal> + Send + 'static {
        self.drive_as(kernel, drain, false)
    }

    /// As [`drive`](Self::drive), but the first signal begins a shutdown
    /// that hands the sessions off ([`Kernel::begin_handoff`], SPEC §12).
    pub fn drive_handoff(
        self,
        kernel: &Kernel,
        drain: Duration,
    ) -> impl Future<Output = ShutdownSignal> + Send + 'static {
        self.drive_as(kernel, drain, true)
    }

    /// As [`drive`](Self::drive), but the signals get their default action
    /// back only once `until` is done as well as the kernel: a frontend that
    /// still has to say how the shutdown went (`settle run`'s summary)
    /// finishes saying it, instead of being killed by a second signal
    /// halfway through its output. A signal in between is logged and
    /// otherwise ignored: the drain it would skip is over.
    pub fn drive_until(
        self,
        kernel: &Kernel,
        drain: Duration,
        until: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ShutdownSignal> + Send + 'static {
        self.drive_with(kernel, drain, false, until)
    }

    /// As [`drive_handoff`](Self::drive_handoff), with the signals given
    /// their default action back only once `until` is done too, as
    /// [`drive_until`](Self::drive_until) says.
    pub fn drive_handoff_until(
        self,
        kernel: &Kernel,
        drain: Duration,
        until: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ShutdownSignal> + Send + 'static {
        self.drive_with(kernel, drain, true, until)
    }

    fn drive_as(
        self,
        kernel: &Kernel,
        drain: Duration,
        handoff: bool,
    ) -> impl Future<Output = ShutdownSignal> + Send + 'static {
        self.drive_with(kernel, drain, handoff, std::future::ready(()))
    }

    fn drive_with(
        mut self,
        kernel: &Kernel,
        drain: Duration,
        handoff: bool,
        until: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ShutdownSignal> + Send + 'static {
        let stopped = kernel.stopped();
        let kernel: WeakKernel = kernel.downgrade();
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let watched = async {
                let first = self.recv().await;
                let _ = FIRST.set(first);
                tracing::info!(signal = ?first, "shutdown requested; a second signal skips the drain");
                match kernel.upgrade() {
                    // A shutdown the program began already: a signal now
                    // asks it to be quicker, as a second one does.
                    Some(kernel) if kernel.is_shutting_down() => kernel.skip_drain(),
                    Some(kernel) if handoff => kernel.begin_handoff(drain),
                    Some(kernel) => kernel.begin_shutdown(drain),
                    None => {}
                }
                let _ = first_tx.send(first);
                loop {
                    let again = self.recv().await;
                    tracing::warn!(signal = ?again, "another signal: skipping the rest of the drain");
                    if let Some(kernel) = kernel.upgrade() {
                        kernel.skip_drain();
                    }
                }
            };
            tokio::select! {
                () = watched => {}
                () = stopped => {}
            }
            // The kernel has stopped; the frontend may still be saying so.
            let said = async {
                loop {
                    let signal = self.recv().await;
                    tracing::info!(
                        ?signal,
                        "the kernel has stopped: finishing what it says first"
                    );
                }
            };
            tokio::select! {
                // A signal that came while the frontend spoke is taken
                // here first, not left for the default action below.
                biased;
                () = said => {}
                () = until => {}
            }
            // The kernel has stopped: nothing is left to wind down, so a
            // signal does what it would do to a process without handlers.
            loop {
                let signal = self.recv().await;
                tracing::info!(
                    ?signal,
                    "the kernel has stopped: the signal's default action"
                );
                if let Err(error) = signal_hook::low_level::emulate_default_handler(signal.number())
                {
                    tracing::error!(%error, "the signal's default action could not be taken");
                }
            }
        });
        async move {
            match first_rx.await {
                Ok(first) => first,
                // The watcher cannot end before sending; if it did, wait forever.
                Err(_) => std::future::pending().await,
            }
        }
    }
}

/// Installs the handlers now and drives `kernel`'s shutdown from them (see
/// [`Signals::drive`]).
///
/// # Errors
/// When the signal handlers cannot be installed.
pub fn shutdown_on_signals(
    kernel: &Kernel,
    drain: Duration,
) -> std::io::Result<impl Future<Output = ShutdownSignal> + Send + 'static> {
    Ok(Signals::install()?.drive(kernel, drain))
}
