//! The scenario file as TOML says it, before validation.
//!
//! Serde checks the syntax, the key names (`deny_unknown_fields`) and the
//! value types; everything that relates values to each other (names,
//! parents, ranges) is checked afterwards, in `validate`. Values keep their
//! spans so that those later errors can still point at a line and column.

use serde::Deserialize;
use toml::Spanned;

use super::TurnEnd;

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
    pub(crate) end: Option<Spanned<TurnEnd>>,
    /// `close_delay_ms`.
    pub(crate) close_delay_ms: Option<Spanned<i64>>,
    /// `ignore_ms`.
    pub(crate) ignore_ms: Option<Spanned<i64>>,
}
