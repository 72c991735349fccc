//! A turn as people and scripts read it: the input that was sent, the reply
//! as one flowing text, how it ended and, for a failed turn, why.
//!
//! [`input`] and [`error`] are the one place that reads a turn's input and
//! error from the store's rows; a turn written before the store kept them
//! has none, and `show`, `show --json` and `export` leave them out.
//!
//! ```
//! use settle_cli::transcript::{new_messages, InputMessage};
//!
//! let first = vec![InputMessage::new("user", "hi")];
//! let second = vec![
//!     InputMessage::new("user", "hi"),
//!     InputMessage::new("assistant", "hello!"),
//!     InputMessage::new("user", "how are you?"),
//! ];
//! // A chat sends its whole history each turn: only the last message is new.
//! assert_eq!(new_messages(Some((&first, "hello!")), &second), &second[2..]);
//! ```

use serde::Serialize;
use settle_store::TurnRow;

/// One message of a turn's input: who wrote it and what it says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// What it says.
    pub content: String,
}

impl InputMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        InputMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Why a turn failed: a kind to sort by (`http_status`, `connect`,
/// `timeout`, ...) and a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TurnFailure {
    /// What kind of failure.
    pub kind: String,
    /// What happened, in words.
    pub message: String,
}

/// The messages sent to the provider for `turn`, where the store keeps them
/// (a JSON array of `{role, content, ...}`, as the runtime serializes them).
pub fn input(turn: &TurnRow) -> Option<Vec<InputMessage>> {
    let messages = turn.input.as_ref()?.as_array()?;
    Some(
        messages
            .iter()
            .map(|m| {
                let text = |key: &str| m.get(key).and_then(|v| v.as_str()).unwrap_or_default();
                InputMessage::new(text("role"), text("content"))
            })
            .collect(),
    )
}

/// Why `turn` failed, where the store keeps it.
pub fn error(turn: &TurnRow) -> Option<TurnFailure> {
    turn.error.as_ref().map(|e| TurnFailure {
        kind: e.kind.as_str().to_owned(),
        message: e.message.clone(),
    })
}

/// The reply of `turn`: its text chunks joined in order, as the model wrote
/// them (tool calls, reasoning and usage are not part of the reply text).
pub fn text(turn: &TurnRow) -> String {
    turn.text()
}

/// What `input` adds to the conversation after the turn before it: a chat
/// sends its whole history with each turn, so when `input` begins with the
/// previous turn's input and then its reply (`previous`), only the rest is
/// new. Otherwise all of `input` is.
pub fn new_messages<'a>(
    previous: Option<(&[InputMessage], &str)>,
    input: &'a [InputMessage],
) -> &'a [InputMessage] {
    let Some((before, reply)) = previous else {
        return input;
    };
    let history = before.len();
    let continues = input.len() > history
        && input[..history] == *before
        && input[history].role == "assistant"
        && input[history].content == reply;
    if continues {
        &input[history + 1..]
    } else {
        input
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> InputMessage {
        InputMessage::new("user", text)
    }

    #[test]
    fn a_fresh_input_is_all_new() {
        let input = [InputMessage::new("system", "be brief"), user("hi")];
        assert_eq!(new_messages(None, &input), &input);
        // A scripted agent sends a new prompt each turn.
        let earlier = [user("root turn 1")];
        let later = [user("root turn 2")];
        assert_eq!(new_messages(Some((&earlier, "done")), &later), &later);
    }

    #[test]
    fn a_history_that_does_not_match_the_reply_is_shown_whole() {
        let earlier = [user("hi")];
        let later = [
            user("hi"),
            InputMessage::new("assistant", "edited"),
            user("and?"),
        ];
        assert_eq!(new_messages(Some((&earlier, "hello")), &later), &later);
    }
}
