//! The params of each method (SPEC §10), read strictly: a missing field, a
//! field of the wrong type or an unknown field is a `bad_request`, so that a
//! typo (`close_on_disconect`) is an error and not a silent default.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use settle_runtime::{Hold, SessionId, State};

use crate::protocol::RpcError;

/// The longest session name accepted, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// Reads `params` as `T`.
pub(crate) fn read<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(RpcError::bad_params)
}

/// `session.create`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Create {
    pub name: String,
    #[serde(default)]
    pub parent: Option<u64>,
    #[serde(default)]
    pub close_on_disconnect: bool,
}

impl Create {
    /// The name, checked: not blank, at most [`MAX_NAME_CHARS`].
    pub fn checked_name(&self) -> Result<&str, RpcError> {
        let chars = self.name.chars().count();
        if self.name.trim().is_empty() {
            return Err(RpcError::bad_params("`name` must not be blank"));
        }
        if chars > MAX_NAME_CHARS {
            return Err(RpcError::bad_params(format!(
                "`name` is {chars} characters long; at most {MAX_NAME_CHARS} are accepted"
            )));
        }
        Ok(&self.name)
    }
}

/// The params of the methods about one session: `session.attach`,
/// `session.detach`, `turn.cancel`, `session.close`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Id {
    pub id: u64,
}

impl Id {
    pub fn session(&self) -> SessionId {
        SessionId(self.id)
    }
}

/// `turn.start`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TurnStart {
    pub id: u64,
    pub prompt: String,
}

/// `session.hold` and `session.release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HoldParams {
    pub id: u64,
    pub hold: HoldWord,
}

/// What a hold waits on, as the protocol spells it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HoldWord {
    /// Input asked of a person (an approval prompt).
    Input,
    /// A delegation still outstanding.
    Delegation,
}

impl From<HoldWord> for Hold {
    fn from(word: HoldWord) -> Hold {
        match word {
            HoldWord::Input => Hold::PendingInput,
            HoldWord::Delegation => Hold::Delegation,
        }
    }
}

/// `sessions.list`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct List {
    #[serde(default)]
    pub state: Option<String>,
}

impl List {
    /// The state asked for, checked against the vocabulary.
    pub fn checked_state(&self) -> Result<Option<State>, RpcError> {
        self.state
            .as_deref()
            .map(str::parse::<State>)
            .transpose()
            .map_err(RpcError::bad_params)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelt_or_missing_field_is_refused() {
        assert!(read::<Create>(json!({"name": "a", "close_on_disconect": true})).is_err());
        assert!(read::<TurnStart>(json!({"id": 1})).is_err());
        assert!(read::<Id>(json!({"id": "1"})).is_err());
        assert!(read::<HoldParams>(json!({"id": 1, "hold": "lunch"})).is_err());
        let create: Create = read(json!({"name": "a"})).unwrap();
        assert!(!create.close_on_disconnect);
        assert_eq!(create.parent, None);
    }

    #[test]
    fn names_and_states_are_checked() {
        let blank: Create = read(json!({"name": "  "})).unwrap();
        assert!(blank.checked_name().is_err());
        let long: Create = read(json!({"name": "x".repeat(MAX_NAME_CHARS + 1)})).unwrap();
        assert!(long.checked_name().is_err());
        let list: List = read(json!({"state": "sleeping"})).unwrap();
        assert!(list.checked_state().is_err());
        let list: List = read(json!({"state": "finalized"})).unwrap();
        assert_eq!(list.checked_state().unwrap(), Some(State::Finalized));
    }
}
