//! Helpers shared by the unit tests of the output, export and trace modules.

use std::time::{Duration, SystemTime};

/// A fixed instant `ms` milliseconds into a day in 2027, so outputs that
/// print times are the same on every run.
pub(crate) fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
}

/// Text chunks numbered from 0, as the store returns them.
pub(crate) fn text_chunks(texts: &[&str]) -> Vec<settle_store::ChunkRow> {
    texts
        .iter()
        .enumerate()
        .map(|(seq, text)| settle_store::ChunkRow {
            seq: seq as u32,
            kind: settle_store::ChunkKind::Text,
            text: (*text).to_owned(),
            data: None,
        })
        .collect()
}
