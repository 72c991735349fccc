//! `settle chat` against a tiny OpenAI-compatible server on the loopback
//! interface: Ctrl-C (SIGINT) cancels the reply in flight and closes its
//! connection, the next prompt works, and end of input closes the session
//! (`user_close`) with exit 0. A failed reply says why on stderr (a server
//! that is not there, a 404, a 500 with a JSON error) and the chat goes on,
//! the reason stored with the turn and shown by `show` and `export`;
//! `--resume ID` and `--last` send the earlier conversation first, as the
//! server sees it; reasoning, tool calls and usage are stored and shown as
//! what they are.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use settle_tests::{assert_success, id_of, Running, Sandbox, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Request `n` (from 0) arrived at `/v1/chat/completions`, with this JSON body.
    Request(usize, Value),
    /// A request arrived at another path, and was answered 404.
    WrongPath(String),
    /// The client closed the connection of request `n` mid-reply.
    Closed(usize),
    /// Request `n` was answered in full.
    Answered(usize),
}

/// How the server answers one request to `/v1/chat/completions`.
#[derive(Debug, Clone)]
enum Answer {
    /// These events (each the JSON of one `data:` line), then `data: [DONE]`.
    Events(Vec<Value>),
    /// These events, then only `: keepalive` comments until the client
    /// goes away (or a minute passes).
    Stall(Vec<Value>),
    /// An HTTP error: the status line and a JSON body.
    Status(&'static str, Value),
}

const FIRST_REPLY: [&str; 3] = ["Hello", ", I am ", "thinking"];
const SECOND_REPLY: [&str; 2] = ["second ", "answer"];

/// One SSE event carrying a piece of reply text.
fn text(piece: &str) -> Value {
    json!({ "choices": [{ "delta": { "content": piece } }] })
}

fn texts(pieces: &[&str]) -> Vec<Value> {
    pieces.iter().map(|p| text(p)).collect()
}

/// A tiny OpenAI-compatible server on 127.0.0.1 that answers the requests
/// to `/v1/chat/completions` as its script says, in order (request `n` gets
/// answer `n`; the last answer repeats), and every other path with a 404.
struct Server {
    port: u16,
    seen: mpsc::Receiver<Seen>,
    // Serves until the test ends.
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    fn start(script: Vec<Answer>) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let (seen_tx, seen) = mpsc::channel();
        runtime.spawn(serve(listener, Arc::new(script), seen_tx));
        Server {
            port,
            seen,
            _runtime: runtime,
        }
    }

    /// The base URL a chat is given: up to and including `/v1`.
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn next(&self, what: &str) -> Seen {
        next_seen(&self.seen, what)
    }

    /// The body of the next request, which must be request `n` (how the
    /// requests before it ended is passed over).
    fn request(&self, n: usize) -> Value {
        loop {
            match self.next(&format!("request {n}")) {
                Seen::Request(m, body) if m == n => return body,
                Seen::Answered(m) | Seen::Closed(m) if m < n => {}
                other => panic!("expected request {n}, saw {other:?}"),
            }
        }
    }
}

async fn serve(listener: TcpListener, script: Arc<Vec<Answer>>, seen: mpsc::Sender<Seen>) {
    let requests = Arc::new(AtomicUsize::new(0));
    while let Ok((socket, _)) = listener.accept().await {
        let (seen, script, requests) = (seen.clone(), script.clone(), requests.clone());
        tokio::spawn(async move {
            let _ = answer(socket, &script, &requests, seen).await;
        });
    }
}

