//! `settle`: run scripted agent trees, inspect a session store, recover it,
//! and chat with a model, all with teardown that is correct on every path.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use settle_cli::listing::{self, Filter};
use settle_cli::scenario::Scenario;
use settle_cli::{
    chat, display, duration, exit, export, open_existing_store, open_store, open_store_to_read,
    out, outfile, outln, output, parse_id, runner, shutdown, terminal, trace, Failure,
};
use settle_runtime::{Kernel, SessionId, State};
use settle_store::{RecoverOptions, SessionDetail, SessionFilter, SessionStore, Store, StoreError};

mod serve;

/// The allocator of the binary: a teardown frees on one thread what another
/// allocated, at a rate glibc's allocator handles poorly (it was a fifth of
/// the teardown's profile; see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long `settle run`'s summary waits for the store after a shutdown that
/// left sessions for recovery (its store may be stalled).
const SUMMARY_AFTER_A_STALL: Duration = Duration::from_millis(100);

/// How long the process waits, once it has said everything, for the async
/// runtime's tasks and blocking reads to end before it exits anyway.
const EXIT_GRACE: Duration = Duration::from_millis(100);

const EXAMPLES: &str = "\
Examples:
  settle run examples/scan.toml            run a scripted agent tree (SQLite: ./settle.db)
  settle sessions --since 1h --tree        the last hour's sessions, each under its parent
  settle show 3                            one session's transcript and timeline
  settle show 1 --trace scan.json          the tree under session 1 as a trace for Perfetto
  settle export 3 --format md -o chat.md   a transcript to read (or --format jsonl to replay)
  settle --db postgres://u@host/db recover finalize sessions of crashed processes
  settle recover --dry-run                 what would be recovered, and whose it was
  settle chat --base-url http://127.0.0.1:8080/v1 --model local
  settle chat --last                       continue the most recent finished session
  settle serve --listen 127.0.0.1:8765 --base-url http://127.0.0.1:8080/v1 --model local

Exit codes:
  0    done
  1    the root agent of `run` failed (its last turn failed or timed out)
  2    bad input: arguments, scenario file, database path or URL; nothing written
  3    store error (or sessions left for `settle recover`)
  129  ended by SIGHUP, after a graceful shutdown
  130  ended by SIGINT, after a graceful shutdown
  143  ended by SIGTERM, after a graceful shutdown

Logs: SETTLE_LOG=debug (an env-filter) logs to stderr, in colour only on a
terminal and without NO_COLOR.";

/// A lifecycle kernel for LLM-agent sessions: teardown that is correct on every path.
#[derive(Debug, Parser)]
#[command(name = "settle", version, after_help = EXAMPLES)]
struct Cli {
    /// The session store: a SQLite file path or a postgres:// URL.
    #[arg(long, global = true, env = "SETTLE_DB", default_value = "settle.db")]
    db: String,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest options is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run a scripted agent tree to its end, showing its progress, then a summary.
    #[command(
        allow_negative_numbers = true,
        after_help = "Example:\n  settle run examples/scan.toml --settle-timeout 500ms --json"
    )]
    Run(RunArgs),
    /// List sessions, newest first.
    #[command(
        allow_negative_numbers = true,
        after_help = "Examples:\n  settle sessions --limit 10\n  settle sessions --since 1h30m --tree\n  settle sessions --state running --json"
    )]
    Sessions(SessionsArgs),
    /// Show one session: its transcript by turn and its timeline.
    #[command(
        allow_negative_numbers = true,
        after_help = "Examples:\n  settle show 3\n  settle show 3 --json\n  settle show 1 --trace teardown.json   (open it in ui.perfetto.dev or chrome://tracing)"
    )]
    Show(ShowArgs),
    /// Export one session: Markdown to read, or JSON Lines to replay.
    #[command(
        allow_negative_numbers = true,
        after_help = "Examples:\n  settle export 3 > chat.md\n  settle export 3 --format jsonl -o chat.jsonl"
    )]
    Export(ExportArgs),
    /// Finalize sessions left live by a crashed process (G8); prints how many (--dry-run: lists them, writes nothing).
    #[command(
        allow_negative_numbers = true,
        after_help = "Examples:\n  settle --db settle.db recover\n  settle recover --dry-run          what would be recovered, and whose it was\n  settle recover --json"
    )]
    Recover(RecoverArgs),
    /// Chat with an OpenAI-compatible server. Ctrl-C cancels the reply in flight, Ctrl-D ends the session.
    #[command(
        allow_negative_numbers = true,
        after_help = "Examples:\n  settle chat --base-url http://127.0.0.1:8080/v1 --model local\n  settle chat --resume 3              continue session 3 in a new session\n  settle chat --last                  continue the most recent finished session"
    )]
    Chat(chat::ChatArgs),
    /// Serve sessions to WebSocket clients: JSON-RPC 2.0 at ws://ADDR/ws (see docs/gateway.md).
    #[command(
        allow_negative_numbers = true,
        after_help = "Example:\n  settle serve --listen 127.0.0.1:8765 --base-url http://127.0.0.1:8080/v1 --model local"
    )]
    Serve(serve::ServeArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The scenario file (TOML).
    scenario: PathBuf,
    /// How long cancelled work may take to unwind before it is detached (default: the scenario's, else 1s).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse)]
    settle_timeout: Option<Duration>,
    /// How long running turns may finish after SIGINT/SIGTERM.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "5s")]
    drain_timeout: Duration,
    /// How long a provider stream may be silent before its turn times out (default: the scenario's, else 30s).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse_nonzero)]
    idle_timeout: Option<Duration>,
    /// Print the final summary as JSON (and no progress): the exit code and this run's sessions.
    #[arg(long)]
    json: bool,
    /// How long the store may take to commit a shutdown's writes once the
    /// drain and the settle timeout are over (default 2s).
    #[arg(long, allow_hyphen_values = true, hide = true, value_parser = duration::parse)]
    flush_budget: Option<Duration>,
    /// How long any other store call may take before it fails (default 10s).
    #[arg(long, allow_hyphen_values = true, hide = true, value_parser = duration::parse_nonzero)]
    store_timeout: Option<Duration>,
    /// How long this process's lease on its sessions lasts, renewed every
    /// tenth of it (default 30s).
    #[arg(long, allow_hyphen_values = true, hide = true, value_parser = duration::parse_nonzero)]
    lease_ttl: Option<Duration>,
}

