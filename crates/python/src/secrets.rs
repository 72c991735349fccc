//! Keeping a program's API keys out of its turns' errors.
//!
//! A Python turn's model client is the program's own, so the package cannot
//! know its key, and a server may echo the key back (a 401 "Incorrect API
//! key provided: sk-…"), in the exception the client raises or in a chunk's
//! `error`: that becomes the turn's error, which the turn tells and the
//! store keeps (`settle show`, `settle export`). The kernel masks, as
//! `***`, the values it was given (`Kernel.open(..., secrets=)`) and those
//! of the environment variables the common clients read their keys from
//! ([`KEY_VARIABLES`]), wherever a turn's error is made from what its
//! source said (see `provider.rs`), in any case of its letters, and its
//! pieces of 12 characters or more (a key echoed cut short or starred). A
//! key it was not told of, and one the server escaped, cannot be masked.

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::args::Text;

/// The environment variables the common model clients read their API keys
/// from; their values are masked by default.
pub(crate) const KEY_VARIABLES: [&str; 9] = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "TOGETHER_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "SETTLE_API_KEY",
];

/// A variable's value shorter than this is not masked: it is no key, and
/// masking it would take that text out of every message.
const SHORTEST_FROM_ENV: usize = 8;

/// The values a kernel masks in its turns' errors, longest first (so that
/// a secret that holds another is masked whole).
#[derive(Default)]
pub(crate) struct Secrets(Vec<String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

impl Secrets {
    /// `given` (an empty one left out) and the values of [`KEY_VARIABLES`]
    /// that are set, valid UTF-8 and at least [`SHORTEST_FROM_ENV`]
    /// characters long, read now.
    pub fn new(given: Vec<String>) -> Self {
        let from_env = KEY_VARIABLES
            .iter()
            .filter_map(|name| std::env::var(name).ok())
            .filter(|value| value.chars().count() >= SHORTEST_FROM_ENV);
        let mut all: Vec<String> = given.into_iter().chain(from_env).collect();
        all.retain(|secret| !secret.is_empty());
        all.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        all.dedup();
        Secrets(all)
    }

    /// The `secrets=` of `Kernel.open`: an iterable of strings, or one
    /// string (one secret, not its characters). A value that is not a
    /// string raises `TypeError`, a string that is not UTF-8 (a lone
    /// surrogate) `BadInput`.
    pub fn given(secrets: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
        let Some(secrets) = secrets else {
            return Ok(Vec::new());
        };
        if secrets.is_instance_of::<PyString>() {
            let Text(secret) = secrets.extract()?;
            return Ok(vec![secret]);
        }
        secrets
            .try_iter()?
            .map(|secret| secret.and_then(|s| s.extract::<Text>()).map(|Text(s)| s))
            .collect()
    }

    /// `text` with every secret masked as the Rust provider masks its key
    /// ([`settle_stream::mask_key`]): in any case of its letters, and each
    /// piece of it 12 characters or more long (a key echoed cut short, or
    /// with its end starred).
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.0 {
            text = settle_stream::mask_key(&text, secret);
        }
        text
    }

    /// What a source said, as a turn's error quotes it
    /// ([`settle_stream::quote`]: one line, bounded), its secrets masked:
    /// before it is quoted (so one the quote would cut is masked whole),
    /// and after (one the quote's joining of lines made whole).
    pub fn quote(&self, text: &str) -> String {
        self.scrub(&settle_stream::quote(&self.scrub(text)))
    }
}
