//! [`ScriptBook`]: a scripted provider that answers each prompt with its own
//! turn script, for tests and demos of a gateway without a model server.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use settle_stream::{
    Provider, ProviderStream, Request, Role, ScriptedEnd, ScriptedProvider, StreamError,
    StreamErrorKind, TurnScript,
};

use crate::ScriptBookError;

/// The longest duration a script book accepts for any `*_ms` key (24 h).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The largest script book file read, in bytes (1 MiB).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A provider that plays the turn script its book has for the prompt (the
/// last user message of the request), or the default script; with neither,
/// the turn fails with a provider error naming the prompt. Unlike
/// [`ScriptedProvider`], every turn with the same prompt plays the same
/// script, whichever session asks.
///
/// As TOML (what `settle serve --scripted FILE` reads), with the keys of a
/// scenario's `[[agent.turn]]`: `chunks`, `chunk_delay_ms`, `end`
/// (`complete`, `fail`, `hang`, `self_cancel` or `ignore_cancel`),
/// `close_delay_ms`, `ignore_ms`:
///
/// ```
/// let book = settle_gateway::ScriptBook::parse(r#"
/// [default]
/// chunks = ["I hear you."]
///
/// [prompt."count to three"]
/// chunks = ["one", " two", " three"]
/// chunk_delay_ms = 100
/// end = "complete"
/// "#)?;
/// assert!(book.script_for("count to three").is_some());
/// # Ok::<(), settle_gateway::ScriptBookError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptBook {
    default: Option<TurnScript>,
    prompts: HashMap<String, TurnScript>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBook {
    #[serde(default)]
    default: Option<RawTurn>,
    #[serde(default)]
    prompt: HashMap<String, RawTurn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    #[serde(default)]
    chunks: Vec<String>,
    #[serde(default)]
    chunk_delay_ms: u64,
    #[serde(default)]
    end: Option<String>,
    #[serde(default)]
    close_delay_ms: u64,
    #[serde(default)]
    ignore_ms: Option<u64>,
}

impl RawTurn {
    fn script(self, at: &str) -> Result<TurnScript, String> {
        let ms = |key: &str, value: u64| {
            let duration = Duration::from_millis(value);
            if duration > MAX_DURATION {
                Err(format!("{at}: `{key}` is longer than the 24 h limit"))
            } else {
                Ok(duration)
            }
        };
        let end = match self.end.as_deref() {
            None => ScriptedEnd::Complete,
            Some(word) => word.parse().map_err(|e| format!("{at}: `end`: {e}"))?,
        };
        let mut script = TurnScript::new(self.chunks)
            .chunk_delay(ms("chunk_delay_ms", self.chunk_delay_ms)?)
            .close_delay(ms("close_delay_ms", self.close_delay_ms)?)
            .end(end);
        if let Some(ignore) = self.ignore_ms {
            script = script.ignore(ms("ignore_ms", ignore)?);
        }
        Ok(script)
    }
}

impl ScriptBook {
    /// An empty book: every turn fails until scripts are added.
    pub fn new() -> Self {
        ScriptBook::default()
    }

    /// Answers `prompt` with `script`.
    #[must_use]
    pub fn reply(mut self, prompt: impl Into<String>, script: TurnScript) -> Self {
        self.prompts.insert(prompt.into(), script);
        self
    }

    /// Answers every other prompt with `script`.
    #[must_use]
    pub fn otherwise(mut self, script: TurnScript) -> Self {
        self.default = Some(script);
        self
    }

    /// Reads a book from TOML (see the type's documentation).
    ///
    /// # Errors
    /// One line naming the key at fault when the text is not a valid book.
    pub fn parse(text: &str) -> Result<Self, ScriptBookError> {
        let failed = |message: String| ScriptBookError {
            path: None,
            message,
        };
        let raw: RawBook = toml::from_str(text).map_err(|e| {
            failed(
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        })?;
        let mut book = ScriptBook::new();
        if let Some(default) = raw.default {
            book.default = Some(default.script("[default]").map_err(failed)?);
        }
        for (prompt, turn) in raw.prompt {
            let script = turn
                .script(&format!("[prompt.{prompt:?}]"))
                .map_err(failed)?;
            book.prompts.insert(prompt, script);
        }
        Ok(book)
    }

    /// Reads a book from a TOML file.
    ///
    /// # Errors
    /// When the file cannot be read, is larger than 1 MiB, or is
    /// not a valid book: one line naming the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScriptBookError> {
        let path = path.as_ref();
        let failed = |message: String| ScriptBookError {
            path: Some(path.to_path_buf()),
            message,
        };
        let size = std::fs::metadata(path)
            .map_err(|e| failed(format!("cannot read it: {e}")))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(failed(format!(
                "it is {size} bytes; a script book is at most {MAX_FILE_BYTES}"
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| failed(format!("cannot read it: {e}")))?;
        ScriptBook::parse(&text).map_err(|e| failed(e.message))
    }

    /// The script for `prompt`.
    pub fn script_for(&self, prompt: &str) -> Option<&TurnScript> {
        self.prompts.get(prompt).or(self.default.as_ref())
    }
}

#[async_trait]
impl Provider for ScriptBook {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        let prompt = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map_or("", |m| m.content.as_str());
        let script = self.script_for(prompt).cloned().ok_or_else(|| {
            StreamError::from(StreamErrorKind::Provider {
                message: format!("the script book has no reply to {prompt:?} and no default"),
            })
        })?;
        Ok(Box::new(ScriptedProvider::new([script]).open_next()?))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_book_and_picks_the_script_by_prompt() {
        let book = ScriptBook::parse(
            r#"
            [default]
            chunks = ["ok"]
            [prompt.slow]
            chunks = ["a", "b"]
            chunk_delay_ms = 250
            end = "hang"
            "#,
        )
        .unwrap();
        let slow = book.script_for("slow").unwrap();
        assert_eq!(slow.chunks, ["a", "b"]);
        assert_eq!(slow.chunk_delay, Duration::from_millis(250));
        assert_eq!(slow.end, ScriptedEnd::Hang);
        assert_eq!(book.script_for("anything").unwrap().chunks, ["ok"]);
        assert_eq!(ScriptBook::new().script_for("x"), None);
    }

    #[test]
    fn refuses_a_bad_book_in_one_line_naming_the_key() {
        for (text, names) in [
            ("[default]\nchunks = [\"a\"]\nend = \"later\"", "end"),
            ("[prompt.x]\nchunk_delay_ms = 90000000", "chunk_delay_ms"),
            ("[default]\nchunk = [\"a\"]", "chunk"),
            ("default = 3", "default"),
        ] {
            let error = ScriptBook::parse(text).unwrap_err().to_string();
            assert!(error.contains(names), "{error}");
            assert!(!error.contains('\n'), "{error}");
        }
    }
}
