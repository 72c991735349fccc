//! `settle`: run scripted agent trees, inspect a session store, recover it,
//! and chat with a model, all with teardown that is correct on every path.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use settle_cli::scenario::Scenario;
use settle_cli::{chat, display, duration, exit, open_store, out, outln, output, runner, Failure};
use settle_runtime::{signals, Runtime, SessionId, State};
use settle_store::{SessionFilter, SessionStore, StoreError};

const EXAMPLES: &str = "\
Examples:
  settle run examples/scan.toml            run a scripted agent tree (SQLite: ./settle.db)
  settle sessions --state finalized        list sessions in a state
  settle show 3 --json                     one session's transcript and timeline
  settle --db postgres://u@host/db recover finalize sessions of crashed processes
  settle chat --base-url http://127.0.0.1:8080/v1 --model local";

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

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a scripted agent tree to its end, showing its progress, then a summary.
    #[command(
        after_help = "Example:\n  settle run examples/scan.toml --settle-timeout 500ms --json"
    )]
    Run(RunArgs),
    /// List sessions.
    #[command(after_help = "Example:\n  settle sessions --state running --json")]
    Sessions(SessionsArgs),
    /// Show one session: its transcript by turn and its timeline.
    #[command(after_help = "Example:\n  settle show 3")]
    Show(ShowArgs),
    /// Finalize sessions left live by a crashed process (G8); prints how many.
    #[command(after_help = "Example:\n  settle --db settle.db recover")]
    Recover,
    /// Chat with an OpenAI-compatible server. Ctrl-C cancels the reply in flight, Ctrl-D ends the session.
    #[command(
        after_help = "Example:\n  settle chat --base-url http://127.0.0.1:8080/v1 --model local"
    )]
    Chat(chat::ChatArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The scenario file (TOML).
    scenario: PathBuf,
    /// How long cancelled work may take to unwind before it is detached (default: the scenario's, else 1s).
    #[arg(long, value_parser = duration::parse)]
    settle_timeout: Option<Duration>,
    /// How long running turns may finish after SIGINT/SIGTERM.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    drain_timeout: Duration,
    /// How long a provider stream may be silent before its turn times out (default: the scenario's, else 30s).
    #[arg(long, value_parser = duration::parse)]
    idle_timeout: Option<Duration>,
    /// Print the final summary as JSON (and no progress).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SessionsArgs {
    /// Only sessions in this state (registered, running, cancelling, settled, finalized).
    #[arg(long, value_parser = parse_state)]
    state: Option<State>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// The session id (see `settle sessions`).
    #[arg(value_parser = parse_id)]
    id: SessionId,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn parse_state(text: &str) -> Result<State, String> {
    text.parse()
        .map_err(|e: settle_runtime::UnknownWord| e.to_string())
}

fn parse_id(text: &str) -> Result<SessionId, String> {
    text.parse().map_err(|_| {
        format!("`{text}` is not a session id: ids are whole numbers, see `settle sessions`")
    })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(error),
    };
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("settle: cannot start the async runtime: {error}");
            return ExitCode::from(exit::STORE);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            // One line (G11), even when a driver's message spans several.
            eprintln!("settle: {}", one_line(&failure.message));
            ExitCode::from(failure.code)
        }
    }
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
        eprintln!(
            "settle: a command is required: run, sessions, show, recover or chat (see `settle --help`)"
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
    eprintln!("settle: {} (see `settle --help`)", one_line(&line));
    ExitCode::from(exit::BAD_INPUT)
}

