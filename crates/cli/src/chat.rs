//! `settle chat`: one session against an OpenAI-compatible server. The reply
//! streams as it is persisted; Ctrl-C cancels the reply in flight (the stream
//! is closed, the partial turn kept as `cancelled`, the session goes on);
//! Ctrl-D or `/exit` ends the session (`user_close`); SIGTERM, or Ctrl-C at
//! the prompt, shuts down gracefully (G9), and every further signal skips the
//! rest of the drain. The signal handlers are installed before anything else
//! and kept until the process exits.
//!
//! `--resume ID` (or `--last`, the most recent finished session) continues a
//! finished or recovered session in a new one, through [`Kernel::resume`]:
//! the new session's row names the one it continues, and its first turn
//! sends the earlier conversation with the new prompt. A session that does
//! not exist or is not finalized is bad input, refused before anything is
//! written (G11).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use settle_runtime::signals::{ShutdownSignal, Signals};
use settle_runtime::{Kernel, Outcome, RuntimeError, SessionHandle, SessionId, State};
use settle_store::{SessionStore, Store, StoreError};
use settle_stream::{Message, Provider, Request, Role};
use tokio::io::BufReader;

use crate::escape;
use crate::input_limits::InputLimitArgs;
use crate::model_server::ModelServerArgs;
use crate::prompt_line::{next_line, Line};
use crate::reply_limits::ReplyLimitArgs;
use crate::turn_timeouts::TurnTimeoutArgs;
use crate::{exit, open_existing_store, open_store, Failure};

/// Options of `settle chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    server: ModelServerArgs,
    #[command(flatten)]
    limits: InputLimitArgs,
    #[command(flatten)]
    replies: ReplyLimitArgs,
    #[command(flatten)]
    timeouts: TurnTimeoutArgs,
    /// How long a running reply may finish after SIGTERM.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::duration::parse, default_value = "5s")]
    drain_timeout: Duration,
    /// Continue the finished (or recovered) session ID in a new session that starts with its conversation.
    #[arg(long, value_name = "ID", value_parser = crate::parse_id, conflicts_with = "last")]
    resume: Option<SessionId>,
    /// Continue the most recently registered session that is finalized.
    #[arg(long)]
    last: bool,
}

/// How the chat ended.
enum End {
    /// Ctrl-D or `/exit`: the session is closed.
    Closed,
    /// A signal: shut down, exit with its code.
    Signalled(ShutdownSignal),
    /// Standard input could not be read: the session is closed, the chat
    /// ends as bad input.
    Unreadable(std::io::Error),
}

/// Refuses a standard input the prompts cannot be read from (a directory)
/// before anything is opened or written (G11), rather than taking its
/// first failed read for a Ctrl-D. (One the parent closed is open on
/// `/dev/null` by the time the process runs, as Rust's runtime does for
/// every program: it reads as input that ends at once, as `< /dev/null`.)
fn prompts_readable() -> Result<(), Failure> {
    use nix::sys::stat::{fstat, SFlag};
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    match fstat(stdin.as_fd()) {
        Ok(stat) if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
            Err(Failure::bad_input(
                "cannot read prompts from standard input: it is a directory",
            ))
        }
        // Anything else a read cannot take is found by the first read, and
        // said then.
        _ => Ok(()),
    }
}

