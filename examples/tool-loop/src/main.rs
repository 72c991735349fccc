//! A whole tool-call loop on `settle`: the model is offered tools, asks for
//! some, each runs under the session's lifecycle (`SessionHandle::spawn`:
//! cancelled with the session, detached past the settle timeout, a
//! subprocess killed and reaped), their results go back with the next turn,
//! until the model answers in words. The library puts each streamed tool
//! call together (`TurnReply::reply.tool_calls`) and builds the assistant
//! message that goes back (`Reply::to_message`).
//!
//! With `--base-url` it talks to an OpenAI-compatible server; without, to a
//! small built-in model that asks for `list_dir` once and then answers, so
//! the example runs anywhere:
//!
//! ```sh
//! cargo run -p settle-example-tool-loop -- "what is in this folder?"
//! cargo run -p settle-example-tool-loop -- --base-url http://127.0.0.1:8080/v1 --model local "what is in /tmp?"
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clap::Parser;
use futures_util::stream;
use serde_json::{json, Value};
use settle_runtime::{
    process, signals, Kernel, Message, ModelOptions, Role, RuntimeError, SessionHandle, ToolCall,
    TurnRequest,
};
use settle_store::MemoryStore;
use settle_stream::{
    Chunk, ChunkKind, DropClose, OpenAiConfig, OpenAiProvider, Provider, ProviderStream, Request,
    StreamError, StreamEvent,
};

/// Runs a tool-call loop toward a question.
#[derive(Debug, Parser)]
struct Args {
    /// The question, in words.
    question: String,
    /// An OpenAI-compatible server's base URL (up to `/v1`); the built-in
    /// model when left out.
    #[arg(long)]
    base_url: Option<String>,
    /// The model name.
    #[arg(long, default_value = "local")]
    model: String,
    /// The most model turns before giving up.
    #[arg(long, default_value_t = 8)]
    max_steps: usize,
}

/// What the loop can end with.
#[derive(Debug)]
enum LoopError {
    Runtime(RuntimeError),
    Turn(String),
    TooManySteps(usize),
}

impl std::fmt::Display for LoopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopError::Runtime(e) => write!(f, "{e}"),
            LoopError::Turn(e) => write!(f, "the model's turn failed: {e}"),
            LoopError::TooManySteps(n) => write!(f, "no answer after {n} model turns"),
        }
    }
}

impl From<RuntimeError> for LoopError {
    fn from(e: RuntimeError) -> Self {
        LoopError::Runtime(e)
    }
}

/// The tools offered to the model, as chat-completion APIs spell them.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "list_dir",
            "description": "List the entries of a folder",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                           "required": ["path"]}}},
        {"type": "function", "function": {
            "name": "word_count",
            "description": "Count the words of a text",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                           "required": ["text"]}}},
    ])
}

/// Runs one tool call under `session`'s lifecycle and returns what goes
/// back to the model (an error is a result too: the model reads it).
async fn run_tool(session: &SessionHandle, call: &ToolCall) -> Result<String, RuntimeError> {
    let arguments = match call.parse_arguments() {
        Ok(arguments) => arguments,
        Err(e) => return Ok(format!("error: the arguments are not JSON: {e}")),
    };
    let text = |key: &str| arguments[key].as_str().unwrap_or_default().to_owned();
    let result = match call.name.as_str() {
        "list_dir" => {
            let path = text("path");
            let tool = session
                .spawn(move |ctx| async move {
                    let mut ls = tokio::process::Command::new("ls");
                    ls.arg("-1").arg(path);
                    process::output(&ctx, ls).await
                })
                .await?;
            match tool.join().await {
                Ok(Ok(output)) if output.status.success() => {
                    String::from_utf8_lossy(&output.stdout).into_owned()
                }
                Ok(Ok(output)) => format!("error: {}", String::from_utf8_lossy(&output.stderr)),
                Ok(Err(e)) => format!("error: {e}"),
                Err(e) => format!("error: {e}"),
            }
        }
        "word_count" => {
            let words = text("text");
            let tool = session
                .spawn(move |_ctx| async move { words.split_whitespace().count() })
                .await?;
            match tool.join().await {
                Ok(n) => n.to_string(),
                Err(e) => format!("error: {e}"),
            }
        }
        other => format!("error: there is no tool `{other}`"),
    };
    Ok(result)
}

