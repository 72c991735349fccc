//! Interleaved rounds and their statistics.
//!
//! Each round runs ours and the baseline back to back on the same data, the
//! order alternating from round to round (A B, B A, A B, …) so that neither
//! side always runs on a warmer cache or a quieter moment. A round's ratio is
//! taken within the round, so load that comes and goes between rounds (other
//! builds on a shared machine) mostly cancels out; the figure quoted is the
//! median of those per-round ratios, with their min and max.

use std::time::Duration;

use crate::Result;

/// How many rounds to run and how many to throw away first.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Untimed rounds first (caches, allocator, lazy statics).
    pub warmup: usize,
    /// Timed rounds.
    pub rounds: usize,
}

/// The timings of one interleaved comparison.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    /// Ours, one per round.
    pub ours: Vec<Duration>,
    /// The baseline, one per round.
    pub base: Vec<Duration>,
}

/// Runs `plan.warmup + plan.rounds` rounds of `ours` and `base`, alternating
/// which goes first, and keeps the timed ones. Each closure returns the time
/// of the part it measures (set-up and tear-down outside it are not timed).
pub fn interleave(
    plan: Plan,
    mut ours: impl FnMut() -> Result<Duration>,
    mut base: impl FnMut() -> Result<Duration>,
) -> Result<Pairs> {
    let mut pairs = Pairs::default();
    for round in 0..plan.warmup + plan.rounds {
        let (o, b) = if round % 2 == 0 {
            let o = ours()?;
            (o, base()?)
        } else {
            let b = base()?;
            (ours()?, b)
        };
        if round >= plan.warmup {
            pairs.ours.push(o);
            pairs.base.push(b);
        }
    }
    Ok(pairs)
}

/// Runs `plan.warmup + plan.rounds` rounds of `ours` alone (a row whose
/// baseline cannot run) and keeps the timed ones.
pub fn rounds(plan: Plan, mut ours: impl FnMut() -> Result<Duration>) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(plan.rounds);
    for round in 0..plan.warmup + plan.rounds {
        let t = ours()?;
        if round >= plan.warmup {
            times.push(t);
        }
    }
    Ok(times)
}

/// Which way a ratio is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sense {
    /// Ours' time over the baseline's: lower is better (target `≤`).
    TimeRatio,
    /// Ours' throughput over the baseline's (the baseline's time over ours):
    /// higher is better (target `≥`).
    ThroughputRatio,
}

/// The median, min and max of a set of per-round ratios.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Pairs {
    /// The per-round ratios, read as `sense` says.
    pub fn ratios(&self, sense: Sense) -> Spread {
        let ratios: Vec<f64> = self
            .ours
            .iter()
            .zip(&self.base)
            .map(|(o, b)| {
                let (o, b) = (o.as_secs_f64(), b.as_secs_f64());
                match sense {
                    Sense::TimeRatio => o / b,
                    Sense::ThroughputRatio => b / o,
                }
            })
            .collect();
        spread(ratios)
    }

    /// The median time of ours.
    pub fn ours_median(&self) -> Duration {
        median_duration(&self.ours)
    }

    /// The median time of the baseline.
    pub fn base_median(&self) -> Duration {
        median_duration(&self.base)
    }
}

/// Median, min and max of `values` (`NaN`s if empty).
pub fn spread(mut values: Vec<f64>) -> Spread {
    if values.is_empty() {
        return Spread {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
        };
    }
    values.sort_by(f64::total_cmp);
    Spread {
        median: median_sorted(&values),
        min: values[0],
        max: values[values.len() - 1],
    }
}

fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The median of `values` (zero if empty).
pub fn median_duration(values: &[Duration]) -> Duration {
    let secs: Vec<f64> = values.iter().map(Duration::as_secs_f64).collect();
    let m = spread(secs).median;
    if m.is_finite() {
        Duration::from_secs_f64(m)
    } else {
        Duration::ZERO
    }
}

/// The `p`-quantile (0..=1) of sorted `values`, nearest rank.
pub fn quantile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
