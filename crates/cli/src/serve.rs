//! `settle serve`: the session gateway (SPEC §10) on a TCP address, over
//! the store of `--db` and an OpenAI-compatible server (or, for tests, a
//! script book). Bad options, a script book that does not parse or an
//! address that cannot be bound are refused before the store is opened
//! (G11). SIGTERM/SIGINT shut down gracefully (G9): clients are told
//! `server.shutdown`, running turns drain, everything is finalized, the
//! connections are closed, and the process exits 143/130; a second signal
//! skips the rest of the drain.
//!
//! On a network: `--token-file` requires a bearer token of every client
//! (and is required to listen on anything but a loopback address),
//! `--allow-origin` lists the web origins allowed, `--tls-cert/--tls-key`
//! serve `wss://`. A token file, a certificate or a key that cannot be used
//! is refused in one line (exit 2) that never quotes a token or a key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use settle_cli::input_limits::InputLimitArgs;
use settle_cli::model_server::ModelServerArgs;
use settle_cli::reply_limits::ReplyLimitArgs;
use settle_cli::turn_timeouts::TurnTimeoutArgs;
use settle_cli::{duration, exit, open_files, open_store, outln, shutdown, Failure};
use settle_gateway::{Fleet, Gateway, ScriptBook, Tls, Tokens};
use settle_runtime::signals::Signals;
use settle_runtime::Kernel;
use settle_stream::Provider;

/// Options of `settle serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0 picks a free one; the address is printed).
    #[arg(long, default_value = "127.0.0.1:8765")]
    listen: SocketAddr,
    #[command(flatten)]
    server: ModelServerArgs,
    #[command(flatten)]
    limits: InputLimitArgs,
    /// How long a session may have no client attached before it is reaped (once idle).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "60s")]
    orphan_grace: Duration,
    /// How long a session may sit idle before it is reaped (0s: never).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "30m")]
    idle_ttl: Duration,
    /// How many open sessions before a new one evicts its principal's least recently active idle one (an attach that would adopt a fleet's session at this bound evicts nothing: it answers over_capacity).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions: u64,
    /// How long running turns may finish after SIGINT/SIGTERM.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "5s")]
    drain_timeout: Duration,
    /// Require `Authorization: Bearer TOKEN` of every client: one `PRINCIPAL TOKEN` pair per line.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Allow WebSocket upgrades from this web origin (repeatable); other origins are refused.
    #[arg(long = "allow-origin", value_name = "ORIGIN", value_parser = settle_gateway::parse_origin)]
    allow_origins: Vec<String>,
    /// Serve wss:// with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long a client has for its TLS handshake and each request header.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse_nonzero, default_value = "10s")]
    header_timeout: Duration,
    /// How long a connection attached to no session may send no request (0s: forever).
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse, default_value = "5m")]
    connection_idle_timeout: Duration,
    /// How many connections may be open at once.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// How many connections each principal of --token-file may have open at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections_per_principal: u64,
    /// How many live sessions each principal may have (default: no bound but --max-sessions).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions_per_principal: Option<u64>,
    /// How many requests per second each connection may send (0: unlimited).
    #[arg(long, default_value_t = 100)]
    requests_per_second: u32,
    /// How many holds each principal may have placed at once (default: no bound).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_holds_per_principal: Option<u64>,
    #[command(flatten)]
    replies: ReplyLimitArgs,
    #[command(flatten)]
    timeouts: TurnTimeoutArgs,
    /// How many bytes of conversation (the prompts and replies sent again
    /// with each turn) all sessions may keep in memory at once: a
    /// `turn.start` past it is refused `over_capacity`, writing nothing.
    /// 0: no bound.
    #[arg(long, default_value_t = 1024 * 1024 * 1024)]
    max_history_memory: u64,
    /// Where clients reach this process, for the other processes of a fleet
    /// on one PostgreSQL (default: ws://LISTEN-ADDRESS/ws).
    #[arg(long, value_name = "URL", value_parser = parse_advertise)]
    advertise: Option<String>,
    /// On PostgreSQL, finalize every session at shutdown (`shutdown`) instead
    /// of handing the sessions off to the other processes of the fleet.
    #[arg(long)]
    no_handoff: bool,
    /// How long this process's lease on its sessions lasts (renewed every
    /// tenth of it); a peer takes over its sessions once it has lapsed, and
    /// a store that answers no renewal for that long stops this process.
    #[arg(long, allow_hyphen_values = true, value_parser = duration::parse_nonzero, default_value = "30s")]
    lease_ttl: Duration,
    /// Before serving, end the sessions a crashed run of a gateway on this
    /// store left live (`recovered`, their last turn `interrupted`), as
    /// `settle recover` does: only those of owners whose lease ran out or,
    /// on this host, whose process is gone; a live process's are never
    /// taken. For a supervisor that restarts the gateway after a crash: its
    /// clients then resume those sessions instead of finding them
    /// `left_for_recovery`. In a fleet, leave it off: the other processes
    /// adopt such sessions, and this would end them instead.
    #[arg(long)]
    recover: bool,
    /// Play the turns of this script book instead of asking a model server.
    #[arg(long, hide = true, value_name = "FILE")]
    scripted: Option<PathBuf>,
}

