//! [`Unclaimed`]: a turn the driver started for a caller that may be gone.
//!
//! A turn's start is answered through a channel, and the caller builds its
//! [`Turn`](crate::Turn), whose drop cancels the turn, from the answer. A
//! caller that gives up first (a `timeout` or a `select!` dropping the
//! start's future) never builds it: the answer is dropped unsent, or unread
//! in the channel. The answer carries this guard, so that a turn nobody
//! took is cancelled as a dropped `Turn` is, by the core (G4: its stream is
//! closed), instead of running and spending with nobody reading it.

use settle_core::{Event, WorkId};
use tokio::sync::mpsc;

use crate::command::Command;

/// A started turn not yet taken by a [`Turn`](crate::Turn): cancelled when
/// dropped untaken.
#[derive(Debug)]
pub(crate) struct Unclaimed {
    work: WorkId,
    /// Where the cancel goes; `None` once taken.
    commands: Option<mpsc::WeakUnboundedSender<Command>>,
}

impl Unclaimed {
    pub fn new(work: WorkId, commands: mpsc::WeakUnboundedSender<Command>) -> Self {
        Unclaimed {
            work,
            commands: Some(commands),
        }
    }

    /// Taken by the caller, whose `Turn` cancels it on its own drop.
    pub fn claim(mut self) -> WorkId {
        self.commands = None;
        self.work
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(commands) = self.commands.take().and_then(|c| c.upgrade()) {
            let event = Event::CancelWork { work: self.work };
            let _ = commands.send(Command::Core { event, reply: None });
        }
    }
}
