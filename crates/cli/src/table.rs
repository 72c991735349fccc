//! Plain-text tables that fit a terminal: each column as wide as its widest
//! cell; when the line is longer than the terminal, the shortenable columns
//! (names) are cut first, with `…`, down to their minimum, then the columns
//! that matter least are dropped, and any line still too long is cut at the
//! width. Widths are display columns (a CJK character takes two), and a cell
//! never carries a control character, so one row is always one line.
//!
//! ```
//! use settle_cli::table::{Align, Column, Table};
//!
//! let mut table = Table::new(vec![
//!     Column::new("ID", Align::Right),
//!     Column::new("NAME", Align::Left).shorten_to(4),
//!     Column::new("TURNS", Align::Right).drop_order(1),
//! ]);
//! table.push(vec!["7".into(), "a-rather-long-name".into(), "3".into()]);
//! assert_eq!(table.render(None), ["ID  NAME                TURNS", " 7  a-rather-long-name      3"]);
//! assert_eq!(table.render(Some(12)), ["ID  NAME", " 7  a-rathe…"]);
//! ```

use crate::escape;
use console::{measure_text_width, truncate_str};

/// The space between two columns.
const GAP: &str = "  ";

/// How a column's cells sit in their width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text: padded on the right.
    Left,
    /// Numbers: padded on the left.
    Right,
}

/// One column: its header, alignment, and how it gives way to a narrow terminal.
#[derive(Debug, Clone)]
pub struct Column {
    header: String,
    align: Align,
    /// Shortened down to this width before any column is dropped.
    shortest: Option<usize>,
    /// Dropped when still too wide, the lowest first; `None` is never dropped.
    drop_order: Option<u8>,
    /// At least this wide, whatever its cells.
    least: usize,
}

impl Column {
    /// A column that is neither shortened nor dropped.
    pub fn new(header: impl Into<String>, align: Align) -> Self {
        Column {
            header: header.into(),
            align,
            shortest: None,
            drop_order: None,
            least: 0,
        }
    }

    /// Keeps the column at least `width` columns wide, so that a table
    /// redrawn as its cells change (`running`, then `cancelling`) does not
    /// shift its columns.
    pub fn at_least(mut self, width: usize) -> Self {
        self.least = width;
        self
    }

    /// Lets its cells be cut (with `…`) down to `width` columns.
    pub fn shorten_to(mut self, width: usize) -> Self {
        self.shortest = Some(width);
        self
    }

    /// Lets the column be dropped when the table is still too wide once every
    /// shortenable column is as short as it may be; lower orders go first.
    pub fn drop_order(mut self, order: u8) -> Self {
        self.drop_order = Some(order);
        self
    }
}

/// Rows of cells under a row of column headers.
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(columns: Vec<Column>) -> Self {
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// Adds a row: one cell per column (missing cells are empty, extra ones
    /// ignored); control characters are shown as `?`.
    pub fn push(&mut self, cells: Vec<String>) {
        self.rows.push(cells.into_iter().map(clean).collect());
    }

    /// How many rows it holds (the header not counted).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The header line, then one line per row, none longer than `width`
    /// display columns when a width is given; trailing spaces trimmed.
    pub fn render(&self, width: Option<usize>) -> Vec<String> {
        let widths = self.fit(width);
        let mut lines = Vec::with_capacity(self.rows.len() + 1);
        let header: Vec<&str> = self.columns.iter().map(|c| c.header.as_str()).collect();
        lines.push(self.line(&header, &widths, width));
        for row in &self.rows {
            let cells: Vec<&str> = (0..self.columns.len())
                .map(|i| row.get(i).map_or("", String::as_str))
                .collect();
            lines.push(self.line(&cells, &widths, width));
        }
        lines
    }

    /// The width of each column, `None` for a dropped one.
    fn fit(&self, width: Option<usize>) -> Vec<Option<usize>> {
        let mut widths: Vec<Option<usize>> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, column)| {
                let cells = self
                    .rows
                    .iter()
                    .map(|row| row.get(i).map_or(0, |c| measure_text_width(c)));
                let widest = cells.fold(measure_text_width(&column.header), usize::max);
                Some(widest.max(column.least))
            })
            .collect();
        let Some(limit) = width else {
            return widths;
        };
        let natural: Vec<usize> = widths.iter().flatten().copied().collect();
        let total = |widths: &[Option<usize>]| {
            let shown: Vec<usize> = widths.iter().flatten().copied().collect();
            shown.iter().sum::<usize>() + GAP.len() * shown.len().saturating_sub(1)
        };
        // Shorten first, then drop, lowest order first.
        for (i, column) in self.columns.iter().enumerate() {
            let over = total(&widths).saturating_sub(limit);
            if let (Some(shortest), Some(w)) = (column.shortest, widths[i]) {
                widths[i] = Some(w - over.min(w.saturating_sub(shortest)));
            }
        }
        let mut droppable: Vec<(u8, usize)> = self
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.drop_order.map(|o| (o, i)))
            .collect();
        droppable.sort_unstable();
        for (_, i) in droppable {
            if total(&widths) <= limit {
                break;
            }
            widths[i] = None;
        }
        // What a dropped column freed goes back to the shortened ones.
        for (i, natural) in natural.iter().enumerate() {
            let slack = limit.saturating_sub(total(&widths));
            if let Some(w) = widths[i] {
                widths[i] = Some(w + slack.min(natural - w));
            }
        }
        widths
    }

    fn line(&self, cells: &[&str], widths: &[Option<usize>], limit: Option<usize>) -> String {
        let mut line = String::new();
        let mut first = true;
        for ((cell, column), width) in cells.iter().zip(&self.columns).zip(widths) {
            let Some(width) = *width else { continue };
            if !first {
                line.push_str(GAP);
            }
            first = false;
            line.push_str(&pad(cell, width, column.align));
        }
        let line = line.trim_end();
        match limit {
            Some(limit) => cut(line, limit),
            None => line.to_owned(),
        }
    }
}

