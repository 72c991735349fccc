//! A log–log line chart of teardown time against tree size, as a standalone
//! SVG file: the stubbed teardown against the token tree, the durable
//! teardown against the asyncio peer, the scale row's million idle sessions
//! against the peer at that size; and under it, one bar per row that is not
//! a teardown time (recover, fleet appends, scale memory): its ratio to its
//! baseline (or to its bound) against its target. Hand-written: ten series of
//! a few points and a handful of bars need no plotting library.

use std::fmt::Write as _;

/// One point: the tree size and the median, min and max time in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    /// Agents in the tree.
    pub n: f64,
    /// Median teardown time, ms.
    pub median: f64,
    /// Fastest round, ms.
    pub min: f64,
    /// Slowest round, ms.
    pub max: f64,
}

/// One line of the chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// The legend's words.
    pub label: String,
    /// A CSS colour.
    pub color: &'static str,
    /// Dashed line and square markers (else solid and round).
    pub dashed: bool,
    /// The points, by increasing size.
    pub points: Vec<Point>,
}

/// One bar of the lower panel: a row's ratio against its target.
#[derive(Debug, Clone)]
pub struct Bar {
    /// The row and its size, in words.
    pub label: String,
    /// The median ratio (ours over the baseline, or over the bound).
    pub ratio: f64,
    /// The target ratio.
    pub target: f64,
    /// Whether the target is a floor (`≥`) rather than a ceiling.
    pub at_least: bool,
}

/// Height of one bar's line.
const BAR_LINE: f64 = 24.0;
/// Room above and below the bars.
const BAR_MARGIN: f64 = 56.0;

const W: f64 = 820.0;
const H: f64 = 460.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 270.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn decades(values: impl Iterator<Item = f64>) -> (i32, i32) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v.log10());
        hi = hi.max(v.log10());
    }
    if !lo.is_finite() {
        return (0, 1);
    }
    let (lo, hi) = (lo.floor() as i32, hi.ceil() as i32);
    (lo, hi.max(lo + 1))
}

fn size_label(exp: i32) -> String {
    crate::report::grouped(10_i64.pow(exp.max(0).unsigned_abs()))
}

fn ms_label(exp: i32) -> String {
    let v = 10_f64.powi(exp);
    if v >= 1000.0 {
        format!("{} s", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v} ms")
    } else {
        format!("{} µs", v * 1000.0)
    }
}

/// The chart as an SVG document, with the bars' panel under it when there
/// are bars.
pub fn chart(title: &str, series: &[Series], bars: &[Bar]) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = decades(all().map(|p| p.n));
    let (y0, y1) = decades(all().flat_map(|p| [p.min, p.max, p.median]));
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    // A little room left and right, so the end points are not on the frame.
    let (xl, xr) = (f64::from(x0) - 0.08, f64::from(x1) + 0.08);
    let x = |n: f64| LEFT + (n.log10() - xl) / (xr - xl) * pw;
    let y = |ms: f64| TOP + ph - (ms.log10() - f64::from(y0)) / f64::from(y1 - y0) * ph;

    let total_h = if bars.is_empty() {
        H
    } else {
        H + 2.0 * BAR_MARGIN + BAR_LINE * bars.len() as f64
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" viewBox="0 0 {W} {total_h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{total_h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + pw / 2.0,
        escape(title)
    );
    // Grid: every decade, with faint lines at 2× and 5×.
    for e in x0..=x1 {
        for (m, major) in [(1.0, true), (2.0, false), (5.0, false)] {
            let n = m * 10_f64.powi(e);
            if e == x1 && !major {
                continue;
            }
            let px = x(n);
            let stroke = if major { "#bbb" } else { "#eee" };
            let _ = writeln!(
                s,
                r#"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="{stroke}"/>"#,
                TOP + ph
            );
            if major {
                let _ = writeln!(
                    s,
                    r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    TOP + ph + 18.0,
                    size_label(e)
                );
            }
        }
    }
    for e in y0..=y1 {
        for (m, major) in [(1.0, true), (2.0, false), (5.0, false)] {
            let v = m * 10_f64.powi(e);
            if e == y1 && !major {
                continue;
            }
            let py = y(v);
            let stroke = if major { "#bbb" } else { "#eee" };
            let _ = writeln!(
                s,
                r#"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="{stroke}"/>"#,
                LEFT + pw
            );
            if major {
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                    LEFT - 8.0,
                    py + 4.0,
                    ms_label(e)
                );
            }
        }
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">agents in the tree (log scale)</text>"#,
        LEFT + pw / 2.0,
        H - 16.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">time until every session is finalized (log scale)</text>"#,
        TOP + ph / 2.0
    );

    for (i, line) in series.iter().enumerate() {
        let dash = if line.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let path: Vec<String> = line
            .points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.n), y(p.median)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            line.color
        );
        for p in &line.points {
            let (px, py) = (x(p.n), y(p.median));
            let _ = writeln!(
                s,
                r#"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="{}"/>"#,
                y(p.min),
                y(p.max),
                line.color
            );
            let _ = writeln!(s, "{}", marker(px, py, line));
        }
        // Legend.
        let ly = TOP + 14.0 + 22.0 * i as f64;
        let lx = LEFT + pw + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/>"#,
            lx + 30.0,
            line.color
        );
        let _ = writeln!(s, "{}", marker(lx + 15.0, ly, line));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 38.0,
            ly + 4.0,
            escape(&line.label)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#555">median of rounds; bars: min–max</text>"##,
        LEFT + pw + 16.0,
        TOP + 14.0 + 22.0 * series.len() as f64 + 6.0
    );
    if !bars.is_empty() {
        bar_panel(&mut s, H, bars);
    }
    s.push_str("</svg>\n");
    s
}

