//! [`Chunk`]: one piece of a turn's output, text or structured.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use settle_core::ChunkKind;

/// One piece of a turn's output: a [`ChunkKind`] and its payload.
///
/// A text chunk holds its text as it came; every other kind holds JSON,
/// kept as JSON text (not a parsed [`serde_json::Value`]) because:
///
/// - text, the common case, costs one `String` and no JSON work at all;
/// - a chunk is persisted before anything else sees it (G7), and the store
///   writes the payload as it is: one column, nothing serialized per chunk;
/// - a provider's structured events are passed through, not interpreted:
///   a framework that wants the tree parses it with [`to_json`](Chunk::to_json).
///
/// The payload of a non-text chunk is always valid JSON: every constructor
/// checks or produces it. Serialized (for a turn's export or an API), a chunk
/// is `{"kind": "text", "payload": "hello"}` or
/// `{"kind": "tool_call", "payload": {...}}`: the payload of a text chunk is
/// its text as a JSON string, the others their JSON value.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{Chunk, ChunkKind};
///
/// let text = Chunk::text("Hello");
/// assert_eq!(text.as_text(), Some("Hello"));
///
/// let usage = Chunk::json(ChunkKind::Usage, &json!({"total_tokens": 12}));
/// assert_eq!(usage.payload(), r#"{"total_tokens":12}"#);
/// assert_eq!(usage.to_json()["total_tokens"], 12);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Chunk {
    kind: ChunkKind,
    // Text: the text. Any other kind: JSON text.
    payload: String,
}

/// A chunk's payload is not what its kind needs: JSON for every kind but text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the payload of a {kind} chunk is not valid JSON ({reason}); only text chunks hold plain text"
)]
pub struct InvalidChunk {
    /// The kind the payload was given for.
    pub kind: ChunkKind,
    /// What the JSON parser said.
    pub reason: String,
}

impl Chunk {
    /// A piece of the model's reply text.
    #[inline]
    pub fn text(text: impl Into<String>) -> Self {
        Chunk {
            kind: ChunkKind::Text,
            payload: text.into(),
        }
    }

    /// A chunk of `kind` carrying `value`. For [`ChunkKind::Text`] a string
    /// value becomes the text itself, and any other value its JSON text.
    pub fn json(kind: ChunkKind, value: &Value) -> Self {
        let payload = match (kind, value) {
            (ChunkKind::Text, Value::String(text)) => text.clone(),
            _ => value.to_string(),
        };
        Chunk { kind, payload }
    }

    /// A chunk from its stored parts (as [`kind`](Self::kind) and
    /// [`payload`](Self::payload) gave them). The payload of any kind but
    /// text must be valid JSON.
    pub fn from_parts(kind: ChunkKind, payload: String) -> Result<Self, InvalidChunk> {
        if kind != ChunkKind::Text {
            if let Err(e) = serde_json::from_str::<IgnoredAny>(&payload) {
                return Err(InvalidChunk {
                    kind,
                    reason: e.to_string(),
                });
            }
        }
        Ok(Chunk { kind, payload })
    }

    /// What the chunk carries.
    #[inline]
    pub fn kind(&self) -> ChunkKind {
        self.kind
    }

    /// Whether this is a piece of the reply text.
    #[inline]
    pub fn is_text(&self) -> bool {
        self.kind == ChunkKind::Text
    }

    /// The text of a text chunk; `None` for the other kinds.
    #[inline]
    pub fn as_text(&self) -> Option<&str> {
        self.is_text().then_some(self.payload.as_str())
    }

    /// The payload as stored: the text of a text chunk, the JSON text of
    /// the others.
    #[inline]
    pub fn payload(&self) -> &str {
        &self.payload
    }

    /// The payload as stored, by value.
    #[inline]
    pub fn into_payload(self) -> String {
        self.payload
    }

    /// The payload as a JSON value: a string for a text chunk, the parsed
    /// JSON for the others.
    pub fn to_json(&self) -> Value {
        if self.is_text() {
            return Value::String(self.payload.clone());
        }
        // Every constructor checked or produced valid JSON.
        serde_json::from_str(&self.payload).unwrap_or(Value::Null)
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chunk::{}({:?})", self.kind, self.payload)
    }
}

impl From<String> for Chunk {
    fn from(text: String) -> Self {
        Chunk::text(text)
    }
}

impl From<&str> for Chunk {
    fn from(text: &str) -> Self {
        Chunk::text(text)
    }
}

impl Serialize for Chunk {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut chunk = serializer.serialize_struct("Chunk", 2)?;
        chunk.serialize_field("kind", self.kind.as_str())?;
        if self.is_text() {
            chunk.serialize_field("payload", &self.payload)?;
        } else {
            chunk.serialize_field("payload", &self.to_json())?;
        }
        chunk.end()
    }
}

impl<'de> Deserialize<'de> for Chunk {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Parts {
            kind: String,
            payload: Value,
        }
        let Parts { kind, payload } = Parts::deserialize(deserializer)?;
        let kind: ChunkKind = kind.parse().map_err(de::Error::custom)?;
        match (kind, payload) {
            (ChunkKind::Text, Value::String(text)) => Ok(Chunk::text(text)),
            (ChunkKind::Text, other) => Err(de::Error::custom(format!(
                "the payload of a text chunk must be a string, not {other}"
            ))),
            (kind, value) => Ok(Chunk::json(kind, &value)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn a_chunk_round_trips_through_json() {
        let chunks = [
            Chunk::text("hello \"world\""),
            Chunk::json(ChunkKind::Reasoning, &json!("thinking")),
            Chunk::json(
                ChunkKind::ToolCall,
                &json!({"index": 0, "function": {"name": "ls", "arguments": "{\"path\""}}),
            ),
            Chunk::json(ChunkKind::Usage, &json!({"total_tokens": 3})),
        ];
        for chunk in chunks {
            let text = serde_json::to_string(&chunk).unwrap();
            let back: Chunk = serde_json::from_str(&text).unwrap();
            assert_eq!(back, chunk, "{text}");
        }
        assert_eq!(
            serde_json::to_value(Chunk::text("hi")).unwrap(),
            json!({"kind": "text", "payload": "hi"})
        );
        assert_eq!(
            serde_json::to_value(Chunk::json(ChunkKind::Usage, &json!({"n": 1}))).unwrap(),
            json!({"kind": "usage", "payload": {"n": 1}})
        );
    }

    #[test]
    fn only_text_chunks_hold_plain_text() {
        assert!(Chunk::from_parts(ChunkKind::Text, "not json".into()).is_ok());
        let err = Chunk::from_parts(ChunkKind::ToolCall, "not json".into()).unwrap_err();
        assert_eq!(err.kind, ChunkKind::ToolCall);
        assert!(err.to_string().contains("tool_call"), "{err}");
        let ok = Chunk::from_parts(ChunkKind::Data, r#"{"a":[1]}"#.into()).unwrap();
        assert_eq!(ok.to_json(), json!({"a": [1]}));
        assert_eq!(ok.as_text(), None);
        let bad: Result<Chunk, _> = serde_json::from_value(json!({"kind": "text", "payload": 1}));
        assert!(bad.is_err());
        let unknown: Result<Chunk, _> =
            serde_json::from_value(json!({"kind": "smell", "payload": 1}));
        assert!(unknown.unwrap_err().to_string().contains("smell"));
    }

    #[test]
    fn a_text_value_given_as_json_is_text() {
        let chunk = Chunk::json(ChunkKind::Text, &json!("plain"));
        assert_eq!(chunk.as_text(), Some("plain"));
        assert_eq!(chunk.to_json(), json!("plain"));
    }
}
