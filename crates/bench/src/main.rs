//! `settle-bench`: every performance target of SPEC §9 against its baseline,
//! in one process, interleaved, side by side.
//!
//! ```text
//! cargo run --release -p settle-bench                  # the full run (minutes: the durable rows)
//! cargo run --release -p settle-bench -- --quick       # small sizes, for CI (well under a minute)
//! cargo run --release -p settle-bench -- --json        # the same rows as JSON
//! cargo run --release -p settle-bench -- --svg docs/teardown.svg
//! cargo run --release -p settle-bench -- --only durable,register
//! cargo build --release -p settle-cli && cargo run --release -p settle-bench -- --only fleet-restart
//! ```
//!
//! Every row runs ours and its baseline in alternating order within each
//! round, after warm-up rounds, and quotes the median of the per-round ratios
//! (see [`measure`]). The `teardown durable` row's baseline is the Python
//! asyncio peer of SPEC §9, run as a subprocess (see [`peer`]); without
//! `python3` that row runs alone and says so. The run reports; it does not
//! gate: it exits 0 when a target is missed, and 1 only when a bench could
//! not run at all.

mod alloc;
mod child;
mod clocked;
mod core_bench;
mod durable;
mod finalized_memory;
mod fleet;
mod fleet_restart;
mod gateway_bench;
mod measure;
mod mid_turn;
mod null_store;
mod peer;
mod raw_sql;
mod recover_bench;
mod register;
mod report;
mod scale;
mod store_bench;
mod stream_bench;
mod svg;
mod teardown;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

use crate::durable::Tree;
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
    Durable,
    Core,
    Stream,
    Store,
    Register,
    Memory,
    Gateway,
    Scale,
    Recover,
    Fleet,
    FleetRestart,
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
    /// Tree sizes for both teardown rows instead of the defaults (comma-separated).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// The gateway row's client process: connect N clients to ADDR and hold them.
    #[arg(long, hide = true, num_args = 2, value_names = ["ADDR", "N"])]
    gateway_clients: Vec<String>,
    /// With --gateway-clients: each client creates a session.
    #[arg(long, hide = true)]
    gateway_sessions: bool,
    /// The memory-after-finalize row's own process: run N sessions through a
    /// runtime and print `BYTES COUNTED`.
    #[arg(long, hide = true, value_name = "N")]
    finalized_memory_child: Option<usize>,
    /// The gateway memory row's own process: serve N clients, ours and bare,
    /// and print the heap bytes per client of each.
    #[arg(long, hide = true, value_name = "N")]
    gateway_memory_child: Option<usize>,
    /// The scale row's own process: N idle sessions, counted and torn down.
    #[arg(long, hide = true, value_name = "N")]
    scale_child: Option<usize>,
    /// A fleet row's process: SIDE (ours or raw), the database URL, chunks.
    #[arg(long, hide = true, num_args = 3, value_names = ["SIDE", "URL", "CHUNKS"])]
    fleet_child: Vec<String>,
}

