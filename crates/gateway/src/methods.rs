//! The methods of SPEC §10, each a thin call into the runtime. None decides
//! anything about a session's lifecycle: the core admits or refuses a turn,
//! a hold, a transport; sweepers and the shutdown are the kernel's.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};
use settle_runtime::{Handled, RuntimeError, SessionId, State, TurnRequest};
use settle_store::SessionFilter;
use settle_stream::{Message, Role};

use crate::auth::Principal;
use crate::listing;
use crate::outbox::Outbox;
use crate::params::{self, read};
use crate::protocol::{code, ErrorKind, RpcError};
use crate::pump::Started;
use crate::reading;
use crate::shared::{finalized_notification, Shared};
use crate::table::{ConnId, Entry};

/// Who is asking: the connection, the principal it speaks for, its queue,
/// and the sessions it is attached to (as transports).
pub(crate) struct Caller<'a> {
    pub conn: ConnId,
    pub principal: &'a Principal,
    pub outbox: &'a Outbox,
    pub attached: &'a mut HashSet<SessionId>,
}

/// A method's result, and a turn to run once it is queued (so that the
/// answer to `turn.start` reaches its caller before the turn's first chunk),
/// or a notification to queue right after it.
pub(crate) struct Answer {
    pub result: Value,
    pub started: Option<Started>,
    pub then: Option<String>,
}

impl From<Value> for Answer {
    fn from(result: Value) -> Self {
        Answer {
            result,
            started: None,
            then: None,
        }
    }
}

fn session_closed(id: SessionId) -> RpcError {
    RpcError::new(
        code::SESSION_CLOSED,
        ErrorKind::SessionClosed,
        format!("session {id} is finalized; its handle is closed"),
    )
}

fn over_capacity(principal: &Principal, live: usize) -> RpcError {
    tracing::warn!(%principal, live, "refused a session: the principal has its maximum of live sessions");
    RpcError::new(
        code::OVER_CAPACITY,
        ErrorKind::OverCapacity,
        format!("{principal} has {live} live sessions, its maximum: close one first"),
    )
}

fn over_holds(principal: &Principal, held: usize) -> RpcError {
    tracing::warn!(%principal, held, "refused a hold: the principal has its maximum of holds");
    RpcError::new(
        code::OVER_CAPACITY,
        ErrorKind::OverCapacity,
        format!("{principal} has {held} holds, its maximum: release one first"),
    )
}

fn wrong_state(message: String) -> RpcError {
    RpcError::new(code::WRONG_STATE, ErrorKind::WrongState, message)
}

fn from_runtime(error: RuntimeError) -> RpcError {
    RpcError::from_runtime(&error)
}

/// The entry of session `id` if `caller`'s principal owns it; another
/// principal's session is `not_found`, as if it did not exist. Every
/// method about a session asks this first.
async fn owned(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    id: SessionId,
) -> Result<Arc<Entry>, RpcError> {
    owned_or_adopted(shared, caller, id, false).await
}

/// [`owned`], and with `adopt` (an attach), in a fleet, a released session
/// is adopted here first: its principal comes from the store, and is asked
/// once it is known (SPEC §12).
async fn owned_or_adopted(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    id: SessionId,
    adopt: bool,
) -> Result<Arc<Entry>, RpcError> {
    let mine_here = shared.owners.knows(id) && shared.owners.may_use(caller.principal, id);
    if !mine_here {
        // Another principal's as far as this process knows, or one it does
        // not know: whose it is, the store says, asked the same way for
        // both, so that neither the answer, nor how long it takes, nor how
        // it fails while the store is down tells another principal's
        // session from one that does not exist (SPEC §10).
        let recorded = shared.recorded_owner(id).await?;
        if recorded != *caller.principal {
            return Err(RpcError::not_found(id.get()));
        }
        shared.owners.recorded(recorded, id);
    }
    let entry = shared.entry(id, adopt, caller.principal).await?;
    if !shared.owners.may_use(caller.principal, id) {
        return Err(RpcError::not_found(id.get()));
    }
    Ok(entry)
}

/// Calls `method` for `caller`.
pub(crate) async fn call(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    method: &str,
    params: Value,
) -> Result<Answer, RpcError> {
    let session = params.get("id").and_then(Value::as_u64);
    let answer = dispatch(shared, caller, method, params).await;
    match (answer, session) {
        (Err(error), Some(id)) if error.kind == ErrorKind::Elsewhere && error.owner.is_none() => {
            Err(where_it_went(shared, id, error).await)
        }
        (answer, _) => answer,
    }
}