/// The loop: model → tools → model, until the model answers in words.
async fn answer(
    session: &SessionHandle,
    model: Arc<dyn Provider>,
    question: &str,
    max_steps: usize,
) -> Result<String, LoopError> {
    let options = ModelOptions::default()
        .tools(tools())
        .tool_choice(json!("auto"));
    let mut history = vec![
        Message::new(Role::System, "Use the tools to answer; be brief."),
        Message::new(Role::User, question),
    ];
    for _ in 0..max_steps {
        let request = TurnRequest::new(history.clone()).options(options.clone());
        let done = session
            .run_turn(model.clone(), request)
            .await?
            .reply()
            .await;
        if let Some(error) = done.error {
            return Err(LoopError::Turn(error.message));
        }
        if done.reply.tool_calls.is_empty() {
            return Ok(done.reply.text);
        }
        // The assistant message with its tool calls, then one result each.
        history.push(done.reply.to_message());
        for call in &done.reply.tool_calls {
            eprintln!("tool call: {}({})", call.name, call.arguments_line());
            let result = run_tool(session, call).await?;
            history.push(Message::tool_result(&call.id, result));
        }
    }
    Err(LoopError::TooManySteps(max_steps))
}

/// A stand-in model: asks for `list_dir` of `.` first, then answers with
/// what the tool said.
struct BuiltIn;

#[async_trait]
impl Provider for BuiltIn {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        let last = request.messages.last();
        let chunks = match last {
            Some(message) if message.role == Role::Tool => {
                let entries = message.content.lines().count();
                vec![Chunk::text(format!("The folder has {entries} entries."))]
            }
            _ => vec![
                Chunk::json(
                    ChunkKind::ToolCall,
                    &json!({"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "list_dir", "arguments": "{\"path\":"}}),
                ),
                Chunk::json(
                    ChunkKind::ToolCall,
                    &json!({"index": 0, "function": {"arguments": " \".\"}"}}),
                ),
            ],
        };
        let events = chunks.into_iter().map(|c| Ok(StreamEvent::Chunk(c)));
        Ok(Box::new(DropClose::new(stream::iter(events))))
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let model: Arc<dyn Provider> = match &args.base_url {
        None => Arc::new(BuiltIn),
        Some(url) => match OpenAiProvider::new(OpenAiConfig::new(url, &args.model)) {
            Ok(provider) => Arc::new(provider),
            Err(e) => {
                eprintln!("tool-loop: {e}");
                return std::process::ExitCode::from(2);
            }
        },
    };
    let started = Kernel::builder(Arc::new(MemoryStore::new()))
        .settle_timeout(Duration::from_secs(1))
        .start()
        .await;
    let kernel = match started {
        Ok(kernel) => kernel,
        Err(e) => {
            eprintln!("tool-loop: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    if let Ok(on_signals) = signals::shutdown_on_signals(&kernel, Duration::from_secs(2)) {
        tokio::spawn(on_signals);
    }
    let outcome = match kernel.register("tool-loop", None).await {
        Ok(session) => {
            let session = session.guard();
            let answered = answer(&session, model, &args.question, args.max_steps).await;
            let _ = session.finish().await;
            answered
        }
        Err(e) => Err(e.into()),
    };
    kernel.shutdown(Duration::from_secs(2)).await;
    match outcome {
        Ok(text) => {
            println!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tool-loop: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_loop_runs_a_tool_and_answers_with_its_result(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("tool-loop-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a"))?;
        std::fs::create_dir_all(dir.join("b"))?;
        let store = MemoryStore::new();
        let kernel = Kernel::builder(Arc::new(store.clone())).start().await?;
        let session = kernel.register("test", None).await?;
        let call = ToolCall::new("c", "list_dir", json!({"path": dir}).to_string());
        assert_eq!(run_tool(&session, &call).await?, "a\nb\n");
        let text = answer(&session, Arc::new(BuiltIn), "what is here?", 4)
            .await
            .map_err(|e| e.to_string())?;
        assert!(text.starts_with("The folder has "), "{text}");
        let detail = settle_store::SessionStore::session_detail(&store, session.id()).await?;
        assert_eq!(detail.turns.len(), 2, "model, then model again");
        let _ = std::fs::remove_dir_all(dir);
        Ok(())
    }
}