/// `text` with every run of whitespace (newlines included) made one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// For the commands that only read (or recover) a store: the SQLite file
/// named by `db` when there is none, so that they report an empty store
/// instead of creating a database (G11: a lookup writes nothing).
fn missing_sqlite_file(db: &str) -> Option<&str> {
    if db.starts_with("postgres://") || db.starts_with("postgresql://") {
        return None;
    }
    let path = db
        .strip_prefix("sqlite://")
        .or_else(|| db.strip_prefix("sqlite:"))
        .unwrap_or(db);
    std::fs::symlink_metadata(path).is_err().then_some(path)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SETTLE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Run(args) => run(&cli.db, args).await,
        Command::Sessions(args) if missing_sqlite_file(&cli.db).is_some() => {
            let rows: [settle_store::SessionRow; 0] = [];
            if args.json {
                outln!("{}", output::sessions_json(&rows));
            } else {
                out!("{}", output::sessions_table(&rows));
            }
            Ok(exit::DONE)
        }
        Command::Show(args) if missing_sqlite_file(&cli.db).is_some() => {
            Err(Failure::bad_input(format!(
                "no session {} in {}: there is no database there; see `settle sessions`",
                args.id, cli.db
            )))
        }
        Command::Recover if missing_sqlite_file(&cli.db).is_some() => {
            outln!("recovered 0 sessions (0 interrupted turns)");
            Ok(exit::DONE)
        }
        Command::Sessions(args) => {
            let store = open_store(&cli.db)?;
            let rows = store
                .list_sessions(SessionFilter::all().in_state_opt(args.state).oldest_first())
                .await?;
            if args.json {
                outln!("{}", output::sessions_json(&rows));
            } else {
                out!("{}", output::sessions_table(&rows));
            }
            Ok(exit::DONE)
        }
        Command::Show(args) => {
            let store = open_store(&cli.db)?;
            let detail = match store.session_detail(args.id).await {
                Ok(detail) => detail,
                Err(StoreError::UnknownSession(id)) => {
                    return Err(Failure::bad_input(format!(
                        "no session {id} in {}; see `settle sessions`",
                        cli.db
                    )))
                }
                Err(error) => return Err(error.into()),
            };
            if args.json {
                outln!("{}", output::show_json(&detail));
            } else {
                out!("{}", output::show_text(&detail));
            }
            Ok(exit::DONE)
        }
        Command::Recover => {
            let store = open_store(&cli.db)?;
            let report = store
                .recover(settle_store::RecoverOptions::now_on_this_host())
                .await?;
            outln!(
                "recovered {} session{} ({} interrupted turn{})",
                report.recovered.len(),
                if report.recovered.len() == 1 { "" } else { "s" },
                report.interrupted_turns.len(),
                if report.interrupted_turns.len() == 1 {
                    ""
                } else {
                    "s"
                },
            );
            Ok(exit::DONE)
        }
        Command::Chat(args) => chat::run(&cli.db, args).await,
    }
}

async fn run(db: &str, args: RunArgs) -> Result<u8, Failure> {
    // The scenario is checked whole before the database is touched (G11).
    let scenario = Arc::new(Scenario::load(&args.scenario).map_err(Failure::bad_input)?);
    let store: Arc<dyn SessionStore> = Arc::new(open_store(db)?);
    let settle_timeout = args
        .settle_timeout
        .or(scenario.settle_timeout())
        .unwrap_or(Duration::from_secs(1));
    let idle_timeout = args
        .idle_timeout
        .or(scenario.idle_timeout())
        .unwrap_or(Duration::from_secs(30));
    let runtime = Runtime::builder(store.clone())
        .settle_timeout(settle_timeout)
        .drain_timeout(args.drain_timeout)
        .idle_timeout(Some(idle_timeout))
        // A scripted run is a batch: no session is reaped for idling.
        .idle_ttl(None)
        .lru_cap(None)
        .start()
        .await
        .map_err(Failure::store)?;

    let mode = if args.json {
        display::Mode::Quiet
    } else if std::io::stdout().is_terminal() {
        display::Mode::Live
    } else {
        display::Mode::Plain
    };
    let (stop_display, stop) = tokio::sync::oneshot::channel();
    let display = tokio::spawn(display::show(runtime.subscribe(), mode, stop));
    // Installed before any agent starts: an early signal is a graceful shutdown too.
    let watch = signals::shutdown_on_signals(runtime.clone(), args.drain_timeout)
        .map_err(|e| Failure::store(format!("cannot install the signal handlers: {e}")))?;
    let mut signal = tokio::spawn(watch);
    let mut run = tokio::spawn(runner::run(scenario, runtime.clone()));

    let (root, signalled) = tokio::select! {
        root = &mut run => (root.ok().flatten(), None),
        signalled = &mut signal => {
            let signalled = signalled.ok();
            // Shutdown is under way: agents are refused new turns and wind down.
            runtime.finished().await;
            let root = run.await.ok().flatten();
            (root, signalled)
        }
    };
    signal.abort();
    runtime.shutdown(Duration::ZERO).await;
    let failures = runtime.store_failures();
    let _ = stop_display.send(());
    let _ = display.await;

    let rows = store
        .list_sessions(SessionFilter::all().oldest_first())
        .await?;
    let code = if let Some(signal) = signalled {
        // 130 / 143: a shell's code for the signal, after a clean shutdown.
        u8::try_from(signal.exit_code()).unwrap_or(exit::DONE)
    } else if failures > 0 {
        exit::STORE
    } else if root.is_some_and(|r| r.failed()) {
        exit::ROOT_FAILED
    } else {
        exit::DONE
    };
    if args.json {
        outln!("{}", output::run_json(i32::from(code), &rows));
    } else {
        outln!();
        out!("{}", output::sessions_table(&rows));
        if failures > 0 {
            eprintln!("settle: {failures} store write(s) failed; run `settle recover` once the store is healthy");
        }
    }
    Ok(code)
}
