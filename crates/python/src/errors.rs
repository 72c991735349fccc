//! The exceptions of the package, all under `settle.Error`, and how each
//! runtime error reads as one.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use settle_runtime::{RuntimeError, TaskError};

pyo3::create_exception!(
    settle,
    Error,
    PyException,
    "Every error of `settle`: the base of the others. A forked child that uses its parent's kernel gets this one."
);
pyo3::create_exception!(
    settle,
    SessionClosed,
    Error,
    "G10: the session is finalized (or the task writing was detached at the settle deadline); its handle is closed."
);
pyo3::create_exception!(
    settle,
    SessionClosing,
    SessionClosed,
    "G1, G10: the session is winding down (its parent finished, it is being closed, cancelled or its budget is spent): it admits no new turn, task or child, and is finalized once its work settles. A `SessionClosed`: its handle takes no new work."
);
pyo3::create_exception!(
    settle,
    AlreadyFinalized,
    Error,
    "G2: the session was already finalized; the request changed nothing."
);
pyo3::create_exception!(
    settle,
    ShuttingDown,
    Error,
    "G9: the kernel is shutting down (or has stopped); no new session, turn or task starts."
);
pyo3::create_exception!(
    settle,
    StoreError,
    Error,
    "The session store failed, or did not answer within its timeout."
);
pyo3::create_exception!(
    settle,
    BadInput,
    Error,
    "An argument was refused before anything was written: an unknown session, one that cannot be resumed (not finalized), a request over a size limit, a number out of its range (a negative id), a string that is not UTF-8 (a lone surrogate), a chunk that cannot be read."
);
pyo3::create_exception!(
    settle,
    Detached,
    Error,
    "G5: the task ignored its cancellation past the settle timeout and was detached; its result is refused."
);
pyo3::create_exception!(
    settle,
    Cancelled,
    Error,
    "The task was cancelled (by its session, the kernel, or `Task.cancel()`) and gave no result."
);

pyo3::create_exception!(
    settle,
    BudgetExhausted,
    Error,
    "The session's budget (its own or an ancestor's `settle.Budget`) is spent: the turn was refused, and the subtree is wound down `budget_exhausted`."
);

pyo3::create_exception!(
    settle,
    TurnRunning,
    Error,
    "A turn was refused because the session's turn before still runs (until it is read to its end, `aclose()`d, cancelled or dropped): stop it with `session.cancel_turn()`, and the next `turn(...)` waits for its end."
);

/// G2: `session` was already finalized; the request changed nothing.
pub(crate) fn already_finalized(session: settle_core::SessionId) -> PyErr {
    AlreadyFinalized::new_err(format!("session {session} was already finalized"))
}

/// A plain `settle.Error`.
pub(crate) fn error(message: impl Into<String>) -> PyErr {
    Error::new_err(message.into())
}

/// A runtime error as the exception that names it.
pub(crate) fn runtime(error: RuntimeError) -> PyErr {
    let message = error.to_string();
    if let RuntimeError::AlreadyFinalized(session) = error {
        return already_finalized(session);
    }
    if error.is_session_closed() {
        return SessionClosed::new_err(message);
    }
    if error.is_shutting_down() {
        return ShuttingDown::new_err(message);
    }
    if error.is_budget_exhausted() {
        return BudgetExhausted::new_err(message);
    }
    match error {
        // Winding down because its budget is spent: said so, as the turn
        // the budget refused is (once finalized: `SessionClosed`).
        RuntimeError::Lifecycle(settle_core::Error::Closing {
            reason: settle_core::EndReason::BudgetExhausted,
            ..
        }) => BudgetExhausted::new_err(message),
        // Winding down: closed to new work (the core's `Closing`, and a
        // parent that is cancelling, settled or closing).
        RuntimeError::Lifecycle(
            settle_core::Error::Closing { .. } | settle_core::Error::ParentNotLive { .. },
        ) => SessionClosing::new_err(message),
        // The caller named a session the store does not know: said as
        // the store says it, not as a failure of the store.
        RuntimeError::Store(unknown @ settle_store::StoreError::UnknownSession(_)) => {
            BadInput::new_err(unknown.to_string())
        }
        RuntimeError::Store(_)
        | RuntimeError::StoreTimeout { .. }
        | RuntimeError::LeftForRecovery(_)
        | RuntimeError::Registration(_) => StoreError::new_err(message),
        // The core's words ("register it before sending events for it")
        // are for a frontend that sends events; a Python program named
        // an id that neither this kernel nor its store has.
        RuntimeError::Lifecycle(settle_core::Error::UnknownSession(session)) => BadInput::new_err(
            format!("session {session} is not known to this kernel or its store"),
        ),
        RuntimeError::TooLarge { .. }
        | RuntimeError::NulInName
        | RuntimeError::BlankName
        | RuntimeError::NameTooLong { .. }
        | RuntimeError::NotResumable { .. }
        | RuntimeError::LiveElsewhere { .. } => BadInput::new_err(message),
        RuntimeError::Stopped => ShuttingDown::new_err(message),
        _ => Error::new_err(message),
    }
}

/// Why a turn could not start, as an exception: as [`runtime`], and a
/// session still in a turn says how that turn is ended, since the usual
/// cause is a reader that left a bare `async for` early (the turn runs on
/// until it is read to its end, closed or dropped).
pub(crate) fn turn_refused(error: RuntimeError) -> PyErr {
    if let RuntimeError::Lifecycle(settle_core::Error::WrongState {
        state: settle_core::State::Running,
        ..
    }) = &error
    {
        return TurnRunning::new_err(format!(
            "{error}: its current turn is still running; read it to its end or aclose() it \
             (leaving `async with turn:` does; a `break` out of a bare `async for` does not), \
             or stop it with session.cancel_turn()"
        ));
    }
    runtime(error)
}

/// Why a task gave no result: the class of exception its awaiters get, as
/// a maker of one from the error's message.
pub(crate) fn task_error_class(error: &TaskError) -> fn(String) -> PyErr {
    match error {
        TaskError::Detached => Detached::new_err,
        TaskError::Stopped => ShuttingDown::new_err,
        TaskError::Panicked(_) => Error::new_err,
    }
}

/// Adds the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("Error", py.get_type::<Error>())?;
    module.add("SessionClosed", py.get_type::<SessionClosed>())?;
    module.add("AlreadyFinalized", py.get_type::<AlreadyFinalized>())?;
    module.add("ShuttingDown", py.get_type::<ShuttingDown>())?;
    module.add("StoreError", py.get_type::<StoreError>())?;
    module.add("BadInput", py.get_type::<BadInput>())?;
    module.add("Detached", py.get_type::<Detached>())?;
    module.add("Cancelled", py.get_type::<Cancelled>())?;
    module.add("TurnRunning", py.get_type::<TurnRunning>())?;
    module.add("SessionClosing", py.get_type::<SessionClosing>())?;
    module.add("BudgetExhausted", py.get_type::<BudgetExhausted>())?;
    Ok(())
}
