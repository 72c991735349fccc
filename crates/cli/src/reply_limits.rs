//! `--max-turn-chunks` and `--max-turn-bytes` of `settle chat` and
//! `settle serve`: how much one turn's reply may stream (the runtime's
//! `max_turn_chunks`, `max_turn_bytes`). The chunk past either is neither
//! stored nor shown, and the turn ends `failed` (`too_large`): a model that
//! never stops cannot grow the process's memory or the database without
//! bound.

use clap::Args;
use settle_runtime::KernelBuilder;

use crate::input_limits::{parse_size, Limit};

/// How much one turn's reply may stream.
#[derive(Debug, Clone, Args)]
pub struct ReplyLimitArgs {
    /// How many chunks one turn may stream: the chunk past it is neither stored nor sent, and the turn ends `failed` (`too_large`) (`none`: no limit).
    #[arg(long, value_name = "N", value_parser = parse_turn_chunks, default_value = "100000")]
    max_turn_chunks: Limit,
    /// How many bytes of chunks one turn may stream, bounded as the chunks are (bytes, or with KiB/MiB/GiB; `none`: no limit).
    #[arg(long, value_name = "SIZE", value_parser = parse_turn_bytes, default_value = "64MiB")]
    max_turn_bytes: Limit,
}

/// A turn's byte limit: a size as `--max-prompt-bytes` takes one, but not
/// zero (every turn would end at its first chunk).
fn parse_turn_bytes(text: &str) -> Result<Limit, String> {
    match parse_size(text)? {
        Limit(Some(0)) => {
            Err("a turn of no bytes ends at its first chunk: give at least 1, or none".to_owned())
        }
        limit => Ok(limit),
    }
}

/// A turn's chunk limit: a whole number of at least 1, or `none`.
fn parse_turn_chunks(text: &str) -> Result<Limit, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    match text.parse::<usize>() {
        Ok(0) => Err("a turn of no chunks ends at its first: give at least 1, or none".to_owned()),
        Ok(n) => Ok(Limit(Some(n))),
        Err(_) => Err("expected a whole number of chunks, or none".to_owned()),
    }
}

impl ReplyLimitArgs {
    /// `builder` with these limits.
    pub fn apply(&self, builder: KernelBuilder) -> KernelBuilder {
        builder
            .max_turn_chunks(self.max_turn_chunks.0)
            .max_turn_bytes(self.max_turn_bytes.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From outside: `--max-turn-bytes none` was taken and
    /// `--max-turn-chunks none` refused. Both take `none`, and refuse 0
    /// (every turn would end at its first chunk) with a reason.
    #[test]
    fn both_turn_bounds_take_none_and_refuse_zero() {
        assert_eq!(parse_turn_chunks("none").map(|l| l.0), Ok(None));
        assert_eq!(parse_turn_chunks("12").map(|l| l.0), Ok(Some(12)));
        assert_eq!(parse_turn_bytes("none").map(|l| l.0), Ok(None));
        for zero in [parse_turn_chunks("0"), parse_turn_bytes("0")] {
            let refused = zero.map(|l| l.0).unwrap_err();
            assert!(refused.contains("at least 1, or none"), "{refused}");
        }
        assert!(parse_turn_chunks("-1").is_err());
        assert!(parse_turn_chunks("1e3").is_err());
    }
}
