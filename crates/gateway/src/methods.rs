//! The methods of SPEC §10, each a thin call into the runtime. None decides
//! anything about a session's lifecycle: the core admits or refuses a turn,
//! a hold, a transport; sweepers and the shutdown are the kernel's.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};
use settle_core::Error as CoreError;
use settle_runtime::{RuntimeError, SessionId, State, Turn, TurnRequest};
use settle_stream::{Message, Role};
use tokio::sync::OwnedMutexGuard;

use crate::gateway::Shared;
use crate::outbox::Outbox;
use crate::params::{self, read};
use crate::protocol::{code, ErrorKind, RpcError};
use crate::table::{ConnId, Entry};

/// Who is asking: the connection, its queue, and the sessions it is
/// attached to (as transports).
pub(crate) struct Caller<'a> {
    pub conn: ConnId,
    pub outbox: &'a Outbox,
    pub attached: &'a mut HashSet<SessionId>,
}

/// A method's result, and a turn to run once it is queued (so that the
/// answer to `turn.start` reaches its caller before the turn's first chunk).
pub(crate) struct Answer {
    pub result: Value,
    pub started: Option<Started>,
}

impl From<Value> for Answer {
    fn from(result: Value) -> Self {
        Answer {
            result,
            started: None,
        }
    }
}

/// A turn the runtime started, to be run by [`crate::pump`].
pub(crate) struct Started {
    pub entry: Arc<Entry>,
    pub turn: Turn,
    pub conversation: OwnedMutexGuard<Vec<Message>>,
}

fn session_closed(id: SessionId) -> RpcError {
    RpcError::new(
        code::SESSION_CLOSED,
        ErrorKind::SessionClosed,
        format!("session {id} is finalized; its handle is closed"),
    )
}

fn wrong_state(message: String) -> RpcError {
    RpcError::new(code::WRONG_STATE, ErrorKind::WrongState, message)
}

fn from_runtime(error: RuntimeError) -> RpcError {
    RpcError::from_runtime(&error)
}

/// Calls `method` for `caller`.
pub(crate) async fn call(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    method: &str,
    params: Value,
) -> Result<Answer, RpcError> {
    match method {
        "session.create" => create(shared, caller, read(params)?).await,
        "session.attach" => attach(shared, caller, read(params)?).await,
        "session.detach" => detach(shared, caller, read(params)?).await,
        "turn.start" => turn_start(shared, read(params)?).await,
        "turn.cancel" => turn_cancel(shared, read(params)?).await,
        "session.hold" => hold(shared, read(params)?, true).await,
        "session.release" => hold(shared, read(params)?, false).await,
        "session.close" => close(shared, read(params)?).await,
        "sessions.list" => list(shared, read(params)?).await,
        other => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            ErrorKind::BadRequest,
            format!(
                "no method `{other}`; the methods are session.create, session.attach, \
                 session.detach, turn.start, turn.cancel, session.hold, session.release, \
                 session.close and sessions.list"
            ),
        )),
    }
}

/// Attaches `caller` to `entry` as a transport, once per connection.
async fn attach_caller(
    caller: &mut Caller<'_>,
    entry: &Entry,
    close_on_disconnect: bool,
) -> Result<(), RpcError> {
    let id = entry.handle.id();
    if caller.attached.contains(&id) {
        return Ok(());
    }
    let _ = entry
        .handle
        .attach_transport(close_on_disconnect)
        .await
        .map_err(from_runtime)?;
    caller.attached.insert(id);
    entry
        .watch(caller.conn, caller.outbox)
        .map_err(|_| session_closed(id))
}

async fn create(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    params: params::Create,
) -> Result<Answer, RpcError> {
    let name = params.checked_name()?;
    if shared.kernel.is_shutting_down() {
        return Err(RpcError::shutting_down());
    }
    let parent = params.parent.map(SessionId);
    let handle = match shared.kernel.register(name, parent).await {
        Ok(handle) => handle,
        Err(RuntimeError::Lifecycle(CoreError::UnknownSession(id))) => {
            // The core forgets finalized sessions; the store says which.
            return Err(match shared.kernel.session(id).await {
                Err(e) if e.is_session_closed() => RpcError::new(
                    code::SESSION_CLOSED,
                    ErrorKind::SessionClosed,
                    format!("parent session {id} is finalized: it takes no children"),
                ),
                _ => RpcError::not_found(id.get()),
            });
        }
        Err(error) => return Err(from_runtime(error)),
    };
    let id = handle.id();
    let entry = shared.adopt(handle);
    attach_caller(caller, &entry, params.close_on_disconnect).await?;
    Ok(json!({ "id": id.get() }).into())
}