async fn answer(
    mut socket: TcpStream,
    script: &[Answer],
    requests: &AtomicUsize,
    seen: mpsc::Sender<Seen>,
) -> std::io::Result<()> {
    // The request: headers, then a body of Content-Length bytes.
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let read = socket.read(&mut buf).await?;
        if read == 0 {
            return Ok(());
        }
        bytes.extend_from_slice(&buf[..read]);
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while bytes.len() < head_end + length {
        let read = socket.read(&mut buf).await?;
        if read == 0 {
            return Ok(());
        }
        bytes.extend_from_slice(&buf[..read]);
    }
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    if !head.starts_with("POST /v1/chat/completions ") {
        let _ = seen.send(Seen::WrongPath(path));
        let body = "404 page not found";
        let response = format!(
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(response.as_bytes()).await?;
        return socket.shutdown().await;
    }
    let body = serde_json::from_slice(&bytes[head_end..head_end + length]).unwrap_or(Value::Null);
    let n = requests.fetch_add(1, Ordering::SeqCst);
    let _ = seen.send(Seen::Request(n, body));
    let Some(reply) = script.get(n).or(script.last()) else {
        return Ok(());
    };

    let events = match reply {
        Answer::Status(status, body) => {
            let body = body.to_string();
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await?;
            socket.shutdown().await?;
            let _ = seen.send(Seen::Answered(n));
            return Ok(());
        }
        Answer::Events(events) | Answer::Stall(events) => events,
    };
    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
              Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
        )
        .await?;
    for event in events {
        socket
            .write_all(format!("data: {event}\n\n").as_bytes())
            .await?;
        socket.flush().await?;
    }
    if let Answer::Events(_) = reply {
        socket.write_all(b"data: [DONE]\n\n").await?;
        socket.shutdown().await?;
        let _ = seen.send(Seen::Answered(n));
        return Ok(());
    }
    // Stall: keepalives only, until the client hangs up (or a minute).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let closed = loop {
        tokio::select! {
            read = socket.read(&mut buf) => {
                if matches!(read, Ok(0) | Err(_)) {
                    break true;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                if socket.write_all(b": keepalive\n\n").await.is_err() {
                    break true;
                }
            }
            () = tokio::time::sleep_until(deadline) => break false,
        }
    };
    if closed {
        let _ = seen.send(Seen::Closed(n));
    }
    Ok(())
}

fn next_seen(seen: &mpsc::Receiver<Seen>, what: &str) -> Seen {
    seen.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("the server did not see {what}"))
}

