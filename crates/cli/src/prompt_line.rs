//! The lines `settle chat` reads from its input, bounded: a line longer
//! than `--max-prompt-bytes` is read past (never held whole in memory) and
//! refused, and one that is not UTF-8 is refused, each with a line of its
//! own; neither ends the chat.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use settle_cli::prompt_line::{next_line, Line};
//!
//! let mut input: &[u8] = b"hello\r\nhe\xffllo\nfar too long\nlast\r";
//! assert_eq!(next_line(&mut input, Some(8)).await?, Some(Line::Text("hello".into())));
//! assert_eq!(next_line(&mut input, Some(8)).await?, Some(Line::NotUtf8));
//! assert_eq!(next_line(&mut input, Some(8)).await?, Some(Line::TooLong { limit: 8 }));
//! assert_eq!(next_line(&mut input, Some(8)).await?, Some(Line::Text("last".into())));
//! assert_eq!(next_line(&mut input, Some(8)).await?, None);
//! # Ok(()) }
//! ```

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line of input, as `settle chat` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A line of text, without its line ending (`\n` or `\r\n`).
    Text(String),
    /// A line whose bytes are not UTF-8 text.
    NotUtf8,
    /// A line longer than `limit` bytes; the rest of it was read past.
    TooLong {
        /// The most bytes a line may have.
        limit: usize,
    },
}

/// The next line of `reader`, holding at most `limit` bytes of it (and its
/// line ending); `None` at the end of the input. Not cancel safe: a line
/// read in part is lost when the future is dropped.
pub async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    limit: Option<usize>,
) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let (mut read_any, mut too_long) = (false, false);
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            break;
        }
        read_any = true;
        let end = available.iter().position(|b| *b == b'\n');
        let piece = &available[..end.map_or(available.len(), |at| at + 1)];
        let taken = piece.len();
        if !too_long {
            line.extend_from_slice(piece);
            // Its ending (at most `\r\n`) does not count against it.
            if limit.is_some_and(|limit| line.len() > limit.saturating_add(2)) {
                too_long = true;
                line = Vec::new();
            }
        }
        reader.consume(taken);
        if end.is_some() {
            break;
        }
    }
    if !read_any {
        return Ok(None);
    }
    // Its ending: `\n` or `\r\n`, and a last line's lone `\r` too.
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if let Some(limit) = limit.filter(|limit| too_long || line.len() > *limit) {
        return Ok(Some(Line::TooLong { limit }));
    }
    Ok(Some(match String::from_utf8(line) {
        Ok(text) => Line::Text(text),
        Err(_) => Line::NotUtf8,
    }))
}