/// An `elsewhere` that does not say where (the store refused this
/// process's write of a session adopted elsewhere meanwhile) with the URL
/// of the process that owns it now, if a live one does (SPEC §12): asked
/// of the store once; left as it is when the store does not say.
async fn where_it_went(shared: &Shared, id: u64, error: RpcError) -> RpcError {
    if shared.fleet.is_none() {
        return error;
    }
    match shared.kernel.locate(SessionId(id)).await {
        Ok(settle_store::Whereabouts::Owned {
            owner,
            advertise: Some(url),
            live: true,
        }) if owner != shared.kernel.owner() => RpcError::elsewhere(id, Some(url)),
        _ => error,
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    method: &str,
    params: Value,
) -> Result<Answer, RpcError> {
    match method {
        "session.create" => create(shared, caller, read(params)?).await,
        "session.attach" => attach(shared, caller, read(params)?).await,
        "session.detach" => detach(shared, caller, read(params)?).await,
        "turn.start" => turn_start(shared, caller, read(params)?).await,
        "turn.cancel" => turn_cancel(shared, caller, read(params)?).await,
        "session.hold" => hold(shared, caller, read(params)?, true).await,
        "session.release" => hold(shared, caller, read(params)?, false).await,
        "session.close" => close(shared, caller, read(params)?).await,
        "sessions.list" => list(shared, caller, read(params)?).await,
        "session.read" => session_read(shared, caller, read(params)?).await,
        other => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            ErrorKind::BadRequest,
            format!(
                "no method `{}`; the methods are session.create, session.attach, \
                 session.detach, turn.start, turn.cancel, session.hold, session.release, \
                 session.close, session.read and sessions.list",
                crate::excerpt::bounded(other, crate::excerpt::MAX_QUOTED_CHARS)
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
    // A closed handle is not attached to anything any more: the core
    // answers the attach (G10) instead of this connection's stale record.
    if entry.handle.is_closed() {
        caller.attached.remove(&id);
    } else if caller.attached.contains(&id) {
        return Ok(());
    }
    let _ = entry
        .handle
        .attach_transport(close_on_disconnect)
        .await
        .map_err(from_runtime)?;
    caller.attached.insert(id);
    entry.watch(caller.conn, caller.outbox).map_err(|_| {
        // Finalized meanwhile: never watched, this connection would not hear
        // of its end, and would count it as attached for good.
        caller.attached.remove(&id);
        session_closed(id)
    })
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
    // A parent of an earlier run is looked up first, so that the core knows
    // it as finalized and answers for it.
    if let Some(parent) = parent {
        owned(shared, caller, parent).await?;
    }
    let place = shared
        .owners
        .reserve(caller.principal, shared.limits.max_sessions_per_principal)
        .map_err(|live| over_capacity(caller.principal, live))?;
    // At the `--max-sessions` cap it evicts only its own principal's idle
    // sessions, never another's.
    let scope = shared.kernel.scope_of(caller.principal.name());
    // A named principal's is recorded as its with its row, in one write.
    let registered = match caller.principal.name() {
        Some(principal) => {
            shared
                .kernel
                .register_for(principal, scope, name, parent)
                .await
        }
        None => shared.kernel.register_in(scope, name, parent).await,
    };
    let handle = registered.map_err(from_runtime)?;
    let id = handle.id();
    place.own(id);
    let entry = shared.adopt(handle);
    let created = json!({ "id": id.get() });
    match attach_caller(caller, &entry, params.close_on_disconnect).await {
        Ok(()) => Ok(created.into()),
        // Evicted under the `--max-sessions` cap by its principal's other
        // creates before its creator could attach (the cap takes the least
        // recently active idle sessions, and a new one is idle): the session was
        // made, and has ended. Said as it happened, its id and then its
        // end, as for any session the cap evicts; not as a refusal naming
        // an id its caller was never given.
        Err(refused) if refused.kind == ErrorKind::SessionClosed => {
            let reason = entry.handle.finalized().await.map_err(|_| refused)?;
            Ok(Answer {
                result: created,
                started: None,
                then: Some(finalized_notification(id, reason)),
            })
        }
        Err(refused) => Err(refused),
    }
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
    let entry = owned_or_adopted(shared, caller, params.session(), true).await?;
    attach_caller(caller, &entry, false).await?;
    state_of(&entry).await
}

async fn detach(
    shared: &Arc<Shared>,
    caller: &mut Caller<'_>,
    params: params::Id,
) -> Result<Answer, RpcError> {
    let id = params.session();
    let entry = owned(shared, caller, id).await?;
    // Not attached through this connection: nothing to let go of.
    if caller.attached.remove(&id) {
        entry.unwatch(caller.conn);
        let _ = entry
            .handle
            .detach_transport()
            .await
            .map_err(from_runtime)?;
    }
    state_of(&entry).await
}

async fn turn_start(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    params: params::TurnStart,
) -> Result<Answer, RpcError> {
    if shared.kernel.is_shutting_down() {
        return Err(RpcError::shutting_down());
    }
    let id = SessionId(params.id);
    let entry = owned(shared, caller, id).await?;
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
            _ => entry.conversation.clone().lock_owned().await,
        },
    };
    // The prompt and the history sent with it are bounded by the kernel
    // (`max_prompt_bytes`, `max_history_bytes`), which refuses a turn over
    // either before anything is written: `too_large`.
    let prompt = Message::new(Role::User, params.prompt);
    if let Err(limit) = shared
        .table
        .held()
        .room_for(crate::conversation::size_of(&prompt))
    {
        tracing::warn!(session = %id, limit, "refused a turn: the gateway holds its maximum of conversation bytes");
        return Err(RpcError::new(
            code::OVER_CAPACITY,
            ErrorKind::OverCapacity,
            format!(
                "the gateway holds its maximum of conversation bytes in memory \
                 (--max-history-memory {limit}); nothing was written: close sessions, \
                 or try again once some are finalized"
            ),
        ));
    }
    let mut messages = conversation.messages().to_vec();
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
        then: None,
    })
}

