//! `settle-bench`: every performance target of SPEC §9 against its baseline,
//! in one process, interleaved, side by side.
//!
//! ```text
//! cargo run --release -p settle-bench                  # the full run (about a minute)
//! cargo run --release -p settle-bench -- --quick       # small sizes, for CI
//! cargo run --release -p settle-bench -- --json        # the same rows as JSON
//! cargo run --release -p settle-bench -- --svg docs/teardown.svg
//! ```
//!
//! Every row runs ours and its baseline in alternating order within each
//! round, after warm-up rounds, and quotes the median of the per-round ratios
//! (see [`measure`]). The run reports; it does not gate: it exits 0 when a
//! target is missed, and 1 only when a bench could not run at all.

mod alloc;
mod core_bench;
mod gateway_bench;
mod measure;
mod null_store;
mod report;
mod store_bench;
mod stream_bench;
mod svg;
mod teardown;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

use crate::measure::{interleave, spread, Plan, Sense};
use crate::report::{grouped, num, Row, Target};
use crate::teardown::Shape;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

/// The error of a bench that could not run.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// A result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The rows of SPEC §9.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Bench {
    Teardown,
    Core,
    Stream,
    Store,
    Memory,
    Gateway,
}

/// Every performance target of SPEC §9 against its baseline, interleaved in
/// one process; prints a table (or JSON) and can draw the teardown chart.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Small sizes and few rounds (for CI: well under a minute).
    #[arg(long)]
    quick: bool,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the chart of teardown time against tree size to this SVG file.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// Run only these benches (comma-separated); all by default.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Bench>,
    /// Largest chain depth for the teardown bench (default: the largest tree size).
    #[arg(long, value_name = "N")]
    max_chain: Option<usize>,
    /// Tokio worker threads for the teardown row (default: one per core;
    /// 1 runs it on a current-thread runtime).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Teardown tree sizes instead of the defaults (comma-separated).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// The gateway row's client process: connect N clients to ADDR and hold them.
    #[arg(long, hide = true, num_args = 2, value_names = ["ADDR", "N"])]
    gateway_clients: Vec<String>,
    /// With --gateway-clients: each client creates a session.
    #[arg(long, hide = true)]
    gateway_sessions: bool,
}

/// Sizes and rounds of one run.
struct Sizes {
    teardown: Vec<(usize, Plan)>,
    core_events: usize,
    core: Plan,
    stream_items: usize,
    stream: Plan,
    store_rows: usize,
    store_batches: Vec<usize>,
    store: Plan,
    lag_per_session: usize,
    memory_sessions: u64,
    gateway: gateway_bench::Sizes,
}

impl Sizes {
    fn full() -> Sizes {
        let plan = |warmup, rounds| Plan { warmup, rounds };
        Sizes {
            teardown: vec![
                (1_000, plan(3, 15)),
                (10_000, plan(2, 9)),
                (100_000, plan(1, 5)),
            ],
            core_events: 200_000,
            core: plan(5, 31),
            stream_items: 1_000_000,
            stream: plan(3, 21),
            store_rows: store_bench::SESSIONS * 1024,
            store_batches: vec![1, 16, 256],
            store: plan(2, 15),
            lag_per_session: 2_000,
            memory_sessions: 100_000,
            gateway: gateway_bench::Sizes {
                clients: 1_000,
                chunks: 20,
                delay: Duration::from_millis(50),
                plan: plan(1, 5),
            },
        }
    }

    fn quick() -> Sizes {
        let plan = |warmup, rounds| Plan { warmup, rounds };
        Sizes {
            teardown: vec![(1_000, plan(1, 5)), (10_000, plan(1, 3))],
            core_events: 200_000,
            core: plan(2, 9),
            stream_items: 200_000,
            stream: plan(2, 9),
            store_rows: store_bench::SESSIONS * 128,
            store_batches: vec![1, 16, 256],
            store: plan(1, 5),
            lag_per_session: 200,
            memory_sessions: 10_000,
            gateway: gateway_bench::Sizes {
                clients: 100,
                chunks: 10,
                delay: Duration::from_millis(20),
                plan: plan(1, 3),
            },
        }
    }
}

