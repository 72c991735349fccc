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
/// - text, the common case, costs one `String` and no JSON work at all (a
///   chunk is the size of a `String`; the other kinds pay one box);
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
pub struct Chunk(Repr);

// A text chunk is a bare `String`, so a chunk is as small as one (its
// capacity's niche tells the variants apart) and is moved through the
// stream wrappers as cheaply; the rarer structured chunks pay one box.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Text(String),
    Json(Box<Structured>),
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Structured {
    // Never `Text`.
    kind: ChunkKind,
    json: String,
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
        Chunk(Repr::Text(text.into()))
    }

    /// A chunk of `kind` carrying `value`. For [`ChunkKind::Text`] a string
    /// value becomes the text itself, and any other value its JSON text.
    pub fn json(kind: ChunkKind, value: &Value) -> Self {
        match (kind, value) {
            (ChunkKind::Text, Value::String(text)) => Chunk::text(text.clone()),
            (ChunkKind::Text, value) => Chunk::text(value.to_string()),
            (kind, value) => Chunk::structured(kind, value.to_string()),
        }
    }

    fn structured(kind: ChunkKind, json: String) -> Self {
        Chunk(Repr::Json(Box::new(Structured { kind, json })))
    }

    /// A chunk from its stored parts (as [`kind`](Self::kind) and
    /// [`payload`](Self::payload) gave them). The payload of any kind but
    /// text must be valid JSON.
    pub fn from_parts(kind: ChunkKind, payload: String) -> Result<Self, InvalidChunk> {
        if kind == ChunkKind::Text {
            return Ok(Chunk::text(payload));
        }
        if let Err(e) = serde_json::from_str::<IgnoredAny>(&payload) {
            return Err(InvalidChunk {
                kind,
                reason: e.to_string(),
            });
        }
        Ok(Chunk::structured(kind, payload))
    }

    /// What the chunk carries.
    #[inline]
    pub fn kind(&self) -> ChunkKind {
        match &self.0 {
            Repr::Text(_) => ChunkKind::Text,
            Repr::Json(structured) => structured.kind,
        }
    }

    /// Whether this is a piece of the reply text.
    #[inline]
    pub fn is_text(&self) -> bool {
        matches!(self.0, Repr::Text(_))
    }

    /// The text of a text chunk; `None` for the other kinds.
    #[inline]
    pub fn as_text(&self) -> Option<&str> {
        match &self.0 {
            Repr::Text(text) => Some(text),
            Repr::Json(_) => None,
        }
    }

    /// The payload as stored: the text of a text chunk, the JSON text of
    /// the others.
    #[inline]
    pub fn payload(&self) -> &str {
        match &self.0 {
            Repr::Text(text) => text,
            Repr::Json(structured) => &structured.json,
        }
    }

    /// The payload as stored, by value.
    #[inline]
    pub fn into_payload(self) -> String {
        match self.0 {
            Repr::Text(text) => text,
            Repr::Json(structured) => structured.json,
        }
    }

    /// The payload as a JSON value: a string for a text chunk, the parsed
    /// JSON for the others.
    pub fn to_json(&self) -> Value {
        match &self.0 {
            Repr::Text(text) => Value::String(text.clone()),
            // Every constructor checked or produced valid JSON.
            Repr::Json(structured) => serde_json::from_str(&structured.json).unwrap_or(Value::Null),
        }
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chunk::{}({:?})", self.kind(), self.payload())
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
        chunk.serialize_field("kind", self.kind().as_str())?;
        match &self.0 {
            Repr::Text(text) => chunk.serialize_field("payload", text)?,
            Repr::Json(_) => chunk.serialize_field("payload", &self.to_json())?,
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
    fn a_chunk_is_no_bigger_than_a_string() {
        assert_eq!(std::mem::size_of::<Chunk>(), std::mem::size_of::<String>());
        assert_eq!(
            std::mem::size_of::<crate::StreamEvent>(),
            std::mem::size_of::<String>()
        );
    }

    #[test]
    fn a_text_value_given_as_json_is_text() {
        let chunk = Chunk::json(ChunkKind::Text, &json!("plain"));
        assert_eq!(chunk.as_text(), Some("plain"));
        assert_eq!(chunk.to_json(), json!("plain"));
    }
}