#[derive(Debug, Args)]
struct SessionsArgs {
    /// Only sessions in this state (registered, running, cancelling, settled, finalized).
    #[arg(long, value_parser = parse_state)]
    state: Option<State>,
    /// Only sessions created within this long, like 30m, 1h30m or 7d.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse_age, value_name = "DURATION")]
    since: Option<Duration>,
    /// At most this many sessions, the newest.
    #[arg(long, value_parser = parse_limit, value_name = "N")]
    limit: Option<usize>,
    /// Show each session under its parent, indented (children in the order they were created).
    #[arg(long)]
    tree: bool,
    /// Print JSON (in the same order as the table).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RecoverArgs {
    /// Only list what would be recovered, with each session's owner and lease; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print what was (or, with --dry-run, would be) recovered as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// The session id (see `settle sessions`).
    #[arg(value_parser = parse_id)]
    id: SessionId,
    /// Print JSON.
    #[arg(long, conflicts_with = "trace")]
    json: bool,
    /// Write the session and its subtree as a Chrome trace (JSON) to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// The session id (see `settle sessions`).
    #[arg(value_parser = parse_id)]
    id: SessionId,
    /// md (Markdown, to read) or jsonl (JSON Lines, one event a line, to replay).
    #[arg(long, default_value = "md", value_parser = parse_format)]
    format: export::Format,
    /// Write to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

fn parse_state(text: &str) -> Result<State, String> {
    text.parse()
        .map_err(|e: settle_runtime::UnknownWord| e.to_string())
}

fn parse_format(text: &str) -> Result<export::Format, String> {
    text.parse()
}

fn parse_limit(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err(
            "`0` lists nothing: ask for 1 or more, or leave --limit out to list them all"
                .to_owned(),
        ),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "`{text}` is not a count: write a whole number, like 20"
        )),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    init_tracing(matches!(cli.command, Command::Serve(_)));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            settle_cli::errln!("settle: cannot start the async runtime: {error}");
            return ExitCode::from(exit::STORE);
        }
    };
    // A command that only reads: its output is all it does.
    let only_reads = match &cli.command {
        Command::Sessions(_) | Command::Show(_) | Command::Export(_) => true,
        Command::Recover(args) => args.dry_run,
        Command::Run(_) | Command::Chat(_) | Command::Serve(_) => false,
    };
    let done = runtime.block_on(dispatch(cli));
    // Output that could not be written is a failure of its own: it is said
    // (once) unless the command failed already. A command that only reads
    // and would have ended 0 ends as one whose output path cannot be
    // written (2: nothing was written); one that wrote (a run, a recovery,
    // a chat) keeps its own code, which says what it did.
    let done = match (done, settle_cli::stdout_failure()) {
        (Ok(code), Some(lost)) if only_reads && code == exit::DONE => Err(lost),
        (Ok(code), Some(lost)) => {
            settle_cli::errln!("settle: {}", one_line(&lost.message));
            Ok(code)
        }
        (done, _) => done,
    };
    let code = match done {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            // One line (G11), even when a driver's message spans several.
            settle_cli::errln!("settle: {}", one_line(&failure.message));
            ExitCode::from(failure.code)
        }
    };
    // Everything was said: written, unless standard error stopped taking
    // lines (the process does not wait on it).
    settle_cli::log_sink::flush_stderr();
    // A read still blocked on a store that stopped answering is left behind
    // rather than waited for (G9's exit bound).
    runtime.shutdown_timeout(EXIT_GRACE);
    code
}