/// Sizes and rounds of one run.
struct Sizes {
    teardown: Vec<(usize, Plan)>,
    /// Each size with its timed rounds and its phase-breakdown rounds.
    durable: Vec<(usize, Plan, usize)>,
    register_sessions: usize,
    register: Plan,
    finalized_sessions: usize,
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
    scale_sessions: usize,
    scale: Plan,
    recover_sessions: usize,
    recover: Plan,
    fleet: fleet::Sizes,
    fleet_restart_sessions: usize,
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
            durable: vec![
                (1_000, plan(2, 7), 3),
                (10_000, plan(1, 5), 2),
                (100_000, plan(0, 3), 1),
            ],
            register_sessions: 10_000,
            register: plan(1, 7),
            finalized_sessions: 100_000,
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
            scale_sessions: 1_000_000,
            scale: plan(0, 1),
            recover_sessions: 100_000,
            recover: plan(0, 3),
            fleet: fleet::Sizes {
                processes: vec![1, 2, 4],
                chunks: 20_000,
                plan: plan(1, 5),
            },
            fleet_restart_sessions: fleet_restart::SESSIONS,
        }
    }

    fn quick() -> Sizes {
        let plan = |warmup, rounds| Plan { warmup, rounds };
        Sizes {
            teardown: vec![(1_000, plan(1, 5)), (10_000, plan(1, 3))],
            durable: vec![(1_000, plan(1, 3), 1)],
            register_sessions: 1_000,
            register: plan(1, 5),
            finalized_sessions: 10_000,
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
            scale_sessions: 10_000,
            scale: plan(0, 1),
            recover_sessions: 1_000,
            recover: plan(0, 3),
            fleet: fleet::Sizes {
                processes: vec![1, 2, 4],
                chunks: 1_000,
                plan: plan(0, 1),
            },
            fleet_restart_sessions: 30,
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

/// The tokio runtime of the teardown rows: one worker per core unless told.
fn teardown_runtime(workers: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Ok(match workers.unwrap_or(cores) {
        0 | 1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    })
}

fn chart_point(n: usize, times: &[Duration]) -> svg::Point {
    let s = spread(times.iter().map(|d| ms(*d)).collect());
    svg::Point {
        n: n as f64,
        median: s.median,
        min: s.min,
        max: s.max,
    }
}

/// The teardown rows, and the chart's series.
fn run_teardown(
    sizes: &Sizes,
    max_chain: Option<usize>,
    workers: Option<usize>,
) -> Result<(Vec<Row>, Vec<svg::Series>)> {
    let rt = teardown_runtime(workers)?;
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
            ours_pts.push(chart_point(n, &pairs.ours));
            base_pts.push(chart_point(n, &pairs.base));
            rows.push(
                Row::compared(
                    format!("teardown {}", shape.name()),
                    format!("{} agents", grouped(n as i64)),
                    "ms",
                    ms(pairs.ours_median()),
                    ms(pairs.base_median()),
                    pairs.ratios(Sense::TimeRatio),
                    Target::ratio_at_most(2.0),
                    plan.rounds,
                )
                .with_note(note),
            );
        }
        let (color_ours, color_base) = ("#c0392b", "#2471a3");
        let dashed = shape == Shape::Chain;
        series.push(svg::Series {
            label: format!("settle stubbed, {}", shape.name()),
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

/// The phase breakdown of the durable row, as the row's note.
fn durable_note(phases: &[durable::Phases], n: usize, timed: Duration) -> String {
    if phases.is_empty() {
        return "no phase-breakdown round".to_owned();
    }
    let at = |f: &dyn Fn(&durable::Phases) -> Option<Duration>| {
        let times: Vec<Duration> = phases.iter().filter_map(f).collect();
        if times.is_empty() {
            "never".to_owned()
        } else {
            num(ms(measure::median_duration(&times)))
        }
    };
    let calls: Vec<String> = clocked::WRITES
        .iter()
        .enumerate()
        .filter_map(|(i, write)| {
            let total: u64 = phases.iter().map(|p| p.calls[i]).sum();
            let per_session = total as f64 / (phases.len() * n.max(1)) as f64;
            (total > 0).then(|| format!("{write} {per_session:.2}"))
        })
        .collect();
    format!(
        "ours, phase breakdown (median of {} separate round{} over an instrumented store, not \
         timed against the target), ms after the cancel: every work exited (its turn's outcome \
         answered) {}; first finalize handed to the store {}; last handed {}; last finalize \
         committed {}; every finalized() answered {} (the timed rounds' median: {}); store \
         writes per session over the round, set-up included: {}",
        phases.len(),
        if phases.len() == 1 { "" } else { "s" },
        at(&|p| Some(p.work_exited)),
        at(&|p| p.finalize.first_handed),
        at(&|p| p.finalize.last_handed),
        at(&|p| p.finalize.last_committed),
        at(&|p| Some(p.answered)),
        num(ms(timed)),
        calls.join(", "),
    )
}

/// The `teardown durable` rows against the asyncio peer, and their series.
fn run_durable(sizes: &Sizes, workers: Option<usize>) -> Result<(Vec<Row>, Vec<svg::Series>)> {
    let rt = teardown_runtime(workers)?;
    let peer = peer::Peer::find()?;
    if peer.is_none() {
        progress("python3 not found: the teardown durable rows run without their baseline");
    }
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for tree in [Tree::Flat, Tree::FanOut(10)] {
        let (mut ours_pts, mut peer_pts) = (Vec::new(), Vec::new());
        for &(n, plan, phase_rounds) in &sizes.durable {
            progress(&format!(
                "teardown durable {} {} agents: {} + {} rounds, {} phase round{}",
                tree.name(),
                grouped(n as i64),
                plan.warmup,
                plan.rounds,
                phase_rounds,
                if phase_rounds == 1 { "" } else { "s" }
            ));
            let ours = || durable::ours(&rt, tree, n);
            let pairs = match &peer {
                Some(peer) => Some(interleave(plan, ours, || peer.round(n, tree.fanout(n)))?),
                None => None,
            };
            let ours_times = match &pairs {
                Some(p) => p.ours.clone(),
                None => measure::rounds(plan, ours)?,
            };
            let phases = (0..phase_rounds)
                .map(|_| durable::phases(&rt, tree, n))
                .collect::<Result<Vec<_>>>()?;
            let ours_median = measure::median_duration(&ours_times);
            let note = durable_note(&phases, n, ours_median);
            ours_pts.push(chart_point(n, &ours_times));
            let bench = format!("teardown durable {}", tree.name());
            let size = format!("{} agents", grouped(n as i64));
            let target = Target::ratio_at_most(0.5);
            let row = match &pairs {
                Some(pairs) => {
                    peer_pts.push(chart_point(n, &pairs.base));
                    Row::compared(
                        bench,
                        size,
                        "ms",
                        ms(ours_median),
                        ms(pairs.base_median()),
                        pairs.ratios(Sense::TimeRatio),
                        target,
                        plan.rounds,
                    )
                    .with_note(format!(
                        "the peer with SQLite synchronous = {} as the store{}; {note}",
                        peer::SYNCHRONOUS,
                        match tree {
                            Tree::Flat => ", cancelling every task in one loop",
                            Tree::FanOut(_) =>
                                ", cancelling by tree (the root's task; each task its children's)",
                        }
                    ))
                }
                None => Row::ours_only(bench, size, "ms", ms(ours_median), target, plan.rounds)
                    .with_note(format!(
                    "no baseline: python3 was not found, so the asyncio peer did not run; {note}"
                )),
            };
            rows.push(row);
        }
        let dashed = tree != Tree::Flat;
        series.push(svg::Series {
            label: format!("settle durable, {}", tree.name()),
            color: "#d35400",
            dashed,
            points: ours_pts,
        });
        if !peer_pts.is_empty() {
            series.push(svg::Series {
                label: format!("asyncio peer, {}", tree.name()),
                color: "#1e8449",
                dashed,
                points: peer_pts,
            });
        }
    }
    Ok((rows, series))
}

fn run_register(sizes: &Sizes) -> Result<Row> {
    let n = sizes.register_sessions;
    let plan = sizes.register;
    progress(&format!(
        "register {} sessions: {} + {} rounds",
        grouped(n as i64),
        plan.warmup,
        plan.rounds
    ));
    let pairs = interleave(plan, || register::ours(n), || register::baseline(n))?;
    let rate = |d: Duration| n as f64 / d.as_secs_f64() / 1e3;
    Ok(Row::compared(
        "register",
        format!("{} sessions", grouped(n as i64)),
        "k sessions/s",
        rate(pairs.ours_median()),
        rate(pairs.base_median()),
        pairs.ratios(Sense::ThroughputRatio),
        Target::ratio_at_least(0.5),
        plan.rounds,
    )
    .with_note(format!(
        "ours: Kernel::register under one root, all in flight, on a fresh SQLite store; baseline: \
         the same session and timeline rows with plain Diesel, {} session{} per transaction, \
         prepared multi-row inserts, the store's checkpoint policy (the store group-commits what \
         is queued)",
        register::STORE_BATCH,
        if register::STORE_BATCH == 1 { "" } else { "s" }
    )))
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
         {:.2}×, Guarded<IdleTimeout<S>> {:.2}×",
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
        let row = Row::compared(
            "store appends",
            format!("{} rows, batch {batch}", grouped(rows_n as i64)),
            "k rows/s",
            rate(pairs.ours_median()),
            rate(pairs.base_median()),
            pairs.ratios(Sense::ThroughputRatio),
            Target::ratio_at_least(0.7),
            sizes.store.rounds,
        );
        rows.push(if sizes.store_batches.last() == Some(&batch) {
            row.with_note(
                "baseline: plain Diesel, one transaction per batch, each batch one prepared \
                 multi-row INSERT, the store's pragmas and checkpoint policy (a passive \
                 checkpoint every 100 ms on its own thread, none inside a commit)",
            )
        } else {
            row
        });
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

fn run_finalized_memory(sizes: &Sizes) -> Result<Row> {
    let n = sizes.finalized_sessions;
    progress(&format!(
        "memory after finalize: {} sessions through a runtime",
        grouped(n as i64)
    ));
    let n_arg = n.to_string();
    let words = child::figures(
        &["--finalized-memory-child", &n_arg],
        "memory-after-finalize",
    )?;
    let (Some(Ok(bytes)), Some(Ok(counted)), Some(Ok(total))) = (
        words.first().map(|w| w.parse::<f64>()),
        words.get(1).map(|w| w.parse::<usize>()),
        words.get(2).map(|w| w.parse::<i64>()),
    ) else {
        return Err(format!("the memory-after-finalize process printed {words:?}").into());
    };
    Ok(Row::absolute(
        "memory after finalize",
        format!("{} finalized sessions", grouped(counted as i64)),
        "B/session",
        bytes,
        Target::ours_at_most(1.0),
        1,
    )
    .with_note(format!(
        "heap bytes still live per session a runtime registered, ran a one-chunk turn in and \
         finalized, counted by the global allocator (no-op store, waves of {} sessions, the first \
         half of them a warm-up not counted): the median growth of a wave, per session; the \
         whole counted half grew by {} B ({:.2} B per session), one-time table growth included; \
         the target is about zero",
        grouped(finalized_memory::WAVE as i64),
        grouped(total),
        total as f64 / counted.max(1) as f64,
    )))
}

/// The scale rows: memory per idle session at a million, and their durable
/// teardown against the peer at the same size; and the chart's points.
fn run_scale(sizes: &Sizes) -> Result<(Vec<Row>, Vec<svg::Series>)> {
    let n = sizes.scale_sessions;
    let plan = sizes.scale;
    let peer = peer::Peer::find()?;
    progress(&format!(
        "scale {} idle sessions: {} + {} rounds",
        grouped(n as i64),
        plan.warmup,
        plan.rounds
    ));
    let mut figures = Vec::new();
    let mut ours = || {
        let f = scale::figures(n)?;
        figures.push(f);
        Ok(f.teardown)
    };
    let (ours_times, pairs) = match &peer {
        Some(peer) => {
            let pairs = interleave(plan, &mut ours, || peer.round(n, n))?;
            (pairs.ours.clone(), Some(pairs))
        }
        None => (measure::rounds(plan, &mut ours)?, None),
    };
    let counted = &figures[plan.warmup.min(figures.len())..];
    let median =
        |f: fn(&scale::Figures) -> f64| measure::spread(counted.iter().map(f).collect()).median;
    let size = format!("{} idle sessions", grouped(n as i64));
    let memory = Row::absolute(
        "scale memory",
        size.clone(),
        "B/session",
        median(|f| f.core_bytes),
        Target::ours_at_most(512.0),
        counted.len(),
    )
    .with_note(format!(
        "heap bytes per idle registered session in the core holding all of them; the whole \
         runtime (core, driver, shared session state) on a real SQLite store holds {} B per \
         session, and the process's resident set grew {} B per session while it registered them",
        num(median(|f| f.runtime_bytes)),
        num(median(|f| f.rss_bytes)),
    ));
    let ours_median = measure::median_duration(&ours_times);
    let bench = "scale teardown durable";
    let note = "ours: every session idle (registered, no turn), children of one root, on a real \
                SQLite store, from the root's cancel until its finalized() answered (by G1 after \
                every child's finalize is committed), checked in the file after; the peer flat, \
                its tasks mid-stream (it has no idle shape), with the store's synchronous setting";
    let mut series = vec![svg::Series {
        label: "settle durable, idle (scale)".to_owned(),
        color: "#7d3c98",
        dashed: false,
        points: vec![chart_point(n, &ours_times)],
    }];
    let teardown = match &pairs {
        Some(pairs) => {
            series.push(svg::Series {
                label: "asyncio peer, flat (scale)".to_owned(),
                color: "#117a65",
                dashed: false,
                points: vec![chart_point(n, &pairs.base)],
            });
            Row::compared(
                bench,
                size,
                "ms",
                ms(ours_median),
                ms(pairs.base_median()),
                pairs.ratios(Sense::TimeRatio),
                Target::ratio_at_most(0.5),
                plan.rounds,
            )
            .with_note(note)
        }
        None => Row::ours_only(
            bench,
            size,
            "ms",
            ms(ours_median),
            Target::ratio_at_most(0.5),
            plan.rounds,
        )
        .with_note(format!("no baseline: python3 was not found; {note}")),
    };
    Ok((vec![memory, teardown], series))
}

/// The recover row.
fn run_recover(sizes: &Sizes) -> Result<Row> {
    let n = sizes.recover_sessions;
    let plan = sizes.recover;
    progress(&format!(
        "recover {} sessions left live: set-up, then {} + {} rounds",
        grouped(n as i64),
        plan.warmup,
        plan.rounds
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let left = std::cell::RefCell::new(recover_bench::LeftLive::new(n)?);
    let pairs = interleave(
        plan,
        || left.borrow_mut().ours(&rt),
        || left.borrow_mut().baseline(),
    )?;
    let rate = |d: Duration| n as f64 / d.as_secs_f64() / 1e3;
    Ok(Row::compared(
        "recover",
        format!("{} sessions left live", grouped(n as i64)),
        "k sessions/s",
        rate(pairs.ours_median()),
        rate(pairs.base_median()),
        pairs.ratios(Sense::ThroughputRatio),
        Target::ratio_at_least(0.5),
        plan.rounds,
    )
    .with_note(format!(
        "ours: the store's recovery (what `settle recover` runs after reading its candidates) \
         on a copy of a file where one owner whose lease ran out left every session live with \
         a turn open; baseline: plain Diesel on another copy, one query for the sessions left \
         live, then per piece of {} session{} (one transaction, as the store commits them) \
         the conditional update of their rows, their turns' and a multi-row insert of their \
         timeline segments",
        recover_bench::RECOVER_BATCH,
        if recover_bench::RECOVER_BATCH == 1 {
            ""
        } else {
            "s"
        }
    )))
}

/// The chart's bars: the rows whose figure is not a teardown time (the
/// scale memory, recover and fleet rows).
fn chart_bars(rows: &[Row]) -> Vec<svg::Bar> {
    rows.iter()
        .filter(|r| {
            ["scale memory", "recover", "fleet"]
                .iter()
                .any(|p| r.bench.starts_with(p))
        })
        .filter_map(|r| {
            let label = format!("{}, {}", r.bench, r.size);
            let at_least = r.target.op == ">=";
            match (r.ratio, r.target.of) {
                (Some(ratio), _) => Some(svg::Bar {
                    label,
                    ratio: ratio.median,
                    target: r.target.value,
                    at_least,
                }),
                (None, "ours") => Some(svg::Bar {
                    label: format!("{label} (of {} {})", num(r.target.value), r.unit),
                    ratio: r.ours / r.target.value,
                    target: 1.0,
                    at_least,
                }),
                _ => None,
            }
        })
        .collect()
}

/// The load average over the last minute, where the system tells it.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let load_before = load_average();
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
        let durable_plan = |n: usize| {
            sizes
                .durable
                .iter()
                .find(|(m, _, _)| *m >= n)
                .or(sizes.durable.last())
                .map_or(
                    (
                        Plan {
                            warmup: 0,
                            rounds: 3,
                        },
                        1,
                    ),
                    |(_, p, k)| (*p, *k),
                )
        };
        sizes.durable = args
            .sizes
            .iter()
            .map(|&n| {
                let (plan, phases) = durable_plan(n);
                (n, plan, phases)
            })
            .collect();
        sizes.teardown = args.sizes.iter().map(|&n| (n, plan(n))).collect();
    }
    let wants = |b: Bench| args.only.is_empty() || args.only.contains(&b);
    let mut rows = Vec::new();
    // Memory first: the allocator counts every thread, and none is running yet.
    if wants(Bench::Memory) {
        rows.push(run_memory(&sizes)?);
        rows.push(run_finalized_memory(&sizes)?);
    }
    let mut series = Vec::new();
    if wants(Bench::Teardown) {
        let (teardown_rows, teardown_series) = run_teardown(&sizes, args.max_chain, args.workers)?;
        rows.extend(teardown_rows);
        series.extend(teardown_series);
    }
    if wants(Bench::Durable) {
        let (durable_rows, durable_series) = run_durable(&sizes, args.workers)?;
        rows.extend(durable_rows);
        series.extend(durable_series);
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
    if wants(Bench::Register) {
        rows.push(run_register(&sizes)?);
    }
    if wants(Bench::Gateway) {
        rows.push(gateway_bench::memory_row(sizes.gateway.clients)?);
        rows.extend(gateway_bench::latency_rows(sizes.gateway)?);
    }
    if wants(Bench::Scale) {
        let (scale_rows, scale_series) = run_scale(&sizes)?;
        rows.extend(scale_rows);
        series.extend(scale_series);
    }
    if wants(Bench::Recover) {
        rows.push(run_recover(&sizes)?);
    }
    if wants(Bench::Fleet) {
        rows.extend(fleet::rows(&sizes.fleet)?);
    }
    if wants(Bench::FleetRestart) {
        rows.extend(fleet_restart::rows(sizes.fleet_restart_sessions)?);
    }
    // The SPEC's order: teardown (stubbed, then durable), scale, recover,
    // fleet, core, stream, store, register, memory, then the gateway's rows.
    let order = |r: &Row| {
        [
            "teardown", "scale", "recover", "fleet", "core", "stream", "store", "register",
            "memory", "gateway",
        ]
        .iter()
        .position(|p| r.bench.starts_with(p))
        .unwrap_or(usize::MAX)
    };
    rows.sort_by_key(order);
    let elapsed = started.elapsed();
    let load_after = load_average();

    if let Some(path) = &args.svg {
        let bars = chart_bars(&rows);
        if series.is_empty() && bars.is_empty() {
            progress("no teardown or scale figures: the chart is not written");
        } else {
            let title = "Teardown: cancel the root of an agent tree, every agent mid-turn";
            std::fs::write(path, svg::chart(title, &series, &bars))
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            progress(&format!("chart written to {}", path.display()));
        }
    }

    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "mode": if args.quick { "quick" } else { "full" },
            "seconds": elapsed.as_secs_f64(),
            "load_average": { "start": load_before, "end": load_after },
            "allocator": alloc::NAME,
            "rows": rows,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        let missed = rows.iter().filter(|r| r.met == Some(false)).count();
        let load = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
        write!(out, "{}", report::table(&rows))?;
        writeln!(
            out,
            "\n{} rows, {} target{} missed, {:.1} s ({} run, {}), load average {} at the start, {} at the end",
            rows.len(),
            missed,
            if missed == 1 { "" } else { "s" },
            elapsed.as_secs_f64(),
            if args.quick { "quick" } else { "full" },
            alloc::NAME,
            load(load_before),
            load(load_after),
        )?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(n) = args.finalized_memory_child {
        return match finalized_memory::bytes_per_finalized_session(n) {
            Ok(stayed) => {
                println!("{} {} {}", stayed.per_session, stayed.counted, stayed.total);
                ExitCode::SUCCESS
            }
            Err(e) => {
                progress(&format!("memory after finalize: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    if let Some(n) = args.gateway_memory_child {
        return match gateway_bench::memory_process(n) {
            Ok((ours, bare)) => {
                println!("{ours} {bare}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                progress(&format!("gateway memory: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    if let Some(n) = args.scale_child {
        return match scale::process(n) {
            Ok(figures) => {
                println!("{}", scale::line(&figures));
                ExitCode::SUCCESS
            }
            Err(e) => {
                progress(&format!("scale: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    if let [side, url, chunks] = args.fleet_child.as_slice() {
        let run = chunks
            .parse()
            .map_err(|e| format!("chunks {chunks:?}: {e}").into())
            .and_then(|chunks| fleet::child(side, url, chunks));
        return match run {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                progress(&format!("fleet process: {e}"));
                ExitCode::FAILURE
            }
        };
    }
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