fn last_user_message(body: &Value) -> &str {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .filter(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no user message last in {body}"))
}

#[test]
fn chat_ctrl_c_cancels_the_reply_and_end_of_input_closes_the_session() {
    let server = Server::start(vec![
        Answer::Stall(texts(&FIRST_REPLY)),
        Answer::Events(texts(&SECOND_REPLY)),
    ]);
    let seen = &server.seen;
    let sandbox = Sandbox::new();
    let base_url = server.base_url();
    let mut chat = sandbox.spawn(&["chat", "--base-url", &base_url, "--model", "m"]);
    chat.wait_for("the first prompt", |out| out.starts_with("> "));

    // A prompt; its reply streams, then stalls.
    writeln!(chat.stdin(), "first question").unwrap();
    let Seen::Request(0, body) = next_seen(seen, "the first request") else {
        panic!("expected the first request");
    };
    assert_eq!(body["model"], "m");
    assert_eq!(body["stream"], true);
    assert_eq!(last_user_message(&body), "first question");
    let first = FIRST_REPLY.concat();
    chat.wait_for("the first reply", |out| out.contains(&first));

    // Ctrl-C: the reply in flight is cancelled, its connection closed.
    chat.signal(Signal::SIGINT);
    assert_eq!(next_seen(seen, "the connection closed"), Seen::Closed(0));
    // The session goes on: a new prompt after the cut reply.
    chat.wait_for("the prompt after the cancelled reply", |out| {
        out.split_once(first.as_str())
            .is_some_and(|(_, after)| after.contains("> "))
    });
    writeln!(chat.stdin(), "second question").unwrap();
    let Seen::Request(1, body) = next_seen(seen, "the second request") else {
        panic!("expected the second request");
    };
    assert_eq!(last_user_message(&body), "second question");
    // The history holds the cut reply, as far as it went.
    assert_eq!(body["messages"][1]["role"], "assistant");
    assert_eq!(body["messages"][1]["content"], first.as_str());
    let second = SECOND_REPLY.concat();
    chat.wait_for("the second reply", |out| out.contains(&second));
    assert_eq!(next_seen(seen, "the second answer"), Seen::Answered(1));

    // End of input (Ctrl-D): the session is closed by the user.
    chat.close_stdin();
    let (status, _) = chat.wait();
    assert_eq!(status.code(), Some(0), "{}", chat.stderr_text());

    let sessions = sandbox.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:#?}");
    let session = &sessions[0];
    assert_eq!(session["name"], "chat");
    assert_eq!(session["state"], "finalized");
    assert_eq!(session["end_reason"], "user_close");
    assert_eq!(session["outcome"], "completed");
    let shown = sandbox.show(session["id"].as_u64().unwrap());
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{shown:#}");
    assert_eq!(turns[0]["outcome"], "cancelled");
    assert_eq!(turns[0]["chunks"], serde_json::json!(FIRST_REPLY));
    assert_eq!(turns[1]["outcome"], "completed");
    assert_eq!(turns[1]["chunks"], serde_json::json!(SECOND_REPLY));
    // Memory from the completed reply only (G7).
    assert_eq!(
        sandbox.memories(session["id"].as_u64().unwrap()),
        [(2, second)]
    );
}

#[test]
fn g9_chat_a_second_sigterm_during_a_reply_skips_the_drain() {
    let server = Server::start(vec![
        Answer::Stall(texts(&FIRST_REPLY)),
        Answer::Events(texts(&SECOND_REPLY)),
    ]);
    let seen = &server.seen;
    let sandbox = Sandbox::new();
    let base_url = server.base_url();
    let mut chat = sandbox.spawn(&[
        "chat",
        "--base-url",
        &base_url,
        "--model",
        "m",
        "--drain-timeout",
        "10m",
    ]);
    chat.wait_for("the first prompt", |out| out.starts_with("> "));
    writeln!(chat.stdin(), "first question").unwrap();
    let Seen::Request(0, _) = next_seen(seen, "the first request") else {
        panic!("expected the first request");
    };
    let first = FIRST_REPLY.concat();
    chat.wait_for("the first reply", |out| out.contains(&first));

    // The reply stalls: with a ten-minute drain only a second signal ends it.
    chat.signal(Signal::SIGTERM);
    assert!(chat.exited_within(Duration::from_millis(500)).is_none());
    chat.signal(Signal::SIGTERM);
    let status = chat
        .exited_within(Duration::from_secs(10))
        .expect("the second SIGTERM skipped the drain");
    assert_eq!(status.code(), Some(143), "{}", chat.stderr_text());
    assert_eq!(next_seen(seen, "the connection closed"), Seen::Closed(0));
    let sessions = sandbox.sessions();
    assert_eq!(sessions[0]["state"], "finalized");
    assert_eq!(sessions[0]["end_reason"], "shutdown");
    assert_eq!(sessions[0]["outcome"], "cancelled");
}

// --- failed replies, resumed chats, structured chunks -------------------------

/// How many prompts (`> `) the chat has printed.
fn prompts(out: &str) -> usize {
    out.matches("> ").count()
}

/// Starts `settle chat --base-url URL --model m EXTRA...` and waits for its
/// first prompt.
fn start_chat(sandbox: &Sandbox, base_url: &str, extra: &[&str]) -> Running {
    let mut args = vec!["chat", "--base-url", base_url, "--model", "m"];
    args.extend_from_slice(extra);
    let mut chat = sandbox.spawn(&args);
    chat.wait_for("the first prompt", |out| prompts(out) >= 1);
    chat
}

/// Types `line`, then waits for the prompt that follows its reply (or its
/// failure).
fn say(chat: &mut Running, line: &str) {
    let before = prompts(chat.output());
    writeln!(chat.stdin(), "{line}").unwrap();
    chat.wait_for(&format!("the prompt after {line:?}"), |out| {
        prompts(out) > before
    });
}

/// Ends the chat with end of input (Ctrl-D): exit 0. Returns its stderr.
fn end_chat(mut chat: Running) -> String {
    chat.close_stdin();
    let (status, _) = chat.wait();
    let stderr = chat.stderr_text();
    assert_eq!(status.code(), Some(0), "{stderr}");
    stderr
}

fn stdout_of(sandbox: &Sandbox, args: &[&str]) -> String {
    let out = sandbox.run(args);
    assert_success(&out, &format!("settle {args:?}"));
    String::from_utf8(out.stdout).unwrap()
}

/// The ids of the sessions, oldest first.
fn session_ids(sandbox: &Sandbox) -> Vec<u64> {
    sandbox.sessions().iter().rev().map(id_of).collect()
}

/// The `(role, content)` of each message of a request body.
fn messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages in {body}"))
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn conversation(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(role, content)| ((*role).to_owned(), (*content).to_owned()))
        .collect()
}

/// Turn `no` of session `id` failed with an error of `kind` whose message
/// contains `says`, and `show`, `show --json`, `export` (Markdown) and
/// `export --format jsonl` all say so.
fn assert_failed_everywhere(sandbox: &Sandbox, id: u64, no: u64, kind: &str, says: &str) {
    let shown = sandbox.show(id);
    let turn = &shown["turns"][usize::try_from(no - 1).unwrap()];
    assert_eq!(turn["outcome"], "failed", "{shown:#}");
    assert_eq!(turn["error"]["kind"], kind, "{shown:#}");
    let message = turn["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{message}");

    let id = id.to_string();
    let text = stdout_of(sandbox, &["show", &id]);
    let line = format!("  error: {message} ({kind})\n");
    assert!(
        text.contains(&format!("  outcome: failed\n{line}")),
        "{text}"
    );

    let md = stdout_of(sandbox, &["export", &id]);
    assert!(
        md.contains(&format!(
            "**Outcome:** failed\n\n**Error** (`{kind}`): {message}\n"
        )),
        "{md}"
    );

    let jsonl = stdout_of(sandbox, &["export", &id, "--format", "jsonl"]);
    let end = jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "turn_end" && e["turn"] == no)
        .unwrap_or_else(|| panic!("no turn_end of turn {no}: {jsonl}"));
    assert_eq!(end["outcome"], "failed");
    assert_eq!(end["error"], turn["error"], "{jsonl}");
}