async fn state_of(entry: &Entry) -> Result<Answer, RpcError> {
    let state = entry.handle.state().await.map_err(from_runtime)?;
    Ok(json!({ "state": state.as_str() }).into())
}

async fn attach(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    params: params::Id,
) -> Result<Answer, RpcError> {
    let entry = shared.entry(params.session()).await?;
    attach_caller(caller, &entry, false).await?;
    state_of(&entry).await
}

async fn detach(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    params: params::Id,
) -> Result<Answer, RpcError> {
    let id = params.session();
    let finalized = || Ok(json!({ "state": State::Finalized.as_str() }).into());
    if caller.attached.remove(&id) {
        let Some(entry) = shared.table.get(id) else {
            return finalized();
        };
        entry.unwatch(caller.conn);
        let _ = entry
            .handle
            .detach_transport()
            .await
            .map_err(from_runtime)?;
        return state_of(&entry).await;
    }
    // Not attached through this connection: nothing to let go of.
    match shared.entry(id).await {
        Ok(entry) => state_of(&entry).await,
        Err(e) if e.kind == ErrorKind::SessionClosed => finalized(),
        Err(e) => Err(e),
    }
}

async fn turn_start(shared: &Arc<Shared>, params: params::TurnStart) -> Result<Answer, RpcError> {
    if shared.kernel.is_shutting_down() {
        return Err(RpcError::shutting_down());
    }
    let id = SessionId(params.id);
    let entry = shared.entry(id).await?;
    let conversation = match entry.conversation.clone().try_lock_owned() {
        Ok(conversation) => conversation,
        // Held by the turn before: refused while the core says it runs; once
        // it has ended, its reply is about to join the conversation.
        Err(_) => match entry.handle.state().await.map_err(from_runtime)? {
            state @ (State::Running | State::Cancelling) => {
                return Err(wrong_state(format!(
                    "session {id} is {state}: a turn is in flight; wait for its turn.ended or cancel it"
                )))
            }
            State::Finalized => return Err(session_closed(id)),
            _ => entry.conversation.clone().lock_owned().await,
        },
    };
    let prompt = Message::new(Role::User, params.prompt);
    let mut messages = conversation.clone();
    messages.push(prompt.clone());
    let turn = entry
        .handle
        .run_turn(shared.provider.clone(), TurnRequest::new(messages))
        .await
        .map_err(from_runtime)?;
    let mut conversation = conversation;
    conversation.push(prompt);
    let no = turn.work().no;
    Ok(Answer {
        result: json!({ "turn": no }),
        started: Some(Started {
            entry,
            turn,
            conversation,
        }),
    })
}

async fn turn_cancel(shared: &Arc<Shared>, params: params::Id) -> Result<Answer, RpcError> {
    match shared.entry(params.session()).await {
        Ok(entry) => {
            let _ = entry.handle.cancel_turn().await.map_err(from_runtime)?;
        }
        // Nothing runs on a finalized session: the cancel is a no-op (G2).
        Err(e) if e.kind == ErrorKind::SessionClosed => {}
        Err(e) => return Err(e),
    }
    Ok(json!({}).into())
}

async fn hold(
    shared: &Arc<Shared>,
    params: params::HoldParams,
    hold: bool,
) -> Result<Answer, RpcError> {
    let entry = match shared.entry(SessionId(params.id)).await {
        Ok(entry) => entry,
        // Letting go of a finalized session's hold is a no-op (G2).
        Err(e) if !hold && e.kind == ErrorKind::SessionClosed => return Ok(json!({}).into()),
        Err(e) => return Err(e),
    };
    let which = params.hold.into();
    let done = if hold {
        entry.handle.hold(which).await
    } else {
        entry.handle.release(which).await
    };
    let _ = done.map_err(from_runtime)?;
    Ok(json!({}).into())
}

async fn close(shared: &Arc<Shared>, params: params::Id) -> Result<Answer, RpcError> {
    let id = params.session();
    let reason = match shared.entry(id).await {
        Ok(entry) => entry.handle.close().await.map_err(from_runtime)?,
        // Closing a closed session reports how it ended (G2).
        Err(e) if e.kind == ErrorKind::SessionClosed => {
            let detail = shared
                .kernel
                .session_detail(id)
                .await
                .map_err(from_runtime)?;
            match detail.session.end_reason {
                Some(reason) => reason,
                None => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    Ok(json!({ "end_reason": reason.as_str() }).into())
}

async fn list(shared: &Arc<Shared>, params: params::List) -> Result<Answer, RpcError> {
    let state = params.checked_state()?;
    let rows = shared
        .kernel
        .list_sessions(state)
        .await
        .map_err(from_runtime)?;
    Ok(crate::listing::rows(&rows).into())
}
