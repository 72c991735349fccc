//! A small agent on `settle`: it asks an OpenAI-compatible server for the
//! next shell command toward a goal, runs it as a tool under its session's
//! lifecycle (a child process in its own group: SIGTERM on cancel, SIGKILL at
//! the settle deadline, always reaped), feeds the output back, and stops when
//! the model says `DONE` or after a few steps. Ctrl-C shuts it down
//! gracefully; a second Ctrl-C skips the drain.
//!
//! ```sh
//! cargo run -p settle-example-shell-agent -- \
//!     --base-url http://127.0.0.1:8080/v1 --model local "how much disk is free?"
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::StreamExt;
use settle_runtime::{process, signals, Kernel, RuntimeError, TurnRequest};
use settle_store::Store;
use settle_stream::{Message, OpenAiConfig, OpenAiProvider, Provider, Role};

/// Asks a model for shell commands toward a goal and runs them, with teardown
/// that is correct on every path.
#[derive(Debug, Parser)]
struct Args {
    /// The goal, in words.
    goal: String,
    /// The server's base URL, up to and including `/v1`.
    #[arg(long, default_value = "http://127.0.0.1:8080/v1")]
    base_url: String,
    /// The model name to ask for.
    #[arg(long, default_value = "default")]
    model: String,
    /// The session store (a SQLite path or a postgres:// URL).
    #[arg(long, default_value = "settle.db")]
    db: String,
    /// How many commands at most.
    #[arg(long, default_value_t = 5)]
    steps: usize,
}

const SYSTEM: &str = "You operate a Linux shell to reach the user's goal. Answer with \
exactly one line: `RUN: <command>` to run a command (you will get its output), or \
`DONE: <answer>` when you know the answer.";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let provider: Arc<dyn Provider> = Arc::new(OpenAiProvider::new(OpenAiConfig::new(
        args.base_url.clone(),
        args.model.clone(),
    ))?);
    let store = Arc::new(Store::open_async(&args.db).await?);
    let kernel = Kernel::builder(store).start().await?;
    tokio::spawn(signals::shutdown_on_signals(
        &kernel,
        Duration::from_secs(5),
    )?);

    // Dropped on any early return: the session is cancelled, never left live.
    let agent = kernel.register("shell-agent", None).await?.guard();
    let mut history = vec![
        Message::new(Role::System, SYSTEM),
        Message::new(Role::User, args.goal.clone()),
    ];
    for _ in 0..args.steps {
        let mut turn = agent
            .run_turn(provider.clone(), TurnRequest::new(history.clone()))
            .await?;
        let mut reply = String::new();
        while let Some(chunk) = turn.next().await {
            if let Some(text) = chunk.as_text() {
                print!("{text}");
                reply.push_str(text);
            }
        }
        println!();
        if let Err(error) = turn.result().await {
            eprintln!("the model's reply failed: {error}");
            break;
        }
        history.push(Message::new(Role::Assistant, reply.clone()));
        let Some(command) = reply.trim().strip_prefix("RUN:").map(str::trim) else {
            break;
        };
        let output = run_tool(&agent, command.to_owned()).await?;
        println!("$ {command}\n{output}");
        history.push(Message::new(
            Role::User,
            format!("Output of `{command}`:\n{output}"),
        ));
    }
    agent.finish().await?;
    kernel.shutdown_default().await;
    Ok(())
}

/// Runs `command` with `sh -c` as a task of the agent's session.
async fn run_tool(
    agent: &settle_runtime::SessionHandle,
    command: String,
) -> Result<String, RuntimeError> {
    let task = agent
        .spawn(move |ctx| async move {
            let mut sh = tokio::process::Command::new("sh");
            sh.arg("-c").arg(command);
            process::output(&ctx, sh).await
        })
        .await?;
    Ok(match task.join().await {
        Ok(Ok(output)) => format!(
            "{}{}(exit status {})",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            output.status
        ),
        Ok(Err(error)) => format!("the command could not run: {error}"),
        Err(error) => format!("the tool did not finish: {error}"),
    })
}
