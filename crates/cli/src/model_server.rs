//! The options that name the OpenAI-compatible model server `settle chat`
//! and `settle serve` stream from.

use std::path::{Path, PathBuf};

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
    /// The API key, sent as a bearer token (else SETTLE_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// A file holding the API key on its one line, so that the key is in no process listing (else SETTLE_API_KEY_FILE).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<PathBuf>,
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
        if let Some(key) = self.api_key()? {
            config = config.api_key(key);
        }
        OpenAiProvider::new(config).map_err(Failure::bad_input)
    }

    /// The API key: `--api-key`, else the one line of `--api-key-file`,
    /// else `SETTLE_API_KEY`, else the file `SETTLE_API_KEY_FILE` names (a
    /// flag beats the environment, whichever of the two it is). One an
    /// HTTP header cannot carry is bad input, said without the key.
    pub fn api_key(&self) -> Result<Option<String>, Failure> {
        let from_env = |name: &str| match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(Some(value)),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Failure::bad_input(format!(
                "{name} is not UTF-8 text: every request would fail"
            ))),
        };
        let file = |path: &Path| {
            let shown = crate::escape::one_line(&path.display().to_string()).into_owned();
            key_file(path, &shown).map(|key| (key, format!("the API key file {shown}")))
        };
        let (key, from) = match (&self.api_key, &self.api_key_file) {
            (Some(key), _) => (key.clone(), "--api-key".to_string()),
            (None, Some(path)) => file(path)?,
            (None, None) => match (
                from_env("SETTLE_API_KEY")?,
                from_env("SETTLE_API_KEY_FILE")?,
            ) {
                (Some(key), _) => (key, "SETTLE_API_KEY".to_string()),
                (None, Some(path)) => file(Path::new(&path))?,
                (None, None) => return Ok(None),
            },
        };
        // Sent as `Authorization: Bearer KEY`: an HTTP header takes
        // visible ASCII, spaces and tabs only. Said without the key.
        if !key.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
            return Err(Failure::bad_input(format!(
                "the API key has a character an HTTP header cannot carry (a line break, \
                 a control or non-ASCII character): every request would fail; check {from}"
            )));
        }
        Ok(Some(key))
    }

    /// How a reply's opening is retried, as `--retries` says. Only the
    /// opening: once a chunk of the reply was stored, nothing is (G7).
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy::default().retries(self.retries)
    }
}

/// The key on the one line of `path` (a final line break is not part of
/// it). What is wrong with the file is said, never what it holds.
fn key_file(path: &Path, shown: &str) -> Result<String, Failure> {
    use std::io::Read;
    /// Far more than any key; a file past it (a device, a log) is no key.
    const MOST: u64 = 16 * 1024;
    let unreadable = |e: std::io::Error| {
        Failure::bad_input(format!("cannot read the API key file {shown}: {e}"))
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MOST + 1).read_to_end(&mut bytes))
        .map_err(unreadable)?;
    if bytes.len() as u64 > MOST {
        return Err(Failure::bad_input(format!(
            "the API key file {shown} is larger than {MOST} bytes: write the key alone on one line"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        Failure::bad_input(format!(
            "the API key file {shown} is not UTF-8 text: write the key on one line"
        ))
    })?;
    let text = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    // Blanks around it are no part of a key: sent, they fail every request.
    let text = text.trim_matches([' ', '\t']);
    if text.trim().is_empty() {
        return Err(Failure::bad_input(format!(
            "the API key file {shown} is empty: write the key on one line"
        )));
    }
    if text.contains(['\n', '\r']) {
        return Err(Failure::bad_input(format!(
            "the API key file {shown} has more than one line: write the key alone on one line"
        )));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Options {
        #[command(flatten)]
        server: ModelServerArgs,
    }

    fn key_of(args: &[&str]) -> Result<Option<String>, String> {
        let options =
            Options::try_parse_from(std::iter::once("settle").chain(args.iter().copied()))
                .map_err(|e| e.to_string())?;
        options.server.api_key().map_err(|f| format!("{f:?}"))
    }

    #[test]
    fn the_key_file_gives_its_one_line_without_its_line_break() {
        let dir = tempfile::tempdir().unwrap();
        for (text, name) in [
            ("sk-unix\n", "unix"),
            ("sk-dos\r\n", "dos"),
            ("sk-bare", "bare"),
            (" sk-blank\t\n", "blank"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let key = key_of(&["--api-key-file", path.to_str().unwrap()]).unwrap();
            assert_eq!(key.as_deref(), Some(text.trim()), "{name}");
        }
    }

    #[test]
    fn a_key_file_that_is_no_key_is_refused_without_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let huge = "k".repeat(20_000);
        for (text, says) in [
            ("sk-a-secret\nsk-b-secret\n", "more than one line"),
            ("  \n", "is empty"),
            ("sk-tab\u{7}-secret\n", "cannot carry"),
            (huge.as_str(), "larger than"),
        ] {
            let path = dir.path().join("key");
            std::fs::write(&path, text).unwrap();
            let refused = key_of(&["--api-key-file", path.to_str().unwrap()]).unwrap_err();
            assert!(refused.contains(says), "{refused}");
            assert!(
                !refused.contains("-secret") && !refused.contains("kkkk"),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_key_and_the_key_file_are_one_or_the_other() {
        let refused = key_of(&["--api-key", "sk-x", "--api-key-file", "f"]).unwrap_err();
        assert!(refused.contains("cannot be used with"), "{refused}");
        assert_eq!(
            key_of(&["--api-key", "sk-flag"]).unwrap().as_deref(),
            Some("sk-flag")
        );
    }
}