/// Runs the chat until Ctrl-D, `/exit` or a shutdown signal; returns the exit code.
pub async fn run(db: &str, args: ChatArgs) -> Result<u8, Failure> {
    // Before anything can block: no signal is swallowed, ever.
    let mut signals = Signals::install()
        .map_err(|e| Failure::store(format!("cannot install the signal handlers: {e}")))?;
    let provider: Arc<dyn Provider> = Arc::new(args.server.provider()?);
    prompts_readable()?;
    // A session to continue must exist and be finished: checked before the
    // kernel registers this process, so a bad one writes nothing (G11).
    let (store, from) = if let Some(id) = args.resume {
        let store = open_existing_store(db)?;
        resumable(&store, db, id).await?;
        (store, Some(id))
    } else if args.last {
        let store = open_existing_store(db)?;
        let last = store.last_session(Some(State::Finalized)).await?;
        let id = last.ok_or_else(|| {
            Failure::bad_input(format!(
                "--last found no finalized session in {db} to resume; see `settle sessions`"
            ))
        })?;
        (store, Some(id))
    } else {
        (open_store(db)?, None)
    };
    let store: Arc<dyn SessionStore> = Arc::new(store);
    let kernel = args
        .limits
        .apply(
            args.replies
                .apply(args.timeouts.apply(Kernel::builder(store))),
        )
        .retry(args.server.retry())
        .drain_timeout(args.drain_timeout)
        .start()
        .await
        .map_err(Failure::store)?;
    let (session, mut history) = match start(&kernel, db, from).await {
        Ok(started) => started,
        Err(failure) => {
            kernel.shutdown(Duration::ZERO).await;
            return Err(failure);
        }
    };
    let mut input = BufReader::new(tokio::io::stdin());
    let max_line = args.limits.max_prompt_bytes();
    let resumed = match from {
        Some(from) => format!(
            ", continuing session {from} ({} earlier message{})",
            history.len(),
            if history.len() == 1 { "" } else { "s" }
        ),
        None => String::new(),
    };
    crate::errln!(
        "settle chat: session {}{resumed} with {} at {}. Ctrl-C cancels a reply, Ctrl-D ends.",
        session.id(),
        args.server.model,
        settle_stream::shown_url(&args.server.base_url)
    );
    let end = loop {
        prompt();
        let line = tokio::select! {
            line = next_line(&mut input, max_line) => line,
            signal = signals.recv() => break End::Signalled(signal),
        };
        let text = match line {
            Ok(Some(Line::Text(text))) if text.trim() == "/exit" => None,
            Ok(Some(Line::Text(text))) => Some(text),
            // Refused with a line of its own; the chat goes on.
            Ok(Some(Line::NotUtf8)) => {
                crate::errln!("settle: that line is not UTF-8 text; it was not sent");
                continue;
            }
            Ok(Some(Line::TooLong { limit })) => {
                crate::errln!(
                    "settle: that line is over the limit of {limit} bytes (max_prompt_bytes); it was not sent"
                );
                continue;
            }
            Ok(None) => None,
            // Not a Ctrl-D: said, and the chat ends as bad input.
            Err(error) => break End::Unreadable(error),
        };
        let Some(text) = text else {
            break End::Closed;
        };
        if text.trim().is_empty() {
            continue;
        }
        history.push(Message::new(Role::User, text));
        let mut turn = match session
            .run_turn(provider.clone(), Request::new(history.clone()))
            .await
        {
            Ok(turn) => turn,
            Err(error) => {
                crate::errln!("settle: {}", escape::one_line(&error.to_string()));
                history.pop();
                continue;
            }
        };
        let mut reply = String::new();
        let mut terminated = None;
        loop {
            tokio::select! {
                chunk = turn.next_chunk() => match chunk {
                    // Text is the reply; tool calls, reasoning and usage are
                    // persisted all the same, not printed. The model's text
                    // is shown, never obeyed: its control characters are
                    // written as their escapes (the stored reply keeps them).
                    Some(chunk) => if let Some(text) = chunk.as_text() {
                        out!("{}", escape::lines(text));
                        let _ = std::io::stdout().flush();
                        reply.push_str(text);
                    },
                    None => break,
                },
                signal = signals.recv() => match (signal, terminated) {
                    // Ctrl-C in a reply cancels the reply; the chat goes on.
                    (ShutdownSignal::Interrupt, None) => turn.cancel(),
                    (signal, None) => {
                        terminated = Some(signal);
                        kernel.begin_shutdown(args.drain_timeout);
                    }
                    // A shutdown is under way: skip the rest of its drain.
                    (_, Some(_)) => kernel.skip_drain(),
                },
            }
        }
        let result = turn.result().await;
        outln!();
        // A reply with no text is not sent back as an empty assistant
        // message (servers may refuse one): the next prompt follows this
        // one, as a resumed chat rebuilds it from the store.
        match result {
            Ok(outcome) => {
                if outcome != Outcome::Completed {
                    crate::errln!("settle: reply {outcome}");
                } else if reply.is_empty() {
                    crate::errln!("settle: the reply had no text");
                }
                if !reply.is_empty() {
                    history.push(Message::new(Role::Assistant, reply));
                }
            }
            Err(error) => {
                // What a provider sent is told on one line, never obeyed.
                let error = error.to_string();
                crate::errln!("settle: reply failed: {}", escape::one_line(&error));
                // The prompt stays in the history; the failed reply does not.
            }
        }
        if let Some(signal) = terminated {
            break End::Signalled(signal);
        }
    };
    match end {
        End::Closed => {
            let _ = session.close().await;
            kernel.shutdown(Duration::ZERO).await;
            Ok(exit::DONE)
        }
        End::Unreadable(error) => {
            let _ = session.close().await;
            kernel.shutdown(Duration::ZERO).await;
            Err(Failure::bad_input(format!(
                "cannot read the next prompt from standard input: {}",
                escape::one_line(&error.to_string())
            )))
        }
        End::Signalled(signal) => {
            outln!();
            let shutdown = kernel.shutdown(args.drain_timeout);
            tokio::pin!(shutdown);
            // Every further signal skips what is left of the drain.
            let report = loop {
                tokio::select! {
                    report = &mut shutdown => break report,
                    _ = signals.recv() => kernel.skip_drain(),
                }
            };
            if report.lease_lost || !report.left_recoverable.is_empty() {
                crate::shutdown::say_left(&report, false);
                return Ok(exit::STORE);
            }
            Ok(u8::try_from(signal.exit_code()).unwrap_or(exit::DONE))
        }
    }
}

/// Checks that `id` can be resumed: it exists and is finalized.
async fn resumable(store: &Store, db: &str, id: SessionId) -> Result<(), Failure> {
    let state = match store.session_detail(id).await {
        Ok(detail) => detail.session.state,
        Err(error) => return Err(refused(db, error.into())),
    };
    if state == State::Finalized {
        Ok(())
    } else {
        Err(Failure::bad_input(RuntimeError::NotResumable {
            session: id,
            state,
        }))
    }
}

/// The chat's session: a new one, or one that continues `from` with the
/// conversation to send first.
async fn start(
    kernel: &Kernel,
    db: &str,
    from: Option<SessionId>,
) -> Result<(SessionHandle, Vec<Message>), Failure> {
    match from {
        Some(from) => {
            let resumed = kernel
                .resume(from, "chat")
                .await
                .map_err(|e| refused(db, e))?;
            Ok((resumed.session, resumed.history))
        }
        None => Ok((
            kernel
                .register("chat", None)
                .await
                .map_err(Failure::store)?,
            Vec::new(),
        )),
    }
}

/// A resume the store or the runtime refused: a session that is not there
/// or not finished is bad input; anything else a store failure.
fn refused(db: &str, error: RuntimeError) -> Failure {
    match error {
        RuntimeError::Store(StoreError::UnknownSession(id)) => Failure::bad_input(format!(
            "no session {id} in {db} to resume; see `settle sessions`"
        )),
        error @ RuntimeError::NotResumable { .. } => Failure::bad_input(error),
        error => Failure::store(error),
    }
}

fn prompt() {
    out!("> ");
    let _ = std::io::stdout().flush();
}
