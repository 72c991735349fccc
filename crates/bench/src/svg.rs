//! A log–log line chart of teardown time against tree size, as a standalone
//! SVG file: the stubbed teardown against the token tree, the durable
//! teardown against the asyncio peer. Hand-written: eight series of a few
//! points need no plotting library.

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

/// The chart as an SVG document.
pub fn chart(title: &str, series: &[Series]) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = decades(all().map(|p| p.n));
    let (y0, y1) = decades(all().flat_map(|p| [p.min, p.max, p.median]));
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    // A little room left and right, so the end points are not on the frame.
    let (xl, xr) = (f64::from(x0) - 0.08, f64::from(x1) + 0.08);
    let x = |n: f64| LEFT + (n.log10() - xl) / (xr - xl) * pw;
    let y = |ms: f64| TOP + ph - (ms.log10() - f64::from(y0)) / f64::from(y1 - y0) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
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
    s.push_str("</svg>\n");
    s
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
