//! [`from_str`]: a frame's JSON read one way only. An object with a key
//! twice is refused, as I-JSON (RFC 7493) requires: JSON leaves such an
//! object's meaning open, and `serde_json` keeps the last value where
//! another reader (a proxy checking `method` or `id` before the gateway)
//! may keep the first, so the two would act on different requests.
//!
//! The check is made while the value is built, in one pass: no second parse,
//! and the depth limit of `serde_json`'s reader still applies.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// `text` as a JSON value, refused if any object in it has a key twice.
pub(crate) fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = Strict::read(&mut reader)?;
    reader.end()?;
    Ok(value)
}

/// Builds a [`Value`] as `serde_json` does, refusing a key seen twice.
struct Strict;

impl Strict {
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(Strict)
    }
}

impl<'de> de::DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Strict::read(deserializer)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate key `{key}`")));
            }
            let value = map.next_value_seed(Strict)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::from_str;

    #[test]
    fn reads_what_serde_json_reads_when_no_key_is_repeated() {
        for text in [
            r#"{"a":1,"b":[true,null,-2,3.5,"x",{"c":{}}],"d":18446744073709551615}"#,
            "[]",
            "\"\\u00e9\"",
            "-0.0",
            "1e400",
        ] {
            let ours = from_str(text);
            let theirs = serde_json::from_str::<serde_json::Value>(text);
            assert_eq!(ours.is_ok(), theirs.is_ok(), "{text}");
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                assert_eq!(ours, theirs, "{text}");
            }
        }
        assert_eq!(from_str(r#"{"a":{"a":1}}"#).unwrap(), json!({"a":{"a":1}}));
    }

    #[test]
    fn refuses_a_key_twice_at_any_depth_saying_which_and_where() {
        for (text, key) in [
            (r#"{"a":1,"a":2}"#, "a"),
            (r#"{"a":1,"b":{"c":1,"c":1}}"#, "c"),
            (r#"[{"x":[{"y":1,"y":2}]}]"#, "y"),
        ] {
            let error = from_str(text).unwrap_err().to_string();
            assert!(error.contains(&format!("duplicate key `{key}`")), "{error}");
            assert!(error.contains("column"), "{error}");
        }
    }

    #[test]
    fn keeps_serde_jsons_depth_limit_and_refuses_trailing_text() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(from_str(&deep).is_err());
        assert!(from_str("{} {}").is_err());
    }
}
