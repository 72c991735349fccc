//! The options that name the OpenAI-compatible model server `settle chat`
//! and `settle serve` stream from.

use clap::Args;
use settle_stream::{OpenAiConfig, OpenAiProvider, RetryPolicy, DEFAULT_MAX_EVENT_BYTES};

use crate::Failure;

/// Where the model server is and how to ask it: flattened into the options
/// of every command that talks to one.
#[derive(Debug, Args)]
pub struct ModelServerArgs {
    /// The model server's base URL, up to and including `/v1`.
    #[arg(
        long,
        env = "SETTLE_BASE_URL",
        default_value = "http://127.0.0.1:8080/v1"
    )]
    pub base_url: String,
    /// The model name to ask for.
    #[arg(long, env = "SETTLE_MODEL", default_value = "default")]
    pub model: String,
    /// The API key, sent as a bearer token.
    #[arg(long, env = "SETTLE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The largest server-sent event the model server may send, in bytes: a
    /// reply with a larger one fails (error kind `protocol`).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_EVENT_BYTES, value_parser = parse_bytes)]
    pub max_event_bytes: usize,
    /// How many times a reply the model server refused before it began (connection refused, HTTP 429 or 5xx) is asked again: after 0.5s, then twice as long each time up to 30s, or as its Retry-After says (0: never).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retries: u32,
}

fn parse_bytes(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!(
            "`{text}` is not a size: write a whole number of bytes, like 4194304"
        )),
        Ok(n) => Ok(n),
    }
}

impl ModelServerArgs {
    /// The provider these options name; a base URL it cannot use is bad input.
    pub fn provider(&self) -> Result<OpenAiProvider, Failure> {
        let mut config = OpenAiConfig::new(self.base_url.clone(), self.model.clone())
            .max_event_bytes(self.max_event_bytes);
        if let Some(key) = &self.api_key {
            // Sent as `Authorization: Bearer KEY`: an HTTP header takes
            // visible ASCII, spaces and tabs only. Said without the key.
            if !key.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
                return Err(Failure::bad_input(
                    "the API key has a character an HTTP header cannot carry (a line break, \
                     a control or non-ASCII character): every request would fail; check \
                     --api-key or SETTLE_API_KEY",
                ));
            }
            config = config.api_key(key.clone());
        }
        OpenAiProvider::new(config).map_err(Failure::bad_input)
    }

    /// How a reply's opening is retried, as `--retries` says. Only the
    /// opening: once a chunk of the reply was stored, nothing is (G7).
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy::default().retries(self.retries)
    }
}