#[test]
fn failed_replies_say_why_the_chat_goes_on_and_the_reason_is_stored() {
    let sandbox = Sandbox::new();

    // Nothing listens on a port that was just given back.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut chat = start_chat(&sandbox, &format!("http://127.0.0.1:{dead}/v1"), &[]);
    say(&mut chat, "anyone there?");
    // The chat goes on after the failure: a second prompt, a second failure.
    say(&mut chat, "hello?");
    let stderr = end_chat(chat);
    let refused: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("settle: reply failed: "))
        .collect();
    assert_eq!(refused.len(), 2, "{stderr}");
    assert!(
        refused
            .iter()
            .all(|l| l.ends_with("connection refused (is the server running?)")),
        "{stderr}"
    );

    // A wrong path: the server answers 404.
    let server = Server::start(vec![
        Answer::Status(
            "500 Internal Server Error",
            json!({"error": {"message": "the model is overloaded", "type": "server_error"}}),
        ),
        Answer::Events(texts(&["All ", "good now"])),
    ]);
    let wrong = format!("http://127.0.0.1:{}/wrong/v1", server.port);
    let mut chat = start_chat(&sandbox, &wrong, &[]);
    say(&mut chat, "is this the place?");
    let stderr = end_chat(chat);
    assert_eq!(
        server.next("the wrong path"),
        Seen::WrongPath("/wrong/v1/chat/completions".to_owned())
    );
    let not_found =
        format!("settle: reply failed: HTTP 404 Not Found from {wrong}/chat/completions");
    assert!(
        stderr.lines().any(|l| l.starts_with(&not_found)),
        "{stderr}"
    );

    // A 500 with a JSON error body: its message is shown; the next prompt
    // works and carries the failed one (not a failed reply) in its history.
    let mut chat = start_chat(&sandbox, &server.base_url(), &[]);
    say(&mut chat, "first try");
    assert_eq!(
        messages(&server.request(0)),
        conversation(&[("user", "first try")])
    );
    say(&mut chat, "second try");
    assert_eq!(
        messages(&server.request(1)),
        conversation(&[("user", "first try"), ("user", "second try")])
    );
    assert!(chat.output().contains("All good now"));
    let stderr = end_chat(chat);
    let overloaded = format!(
        "settle: reply failed: HTTP 500 Internal Server Error from {}/chat/completions: the model is overloaded",
        server.base_url()
    );
    assert!(stderr.lines().any(|l| l == overloaded), "{stderr}");

    // Each failure is stored with its turn, and shown and exported.
    let ids = session_ids(&sandbox);
    assert_eq!(ids.len(), 3);
    for no in [1, 2] {
        assert_failed_everywhere(
            &sandbox,
            ids[0],
            no,
            "connect",
            "connection refused (is the server running?)",
        );
    }
    assert_failed_everywhere(
        &sandbox,
        ids[1],
        1,
        "http_status",
        "HTTP 404 Not Found from",
    );
    assert_failed_everywhere(
        &sandbox,
        ids[2],
        1,
        "http_status",
        "HTTP 500 Internal Server Error from",
    );
    let third = sandbox.show(ids[2]);
    assert!(third["turns"][0]["error"]["message"]
        .as_str()
        .unwrap()
        .ends_with(": the model is overloaded"));
    assert_eq!(third["turns"][1]["outcome"], "completed");
    assert_eq!(third["turns"][1]["text"], "All good now");
    assert!(third["turns"][1]["error"].is_null());
    // The input of each turn is stored: what was sent, failed prompt included.
    assert_eq!(
        third["turns"][1]["input"],
        json!([{"role": "user", "content": "first try"}, {"role": "user", "content": "second try"}])
    );
}

