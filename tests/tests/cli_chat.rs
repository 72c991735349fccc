//! `settle chat` against a tiny OpenAI-compatible server on the loopback
//! interface: Ctrl-C (SIGINT) cancels the reply in flight and closes its
//! connection, the next prompt works, and end of input closes the session
//! (`user_close`) with exit 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use settle_tests::{Sandbox, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Request `n` (from 0) arrived, with this JSON body.
    Request(usize, Value),
    /// The client closed the connection of request `n` mid-reply.
    Closed(usize),
    /// Request `n` was answered in full.
    Answered(usize),
}

const FIRST_REPLY: [&str; 3] = ["Hello", ", I am ", "thinking"];
const SECOND_REPLY: [&str; 2] = ["second ", "answer"];

fn event(text: &str) -> String {
    let data = serde_json::json!({ "choices": [{ "delta": { "content": text } }] });
    format!("data: {data}\n\n")
}

/// Serves `POST /v1/chat/completions` as server-sent events: the first
/// request gets a few chunks and then stalls, sending only `: keepalive`
/// comments until the client goes away; later ones get a short reply and
/// `data: [DONE]`.
async fn serve(listener: TcpListener, seen: mpsc::Sender<Seen>) {
    let requests = Arc::new(AtomicUsize::new(0));
    while let Ok((socket, _)) = listener.accept().await {
        let n = requests.fetch_add(1, Ordering::SeqCst);
        let seen = seen.clone();
        tokio::spawn(async move {
            let _ = answer(socket, n, seen).await;
        });
    }
}

async fn answer(mut socket: TcpStream, n: usize, seen: mpsc::Sender<Seen>) -> std::io::Result<()> {
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
    assert!(
        head.starts_with("POST /v1/chat/completions "),
        "unexpected request: {head}"
    );
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
    let body = serde_json::from_slice(&bytes[head_end..head_end + length]).unwrap_or(Value::Null);
    let _ = seen.send(Seen::Request(n, body));

    socket
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
              Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
        )
        .await?;
    if n > 0 {
        for text in SECOND_REPLY {
            socket.write_all(event(text).as_bytes()).await?;
        }
        socket.write_all(b"data: [DONE]\n\n").await?;
        socket.shutdown().await?;
        let _ = seen.send(Seen::Answered(n));
        return Ok(());
    }
    for text in FIRST_REPLY {
        socket.write_all(event(text).as_bytes()).await?;
        socket.flush().await?;
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
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = server
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind a loopback port");
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen) = mpsc::channel();
    server.spawn(serve(listener, seen_tx));

    let sandbox = Sandbox::new();
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let mut chat = sandbox.spawn(&["chat", "--base-url", &base_url, "--model", "m"]);
    chat.wait_for("the first prompt", |out| out.starts_with("> "));

    // A prompt; its reply streams, then stalls.
    writeln!(chat.stdin(), "first question").unwrap();
    let Seen::Request(0, body) = next_seen(&seen, "the first request") else {
        panic!("expected the first request");
    };
    assert_eq!(body["model"], "m");
    assert_eq!(body["stream"], true);
    assert_eq!(last_user_message(&body), "first question");
    let first = FIRST_REPLY.concat();
    chat.wait_for("the first reply", |out| out.contains(&first));

    // Ctrl-C: the reply in flight is cancelled, its connection closed.
    chat.signal(Signal::SIGINT);
    assert_eq!(next_seen(&seen, "the connection closed"), Seen::Closed(0));
    // The session goes on: a new prompt after the cut reply.
    chat.wait_for("the prompt after the cancelled reply", |out| {
        out.split_once(first.as_str())
            .is_some_and(|(_, after)| after.contains("> "))
    });
    writeln!(chat.stdin(), "second question").unwrap();
    let Seen::Request(1, body) = next_seen(&seen, "the second request") else {
        panic!("expected the second request");
    };
    assert_eq!(last_user_message(&body), "second question");
    // The history holds the cut reply, as far as it went.
    assert_eq!(body["messages"][1]["role"], "assistant");
    assert_eq!(body["messages"][1]["content"], first.as_str());
    let second = SECOND_REPLY.concat();
    chat.wait_for("the second reply", |out| out.contains(&second));
    assert_eq!(next_seen(&seen, "the second answer"), Seen::Answered(1));

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
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = server
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind a loopback port");
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen) = mpsc::channel();
    server.spawn(serve(listener, seen_tx));

    let sandbox = Sandbox::new();
    let base_url = format!("http://127.0.0.1:{port}/v1");
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
    let Seen::Request(0, _) = next_seen(&seen, "the first request") else {
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
    assert_eq!(next_seen(&seen, "the connection closed"), Seen::Closed(0));
    let sessions = sandbox.sessions();
    assert_eq!(sessions[0]["state"], "finalized");
    assert_eq!(sessions[0]["end_reason"], "shutdown");
    assert_eq!(sessions[0]["outcome"], "cancelled");
}