/// Serves until a signal (or a lost lease) has shut it down; returns the exit code.
/// `--max-connections`, lowered to what the open-file limit leaves room
/// for once raised as far as it goes (see [`open_files`]), with one line
/// saying so: past the limit every client would fail at once, the model's
/// and the store's connections with them.
fn fitting_connections(asked: u64) -> u64 {
    let Some(fit) = open_files::raise() else {
        return asked;
    };
    if asked <= fit.connections {
        return asked;
    }
    settle_cli::errln!(
        "settle serve: --max-connections {asked} is more than the open-file limit ({}) leaves \
         room for (a connection may hold a turn's model connection too); serving at most {} \
         connections: raise `ulimit -n` (LimitNOFILE= under systemd) to allow more",
        fit.limit,
        fit.connections
    );
    fit.connections
}

pub async fn run(db: &str, args: ServeArgs) -> Result<u8, Failure> {
    // The kernel stops before the process has said how it went (a lost
    // lease's lines, the exit code 3) and before its store is let go (whose
    // writer may still wait on a locked database), and the process exits
    // after this function returns, within a bound (`EXIT_GRACE`): a signal
    // from the kernel's stop to the exit is taken and ignored, never given
    // the default action that would end the process by the signal and
    // hide the code that says what it left. (Given back as this function
    // returned, a signal still ended the process by it in the moments
    // before the runtime's shutdown, seen under load with a signal every
    // 50 ms.)
    let said = std::future::pending::<()>();
    // Before anything can block: no signal is swallowed, ever.
    let signals = Signals::install()
        .map_err(|e| Failure::store(format!("cannot install the signal handlers: {e}")))?;
    let provider: Arc<dyn Provider> = match &args.scripted {
        Some(path) => Arc::new(ScriptBook::load(path).map_err(Failure::bad_input)?),
        None => Arc::new(args.server.provider()?),
    };
    let tokens = match &args.token_file {
        Some(path) => Some(Tokens::load(path).map_err(Failure::bad_input)?),
        None if !args.listen.ip().is_loopback() => {
            return Err(Failure::bad_input(format!(
                "refusing to listen on {} without --token-file: anyone who can reach it could \
                 drive every session (listen on 127.0.0.1, or give tokens)",
                args.listen
            )))
        }
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(Tls::from_pem_files(cert, key).map_err(Failure::bad_input)?)
        }
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::bad_input(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::bad_input(format!("cannot listen on {}: {e}", args.listen)))?;
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{addr}/ws"));
    let store = open_store(db)?;
    // A fleet shares one PostgreSQL; on SQLite one process serves alone.
    let handoff = store.is_postgres() && !args.no_handoff;
    // In a fleet, `elsewhere` sends clients to this URL: an address that
    // means "every interface" reaches nobody from another machine.
    if store.is_postgres() && args.advertise.is_none() && addr.ip().is_unspecified() {
        settle_cli::errln!(
            "settle serve: warning: advertising {advertise} to the fleet, which no client on another machine can reach; pass --advertise {scheme}://HOST:{}/ws",
            addr.port()
        );
    }
    let store: Arc<dyn settle_store::SessionStore> = Arc::new(store);
    let idle_ttl = Some(args.idle_ttl).filter(|ttl| !ttl.is_zero());
    let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let max_connections = fitting_connections(args.max_connections);
    let kernel = args
        .limits
        .apply(
            args.replies
                .apply(args.timeouts.apply(Kernel::builder(store))),
        )
        .retry(args.server.retry())
        .advertise(Some(advertise))
        .lease_ttl(args.lease_ttl)
        .recover_on_start(args.recover)
        .orphan_grace(args.orphan_grace)
        .idle_ttl(idle_ttl)
        .lru_cap(Some(
            usize::try_from(args.max_sessions).unwrap_or(usize::MAX),
        ))
        .drain_timeout(args.drain_timeout)
        .start()
        .await
        .map_err(Failure::store)?;
    let mut gateway = Gateway::builder(kernel.clone(), provider)
        .drain_timeout(args.drain_timeout)
        .header_timeout(args.header_timeout)
        .connection_idle_timeout(Some(args.connection_idle_timeout))
        .max_connections(as_usize(max_connections))
        .max_connections_per_principal(as_usize(args.max_connections_per_principal))
        .max_sessions_per_principal(args.max_sessions_per_principal.map(as_usize))
        .requests_per_second(Some(args.requests_per_second))
        .max_holds_per_principal(args.max_holds_per_principal.map(as_usize))
        .max_history_memory(Some(as_usize(args.max_history_memory)).filter(|n| *n > 0));
    for origin in &args.allow_origins {
        gateway = gateway.allow_origin(origin);
    }
    if let Some(tokens) = tokens {
        gateway = gateway.tokens(tokens);
    }
    if let Some(tls) = tls {
        gateway = gateway.tls(tls);
    }
    if handoff {
        // Swept often enough that a crashed peer's sessions wait little
        // past its lease.
        let every = (args.lease_ttl / 3).min(Duration::from_secs(5));
        gateway = gateway.fleet(Fleet::new().sweep_every(every).idle_ttl(idle_ttl));
    }
    let gateway = gateway.build();
    // The watcher runs on a task of its own from here on and records the
    // first signal before it begins the shutdown: once the gateway has
    // stopped, `signals::received` tells a stop by signal from one by the
    // kernel itself, so the future that would yield that signal is not kept.
    if handoff {
        drop(signals.drive_handoff_until(&kernel, args.drain_timeout, said));
    } else {
        drop(signals.drive_until(&kernel, args.drain_timeout, said));
    }
    outln!("settle serve: listening on {scheme}://{addr}/ws");
    let report = gateway
        .serve(listener)
        .await
        .map_err(|e| Failure::store(e.to_string()))?;
    if report.lease_lost || !report.left_recoverable.is_empty() {
        shutdown::say_left(&report, handoff);
        return Ok(exit::STORE);
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    match report.handoff {
        true => outln!(
            "settle serve: shut down; {} session{} handed off, {} finalized",
            report.released.len(),
            plural(report.released.len()),
            report.finalized.len()
        ),
        false => outln!(
            "settle serve: shut down; {} session{} finalized",
            report.finalized.len(),
            plural(report.finalized.len())
        ),
    }
    match settle_runtime::signals::received() {
        Some(signal) => Ok(u8::try_from(signal.exit_code()).unwrap_or(exit::DONE)),
        // Shut down by the kernel itself (no signal): only a lost lease does.
        None => Ok(exit::STORE),
    }
}

/// `--advertise`: a `ws://` or `wss://` URL with a host.
fn parse_advertise(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("ws://")
        .or_else(|| url.strip_prefix("wss://"))
        .ok_or_else(|| format!("`{url}` is not a ws:// or wss:// URL"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() || url.chars().any(char::is_whitespace) {
        return Err(format!("`{url}` names no host to reach this process at"));
    }
    Ok(url.to_owned())
}
