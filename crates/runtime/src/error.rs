use settle_core::SessionId;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The core refused the request (wrong state, shutting down, closing...).
    #[error(transparent)]
    Lifecycle(settle_core::Error),
    /// The session is finalized: its handle is closed (G10).
    #[error("session {0} is finalized; its handle is closed")]
    SessionClosed(SessionId),
    /// An end was asked of a session already finalized: nothing changed
    /// (G2). Its handle is closed too, so
    /// [`is_session_closed`](Self::is_session_closed) holds.
    #[error("session {0} was already finalized")]
    AlreadyFinalized(SessionId),
    /// The store failed.
    #[error("the session store failed: {0}")]
    Store(#[from] settle_store::StoreError),
    /// The store did not answer in time: the request was given up. A write
    /// (`writing`) may still be committed: what it wrote, if anything, is
    /// decided by the store, and nothing was acknowledged; a read wrote
    /// nothing.
    #[error("{} while {what}{}; check that the database is up and reachable", waited(.after), given_up(*.writing))]
    StoreTimeout {
        /// What the kernel was doing.
        what: &'static str,
        /// The bound that ran out.
        after: std::time::Duration,
        /// Whether it was a write, which the store may still commit (a
        /// read leaves nothing behind).
        writing: bool,
    },
    /// The session cannot be continued yet: it is not finalized.
    #[error("session {session} is {state}: only a finalized session can be resumed; if its process crashed, recover it first (`settle recover`, or the kernel's `recover()`)")]
    NotResumable {
        /// The session.
        session: SessionId,
        /// Its state in the store.
        state: settle_core::State,
    },
    /// The session is live in the store but not in this kernel: another
    /// process owns it (a live one, or one that crashed and left it for
    /// recovery), so this kernel cannot drive it.
    #[error("session {session} is {state} in the store, owned by another kernel (another process's, or another kernel's of this process), not this one; if that process crashed, recovery (`settle recover`, or the kernel's `recover()`) finalizes it once its lease has run out or, on this machine, its process is gone, and a finalized session can be resumed")]
    LiveElsewhere {
        /// The session.
        session: SessionId,
        /// Its state in the store.
        state: settle_core::State,
    },
    /// No session id could be reserved for a registration.
    #[error("no session id could be reserved: {0}")]
    Registration(std::sync::Arc<settle_store::StoreError>),
    /// Every active-session slot is taken.
    #[error("all {0} active-session slots are taken; wait for a session to be finalized or configure more slots")]
    NoSlot(usize),
    /// A turn's request is over a size limit
    /// ([`Config::max_prompt_bytes`](crate::Config::max_prompt_bytes),
    /// [`Config::max_history_bytes`](crate::Config::max_history_bytes)): it
    /// was refused before anything was sent or written.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes ({setting}); nothing was sent or written")]
    TooLarge {
        /// What is too large: `a message of the turn` or `the turn's whole request`.
        what: &'static str,
        /// The setting that limits it: `max_prompt_bytes` or `max_history_bytes`.
        setting: &'static str,
        /// Its size, in bytes.
        size: usize,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The runtime's driver has stopped (after shutdown, or it was dropped).
    #[error("the runtime has shut down; no further requests are accepted")]
    Stopped,
    /// A session name no store keeps: refused before anything is written,
    /// on every store alike.
    #[error("a session name must not hold a NUL character (U+0000); nothing was registered")]
    NulInName,
    /// A session name that is empty or only white space: refused before
    /// anything is written, on every frontend alike.
    #[error("a session name must not be blank; nothing was registered")]
    BlankName,
    /// A session name longer than [`MAX_NAME_CHARS`](crate::MAX_NAME_CHARS)
    /// characters: refused before anything is written.
    #[error(
        "a session name is at most {max} characters long, not {chars}; nothing was registered"
    )]
    NameTooLong {
        /// Its length, in characters.
        chars: usize,
        /// The most accepted.
        max: usize,
    },
    /// The session's finalize ran here but the store did not commit the
    /// end of its row (a stalled store at shutdown, a lost lease): its row
    /// is left live, for `settle recover` or a peer of the fleet (G8).
    #[error("session {0} was not finalized in the store; it is left for recovery")]
    LeftForRecovery(SessionId),
}

impl RuntimeError {
    /// Whether a budget over the session has nothing left (see
    /// [`Kernel::register_with_budget`](crate::Kernel::register_with_budget)).
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(self, RuntimeError::Lifecycle(e) if e.is_budget_exhausted())
    }

    /// Whether the kernel stopped before it could answer.
    pub fn is_stopped(&self) -> bool {
        matches!(self, RuntimeError::Stopped)
    }

    /// The store's `error` for a call that was `what` (`"registering a
    /// session"`): a store that did not answer in time is
    /// [`StoreTimeout`](Self::StoreTimeout), whichever side stopped
    /// waiting first, so that the same outage reads the same to every
    /// caller; any other failure is [`Store`](Self::Store), with the
    /// store's own cause.
    pub(crate) fn from_store(what: &'static str, error: settle_store::StoreError) -> Self {
        match error {
            settle_store::StoreError::TimedOut { after } => RuntimeError::StoreTimeout {
                what,
                after,
                writing: true,
            },
            error => RuntimeError::Store(error),
        }
    }
}

impl From<settle_core::Error> for RuntimeError {
    /// The core's answer as the runtime says it: `SessionClosed` and
    /// `NoSlot` have variants of their own, the rest are `Lifecycle`.
    fn from(refused: settle_core::Error) -> Self {
        match refused {
            settle_core::Error::SessionClosed(id) => RuntimeError::SessionClosed(id),
            settle_core::Error::NoSlot { slots } => RuntimeError::NoSlot(slots),
            refused => RuntimeError::Lifecycle(refused),
        }
    }
}

impl RuntimeError {
    /// Whether it was refused because a shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        matches!(
            self,
            RuntimeError::Lifecycle(settle_core::Error::ShuttingDown)
        )
    }

    /// Whether this is the typed `SessionClosed` of G10, from the core or the store.
    pub fn is_session_closed(&self) -> bool {
        matches!(
            self,
            RuntimeError::SessionClosed(_)
                | RuntimeError::AlreadyFinalized(_)
                | RuntimeError::Lifecycle(settle_core::Error::SessionClosed(_))
                | RuntimeError::Store(settle_store::StoreError::SessionClosed(_))
        )
    }
}

/// Why a task gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// It ignored its cancel past the settle timeout and was abandoned; its
    /// result, if it ever produced one, was refused.
    #[error("the task ignored its cancellation past the settle timeout and was detached")]
    Detached,
    /// It panicked, with this message (the panic's payload).
    #[error("the task panicked: {0}")]
    Panicked(String),
    /// The kernel stopped before the task said how it ended.
    #[error("the kernel stopped before the task ended")]
    Stopped,
}

/// What a call given up leaves behind: a write may still land.
fn given_up(writing: bool) -> &'static str {
    match writing {
        true => ", so it may still be written (the kernel ends whatever it later finds written)",
        false => " (a read: nothing was written)",
    }
}

/// How long the store was waited for, or that it was not waited for at
/// all (no time was left: a shutdown's time for the store spent).
fn waited(after: &std::time::Duration) -> String {
    match after.is_zero() {
        true => "the store was not waited for (no time was left for it)".to_owned(),
        false => format!("the store did not answer within {after:?}"),
    }
}