/// How long past the settle timeout `turn.cancel` waits for the turn's end
/// before it answers all the same (the end's write may wait on the store).
const CANCEL_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

async fn turn_cancel(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    params: params::Id,
) -> Result<Answer, RpcError> {
    let entry = owned(shared, caller, params.session()).await?;
    let _ = entry.handle.cancel_turn().await.map_err(from_runtime)?;
    // Answered once the turn has ended (its pump lets the conversation go
    // then), within the settle timeout and a margin: a client that sends
    // its next turn.start as soon as this answers (a user's "stop, then
    // the next message") finds the session ready for it.
    let bound = shared.kernel.settle_timeout().saturating_add(CANCEL_MARGIN);
    let _ = tokio::time::timeout(bound, entry.conversation.lock()).await;
    Ok(json!({}).into())
}

async fn hold(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    params: params::HoldParams,
    hold: bool,
) -> Result<Answer, RpcError> {
    let id = SessionId(params.id);
    let entry = owned(shared, caller, id).await?;
    let which = params.hold.into();
    if hold {
        let place = shared
            .owners
            .reserve_hold(caller.principal, shared.limits.max_holds_per_principal)
            .map_err(|held| over_holds(caller.principal, held))?;
        let done = entry.handle.hold(which).await.map_err(from_runtime)?;
        if done == Handled::Applied {
            place.keep(id);
        }
    } else {
        let done = entry.handle.release(which).await.map_err(from_runtime)?;
        if done == Handled::Applied {
            shared.owners.released_hold(id);
        }
    }
    Ok(json!({}).into())
}

async fn close(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    params: params::Id,
) -> Result<Answer, RpcError> {
    let entry = owned(shared, caller, params.session()).await?;
    // Closing a closed session reports how it ended (G2).
    let reason = entry.handle.close().await.map_err(from_runtime)?;
    Ok(json!({ "end_reason": reason.as_str() }).into())
}

async fn session_read(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    params: params::Read,
) -> Result<Answer, RpcError> {
    let id = SessionId(params.id);
    match owned(shared, caller, id).await {
        Ok(_) => {}
        // Its principal's, live in the store and served by no process here
        // (one that stopped left it): what it stored is read all the same.
        Err(error) if error.kind == ErrorKind::LeftForRecovery => {}
        Err(error) => return Err(error),
    }
    let from = reading::From {
        turn: params.turn,
        seq: params.seq,
        part: params.part,
    };
    let limits = &shared.limits;
    let (page_bytes, part_bytes) = (limits.page_bytes(), limits.part_bytes());
    // Only the chunks a page can hold are read: each takes a part at least.
    let rows = reading::most_chunks(id, page_bytes, part_bytes);
    let page = shared
        .kernel
        .turn_page(id, from.turn, from.seq, rows)
        .await
        .map_err(|error| match error {
            // Not written yet: as good as not there.
            RuntimeError::Store(settle_store::StoreError::UnknownSession(_)) => {
                RpcError::not_found(id.get())
            }
            error => from_runtime(error),
        })?;
    Ok(reading::page(id, &page, from, page_bytes, part_bytes)?.into())
}

async fn list(
    shared: &Arc<Shared>,
    caller: &Caller<'_>,
    params: params::List,
) -> Result<Answer, RpcError> {
    let state = params.checked_state()?;
    let since = params.checked_since()?;
    let limit = params.checked_limit()?;
    let mut filter = SessionFilter::all().in_state_opt(state);
    if let Some(since) = since {
        filter = filter.since(since);
    }
    if let Some(after) = params.checked_cursor()? {
        filter = filter.after(after);
    }
    // Asked for by the principal the store recorded for each (another
    // process's, or one's of before a restart, included), in the page's
    // query: another's never take a place in it.
    filter = filter.of_principal(caller.principal.name().map(str::to_owned));
    let rows = shared
        .kernel
        .list_sessions_where(listing::filter(filter, limit))
        .await
        .map_err(from_runtime)?;
    Ok(listing::page(&rows, limit, shared.limits.page_bytes()).into())
}