#[test]
fn a_reply_without_text_is_told_and_never_sent_back_as_an_empty_message() {
    // The first reply is keepalive-like events only (no choices), then
    // `[DONE]`: it completes with no text.
    let server = Server::start(vec![
        Answer::Events(vec![json!({"choices": []}), json!({"choices": []})]),
        Answer::Events(texts(&["ok"])),
        Answer::Events(texts(&["still ok"])),
    ]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let mut chat = start_chat(&sandbox, &url, &[]);
    say(&mut chat, "first");
    say(&mut chat, "second");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains("settle: the reply had no text\n"),
        "{stderr}"
    );
    // No empty assistant message between the two prompts: some servers
    // refuse one.
    server.request(0);
    assert_eq!(
        messages(&server.request(1)),
        conversation(&[("user", "first"), ("user", "second")])
    );
    // A resumed chat sends the same conversation.
    let first = session_ids(&sandbox)[0].to_string();
    let mut chat = start_chat(&sandbox, &url, &["--resume", &first]);
    say(&mut chat, "third");
    end_chat(chat);
    assert_eq!(
        messages(&server.request(2)),
        conversation(&[
            ("user", "first"),
            ("user", "second"),
            ("assistant", "ok"),
            ("user", "third"),
        ])
    );
}

#[test]
fn a_first_event_timeout_ends_a_reply_that_never_starts_and_the_chat_goes_on() {
    // Keepalives only: no first event, ever.
    let server = Server::start(vec![Answer::Stall(vec![]), Answer::Events(texts(&["ok"]))]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let timeouts = ["--first-event-timeout", "1s", "--idle-timeout", "1h"];
    let mut chat = start_chat(&sandbox, &url, &timeouts);
    say(&mut chat, "first");
    say(&mut chat, "second");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains("settle: reply failed: the provider sent no first event within 1s"),
        "{stderr}"
    );
    let shown = sandbox.show(session_ids(&sandbox)[0]);
    let turns = &shown["turns"];
    assert_eq!(turns[0]["outcome"], "idle_timeout", "{shown:#}");
    let message = turns[0]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("within 1s (first-event timeout"),
        "{message}"
    );
    assert_eq!(turns[1]["outcome"], "completed", "{shown:#}");
}

#[test]
fn retries_ask_again_for_a_reply_the_server_refused_before_it_began() {
    let busy = json!({ "error": { "message": "overloaded" } });
    let server = Server::start(vec![
        Answer::Status("503 Service Unavailable", busy.clone()),
        Answer::Events(texts(&["ok"])),
        Answer::Status("503 Service Unavailable", busy),
    ]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let mut chat = start_chat(&sandbox, &url, &["--retries", "1"]);
    say(&mut chat, "first");
    // Its retries spent, a refusal fails the reply as without them.
    say(&mut chat, "second");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains("settle: reply failed: HTTP 503"),
        "{stderr}"
    );
    for n in 0..4 {
        server.request(n);
    }
    let shown = sandbox.show(session_ids(&sandbox)[0]);
    let turns = &shown["turns"];
    assert_eq!(turns[0]["outcome"], "completed", "{shown:#}");
    assert_eq!(turns[1]["outcome"], "failed", "{shown:#}");
}

#[test]
fn a_resumed_chat_sends_the_earlier_conversation_first() {
    let server = Server::start(vec![
        Answer::Events(texts(&["Hello ", "Ada"])),
        Answer::Events(texts(&["You are ", "Ada"])),
        Answer::Events(texts(&["Still ", "Ada"])),
    ]);
    let sandbox = Sandbox::new();
    let url = server.base_url();

    let mut chat = start_chat(&sandbox, &url, &[]);
    say(&mut chat, "my name is Ada");
    end_chat(chat);
    let first = session_ids(&sandbox)[0];
    assert_eq!(
        messages(&server.request(0)),
        conversation(&[("user", "my name is Ada")])
    );

    // --resume ID: a new session, whose first request carries the stored
    // conversation before the new prompt.
    let resume = first.to_string();
    let mut chat = start_chat(&sandbox, &url, &["--resume", &resume]);
    say(&mut chat, "what is my name?");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains(&format!("continuing session {first} (2 earlier messages)")),
        "{stderr}"
    );
    assert_eq!(
        messages(&server.request(1)),
        conversation(&[
            ("user", "my name is Ada"),
            ("assistant", "Hello Ada"),
            ("user", "what is my name?"),
        ])
    );

    // --last: the most recent finished session, the resumed one.
    let mut chat = start_chat(&sandbox, &url, &["--last"]);
    say(&mut chat, "and now?");
    end_chat(chat);
    assert_eq!(
        messages(&server.request(2)),
        conversation(&[
            ("user", "my name is Ada"),
            ("assistant", "Hello Ada"),
            ("user", "what is my name?"),
            ("assistant", "You are Ada"),
            ("user", "and now?"),
        ])
    );

    // Each link is stored and shown.
    let ids = session_ids(&sandbox);
    assert_eq!(ids.len(), 3);
    let sessions = sandbox.sessions();
    let from: Vec<Value> = sessions
        .iter()
        .rev()
        .map(|s| s["resumed_from"].clone())
        .collect();
    assert_eq!(from, [Value::Null, json!(ids[0]), json!(ids[1])]);
    for session in &sessions {
        assert_eq!(session["end_reason"], "user_close", "{session}");
    }
    let shown = sandbox.show(ids[2]);
    assert_eq!(shown["session"]["resumed_from"], ids[1]);
    let text = stdout_of(&sandbox, &["show", &ids[2].to_string()]);
    assert!(
        text.starts_with(&format!(
            "session {} \"chat\" (resumed from {})\n",
            ids[2], ids[1]
        )),
        "{text}"
    );
    let table = stdout_of(&sandbox, &["sessions"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    let column = header
        .iter()
        .position(|h| *h == "FROM")
        .expect("a FROM column");
    let resumed: Vec<&str> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(column).unwrap())
        .collect();
    let expected = [ids[1].to_string(), ids[0].to_string(), "-".to_owned()];
    assert_eq!(resumed, expected, "{table}");
}