/// Clap's own errors, cut to their one meaningful line (G11); help and
/// version print in full.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = error.print();
        return ExitCode::from(exit::DONE);
    }
    if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // No command at all: one line that says what to type (G11), not the
        // whole help on stderr.
        settle_cli::errln!(
            "settle: a command is required: run, sessions, show, export, recover, chat or serve (see `settle --help`)"
        );
        return ExitCode::from(exit::BAD_INPUT);
    }
    let rendered = error.render().to_string();
    // The error line, with the indented lines that follow it (clap lists the
    // missing arguments there), made one line.
    let mut lines = rendered
        .lines()
        .skip_while(|l| !l.starts_with("error:"))
        .take_while(|l| !l.trim().is_empty());
    let mut line = lines
        .next()
        .unwrap_or("error: invalid arguments")
        .trim_start_matches("error: ")
        .to_owned();
    for more in lines.filter(|l| l.starts_with(char::is_whitespace)) {
        line.push(' ');
        line.push_str(more.trim());
    }
    settle_cli::errln!("settle: {} (see `settle --help`)", one_line(&line));
    ExitCode::from(exit::BAD_INPUT)
}

/// `text` with every run of whitespace (newlines included) made one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Logs to stderr, by `SETTLE_LOG` or else errors only; a gateway, which
/// has no other voice, also says by default when it dropped a connection,
/// a limit refused something, a queue overflowed, or a store call failed
/// (and is tried again).
fn init_tracing(serving: bool) {
    let default = match serving {
        true => "error,settle_gateway=warn,settle_runtime=warn",
        false => "error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SETTLE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a person at a terminal who did not ask for none
    // (no-color.org): a log in a file or a pipe holds no escape sequences.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // A log line that cannot be written is lost, never reported with
    // `eprintln!` (the default), which panics on the same failing stderr:
    // a work, the recorder or the driver panicked on a full disk.
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .log_internal_errors(false);
    // A gateway's clients make it log (a line per refused origin, per
    // message it could not read): a standard error nobody reads any more
    // must stall none of its threads (G9), so its lines are queued, bounded,
    // and written by a thread of their own (see `log_sink`).
    let _ = match serving.then(settle_cli::log_sink::install_stderr).flatten() {
        Some(sink) => log.with_writer(sink.clone()).try_init(),
        None => log.with_writer(std::io::stderr).try_init(),
    };
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Run(args) => run(&cli.db, args).await,
        Command::Sessions(args) => sessions(&cli.db, args).await,
        Command::Show(args) => show(&cli.db, args).await,
        Command::Export(args) => export(&cli.db, args).await,
        Command::Recover(args) => recover(&cli.db, args).await,
        Command::Chat(args) => chat::run(&cli.db, args).await,
        Command::Serve(args) => serve::run(&cli.db, args).await,
    }
}

async fn sessions(db: &str, args: SessionsArgs) -> Result<u8, Failure> {
    let store = open_store_to_read(db)?;
    let filter = Filter {
        state: args.state,
        since: args.since,
        limit: args.limit,
    };
    let now = SystemTime::now();
    let rows = store.list_sessions(filter.to_store(now)).await?;
    let listed = if args.tree {
        listing::tree(rows)
    } else {
        listing::flat(rows)
    };
    if args.json {
        outln!("{}", output::sessions_json(&listed));
    } else {
        out!(
            "{}",
            output::sessions_table(&listed, now, terminal::stdout_width())
        );
    }
    Ok(exit::DONE)
}