/// `text` cut to at most `width` display columns, ending in `…` when cut.
pub fn cut(text: &str, width: usize) -> String {
    if width == 0 {
        return String::new();
    }
    truncate_str(text, width, "…").into_owned()
}

/// `text` cut or padded to exactly `width` display columns.
fn pad(text: &str, width: usize, align: Align) -> String {
    let text = cut(text, width);
    let fill = " ".repeat(width.saturating_sub(measure_text_width(&text)));
    match align {
        Align::Left => text + &fill,
        Align::Right => fill + &text,
    }
}

/// `text` with every control character (newlines, escapes) and every
/// character that reorders or hides text unseen ([`escape::hides`]) shown
/// as `?`, so that a cell is one line, moves no cursor and reads as it is.
pub fn clean(text: String) -> String {
    if text.chars().any(escape::hides) {
        text.chars()
            .map(|c| if escape::hides(c) { '?' } else { c })
            .collect()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut t = Table::new(vec![
            Column::new("ID", Align::Right),
            Column::new("NAME", Align::Left).shorten_to(6),
            Column::new("STATE", Align::Left),
            Column::new("TURNS", Align::Right).drop_order(1),
            Column::new("END REASON", Align::Left).drop_order(2),
        ]);
        t.push(vec![
            "1".into(),
            "root".into(),
            "finalized".into(),
            "2".into(),
            "completed".into(),
        ]);
        t.push(vec![
            "12".into(),
            "  a-worker-with-a-long-name".into(),
            "running".into(),
            "10".into(),
            "parent_finished".into(),
        ]);
        t
    }

    #[test]
    fn columns_are_as_wide_as_their_content() {
        assert_eq!(
            table().render(None),
            [
                "ID  NAME                         STATE      TURNS  END REASON",
                " 1  root                         finalized      2  completed",
                "12    a-worker-with-a-long-name  running       10  parent_finished",
            ]
        );
    }

    #[test]
    fn names_are_shortened_before_columns_are_dropped() {
        let lines = table().render(Some(50));
        assert_eq!(lines[0], "ID  NAME         STATE      TURNS  END REASON");
        assert_eq!(
            lines[2],
            "12    a-worker…  running       10  parent_finished"
        );
    }

    #[test]
    fn the_least_useful_columns_go_first() {
        let lines = table().render(Some(44));
        assert_eq!(lines[0], "ID  NAME          STATE      END REASON");
        assert_eq!(lines[2], "12    a-worker-…  running    parent_finished");
        // What the dropped columns freed goes back to the names.
        let lines = table().render(Some(34));
        assert_eq!(lines[0], "ID  NAME                 STATE");
        assert_eq!(lines[2], "12    a-worker-with-a-…  running");
        let lines = table().render(Some(22));
        assert_eq!(lines[2], "12    a-wo…  running");
    }

    #[test]
    fn no_line_is_longer_than_the_width() {
        for width in 0..80 {
            for line in table().render(Some(width)) {
                assert!(measure_text_width(&line) <= width, "{width}: {line:?}");
            }
        }
    }

    #[test]
    fn wide_characters_count_twice_and_control_characters_are_cleaned() {
        let mut t = Table::new(vec![Column::new("NAME", Align::Left).shorten_to(3)]);
        t.push(vec!["検索エージェント".into()]);
        t.push(vec!["two\nlines\x1b[2J".into()]);
        let lines = t.render(Some(7));
        assert_eq!(lines[1], "検索エ…");
        assert_eq!(lines[2], "two?li…");
        assert!(lines.iter().all(|l| measure_text_width(l) <= 7));
    }
}