#[test]
fn a_chat_left_by_a_crash_is_resumed_once_recovered() {
    let server = Server::start(vec![
        Answer::Stall(texts(&["Half an ", "answer"])),
        Answer::Events(texts(&["The rest"])),
    ]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let mut chat = start_chat(&sandbox, &url, &[]);
    writeln!(chat.stdin(), "a long question").unwrap();
    server.request(0);
    chat.wait_for("the half answer", |out| out.contains("Half an answer"));
    chat.signal(Signal::SIGKILL);
    let (status, _) = chat.wait();
    assert_eq!(status.code(), None, "killed");
    let crashed = session_ids(&sandbox)[0].to_string();

    // Still live: not resumable yet, and nothing is written by asking.
    let out = sandbox.run(&["chat", "--base-url", &url, "--resume", &crashed]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("settle recover"), "{stderr}");
    assert_eq!(session_ids(&sandbox).len(), 1);

    assert_eq!(
        sandbox.recover(),
        "recovered 1 session (1 interrupted turn)"
    );
    let mut chat = start_chat(&sandbox, &url, &["--resume", &crashed]);
    say(&mut chat, "go on");
    end_chat(chat);
    // The interrupted reply is part of the conversation, as far as it went.
    assert_eq!(
        messages(&server.request(1)),
        conversation(&[
            ("user", "a long question"),
            ("assistant", "Half an answer"),
            ("user", "go on"),
        ])
    );
}

#[test]
fn show_and_export_give_reasoning_tool_calls_and_usage_as_what_they_are() {
    let server = Server::start(vec![Answer::Events(vec![
        json!({"choices": [{"delta": {"role": "assistant", "reasoning_content": "The user "}}]}),
        json!({"choices": [{"delta": {"reasoning_content": "wants the weather"}}]}),
        text("Checking."),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": "{\"city\": \"Paris\"}"}}]}}]}),
        json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
    ])]);
    let sandbox = Sandbox::new();
    let mut chat = start_chat(&sandbox, &server.base_url(), &[]);
    say(&mut chat, "weather in Paris?");
    // Only the reply text is printed.
    assert!(
        chat.output().contains("> Checking.\n> "),
        "{}",
        chat.output()
    );
    end_chat(chat);
    let id = session_ids(&sandbox)[0];

    let shown = sandbox.show(id);
    let turn = &shown["turns"][0];
    assert_eq!(turn["outcome"], "completed");
    assert_eq!(turn["text"], "Checking.");
    let call = |arguments: &str, first: bool| {
        let mut piece = json!({"index": 0, "function": {"arguments": arguments}});
        if first {
            piece = json!({"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": arguments}});
        }
        json!({"kind": "tool_call", "data": piece})
    };
    assert_eq!(
        turn["chunks"],
        json!([
            {"kind": "reasoning", "data": "The user "},
            {"kind": "reasoning", "data": "wants the weather"},
            "Checking.",
            call("", true),
            call("{\"city\": \"Paris\"}", false),
            {"kind": "usage", "data": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}},
        ])
    );
    assert_eq!(shown["session"]["chunks"], 6);

    let text = stdout_of(&sandbox, &["show", &id.to_string()]);
    let expected = "  user:\n    weather in Paris?\n  reasoning:\n    The user wants the weather\n  \
         reply:\n    Checking.\n  tool call: get_weather({\"city\":\"Paris\"})   [call_1]\n  usage: ";
    assert!(text.contains(expected), "{text}");
    for field in ["prompt_tokens=9", "completion_tokens=4", "total_tokens=13"] {
        let usage = text.lines().find(|l| l.starts_with("  usage: ")).unwrap();
        assert!(usage.contains(field), "{usage}");
    }

    let md = stdout_of(&sandbox, &["export", &id.to_string()]);
    assert!(
        md.contains(
            "**reasoning:**\n\n> The user wants the weather\n\n**reply:**\n\nChecking.\n\n\
             **tool call** `get_weather` (call_1):\n\n```json\n{\"city\":\"Paris\"}\n```\n\n**usage:** "
        ),
        "{md}"
    );

    let jsonl = stdout_of(&sandbox, &["export", &id.to_string(), "--format", "jsonl"]);
    let chunks: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "chunk")
        .collect();
    let kinds: Vec<&str> = chunks.iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "reasoning",
            "reasoning",
            "text",
            "tool_call",
            "tool_call",
            "usage"
        ]
    );
    // The same payloads as show --json, in the same order.
    for (chunk, shown) in chunks.iter().zip(turn["chunks"].as_array().unwrap()) {
        match shown.as_str() {
            Some(text) => assert_eq!(chunk["text"], text),
            None => assert_eq!(chunk["data"], shown["data"]),
        }
    }
}

