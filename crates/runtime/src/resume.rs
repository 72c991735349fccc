//! Continuing a stored session in a new one (`settle chat --resume`): the
//! conversation as it was sent and answered, read back from the store, and
//! [`Kernel::resume`], which registers the new session with it.

use std::sync::Arc;

use settle_core::{Outcome, SessionId, State};
use settle_store::{Conversation, SessionDetail};
use settle_stream::{Message, ReplyBuilder, ToolCall};

use crate::command::Command;
use crate::error::RuntimeError;
use crate::kernel::Kernel;
use crate::session::SessionHandle;

/// A new session that continues an earlier one, and the conversation to
/// send with its next turn.
#[derive(Debug)]
#[non_exhaustive]
pub struct Resumed {
    /// The new session (its row names the one it continues).
    pub session: SessionHandle,
    /// The session it continues.
    pub from: SessionId,
    /// The messages of the earlier session, oldest first: what its last
    /// turn was sent, then its reply unless the turn failed; a reply that
    /// asked for tools is the assistant message with its tool calls, so
    /// the conversation goes on from them.
    pub history: Vec<Message>,
    /// The tool calls of that last reply, which no tool has answered yet:
    /// run them and send their results
    /// ([`Message::tool_result`]) with the next turn. Empty unless that
    /// reply completed: the calls of one cut short (cancelled, interrupted
    /// by a crash) may have lost the end of their arguments.
    pub pending_tool_calls: Vec<ToolCall>,
}

/// The conversation stored for `detail`: what its last turn that has an
/// input was sent, rebuilt from what each turn added (the store keeps a
/// turn's additions, not the whole history again), then that turn's reply
/// text, unless the turn failed (the prompt stays, the failed reply does
/// not, as `settle chat` keeps it).
///
/// # Errors
/// [`RuntimeError::NotResumable`] when the session is not finalized: it may
/// still be live in another process, or was left by one that crashed and
/// must be recovered first.
pub(crate) fn history(
    detail: &SessionDetail,
) -> Result<(Vec<Message>, Vec<ToolCall>), RuntimeError> {
    let session = &detail.session;
    if session.state != State::Finalized {
        return Err(RuntimeError::NotResumable {
            session: session.id,
            state: session.state,
        });
    }
    Ok(conversation(detail))
}

/// The conversation stored for `detail`, as [`history`] says, whatever the
/// session's state (an adopted session is open): the messages, and the
/// tool calls of the last reply that no tool has answered yet.
pub(crate) fn conversation(detail: &SessionDetail) -> (Vec<Message>, Vec<ToolCall>) {
    let Some(last) = detail.turns.iter().rposition(|t| t.input.is_some()) else {
        return (Vec::new(), Vec::new());
    };
    let mut conversation = Conversation::new();
    for turn in &detail.turns[..=last] {
        let _ = conversation.turn(turn);
    }
    let outcome = detail.turns[last].outcome;
    let failed = matches!(outcome, Some(Outcome::Failed | Outcome::IdleTimeout));
    // Only a reply read to its end asks for tools: one cut short (cancelled,
    // interrupted by a crash, detached) may stop mid-arguments, and running
    // its calls would run what the model never asked for (G7).
    let whole = outcome == Some(Outcome::Completed);
    // The last reply, put together: its tool calls are the conversation's
    // next step, not only its text.
    let mut reply = ReplyBuilder::default();
    for chunk in &detail.turns[last].chunks {
        let payload = chunk
            .data
            .clone()
            .unwrap_or_else(|| serde_json::Value::String(chunk.text.clone()));
        reply.push_json(chunk.kind, &payload);
    }
    let reply = reply.finish();
    let pending = whole && !reply.tool_calls.is_empty();
    let mut history: Vec<Message> = conversation
        .into_messages(!failed && !pending)
        .into_iter()
        .filter_map(|message| serde_json::from_value(message).ok())
        .collect();
    if !pending {
        return (history, Vec::new());
    }
    history.push(reply.to_message());
    (history, reply.tool_calls)
}

impl Kernel {
    /// Registers a new session named `name` that continues the stored
    /// session `from` (finished, or finalized by recovery after a crash), and
    /// returns it with the conversation to send with its next turn. The new
    /// session's row names `from` (`resumed_from`). When `from` ran no turn
    /// (a chat resumed and left at once), the conversation is the one it
    /// resumed, followed back as far as sessions ran nothing.
    ///
    /// # Errors
    /// [`RuntimeError::NotResumable`] when `from` is not finalized (recover
    /// it first), a store error when it cannot be read, or what
    /// [`register`](Self::register) returns.
    pub async fn resume(
        &self,
        from: SessionId,
        name: impl Into<String>,
    ) -> Result<Resumed, RuntimeError> {
        let name = name.into();
        crate::session::check_name(&name)?;
        let what = "reading the session to resume";
        let read = |id: SessionId| self.read_store(what, self.store().session_detail(id));
        let detail = read(from).await?;
        let (mut history, mut pending_tool_calls) = history(&detail)?;
        // A session that ran no turn (a chat resumed and left at once)
        // continues the one it resumed: its conversation is that one's, not
        // none. Followed back as far as sessions ran nothing, a loop (a
        // store changed outside settle) stopping the walk.
        let mut seen = vec![from];
        let mut back = detail.session.resumed_from;
        while let Some(earlier) =
            back.filter(|id| history.is_empty() && !seen.contains(id) && seen.len() < 1024)
        {
            seen.push(earlier);
            let detail = read(earlier).await?;
            (history, pending_tool_calls) = conversation(&detail);
            back = detail.session.resumed_from;
        }
        let name: Arc<str> = name.into();
        let shared = self
            .register_command(|reply| Command::Register {
                name,
                parent: None,
                resumed_from: Some(from),
                budget: None,
                // A root: the shared scope.
                scope: None,
                principal: None,
                reply,
            })
            .await?;
        Ok(Resumed {
            session: SessionHandle::new(shared, self.clone()),
            from,
            history,
            pending_tool_calls,
        })
    }
}
