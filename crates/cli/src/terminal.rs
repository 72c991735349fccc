//! Whether stdout and stderr are terminals, and how big: what decides where
//! `settle run` draws its live view and how wide a table may be.

use console::Term;

/// The size of a terminal, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Lines.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

fn size(term: &Term) -> Option<Size> {
    if !term.is_term() {
        return None;
    }
    // A terminal that does not say its size is taken as the classic 80×24.
    let (rows, cols) = term.size_checked().unwrap_or((24, 80));
    Some(Size {
        rows: usize::from(rows),
        cols: usize::from(cols),
    })
}

/// The size of the terminal on stdout, if stdout is one.
pub fn stdout() -> Option<Size> {
    size(&Term::stdout())
}

/// The size of the terminal on stderr, if stderr is one.
pub fn stderr() -> Option<Size> {
    size(&Term::stderr())
}

/// How wide a table printed on stdout may be: the terminal's width, or no
/// limit when stdout is a file or a pipe (a script reads whole lines).
pub fn stdout_width() -> Option<usize> {
    stdout().map(|s| s.cols)
}
