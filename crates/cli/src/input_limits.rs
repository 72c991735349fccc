//! `--max-prompt-bytes` and `--max-history-bytes` of `settle chat` and
//! `settle serve`: the size limits of a turn's request (the runtime's
//! `max_prompt_bytes`, `max_history_bytes`), refused before anything is
//! sent or written. Sizes are bytes, or a number with `KiB`, `MiB` or `GiB`;
//! `none` lifts the limit.
//!
//! ```
//! use settle_cli::input_limits::parse_size;
//!
//! assert_eq!(parse_size("512KiB").map(|s| s.0), Ok(Some(512 * 1024)));
//! assert_eq!(parse_size("1000").map(|s| s.0), Ok(Some(1000)));
//! assert_eq!(parse_size("none").map(|s| s.0), Ok(None));
//! assert!(parse_size("1MB").is_err());
//! ```

use clap::Args;
use settle_runtime::KernelBuilder;

/// The size limits of a turn's request.
#[derive(Debug, Clone, Args)]
pub struct InputLimitArgs {
    /// The largest one message of a turn may be (bytes, or with KiB/MiB/GiB; `none`: no limit).
    #[arg(long, value_name = "SIZE", value_parser = parse_message_size, default_value = "1MiB")]
    max_prompt_bytes: Limit,
    /// The largest a turn's whole conversation may be (bytes, or with KiB/MiB/GiB; `none`: no limit).
    #[arg(long, value_name = "SIZE", value_parser = parse_message_size, default_value = "16MiB")]
    max_history_bytes: Limit,
}

/// A request's size limit: a size, but not zero (every turn would be
/// refused: a mistake said at the start, not at every turn).
fn parse_message_size(text: &str) -> Result<Limit, String> {
    match parse_size(text)? {
        Limit(Some(0)) => {
            Err("a limit of no bytes refuses every message: give at least 1, or none".to_owned())
        }
        limit => Ok(limit),
    }
}

/// A size limit in bytes; `None` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<usize>);

impl InputLimitArgs {
    /// The largest one message may be, in bytes (`None`: no limit).
    pub fn max_prompt_bytes(&self) -> Option<usize> {
        self.max_prompt_bytes.0
    }

    /// `builder` with these limits.
    pub fn apply(&self, builder: KernelBuilder) -> KernelBuilder {
        builder
            .max_prompt_bytes(self.max_prompt_bytes.0)
            .max_history_bytes(self.max_history_bytes.0)
    }
}

/// A size: bytes, or a number with `KiB`, `MiB` or `GiB`; `none` for no
/// limit.
pub fn parse_size(text: &str) -> Result<Limit, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let scale: usize = match unit.trim() {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}` is not a size: give bytes, or a number with KiB, MiB or GiB (or none)"
            ))
        }
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size: it must start with a whole number"))?;
    n.checked_mul(scale)
        .map(|n| Limit(Some(n)))
        .ok_or_else(|| format!("`{text}` is too large a size"))
}