/// A prompt over `--max-prompt-bytes` is refused before anything is sent or
/// written, in one line naming the limit; the chat goes on without it.
#[test]
fn g11_a_prompt_over_the_size_limit_is_refused_and_the_chat_goes_on() {
    let server = Server::start(vec![Answer::Events(texts(&["fine"]))]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let mut chat = start_chat(&sandbox, &url, &["--max-prompt-bytes", "16"]);
    say(&mut chat, "this prompt is far too long to send");
    say(&mut chat, "short");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains("over the limit of 16 bytes (max_prompt_bytes)"),
        "{stderr}"
    );
    // The refused prompt was never sent, nor kept in the history.
    assert_eq!(
        messages(&server.request(0)),
        conversation(&[("user", "short")])
    );
    let shown = sandbox.show(session_ids(&sandbox)[0]);
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{shown}");
    assert_eq!(
        turns[0]["input"],
        json!([{"role": "user", "content": "short"}])
    );
}

/// Found from outside: a line that was not UTF-8 ended the chat as Ctrl-D
/// would (exit 0, `user_close`, the lines after it dropped), and a very long
/// line was read whole into memory before its refusal. Each is now refused
/// with a line of its own, a long one read past as it comes, and the chat
/// goes on.
#[test]
fn g11_a_line_that_is_not_utf8_or_too_long_is_refused_and_the_chat_goes_on() {
    let server = Server::start(vec![Answer::Events(texts(&["fine"]))]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let mut chat = start_chat(&sandbox, &url, &["--max-prompt-bytes", "1KiB"]);
    for line in [
        b"he\xffllo\n".to_vec(),
        [b'x'; 300_000].iter().chain(b"\n").copied().collect(),
    ] {
        let before = prompts(chat.output());
        chat.stdin().write_all(&line).unwrap();
        chat.wait_for("the prompt after a refused line", |out| {
            prompts(out) > before
        });
    }
    say(&mut chat, "third");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains("that line is not UTF-8 text; it was not sent"),
        "{stderr}"
    );
    assert!(
        stderr.contains("over the limit of 1024 bytes (max_prompt_bytes"),
        "{stderr}"
    );
    assert_eq!(
        messages(&server.request(0)),
        conversation(&[("user", "third")])
    );
    let shown = sandbox.show(session_ids(&sandbox)[0]);
    assert_eq!(shown["turns"].as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(shown["session"]["end_reason"], "user_close", "{shown}");
}

/// A reply is bounded as the gateway's are: past `--max-turn-chunks` it
/// ends `too_large` and does not join the conversation; and a reply longer
/// than a prompt may be goes back with the history (the per-message limit
/// is the prompt's), so the chat goes on after either.
#[test]
fn a_reply_past_its_bound_ends_too_large_and_a_long_reply_does_not_refuse_the_next_prompt() {
    let many: Vec<String> = (0..50).map(|i| format!("piece {i} ")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let server = Server::start(vec![
        Answer::Events(texts(&many)),
        Answer::Events(texts(&["a reply far longer than sixteen bytes"])),
        Answer::Events(texts(&["fine"])),
    ]);
    let sandbox = Sandbox::new();
    let url = server.base_url();
    let limits = ["--max-turn-chunks", "10", "--max-prompt-bytes", "16"];
    let mut chat = start_chat(&sandbox, &url, &limits);
    say(&mut chat, "go on forever");
    say(&mut chat, "say more");
    say(&mut chat, "and then?");
    let stderr = end_chat(chat);
    assert!(
        stderr.contains("streamed more than a turn may (10 chunks"),
        "{stderr}"
    );
    assert!(!stderr.contains("max_prompt_bytes"), "{stderr}");
    let _ = server.request(0);
    assert_eq!(
        messages(&server.request(1)),
        conversation(&[("user", "go on forever"), ("user", "say more")])
    );
    assert_eq!(
        messages(&server.request(2)),
        conversation(&[
            ("user", "go on forever"),
            ("user", "say more"),
            ("assistant", "a reply far longer than sixteen bytes"),
            ("user", "and then?"),
        ])
    );
    let shown = sandbox.show(session_ids(&sandbox)[0]);
    let turns = shown["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{shown}");
    assert_eq!(turns[0]["outcome"], "failed", "{shown}");
    assert_eq!(
        turns[0]["chunks"].as_array().map(Vec::len),
        Some(10),
        "{shown}"
    );
}

/// A reply is shown, never obeyed: control sequences a model sends (a
/// terminal title, a clipboard write, a screen clear) reach the terminal as
/// their escapes, while the stored reply keeps them exactly.
#[test]
fn a_reply_with_terminal_control_sequences_is_shown_escaped_and_stored_exactly() {
    let hostile = [
        "plain ",
        "\u{1b}]0;owned\u{7}",
        "\u{1b}[2J",
        "\u{1b}]52;c;ZXZpbA==\u{7}",
        "\ttab\nnext line",
    ];
    let server = Server::start(vec![Answer::Events(texts(&hostile))]);
    let sandbox = Sandbox::new();
    let mut chat = start_chat(&sandbox, &server.base_url(), &[]);
    say(&mut chat, "hello");
    let shown = chat.output().to_owned();
    end_chat(chat);
    assert!(
        !shown.contains('\u{1b}'),
        "an escape reached the terminal: {shown:?}"
    );
    assert!(
        !shown.contains('\u{7}'),
        "a bell reached the terminal: {shown:?}"
    );
    assert!(shown.contains(r"\u{1b}]0;owned\u{7}"), "{shown:?}");
    assert!(
        shown.contains("\ttab\nnext line"),
        "tabs and newlines stay: {shown:?}"
    );
    let sessions = sandbox.sessions();
    let shown_json = sandbox.show(sessions[0]["id"].as_u64().unwrap());
    assert_eq!(shown_json["turns"][0]["chunks"], serde_json::json!(hostile));
}

#[test]
fn g11_the_chat_banner_names_the_base_url_without_its_password() {
    let sandbox = Sandbox::new();
    // No model server behind it: the banner comes first, and stdin is empty.
    let out = sandbox.run(&[
        "chat",
        "--base-url",
        "http://operator:URLSECRET@127.0.0.1:1/v1?api-key=QUERYSECRET",
        "--model",
        "m",
    ]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("operator:***@127.0.0.1:1"), "{all}");
    assert!(
        !all.contains("URLSECRET") && !all.contains("QUERYSECRET"),
        "{all}"
    );
}

/// Found from outside: a provider's error text with terminal escapes, NUL
/// and line breaks reached the terminal raw, over several lines. It is
/// told on one line, every control character escaped.
#[test]
fn a_providers_error_with_control_characters_is_told_on_one_line_escaped() {
    let sandbox = Sandbox::new();
    let server = Server::start(vec![Answer::Status(
        "500 Internal Server Error",
        json!({"error": {"message": "over\u{1b}[31mloaded\u{0}\nnow"}}),
    )]);
    let mut chat = start_chat(&sandbox, &server.base_url(), &[]);
    say(&mut chat, "hi");
    let stderr = end_chat(chat);
    let failed: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("settle: reply failed: "))
        .collect();
    assert_eq!(failed.len(), 1, "{stderr:?}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\0'),
        "{stderr:?}"
    );
    assert!(
        failed[0].contains("over\\u{1b}[31mloaded\\u{0} now"),
        "{stderr:?}"
    );
}