fn progress(what: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "settle-bench: {what}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The teardown rows, and the chart's series.
fn run_teardown(
    sizes: &Sizes,
    max_chain: Option<usize>,
    workers: Option<usize>,
) -> Result<(Vec<Row>, Vec<svg::Series>)> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = match workers.unwrap_or(cores) {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for shape in [Shape::Flat, Shape::Chain] {
        let (mut ours_pts, mut base_pts) = (Vec::new(), Vec::new());
        for &(n, plan) in &sizes.teardown {
            if shape == Shape::Chain && max_chain.is_some_and(|max| n > max) {
                continue;
            }
            progress(&format!(
                "teardown {} {} agents: {} + {} rounds",
                shape.name(),
                grouped(n as i64),
                plan.warmup,
                plan.rounds
            ));
            let mut phases = Vec::new();
            let pairs = interleave(
                plan,
                || {
                    let p = rt.block_on(teardown::ours(shape, n))?;
                    phases.push(p);
                    Ok(p.all_finalized)
                },
                || rt.block_on(teardown::baseline(shape, n)),
            )?;
            let phases = &phases[plan.warmup..];
            let at = |f: fn(&teardown::Phases) -> Duration| {
                let times: Vec<Duration> = phases.iter().map(f).collect();
                num(ms(measure::median_duration(&times)))
            };
            let note = format!(
                "ours, median ms after the cancel: driver handled it {}; recorder ended turns {}–{}; \
                 first finalize {}; the root's finalized() answered {}; last finalize {}",
                at(|p| p.cancel_handled),
                at(|p| p.first_turn_ended),
                at(|p| p.last_turn_ended),
                at(|p| p.first_finalized),
                at(|p| p.root_finalized_in_core),
                at(|p| p.all_finalized),
            );
            let point = |times: &[Duration]| {
                let s = spread(times.iter().map(|d| ms(*d)).collect());
                svg::Point {
                    n: n as f64,
                    median: s.median,
                    min: s.min,
                    max: s.max,
                }
            };
            ours_pts.push(point(&pairs.ours));
            base_pts.push(point(&pairs.base));
            rows.push(
                Row::compared(
                    format!("teardown {}", shape.name()),
                    format!("{} agents", grouped(n as i64)),
                    "ms",
                    ms(pairs.ours_median()),
                    ms(pairs.base_median()),
                    pairs.ratios(Sense::TimeRatio),
                    Target::ratio_at_most(1.5),
                    plan.rounds,
                )
                .with_note(note),
            );
        }
        let (color_ours, color_base) = ("#c0392b", "#2471a3");
        let dashed = shape == Shape::Chain;
        series.push(svg::Series {
            label: format!("settle, {}", shape.name()),
            color: color_ours,
            dashed,
            points: ours_pts,
        });
        series.push(svg::Series {
            label: format!("token tree, {}", shape.name()),
            color: color_base,
            dashed,
            points: base_pts,
        });
    }
    Ok((rows, series))
}

fn run_core(sizes: &Sizes) -> Result<Row> {
    let n = sizes.core_events;
    progress(&format!(
        "core {} events: {} + {} rounds",
        grouped(n as i64),
        sizes.core.warmup,
        sizes.core.rounds
    ));
    let ops = core_bench::workload(core_bench::SEED, core_bench::SLOTS, n);
    let pairs = interleave(
        sizes.core,
        || Ok(core_bench::core_round(&ops)),
        || Ok(core_bench::map_round(&ops)),
    )?;
    let rate = |d: Duration| n as f64 / d.as_secs_f64() / 1e6;
    Ok(Row::compared(
        "core",
        format!("{} events", grouped(n as i64)),
        "M ev/s",
        rate(pairs.ours_median()),
        rate(pairs.base_median()),
        pairs.ratios(Sense::ThroughputRatio),
        Target::ratio_at_least(0.5),
        sizes.core.rounds,
    ))
}

fn run_stream(sizes: &Sizes) -> Result<Row> {
    let n = sizes.stream_items;
    progress(&format!(
        "stream {} items: {} + {} rounds",
        grouped(n as i64),
        sizes.stream.warmup,
        sizes.stream.rounds
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let pairs = interleave(
        sizes.stream,
        || Ok(stream_bench::guarded_round(&rt, n)),
        || Ok(stream_bench::bare_round(&rt, n)),
    )?;
    let per_item = |d: Duration| d.as_secs_f64() * 1e9 / n as f64;
    // The layers one by one, against the bare stream again (fewer rounds).
    let layers = Plan {
        warmup: 1,
        rounds: sizes.stream.rounds.div_ceil(2),
    };
    let guarded = interleave(
        layers,
        || Ok(stream_bench::guarded_only_round(&rt, n)),
        || Ok(stream_bench::bare_round(&rt, n)),
    )?;
    let idle = interleave(
        layers,
        || Ok(stream_bench::idle_only_round(&rt, n)),
        || Ok(stream_bench::bare_round(&rt, n)),
    )?;
    let note = format!(
        "per layer, median ratio to the bare stream: Guarded<S> {:.2}×, IdleTimeout<S> \
         (which holds a Guarded<S>) {:.2}×, Guarded<IdleTimeout<S>> {:.2}×",
        guarded.ratios(Sense::TimeRatio).median,
        idle.ratios(Sense::TimeRatio).median,
        pairs.ratios(Sense::TimeRatio).median,
    );
    Ok(Row::compared(
        "stream",
        format!("{} items", grouped(n as i64)),
        "ns/item",
        per_item(pairs.ours_median()),
        per_item(pairs.base_median()),
        pairs.ratios(Sense::TimeRatio),
        Target::ratio_at_most(1.10),
        sizes.stream.rounds,
    )
    .with_note(note))
}

fn run_store(sizes: &Sizes) -> Result<Vec<Row>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rows_n = sizes.store_rows;
    let mut rows = Vec::new();
    for &batch in &sizes.store_batches {
        progress(&format!(
            "store {} rows, batch {batch}: {} + {} rounds",
            grouped(rows_n as i64),
            sizes.store.warmup,
            sizes.store.rounds
        ));
        let dir = tempfile::tempdir()?;
        let ours = store_bench::Ours::new(&rt, &dir.path().join("store.db"), batch, rows_n)?;
        let mut raw = store_bench::Raw::new(&rt, &dir.path().join("raw.db"), batch, rows_n)?;
        let pairs = interleave(sizes.store, || ours.round(&rt), || raw.round())?;
        let rate = |d: Duration| rows_n as f64 / d.as_secs_f64() / 1e3;
        rows.push(Row::compared(
            "store appends",
            format!("{} rows, batch {batch}", grouped(rows_n as i64)),
            "k rows/s",
            rate(pairs.ours_median()),
            rate(pairs.base_median()),
            pairs.ratios(Sense::ThroughputRatio),
            Target::ratio_at_least(0.7),
            sizes.store.rounds,
        ));
    }
    progress(&format!(
        "store durability lag: {} sessions × {} chunks at 1 ms",
        store_bench::SESSIONS,
        sizes.lag_per_session
    ));
    let dir = tempfile::tempdir()?;
    let lag = store_bench::durability_lag(&dir.path().join("lag.db"), sizes.lag_per_session)?;
    let interval = ms(lag.interval);
    for (name, value) in [("p50", lag.p50), ("p99", lag.p99)] {
        let ratio = ms(value) / interval;
        let row = Row::compared(
            format!("store lag {name}"),
            format!("{} chunks", grouped(lag.samples as i64)),
            "ms",
            ms(value),
            interval,
            spread(vec![ratio]),
            Target::ratio_at_most(1.0),
            1,
        );
        rows.push(if name == "p99" {
            row.with_note(format!(
                "append → ack, {} sessions at ~1,000 chunks/s each; baseline = the flush interval; max {} ms",
                store_bench::SESSIONS,
                num(ms(lag.max))
            ))
        } else {
            row
        });
    }
    Ok(rows)
}

fn run_memory(sizes: &Sizes) -> Result<Row> {
    let n = sizes.memory_sessions;
    progress(&format!("memory: {} idle sessions", grouped(n as i64)));
    let bytes = core_bench::bytes_per_idle_session(n)?;
    Ok(Row::absolute(
        "memory",
        format!("{} idle sessions", grouped(n as i64)),
        "B/session",
        bytes,
        Target::ours_at_most(512.0),
        1,
    )
    .with_note(
        "heap bytes per idle registered session in the core, counted by the global allocator",
    ))
}

fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    let mut sizes = sizes;
    if !args.sizes.is_empty() {
        let plan = |n: usize| {
            sizes
                .teardown
                .iter()
                .find(|(m, _)| *m >= n)
                .or(sizes.teardown.last())
                .map_or(
                    Plan {
                        warmup: 1,
                        rounds: 3,
                    },
                    |(_, p)| *p,
                )
        };
        sizes.teardown = args.sizes.iter().map(|&n| (n, plan(n))).collect();
    }
    let wants = |b: Bench| args.only.is_empty() || args.only.contains(&b);
    let mut rows = Vec::new();
    // Memory first: the allocator counts every thread, and none is running yet.
    if wants(Bench::Memory) {
        rows.push(run_memory(&sizes)?);
    }
    let mut series = Vec::new();
    if wants(Bench::Teardown) {
        let (teardown_rows, teardown_series) = run_teardown(&sizes, args.max_chain, args.workers)?;
        rows.extend(teardown_rows);
        series = teardown_series;
    }
    if wants(Bench::Core) {
        rows.push(run_core(&sizes)?);
    }
    if wants(Bench::Stream) {
        rows.push(run_stream(&sizes)?);
    }
    if wants(Bench::Store) {
        rows.extend(run_store(&sizes)?);
    }
    if wants(Bench::Gateway) {
        rows.push(gateway_bench::memory_row(sizes.gateway.clients)?);
        rows.extend(gateway_bench::latency_rows(sizes.gateway)?);
    }
    // The SPEC's order: teardown, core, stream, store, memory.
    let order = |r: &Row| {
        ["teardown", "core", "stream", "store", "memory", "gateway"]
            .iter()
            .position(|p| r.bench.starts_with(p))
            .unwrap_or(usize::MAX)
    };
    rows.sort_by_key(order);
    let elapsed = started.elapsed();

    if let Some(path) = &args.svg {
        if series.is_empty() {
            progress("no teardown figures: the chart is not written");
        } else {
            let title = "Teardown: cancel the root of an agent tree, every agent mid-turn";
            std::fs::write(path, svg::chart(title, &series))
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            progress(&format!("chart written to {}", path.display()));
        }
    }

    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "mode": if args.quick { "quick" } else { "full" },
            "seconds": elapsed.as_secs_f64(),
            "rows": rows,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        let missed = rows.iter().filter(|r| !r.met).count();
        write!(out, "{}", report::table(&rows))?;
        writeln!(
            out,
            "\n{} rows, {} target{} missed, {:.1} s ({} run)",
            rows.len(),
            missed,
            if missed == 1 { "" } else { "s" },
            elapsed.as_secs_f64(),
            if args.quick { "quick" } else { "full" }
        )?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let [addr, n] = args.gateway_clients.as_slice() {
        let clients = n.parse().unwrap_or(0);
        return match gateway_bench::client_process(addr, clients, args.gateway_sessions) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                progress(&format!("client process: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            progress(&format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