/// One session's detail, an unknown id being bad input.
async fn detail(store: &Store, db: &str, id: SessionId) -> Result<SessionDetail, Failure> {
    match store.session_detail(id).await {
        Ok(detail) => Ok(detail),
        Err(StoreError::UnknownSession(id)) => Err(Failure::bad_input(format!(
            "no session {id} in {db}; see `settle sessions`"
        ))),
        Err(error) => Err(error.into()),
    }
}

async fn show(db: &str, args: ShowArgs) -> Result<u8, Failure> {
    let store = open_store_to_read(db)?;
    let top = detail(&store, db, args.id).await?;
    if let Some(path) = &args.trace {
        let rows = store.list_sessions(SessionFilter::all()).await?;
        let mut details = vec![top];
        // Parents that loop were written outside settle: a store error.
        let below = listing::descendants(&rows, args.id).map_err(|looped| {
            Failure::store(format!(
                "session {}'s parents loop back to it (its parent is {}); the store was changed outside settle",
                looped.session, looped.parent
            ))
        })?;
        for id in below {
            details.push(detail(&store, db, id).await?);
        }
        let tree = trace::subtree(args.id, details);
        outfile::write(path, &trace::render(&tree, SystemTime::now()), db)?;
        if path != Path::new("-") {
            outln!(
                "wrote the trace of {} session{} to {}: open it in ui.perfetto.dev or chrome://tracing",
                tree.sessions.len(),
                if tree.sessions.len() == 1 { "" } else { "s" },
                path.display()
            );
        }
    } else if args.json {
        outln!("{}", output::show_json(&top));
    } else {
        out!("{}", output::show_text(&top));
    }
    Ok(exit::DONE)
}

async fn export(db: &str, args: ExportArgs) -> Result<u8, Failure> {
    let store = open_store_to_read(db)?;
    let detail = detail(&store, db, args.id).await?;
    let text = export::render(&detail, args.format);
    match &args.output {
        Some(path) => outfile::write(path, &text, db)?,
        None => out!("{text}"),
    }
    Ok(exit::DONE)
}

async fn recover(db: &str, args: RecoverArgs) -> Result<u8, Failure> {
    // A dry run writes nothing: a file this user may only read will do.
    let store = if args.dry_run {
        open_store_to_read(db)?
    } else {
        open_existing_store(db)?
    };
    let options = RecoverOptions::now_on_this_host();
    // What recovery takes over, with owners and leases: read first (it
    // writes nothing), so that a real recovery can say whose sessions it took.
    let found = store.recovery_candidates(options.clone()).await?;
    // The rows the JSON names parents from: the candidates' alone (not
    // the whole store, which one unreadable row elsewhere would fail), and
    // read before anything is written, so that a failure to read them
    // cannot follow a recovery that wrote.
    let rows = match args.json {
        true => {
            let ids: Vec<SessionId> = found.iter().map(|c| c.session).collect();
            store.list_sessions(SessionFilter::all().only(ids)).await?
        }
        false => Vec::new(),
    };
    if args.dry_run {
        if args.json {
            outln!("{}", output::recover_dry_run_json(&found, &rows));
        } else {
            out!(
                "{}",
                output::recover_dry_run_text(&found, terminal::stdout_width())
            );
        }
        return Ok(exit::DONE);
    }
    let report = store.recover(options).await?;
    if args.json {
        outln!("{}", output::recover_json(&report, &found, &rows));
    } else {
        outln!("{}", output::recover_line(&report));
    }
    Ok(exit::DONE)
}

