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
    /// How many chunks one turn may stream: the chunk past it is neither
    /// stored nor sent, and the turn ends `failed` (`too_large`).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_turn_chunks: u64,
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

impl ReplyLimitArgs {
    /// `builder` with these limits.
    pub fn apply(&self, builder: KernelBuilder) -> KernelBuilder {
        let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        builder
            .max_turn_chunks(Some(as_usize(self.max_turn_chunks)))
            .max_turn_bytes(self.max_turn_bytes.0)
    }
}
