//! `settle chat`: one session against an OpenAI-compatible server. The reply
//! streams as it is persisted; Ctrl-C cancels the reply in flight (the stream
//! is closed, the partial turn kept as `cancelled`, the session goes on);
//! Ctrl-D or `/exit` ends the session (`user_close`); SIGTERM, or Ctrl-C at
//! the prompt, shuts down gracefully (G9).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use settle_runtime::{Outcome, Runtime};
use settle_stream::{Message, OpenAiConfig, OpenAiProvider, Provider, Request, Role};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{signal, SignalKind};

use crate::{exit, open_store, Failure};

/// Options of `settle chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The server's base URL, up to and including `/v1`.
    #[arg(
        long,
        env = "SETTLE_BASE_URL",
        default_value = "http://127.0.0.1:8080/v1"
    )]
    base_url: String,
    /// The model name to ask for.
    #[arg(long, env = "SETTLE_MODEL", default_value = "default")]
    model: String,
    /// The API key, sent as a bearer token.
    #[arg(long, env = "SETTLE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// How long the server may be silent mid-reply before the turn times out.
    #[arg(long, value_parser = crate::duration::parse, default_value = "60s")]
    idle_timeout: Duration,
    /// How long a running reply may finish after SIGTERM.
    #[arg(long, value_parser = crate::duration::parse, default_value = "5s")]
    drain_timeout: Duration,
}

/// Runs the chat until Ctrl-D, `/exit` or a shutdown signal; returns the exit code.
pub async fn run(db: &str, args: ChatArgs) -> Result<u8, Failure> {
    let mut config = OpenAiConfig::new(args.base_url.clone(), args.model.clone());
    if let Some(key) = &args.api_key {
        config = config.api_key(key.clone());
    }
    let provider: Arc<dyn Provider> =
        Arc::new(OpenAiProvider::new(config).map_err(Failure::bad_input)?);
    let store: Arc<dyn settle_store::SessionStore> = Arc::new(open_store(db)?);
    let runtime = Runtime::builder(store)
        .idle_timeout(Some(args.idle_timeout))
        .drain_timeout(args.drain_timeout)
        .start()
        .await
        .map_err(Failure::store)?;
    let session = runtime
        .register("chat", None)
        .await
        .map_err(Failure::store)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Failure::store)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(Failure::store)?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut history: Vec<Message> = Vec::new();
    eprintln!(
        "settle chat: session {} with {} at {}. Ctrl-C cancels a reply, Ctrl-D ends.",
        session.id(),
        args.model,
        args.base_url
    );
    let code = loop {
        prompt();
        let line = tokio::select! {
            line = lines.next_line() => line,
            _ = interrupt.recv() => break shutdown(&runtime, args.drain_timeout, 130).await,
            _ = terminate.recv() => break shutdown(&runtime, args.drain_timeout, 143).await,
        };
        let text = match line {
            Ok(Some(text)) if text.trim() == "/exit" => None,
            Ok(Some(text)) => Some(text),
            Ok(None) | Err(_) => None,
        };
        let Some(text) = text else {
            // Ctrl-D: the user ends the session.
            let _ = session.close().await;
            runtime.shutdown(Duration::ZERO).await;
            break exit::DONE;
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
                eprintln!("settle: {error}");
                continue;
            }
        };
        let mut reply = String::new();
        let mut terminated = false;
        loop {
            tokio::select! {
                chunk = turn.next_chunk() => match chunk {
                    Some(chunk) => {
                        out!("{chunk}");
                        let _ = std::io::stdout().flush();
                        reply.push_str(&chunk);
                    }
                    None => break,
                },
                _ = interrupt.recv() => {
                    let _ = session.cancel_turn().await;
                }
                _ = terminate.recv() => {
                    terminated = true;
                    runtime.begin_shutdown(args.drain_timeout);
                }
            }
        }
        let outcome = turn.outcome().await;
        outln!();
        if outcome != Outcome::Completed {
            eprintln!("settle: reply {outcome}");
        }
        history.push(Message::new(Role::Assistant, reply));
        if terminated {
            runtime.finished().await;
            break 143;
        }
    };
    Ok(code)
}

fn prompt() {
    out!("> ");
    let _ = std::io::stdout().flush();
}

async fn shutdown(runtime: &Runtime, drain: Duration, code: u8) -> u8 {
    outln!();
    runtime.shutdown(drain).await;
    code
}
