//! The scenario file as TOML says it, before validation.
//!
//! Serde checks the syntax, the key names (`deny_unknown_fields`) and the
//! value types; everything that relates values to each other (names,
//! parents, ranges) is checked afterwards, in `validate`. Values keep their
//! spans so that those later errors can still point at a line and column.

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::TurnEnd;

/// `end` as written: one of the scripted provider's turn ends, read through
/// its own spelling so the file and the provider cannot drift apart.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawEnd(pub(crate) TurnEnd);

/// The spellings serde lists when a value is not one of them.
const END_SPELLINGS: &[&str] = &["complete", "fail", "hang", "self_cancel", "ignore_cancel"];

impl<'de> Deserialize<'de> for RawEnd {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse()
            .map(RawEnd)
            .map_err(|_| serde::de::Error::unknown_variant(&text, END_SPELLINGS))
    }
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScenario {
    /// `name`.
    pub(crate) name: Spanned<String>,
    /// `settle_timeout_ms`.
    pub(crate) settle_timeout_ms: Option<Spanned<i64>>,
    /// `idle_timeout_ms`.
    pub(crate) idle_timeout_ms: Option<Spanned<i64>>,
    /// `[[agent]]`.
    #[serde(default)]
    pub(crate) agent: Vec<Spanned<RawAgent>>,
}

/// One `[[agent]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    /// `name`.
    pub(crate) name: Spanned<String>,
    /// `parent`.
    pub(crate) parent: Option<Spanned<String>>,
    /// `spawn_after_ms`.
    pub(crate) spawn_after_ms: Option<Spanned<i64>>,
    /// `count`: this entry stands for that many agents, `name-1` … `name-N`.
    pub(crate) count: Option<Spanned<i64>>,
    /// `[[agent.turn]]`.
    #[serde(default)]
    pub(crate) turn: Vec<Spanned<RawTurn>>,
}

/// One `[[agent.turn]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTurn {
    /// `chunks` (absent means none).
    #[serde(default)]
    pub(crate) chunks: Vec<String>,
    /// `chunk_delay_ms`.
    pub(crate) chunk_delay_ms: Option<Spanned<i64>>,
    /// `end`.
    pub(crate) end: Option<Spanned<RawEnd>>,
    /// `close_delay_ms`.
    pub(crate) close_delay_ms: Option<Spanned<i64>>,
    /// `ignore_ms`.
    pub(crate) ignore_ms: Option<Spanned<i64>>,
}
