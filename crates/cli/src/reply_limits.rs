//! `--max-turn-chunks` and `--max-turn-bytes` of `settle chat` and
//! `settle serve`: how much one turn's reply may stream (the runtime's
//! `max_turn_chunks`, `max_turn_bytes`). The chunk past either is neither
//! stored nor shown, and the turn ends `failed` (`too_large`): a model that
//! never stops cannot grow the process's memory or the database without
//! bound.

use clap::Args;
use settle_runtime::KernelBuilder;

/// How much one turn's reply may stream.
#[derive(Debug, Clone, Args)]
pub struct ReplyLimitArgs {
    /// How many chunks one turn may stream: the chunk past it is neither
    /// stored nor sent, and the turn ends `failed` (`too_large`).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_turn_chunks: u64,
    /// How many bytes of chunks one turn may stream, bounded as the chunks are.
    #[arg(long, default_value_t = 64 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_turn_bytes: u64,
}

impl ReplyLimitArgs {
    /// `builder` with these limits.
    pub fn apply(&self, builder: KernelBuilder) -> KernelBuilder {
        let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        builder
            .max_turn_chunks(Some(as_usize(self.max_turn_chunks)))
            .max_turn_bytes(Some(as_usize(self.max_turn_bytes)))
    }
}
