//! The rows of the report, printed as a table or as JSON.

use serde::Serialize;

use crate::measure::Spread;

/// What a row's figure must meet.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Target {
    /// `"<="` or `">="`.
    pub op: &'static str,
    /// The bound.
    pub value: f64,
    /// `"ratio"` (the median per-round ratio) or `"ours"` (the figure itself).
    pub of: &'static str,
}

impl Target {
    /// The median ratio must be at most `value`.
    pub const fn ratio_at_most(value: f64) -> Target {
        Target {
            op: "<=",
            value,
            of: "ratio",
        }
    }

    /// The median ratio must be at least `value`.
    pub const fn ratio_at_least(value: f64) -> Target {
        Target {
            op: ">=",
            value,
            of: "ratio",
        }
    }

    /// Our figure itself must be at most `value`.
    pub const fn ours_at_most(value: f64) -> Target {
        Target {
            op: "<=",
            value,
            of: "ours",
        }
    }

    /// No target: the row says a figure users feel, with nothing to beat.
    pub const fn none() -> Target {
        Target {
            op: "",
            value: f64::NAN,
            of: "none",
        }
    }

    fn holds(&self, x: f64) -> bool {
        match self.op {
            "<=" => x <= self.value,
            _ => x >= self.value,
        }
    }

    fn describe(&self, unit: &str) -> String {
        let op = if self.op == "<=" { "≤" } else { "≥" };
        if self.of == "none" {
            "none".to_owned()
        } else if self.of == "ratio" {
            format!("{op} {:.2}×", self.value)
        } else {
            format!("{op} {} {unit}", num(self.value))
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The SPEC §9 row and variant, e.g. `teardown flat`.
    pub bench: String,
    /// The workload size, in words.
    pub size: String,
    /// The unit of `ours` and `baseline`.
    pub unit: String,
    /// Our median figure.
    pub ours: f64,
    /// The baseline's median figure, when the row has a baseline.
    pub baseline: Option<f64>,
    /// The per-round ratios (median, min, max), when the row has a baseline.
    pub ratio: Option<Spread>,
    /// What must hold.
    pub target: Target,
    /// Whether it held (on the median); `None` when it could not be judged
    /// (a baseline that did not run).
    pub met: Option<bool>,
    /// How many timed rounds the figures come from.
    pub rounds: usize,
    /// Anything a reader needs to read the row right.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Row {
    /// A row comparing ours with a baseline through per-round ratios.
    #[allow(clippy::too_many_arguments)]
    pub fn compared(
        bench: impl Into<String>,
        size: impl Into<String>,
        unit: impl Into<String>,
        ours: f64,
        baseline: f64,
        ratio: Spread,
        target: Target,
        rounds: usize,
    ) -> Row {
        let met = Some(target.holds(ratio.median));
        let mut row = Row::ours_only(bench, size, unit, ours, target, rounds);
        row.baseline = Some(baseline);
        row.ratio = Some(ratio);
        row.met = met;
        row
    }

    /// A row whose figure is checked against an absolute bound.
    pub fn absolute(
        bench: impl Into<String>,
        size: impl Into<String>,
        unit: impl Into<String>,
        ours: f64,
        target: Target,
        rounds: usize,
    ) -> Row {
        let met = Some(target.holds(ours));
        let mut row = Row::ours_only(bench, size, unit, ours, target, rounds);
        row.met = met;
        row
    }

    /// A row whose baseline could not run: our figure alone, its ratio
    /// target not judged.
    pub fn ours_only(
        bench: impl Into<String>,
        size: impl Into<String>,
        unit: impl Into<String>,
        ours: f64,
        target: Target,
        rounds: usize,
    ) -> Row {
        Row {
            bench: bench.into(),
            size: size.into(),
            unit: unit.into(),
            ours,
            baseline: None,
            ratio: None,
            met: None,
            target,
            rounds,
            note: None,
        }
    }

    /// Adds a note.
    pub fn with_note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

/// A number with three significant digits (more for large integers), with
/// thousands separators.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "—".to_owned();
    }
    let a = x.abs();
    if a >= 1000.0 {
        grouped(x.round() as i64)
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// An integer with thousands separators: `100,000`.
pub fn grouped(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

const HEADERS: [&str; 7] = [
    "bench",
    "size",
    "ours",
    "baseline",
    "ratio (min–max)",
    "target",
    "met",
];

fn cells(row: &Row) -> [String; 7] {
    let with_unit = |x: f64| format!("{} {}", num(x), row.unit);
    [
        row.bench.clone(),
        row.size.clone(),
        with_unit(row.ours),
        row.baseline.map_or_else(|| "—".to_owned(), with_unit),
        row.ratio.map_or_else(
            || "—".to_owned(),
            |r| format!("{:.2}× ({:.2}–{:.2})", r.median, r.min, r.max),
        ),
        row.target.describe(&row.unit),
        match row.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "—",
        }
        .to_owned(),
    ]
}

/// The rows as an aligned plain-text table (also valid Markdown).
pub fn table(rows: &[Row]) -> String {
    let body: Vec<[String; 7]> = rows.iter().map(cells).collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for r in &body {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::from("|");
        for (c, w) in cells.iter().zip(widths) {
            let pad = w - c.chars().count();
            s.push(' ');
            s.push_str(c);
            s.push_str(&" ".repeat(pad));
            s.push_str(" |");
        }
        s.push('\n');
        s
    };
    let mut out = line(&HEADERS.map(String::from));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line(&rule));
    for r in &body {
        out.push_str(&line(r));
    }
    let notes: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.note
                .as_ref()
                .map(|n| format!("- {} ({}): {n}", r.bench, r.size))
        })
        .collect();
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes.join("\n"));
        out.push('\n');
    }
    out
}
