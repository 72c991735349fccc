//! The live view of `settle run` on a terminal: the agent tree as a table,
//! redrawn in place, that fits the terminal. No line is longer than the
//! terminal is wide (a wrapped line would throw the redraw off by a line),
//! and the view is never taller than the terminal: when the sessions do not
//! fit, the live ones are shown first and one line sums up the rest.
//!
//! The layout is a pure function of the rows and the terminal's size,
//! [`frame`]; [`LiveView`] hands each frame to indicatif, which redraws it in
//! place on stderr (or stdout) and draws nothing on a file or a pipe.
//!
//! ```
//! use settle_cli::live::{frame, LiveRow};
//! use settle_cli::terminal::Size;
//! use settle_runtime::{SessionId, State};
//!
//! let rows: Vec<LiveRow> = (1..=100)
//!     .map(|id| LiveRow::new(SessionId(id), format!("agent{id}"), 1, State::Running))
//!     .collect();
//! let lines = frame(&rows, Size { rows: 24, cols: 80 });
//! assert_eq!(lines.len(), 23);
//! assert!(lines[22].starts_with("… 79 more sessions"));
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use console::measure_text_width;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use settle_runtime::{Outcome, SessionId, State};

use crate::table::{cut, Align, Column, Table};
use crate::terminal::{self, Size};

/// One session as the live view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRow {
    /// Its id.
    pub id: SessionId,
    /// Its name.
    pub name: String,
    /// How deep it sits in the tree (0 for the root).
    pub depth: usize,
    /// Its state.
    pub state: State,
    /// How many turns it started.
    pub turns: u32,
    /// How many chunks were persisted.
    pub chunks: u32,
    /// How its last turn ended.
    pub outcome: Option<Outcome>,
    /// Why it was finalized, once it is.
    pub end: Option<String>,
}

impl LiveRow {
    /// A row with no turn yet.
    pub fn new(id: SessionId, name: impl Into<String>, depth: usize, state: State) -> Self {
        LiveRow {
            id,
            name: name.into(),
            depth,
            state,
            turns: 0,
            chunks: 0,
            outcome: None,
            end: None,
        }
    }
}

/// Which rows are shown first when not all fit: the live ones.
fn precedence(state: State) -> u8 {
    match state {
        State::Running | State::Cancelling => 0,
        State::Registered | State::Settled => 1,
        State::Finalized => 2,
    }
}

/// The lines of one frame for `rows` (in tree order) on a terminal of `size`:
/// the header, as many rows as fit, and when some do not fit a last line
/// that counts them by state. No line is wider than `size.cols`, and there
/// are fewer lines than `size.rows` (the line under the view stays free, so
/// that the terminal never scrolls).
pub fn frame(rows: &[LiveRow], size: Size) -> Vec<String> {
    let room = size.rows.saturating_sub(1);
    if room == 0 || size.cols == 0 {
        return Vec::new();
    }
    let fits = rows.len() < room;
    let shown: Vec<&LiveRow> = if fits {
        rows.iter().collect()
    } else if room < 3 {
        // No room for a table: the count alone.
        Vec::new()
    } else {
        // Room for the header, `room - 2` rows, and the count.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| (precedence(rows[i].state), i));
        order.truncate(room - 2);
        order.sort_unstable();
        order.into_iter().map(|i| &rows[i]).collect()
    };
    let mut lines = Vec::with_capacity(room);
    if !fits && shown.is_empty() {
        lines.push(cut(&count_line(rows, &[], "sessions"), size.cols));
        return lines;
    }
    lines.extend(table(&shown).render(Some(size.cols)));
    if !fits {
        lines.push(cut(&count_line(rows, &shown, "more sessions"), size.cols));
    }
    lines
}

