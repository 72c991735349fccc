//! Lifecycle writes one at a time, each a batch of one through
//! [`SessionStore::apply`], the store's one write path: the tests that are
//! about one write at a time read as they did, and every answer they check is
//! the batch's answer to that write.

use std::time::SystemTime;

use serde_json::Value;
use settle_store::{
    Applied, Cause, FinalizeRequest, Finalized, LifecycleWrite, NewSession, Outcome, SessionId,
    SessionStore, State, StoreError, TurnError, TurnInput,
};

/// Apply `write` alone and return its one answer.
pub(crate) async fn apply(
    store: &dyn SessionStore,
    write: LifecycleWrite,
) -> Result<Applied, StoreError> {
    let mut answers = store.apply(vec![write]).await;
    assert_eq!(answers.len(), 1, "one answer per write: {answers:?}");
    answers.remove(0)
}

/// Register `new`; its id.
pub(crate) async fn register(
    store: &dyn SessionStore,
    new: NewSession,
) -> Result<SessionId, StoreError> {
    match apply(store, LifecycleWrite::Register(new)).await? {
        Applied::Registered(id) => Ok(id),
        other => panic!("a registration answered {other:?}"),
    }
}

/// Move `session` from `from` to `to` for `cause`.
pub(crate) async fn transition(
    store: &dyn SessionStore,
    session: SessionId,
    from: State,
    to: State,
    cause: Cause,
    at: SystemTime,
) -> Result<(), StoreError> {
    done(
        apply(
            store,
            LifecycleWrite::Transition {
                session,
                from,
                to,
                cause,
                at,
            },
        )
        .await,
    )
}

/// Open turn `no` of `session`.
pub(crate) async fn start_turn(
    store: &dyn SessionStore,
    session: SessionId,
    no: u32,
    input: Option<Value>,
    at: SystemTime,
) -> Result<(), StoreError> {
    done(
        apply(
            store,
            LifecycleWrite::StartTurn {
                session,
                no,
                input: input.map(TurnInput::whole),
                at,
            },
        )
        .await,
    )
}

/// End turn `no` of `session` with `outcome` (and `error`).
pub(crate) async fn end_turn(
    store: &dyn SessionStore,
    session: SessionId,
    no: u32,
    outcome: Outcome,
    error: Option<TurnError>,
    at: SystemTime,
) -> Result<(), StoreError> {
    done(
        apply(
            store,
            LifecycleWrite::EndTurn {
                session,
                no,
                outcome,
                error,
                at,
            },
        )
        .await,
    )
}

/// Spend the finalize latch of `session` with `plan`.
pub(crate) async fn finalize(
    store: &dyn SessionStore,
    session: SessionId,
    plan: FinalizeRequest,
) -> Result<Finalized, StoreError> {
    match apply(store, LifecycleWrite::Finalize { session, plan }).await? {
        Applied::Finalized(finalized) => Ok(finalized),
        other => panic!("a finalize answered {other:?}"),
    }
}

fn done(answer: Result<Applied, StoreError>) -> Result<(), StoreError> {
    match answer? {
        Applied::Done => Ok(()),
        other => panic!("a transition or turn write answered {other:?}"),
    }
}