async fn run(db: &str, args: RunArgs) -> Result<u8, Failure> {
    // The scenario is checked whole before the database is touched (G11).
    let scenario = Arc::new(Scenario::load(&args.scenario).map_err(Failure::bad_input)?);
    let signals = shutdown::install()?;
    let store: Arc<dyn SessionStore> = Arc::new(open_store(db)?);
    let settle_timeout = args
        .settle_timeout
        .or(scenario.settle_timeout())
        .unwrap_or(Duration::from_secs(1));
    let idle_timeout = args
        .idle_timeout
        .or(scenario.idle_timeout())
        .unwrap_or(settle_stream::DEFAULT_IDLE_TIMEOUT);
    let mut builder = Kernel::builder(store.clone())
        .settle_timeout(settle_timeout)
        .drain_timeout(args.drain_timeout)
        .idle_timeout(Some(idle_timeout))
        // A scripted run is a batch: no session is reaped for idling.
        .idle_ttl(None)
        .lru_cap(None);
    if let Some(budget) = args.flush_budget {
        builder = builder.flush_budget(budget);
    }
    if let Some(timeout) = args.store_timeout {
        builder = builder.store_timeout(timeout);
    }
    if let Some(ttl) = args.lease_ttl {
        builder = builder.lease_ttl(ttl);
    }
    let kernel = builder.start().await.map_err(Failure::store)?;
    // Every session of this run is registered from now on: the summary
    // reads those, not every session the file ever held (a run on a file of
    // 50,000 sessions took 0.25 s instead of 0.11 s, the listing most of
    // it). A minute's slack, for a clock stepped back during the run.
    let since = SessionFilter::all().since(
        SystemTime::now()
            .checked_sub(Duration::from_secs(60))
            .unwrap_or(SystemTime::UNIX_EPOCH),
    );

    let mode = if args.json {
        display::Mode::QUIET
    } else {
        display::Mode::for_terminals(
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
        )
    };
    let (stop_display, stop) = tokio::sync::oneshot::channel();
    let display = tokio::spawn(display::show(kernel.subscribe(), mode, stop));
    // Installed before any agent starts, and kept until the process exits: an
    // early signal is a graceful shutdown too, and none is ever swallowed.
    // The summary is written whole before a later signal may end the process.
    let (summary_said, said) = tokio::sync::oneshot::channel::<()>();
    let mut signal = tokio::spawn(shutdown::watch(
        signals,
        &kernel,
        args.drain_timeout,
        async {
            let _ = said.await;
        },
    ));
    let mut run = tokio::spawn(runner::run(scenario, kernel.clone()));

    // Biased: a run that ended because a signal shut the kernel down ended
    // by that signal (its code wins), even if both are ready at once.
    let (root, signalled) = tokio::select! {
        biased;
        signalled = &mut signal => {
            let signalled = signalled.ok();
            // Shutdown is under way: agents are refused new turns, those
            // waiting to spawn give up, running turns drain.
            kernel.finished().await;
            let root = run.await.ok().flatten();
            (root, signalled)
        }
        // The run may see the shutdown a signal began before the watcher's
        // future is polled: the signal recorded first still decides.
        root = &mut run => (root.ok().flatten(), settle_runtime::signals::received()),
    };
    let report = kernel.shutdown(Duration::ZERO).await;
    let failures = kernel.store_failures();
    let _ = stop_display.send(());
    let _ = display.await;

    let left = report.lease_lost || !report.left_recoverable.is_empty();
    let now = SystemTime::now();
    let rows = if left {
        // A store that could not commit the shutdown's writes may not answer
        // a read either: the summary waits for it only briefly, and is left
        // out without it, so that the exit keeps the shutdown's bound (G9).
        match tokio::time::timeout(SUMMARY_AFTER_A_STALL, store.list_sessions(since.clone())).await
        {
            Ok(Ok(rows)) => Some(rows),
            Ok(Err(_)) | Err(_) => None,
        }
    } else {
        Some(store.list_sessions(since).await?)
    };
    // This run's sessions: its agents all descend from its root (none
    // registered when the root could not).
    let rows = rows.map(|rows| match &root {
        Some(root) => listing::subtree(rows, root.session),
        None => Vec::new(),
    });
    let code = if left {
        // What could not be committed is left for `settle recover` (G8).
        exit::STORE
    } else if let Some(signal) = signalled {
        // 130 / 143: a shell's code for the signal, after a clean shutdown.
        u8::try_from(signal.exit_code()).unwrap_or(exit::DONE)
    } else if failures > 0 {
        exit::STORE
    } else if root.is_some_and(|r| r.failed()) {
        exit::ROOT_FAILED
    } else {
        exit::DONE
    };
    if left {
        shutdown::say_left(&report, false);
    }
    if args.json {
        // In the table's order: the tree's.
        let rows: Vec<_> = listing::tree(rows.unwrap_or_default())
            .into_iter()
            .map(|listed| listed.row)
            .collect();
        outln!("{}", output::run_json(i32::from(code), &rows));
    } else {
        if let Some(rows) = rows {
            outln!();
            out!(
                "{}",
                output::sessions_table(&listing::tree(rows), now, terminal::stdout_width())
            );
        }
        // One line on stderr: `say_left` already said what to run.
        if failures > 0 && !left {
            // The shutdown left nothing for recovery by its own count; a
            // write that failed for good may still have, so say how to look.
            settle_cli::errln!("settle: {failures} store write(s) failed (see the STORE ERROR lines); `settle recover --dry-run` lists any session they left live");
        }
    }
    // Said whole: a signal from now on ends the process as it would.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let _ = summary_said.send(());
    Ok(code)
}