/// The bars' panel, from `top` down: each row's ratio as a bar on a linear
/// scale, green where its target is met and red where not, the target a
/// black tick, 1× a grey line.
fn bar_panel(s: &mut String, top: f64, bars: &[Bar]) {
    let label_w = 410.0;
    let (x0, x1) = (label_w, W - 60.0);
    let max = bars
        .iter()
        .flat_map(|b| [b.ratio, b.target])
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max)
        * 1.15;
    let x = |v: f64| x0 + (v.clamp(0.0, max) / max) * (x1 - x0);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15">Other rows: ratio to the baseline (or to the bound), against the target</text>"#,
        W / 2.0,
        top + 28.0
    );
    let y0 = top + BAR_MARGIN;
    let y1 = y0 + BAR_LINE * bars.len() as f64;
    let one = x(1.0);
    let _ = writeln!(
        s,
        r##"<line x1="{one:.1}" y1="{y0:.1}" x2="{one:.1}" y2="{y1:.1}" stroke="#bbb"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{one:.1}" y="{:.1}" text-anchor="middle">1×</text>"#,
        y1 + 16.0
    );
    for (i, bar) in bars.iter().enumerate() {
        let y = y0 + BAR_LINE * i as f64;
        let met = if bar.at_least {
            bar.ratio >= bar.target
        } else {
            bar.ratio <= bar.target
        };
        let color = if met { "#1e8449" } else { "#c0392b" };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            x0 - 8.0,
            y + 16.0,
            escape(&bar.label)
        );
        if bar.ratio.is_finite() {
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="14" fill="{color}"/>"#,
                y + 5.0,
                (x(bar.ratio) - x0).max(1.0)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{:.2}×</text>"#,
                x(bar.ratio) + 4.0,
                y + 16.0,
                bar.ratio
            );
        }
        let tx = x(bar.target);
        let _ = writeln!(
            s,
            r##"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#000" stroke-width="2"/>"##,
            y + 2.0,
            y + 22.0
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{x0:.1}" y="{:.1}" fill="#555">black tick: the target (≥ for throughput, ≤ for time and bounds); green: met</text>"##,
        y1 + 34.0
    );
}

fn marker(px: f64, py: f64, line: &Series) -> String {
    if line.dashed {
        format!(
            r#"<rect x="{:.1}" y="{:.1}" width="8" height="8" fill="{}"/>"#,
            px - 4.0,
            py - 4.0,
            line.color
        )
    } else {
        format!(
            r#"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="{}"/>"#,
            line.color
        )
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