fn table(rows: &[&LiveRow]) -> Table {
    let widest_state = State::ALL
        .iter()
        .map(|s| s.as_str().len())
        .max()
        .unwrap_or(0);
    let mut table = Table::new(vec![
        Column::new("ID", Align::Right),
        Column::new("SESSION", Align::Left).shorten_to(10),
        // As wide as the widest state, so that the columns stay put.
        Column::new("STATE", Align::Left).at_least(widest_state),
        Column::new("TURNS", Align::Right).drop_order(2),
        Column::new("CHUNKS", Align::Right).drop_order(1),
        Column::new("OUTCOME", Align::Left).drop_order(4),
        Column::new("END", Align::Left).drop_order(3),
    ]);
    for row in rows {
        table.push(vec![
            row.id.to_string(),
            crate::listing::indented(&row.name, row.depth),
            row.state.as_str().to_owned(),
            row.turns.to_string(),
            row.chunks.to_string(),
            row.outcome.map_or("-", Outcome::as_str).to_owned(),
            row.end.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    table
}

/// `… 37 more sessions: 12 running, 25 finalized`, counting the rows of
/// `all` that are not in `shown`.
fn count_line(all: &[LiveRow], shown: &[&LiveRow], what: &str) -> String {
    let mut by_state: BTreeMap<u8, (State, usize)> = BTreeMap::new();
    let mut hidden = 0;
    for row in all {
        if shown.iter().any(|s| s.id == row.id) {
            continue;
        }
        hidden += 1;
        by_state.entry(row.state.rank()).or_insert((row.state, 0)).1 += 1;
    }
    let counts: Vec<String> = by_state
        .values()
        .map(|(state, n)| format!("{n} {state}"))
        .collect();
    let prefix = if shown.is_empty() { "" } else { "… " };
    format!("{prefix}{hidden} {what}: {}", counts.join(", "))
}

/// Where the live view is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// On stderr (stdout may be a file or a pipe that gets the log).
    Stderr,
    /// On stdout (when stderr is not a terminal).
    Stdout,
}

impl Target {
    fn size(self) -> Size {
        let size = match self {
            Target::Stderr => terminal::stderr(),
            Target::Stdout => terminal::stdout(),
        };
        size.unwrap_or(Size { rows: 24, cols: 80 })
    }
}

/// The live view on a terminal: each [`LiveView::draw`] replaces the frame
/// shown; indicatif redraws it in place, at most ten times a second.
#[derive(Debug)]
pub struct LiveView {
    bar: ProgressBar,
    target: Target,
}

impl LiveView {
    /// A view drawn on `target`.
    pub fn new(target: Target) -> Self {
        let draw = match target {
            Target::Stderr => ProgressDrawTarget::stderr_with_hz(10),
            Target::Stdout => ProgressDrawTarget::stdout_with_hz(10),
        };
        let bar = ProgressBar::with_draw_target(None, draw);
        // The template is a constant: it parses.
        if let Ok(style) = ProgressStyle::with_template("{msg}") {
            bar.set_style(style);
        }
        // Redraws the latest frame even when no event comes.
        bar.enable_steady_tick(Duration::from_millis(100));
        LiveView { bar, target }
    }

    /// Shows `rows` (in tree order), laid out for the terminal's size now.
    pub fn draw(&self, rows: &[LiveRow]) {
        let lines = frame(rows, self.target.size());
        debug_assert!(lines.iter().all(|l| !l.contains('\n')));
        let widest = lines.iter().map(|l| measure_text_width(l)).max();
        tracing::trace!(lines = lines.len(), ?widest, "live frame");
        self.bar.set_message(lines.join("\n"));
    }

    /// Ends the view, leaving its last frame on the terminal.
    pub fn finish(self) {
        self.bar.finish();
    }

    /// Ends the view and wipes it (a summary follows on the same terminal).
    pub fn clear(self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rows(n: u64, state: State) -> Vec<LiveRow> {
        (1..=n)
            .map(|id| {
                let mut row = LiveRow::new(SessionId(id), format!("agent-{id}"), 1, state);
                row.turns = 2;
                row.chunks = 40;
                row.outcome = Some(Outcome::Completed);
                row.end = Some("parent_finished".to_owned());
                row
            })
            .collect()
    }

    const TERM: Size = Size { rows: 24, cols: 80 };

    #[test]
    fn everything_shows_when_it_fits() {
        let lines = frame(&rows(5, State::Running), TERM);
        assert_eq!(lines.len(), 6);
        assert_eq!(
            lines[0],
            "ID  SESSION    STATE       TURNS  CHUNKS  OUTCOME    END"
        );
        // The state column is as wide as `registered` from the start.
        assert_eq!(
            lines[1],
            " 1    agent-1  running         2      40  completed  parent_finished"
        );
    }

    #[test]
    fn rows_that_do_not_fit_are_counted_on_the_last_line() {
        let mut all = rows(30, State::Finalized);
        for row in &mut all[20..25] {
            row.state = State::Running;
        }
        all[27].state = State::Cancelling;
        let lines = frame(&all, TERM);
        assert_eq!(lines.len(), 23);
        // The live ones are shown first.
        for id in (21..=25).chain([28]) {
            assert!(
                lines.iter().any(|l| l.starts_with(&format!("{id:>2}  "))),
                "{id} not shown: {lines:#?}"
            );
        }
        assert_eq!(lines[22], "… 9 more sessions: 9 finalized");
        // Shown in tree order all the same.
        let ids: Vec<u64> = lines[1..22]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }

    #[test]
    fn a_narrow_terminal_drops_columns_rather_than_wrapping() {
        let lines = frame(&rows(3, State::Running), Size { rows: 24, cols: 30 });
        assert_eq!(lines[0], "ID  SESSION    STATE");
        assert_eq!(lines[1], " 1    agent-1  running");
    }

    #[test]
    fn a_tiny_terminal_gets_the_count_alone() {
        let lines = frame(&rows(30, State::Running), Size { rows: 3, cols: 80 });
        assert_eq!(lines, ["30 sessions: 30 running"]);
        assert!(frame(&rows(30, State::Running), Size { rows: 1, cols: 80 }).is_empty());
    }

    fn any_row() -> impl Strategy<Value = LiveRow> {
        (
            1u64..100_000,
            "\\PC{0,40}",
            0usize..12,
            prop::sample::select(State::ALL.to_vec()),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(|(id, name, depth, state, turns, chunks)| {
                let mut row = LiveRow::new(SessionId(id), name, depth, state);
                row.turns = turns;
                row.chunks = chunks;
                row
            })
    }

    proptest! {
        #[test]
        fn every_frame_fits_its_terminal(
            rows in prop::collection::vec(any_row(), 0..120),
            cols in 0usize..200,
            height in 0usize..60,
        ) {
            let size = Size { rows: height, cols };
            let lines = frame(&rows, size);
            prop_assert!(lines.len() < height.max(1), "{} lines for {height} rows", lines.len());
            for line in &lines {
                prop_assert!(measure_text_width(line) <= cols, "{line:?} wider than {cols}");
                prop_assert!(!line.chars().any(char::is_control), "{line:?}");
            }
            if rows.len() + 1 < height && cols >= 20 {
                prop_assert_eq!(lines.len(), rows.len() + 1, "everything fits");
            }
        }
    }
}
