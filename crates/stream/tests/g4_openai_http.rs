//! G4 against a real HTTP server on 127.0.0.1: the server itself sees the
//! connection closed after the consumer drops the stream, after the idle
//! timeout, and after the run is cancelled. Real time, generous bounds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use settle_core::{CancelMode, ChunkKind, Outcome, TurnErrorKind};
use settle_stream::{
    CancelIssued, CancelledBy, Chunk, Guarded, IdleTimeout, Keyed, Message, OpenAiConfig,
    OpenAiProvider, Provider, Request, Role, StreamError, StreamErrorKind, StreamEvent,
    TurnOptions, Work, WorkEnd, WorkSignal,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, Instant};
use tokio_util::task::TaskTracker;

#[path = "support/http.rs"]
mod http;
use http::chunk_json;

/// How long the server may take to notice a close; generous for a busy box.
const CLOSE_BOUND: Duration = Duration::from_secs(5);
const IDLE: Duration = Duration::from_millis(200);

#[derive(Clone, Copy)]
enum Script {
    /// Two chunks, then keepalive comments every 50 ms, forever.
    ChunksThenKeepalives,
    /// Two chunks and `[DONE]`.
    Complete,
    /// An `error` object.
    ErrorObject,
    /// Accepts the connection and never answers.
    NoHeaders,
    /// These `data:` payloads, then `[DONE]`.
    Events(&'static [&'static str]),
    /// These `data:` payloads, then nothing more (keepalives until closed).
    EventsNoDone(&'static [&'static str]),
    /// These `data:` payloads, then the body's end, without `[DONE]`.
    EventsThenEnd(&'static [&'static str]),
    /// A non-success status with this JSON body.
    Status(u16, &'static str),
    /// A non-success status whose body is announced, begun, and never
    /// finished.
    StatusBodyStalls(u16, &'static str),
    /// One chunk, then the connection is dropped mid-reply.
    CutMidReply,
}

struct Server {
    base_url: String,
    /// The request the server got (headers and body).
    request: oneshot::Receiver<String>,
    /// Fires when the server sees the connection closed by the client.
    closed: oneshot::Receiver<Instant>,
}

async fn serve(script: Script) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let connection = http::serve_one(listener, move |mut wr| async move {
        match script {
            Script::NoHeaders => std::future::pending::<()>().await,
            Script::Status(status, body) => {
                let response = format!(
                    "HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                wr.write_all(response.as_bytes()).await?;
                std::future::pending::<()>().await;
            }
            Script::StatusBodyStalls(status, start) => {
                let response = format!(
                    "HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\n\
                     content-length: 4096\r\n\r\n{start}"
                );
                wr.write_all(response.as_bytes()).await?;
                std::future::pending::<()>().await;
            }
            _ => {}
        }
        wr.write_all(http::SSE_HEAD).await?;
        let send = |text: String| http::chunked(&text);
        match script {
            Script::ErrorObject => {
                let e =
                    r#"data: {"error":{"message":"model is overloaded","type":"server_error"}}"#;
                wr.write_all(&send(format!("{e}\n\n"))).await?;
            }
            Script::EventsNoDone(events) => {
                for data in events {
                    wr.write_all(&send(format!("data: {data}\n\n"))).await?;
                }
            }
            Script::CutMidReply => {
                let data = chunk_json("hello");
                wr.write_all(&send(format!("data: {data}\n\n"))).await?;
                // Dropping the write half ends the body without its
                // last chunk: the reply is cut.
                drop(wr);
                match std::future::pending::<std::convert::Infallible>().await {}
            }
            Script::Events(events) => {
                for data in events {
                    wr.write_all(&send(format!("data: {data}\n\n"))).await?;
                }
                wr.write_all(&send("data: [DONE]\n\n".into())).await?;
                wr.write_all(b"0\r\n\r\n").await?;
            }
            Script::EventsThenEnd(events) => {
                for data in events {
                    wr.write_all(&send(format!("data: {data}\n\n"))).await?;
                }
                wr.write_all(b"0\r\n\r\n").await?;
            }
            _ => {
                for text in ["hello", " world"] {
                    wr.write_all(&send(format!(
                        ": keepalive\n\ndata: {}\n\n",
                        chunk_json(text)
                    )))
                    .await?;
                }
            }
        }
        if let Script::Complete = script {
            wr.write_all(&send("data: [DONE]\n\n".into())).await?;
            wr.write_all(b"0\r\n\r\n").await?;
        }
        // Stall with keepalives only, until the client goes away.
        for _ in 0..2000 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            wr.write_all(&send(": keepalive\n\n".into())).await?;
        }
        Ok(())
    });
    Server {
        base_url,
        request: connection.request,
        closed: connection.closed,
    }
}

fn provider(server: &Server) -> OpenAiProvider {
    OpenAiProvider::new(
        OpenAiConfig::new(&server.base_url, "test-model")
            .api_key("secret-key")
            .headers_timeout(Duration::from_millis(500)),
    )
    .unwrap()
}

async fn next_chunk<S>(stream: &mut S) -> String
where
    S: futures_util::Stream<Item = Result<StreamEvent, StreamError>> + Unpin,
{
    loop {
        match timeout(CLOSE_BOUND, stream.next()).await.unwrap() {
            Some(Ok(StreamEvent::Chunk(chunk))) => return chunk.into_payload(),
            Some(Ok(StreamEvent::KeepAlive)) => {}
            other => panic!("expected a chunk, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn g4_http_consumer_drop_closes_the_connection() {
    let server = serve(Script::ChunksThenKeepalives).await;
    let provider = provider(&server);
    let mut stream = Guarded::new(provider.open(&Request::prompt("hi")).await.unwrap());
    assert_eq!(next_chunk(&mut stream).await, "hello");
    assert_eq!(next_chunk(&mut stream).await, " world");

    let request = server.request.await.unwrap();
    assert!(
        request.starts_with("POST /v1/chat/completions "),
        "{request}"
    );
    assert!(request
        .to_lowercase()
        .contains("authorization: bearer secret-key"));
    assert!(request.contains(r#""stream":true"#), "{request}");
    assert!(request.contains(r#""content":"hi""#), "{request}");

    let dropped = Instant::now();
    drop(stream);
    let closed = timeout(CLOSE_BOUND, server.closed)
        .await
        .expect("server saw no close");
    assert!(closed.unwrap() >= dropped);
}

#[tokio::test]
async fn g4_http_keepalive_only_stall_trips_the_idle_timeout_and_closes() {
    let server = serve(Script::ChunksThenKeepalives).await;
    let provider = provider(&server);
    let stream = provider.open(&Request::prompt("hi")).await.unwrap();
    let mut stream = Guarded::new(IdleTimeout::new(stream, IDLE));
    assert_eq!(next_chunk(&mut stream).await, "hello");
    assert_eq!(next_chunk(&mut stream).await, " world");
    let mut keepalives = 0;
    let error = loop {
        match timeout(CLOSE_BOUND, stream.next()).await.unwrap() {
            Some(Ok(StreamEvent::KeepAlive)) => keepalives += 1,
            Some(Err(e)) => break e,
            other => panic!("expected keepalives then a timeout, got {other:?}"),
        }
    };
    assert!(
        matches!(error.kind(), StreamErrorKind::IdleTimeout(_)),
        "{error}"
    );
    assert!(
        keepalives >= 1,
        "the stall's keepalives came through as keepalives"
    );
    // The stream was closed before the error was yielded: the server sees it.
    let fired = Instant::now();
    let closed = timeout(CLOSE_BOUND, server.closed)
        .await
        .expect("server saw no close");
    assert!(closed.unwrap() <= fired + CLOSE_BOUND);
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn g4_http_cancelled_work_closes_the_connection() {
    let server = serve(Script::ChunksThenKeepalives).await;
    let provider: Arc<dyn Provider> = Arc::new(provider(&server));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (signals, mut reports) = mpsc::unbounded_channel();
    let tracker = TaskTracker::new();
    let mut control = Work::new(provider, Request::prompt("hi"))
        .options(TurnOptions {
            idle_timeout: Duration::from_secs(60),
            first_event_timeout: None,
            ..TurnOptions::default()
        })
        .spawn(&tracker, tx, Keyed::new((), signals));
    assert_eq!(
        timeout(CLOSE_BOUND, rx.recv()).await.unwrap().unwrap(),
        Chunk::text("hello")
    );
    assert_eq!(
        timeout(CLOSE_BOUND, rx.recv()).await.unwrap().unwrap(),
        Chunk::text(" world")
    );
    assert_eq!(
        control.cancel(CancelMode::Immediate),
        CancelIssued::Cancelled
    );
    let mut seen = Vec::new();
    while let Some(((), signal)) = timeout(CLOSE_BOUND, reports.recv()).await.unwrap() {
        let ended = matches!(signal, WorkSignal::Ended(_));
        seen.push(signal);
        if ended {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            WorkSignal::StreamAttached,
            WorkSignal::StreamClosed,
            WorkSignal::Ended(WorkEnd::Cancelled(CancelledBy::Request))
        ]
    );
    timeout(CLOSE_BOUND, server.closed)
        .await
        .expect("server saw no close")
        .unwrap();
}

#[tokio::test]
async fn g4_http_done_completes_and_an_error_object_fails() {
    let server = serve(Script::Complete).await;
    let provider = provider(&server);
    let mut stream = Guarded::new(provider.open(&Request::prompt("hi")).await.unwrap());
    let mut reply = String::new();
    while let Some(event) = timeout(CLOSE_BOUND, stream.next()).await.unwrap() {
        if let StreamEvent::Chunk(chunk) = event.unwrap() {
            reply.push_str(chunk.as_text().unwrap());
        }
    }
    assert_eq!(reply, "hello world");
    assert!(stream.is_closed());

    let server = serve(Script::ErrorObject).await;
    let failing = self::provider(&server);
    let mut stream = Guarded::new(failing.open(&Request::prompt("hi")).await.unwrap());
    let error = timeout(CLOSE_BOUND, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(error.to_string().contains("model is overloaded"), "{error}");
    assert_eq!(error.outcome(), Outcome::Failed);
    timeout(CLOSE_BOUND, server.closed)
        .await
        .expect("server saw no close")
        .unwrap();
}

#[tokio::test]
async fn g4_http_headers_timeout_is_a_typed_error_and_closes() {
    let server = serve(Script::NoHeaders).await;
    let provider = provider(&server);
    let error = match provider.open(&Request::prompt("hi")).await {
        Err(e) => e,
        Ok(_) => panic!("a server that never answers must time out"),
    };
    assert!(
        matches!(error.kind(), StreamErrorKind::HeadersTimeout { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("500ms"), "{error}");
    assert!(error.to_string().contains("headers timeout"), "{error}");
    assert_eq!(error.turn_error().kind, TurnErrorKind::Timeout);
    timeout(CLOSE_BOUND, server.closed)
        .await
        .expect("server saw no close")
        .unwrap();
}

/// Every chunk of a stream until its end or its error.
async fn drain(provider: &OpenAiProvider, request: &Request) -> (Vec<Chunk>, Option<StreamError>) {
    let mut stream = Guarded::new(provider.open(request).await.unwrap());
    let mut chunks = Vec::new();
    while let Some(event) = timeout(CLOSE_BOUND, stream.next()).await.unwrap() {
        match event {
            Ok(StreamEvent::Chunk(chunk)) => chunks.push(chunk),
            Ok(StreamEvent::KeepAlive | StreamEvent::Finished(_)) => {}
            Err(error) => return (chunks, Some(error)),
        }
    }
    (chunks, None)
}

#[tokio::test]
async fn structured_deltas_become_chunks_of_their_kind() {
    let server = serve(Script::Events(&[
        r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning":"ing","content":"Hi"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"ls","arguments":""}},{"index":1,"id":"c2","type":"function","function":{"name":"cat","arguments":""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#,
    ]))
    .await;
    let history = Request::new(vec![
        Message::new(Role::User, "list"),
        Message::new(Role::Assistant, "").tool_calls(json!([{"id": "c0", "type": "function",
            "function": {"name": "ls", "arguments": "{}"}}])),
        Message::tool_result("c0", "a.txt"),
    ]);
    let (chunks, error) = drain(&provider(&server), &history).await;
    assert!(error.is_none(), "{error:?}");
    let kinds: Vec<ChunkKind> = chunks.iter().map(Chunk::kind).collect();
    assert_eq!(
        kinds,
        [
            ChunkKind::Reasoning,
            ChunkKind::Reasoning,
            ChunkKind::Text,
            ChunkKind::ToolCall,
            ChunkKind::ToolCall,
            ChunkKind::ToolCall,
            ChunkKind::Usage,
        ]
    );
    assert_eq!(chunks[0].to_json(), json!("think"));
    assert_eq!(chunks[2].as_text(), Some("Hi"));
    assert_eq!(chunks[3].to_json()["function"]["name"], "ls");
    assert_eq!(chunks[4].to_json()["id"], "c2");
    assert_eq!(chunks[5].to_json()["function"]["arguments"], "{}");
    assert_eq!(chunks[6].to_json()["total_tokens"], 12);

    // The tool fields of the history went to the server as they are.
    let request = server.request.await.unwrap();
    let body = &request[request.find("\r\n\r\n").unwrap() + 4..];
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["messages"][1]["tool_calls"][0]["id"], "c0");
    assert_eq!(
        body["messages"][2],
        json!({"role": "tool", "content": "a.txt", "tool_call_id": "c0"})
    );
    assert_eq!(
        body["messages"][0],
        json!({"role": "user", "content": "list"})
    );
}

fn unreachable_provider() -> (OpenAiProvider, String) {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let provider = OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap();
    (provider, format!("{base_url}/chat/completions"))
}

async fn open_error(provider: &OpenAiProvider) -> StreamError {
    match provider.open(&Request::prompt("hi")).await {
        Err(e) => e,
        Ok(_) => panic!("expected the open to fail"),
    }
}

#[tokio::test]
async fn a_refused_connection_says_so_with_the_url() {
    let (provider, url) = unreachable_provider();
    let error = open_error(&provider).await;
    let turn = error.turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Connect);
    assert_eq!(
        turn.message,
        format!("could not connect to {url}: connection refused (is the server running?)")
    );
    assert_eq!(error.outcome(), Outcome::Failed);
}

#[tokio::test]
async fn an_http_404_names_the_status_and_the_url() {
    let server = serve(Script::Status(404, "")).await;
    let error = open_error(&provider(&server)).await;
    let turn = error.turn_error();
    assert_eq!(turn.kind, TurnErrorKind::HttpStatus);
    assert_eq!(
        turn.message,
        format!(
            "HTTP 404 Not Found from {}/chat/completions",
            server.base_url
        )
    );
}

#[tokio::test]
async fn an_http_500_with_a_json_body_shows_the_error_message() {
    let body = r#"{"error":{"message":"the model `gpt-9` does not exist","type":"invalid_request_error","code":null}}"#;
    let server = serve(Script::Status(500, body)).await;
    let error = open_error(&provider(&server)).await;
    let turn = error.turn_error();
    assert_eq!(turn.kind, TurnErrorKind::HttpStatus);
    assert_eq!(
        turn.message,
        format!(
            "HTTP 500 Internal Server Error from {}/chat/completions: \
             the model `gpt-9` does not exist",
            server.base_url
        )
    );
    match error.kind() {
        StreamErrorKind::Status {
            status, body: kept, ..
        } => {
            assert_eq!(*status, 500);
            assert_eq!(kept, body, "the body's start is kept whole");
        }
        other => panic!("expected a status error, got {other:?}"),
    }
}

/// Found from outside: a server that answered 503 and then stalled its
/// body, under a first-event timeout shorter than the wait for an error
/// body (5 s), ended the turn `idle_timeout` ("no first event"), its answer
/// lost, and never retried. The open, its retries and the first event
/// share one deadline; the wait for an error body is bounded by what is
/// left of it, so the refusal is told as itself, before the deadline.
#[tokio::test]
async fn a_refusal_whose_body_stalls_is_told_as_itself_before_the_first_event_deadline() {
    let server = serve(Script::StatusBodyStalls(503, "{\"error\":")).await;
    let provider: Arc<dyn Provider> = Arc::new(provider(&server));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (signals, mut reports) = mpsc::unbounded_channel();
    let tracker = TaskTracker::new();
    let first = Duration::from_secs(2);
    let began = Instant::now();
    let _control = Work::new(provider, Request::prompt("hi"))
        .options(TurnOptions::default().first_event_timeout(first))
        .spawn(&tracker, tx, Keyed::new((), signals));
    let end = loop {
        match timeout(CLOSE_BOUND * 2, reports.recv()).await.unwrap() {
            Some(((), WorkSignal::Ended(end))) => break end,
            Some(_) => {}
            None => panic!("the work ended without saying so"),
        }
    };
    let WorkEnd::Failed(error) = &end else {
        panic!("expected the refusal, got {end:?}");
    };
    assert_eq!(error.kind, TurnErrorKind::HttpStatus, "{error:?}");
    assert!(error.message.contains("HTTP 503"), "{}", error.message);
    assert!(began.elapsed() < first, "told after the deadline: {end:?}");
}

#[tokio::test]
async fn garbage_event_data_is_a_protocol_error() {
    let server = serve(Script::EventsNoDone(&["this is not json"])).await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert!(chunks.is_empty());
    let error = error.expect("garbage must fail the stream");
    let turn = error.turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Protocol);
    assert!(turn.message.contains("not JSON"), "{turn}");
    assert!(turn.message.contains("this is not json"), "{turn}");
    assert!(turn.message.contains(&server.base_url), "{turn}");
    timeout(CLOSE_BOUND, server.closed)
        .await
        .expect("server saw no close")
        .unwrap();
}

/// Found from outside: events of another shape (not an object, or whose
/// `choices` is not a list) were taken for keepalives, so a reply of
/// nothing else ended `completed` and empty, and `choices` as an object
/// keyed "0" was read as the reply. Each is a protocol error.
#[tokio::test]
async fn a_chunk_of_another_shape_is_a_protocol_error() {
    const SHAPES: [&[&str]; 8] = [
        &["42"],
        &["[1,2]"],
        &["\"text\""],
        &["null"],
        &[r#"{"choices":"nope"}"#],
        &[r#"{"choices":{"0":{"delta":{"content":"OBJ"}}}}"#],
        &[r#"{"choices":[42]}"#],
        &[r#"{"choices":[{"delta":"text"}]}"#],
    ];
    for events in SHAPES {
        let server = serve(Script::EventsNoDone(events)).await;
        let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
        assert!(chunks.is_empty(), "{events:?}: {chunks:?}");
        let turn = error
            .expect("another shape must fail the stream")
            .turn_error();
        assert_eq!(turn.kind, TurnErrorKind::Protocol, "{events:?}: {turn}");
    }
    // A chunk without choices, or with none, is still activity.
    let server = serve(Script::Events(&[
        r#"{"id":"x","object":"chat.completion.chunk"}"#,
        r#"{"choices":[]}"#,
        r#"{"choices":[{"delta":{"content":"ok"}}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(chunks, [Chunk::text("ok")]);
}

#[tokio::test]
async fn a_connection_cut_mid_reply_says_so() {
    let server = serve(Script::CutMidReply).await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert_eq!(chunks, [Chunk::text("hello")]);
    let turn = error.expect("a cut reply must fail").turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Connect);
    assert_eq!(
        turn.message,
        format!(
            "the connection to {}/chat/completions broke during the reply: \
             the server closed the connection mid-reply",
            server.base_url
        )
    );
}

#[tokio::test]
async fn g7_a_length_cut_reply_fails_truncated_after_its_content() {
    let server = serve(Script::Events(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Once upon"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":"length"}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert_eq!(chunks, [Chunk::text("Once upon"), Chunk::text(" a")]);
    let error = error.expect("a length cut is not a completed reply");
    assert_eq!(error.outcome(), Outcome::Failed);
    let turn = error.turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Truncated);
    assert!(turn.message.contains("finish_reason: length"), "{turn}");
    assert!(turn.message.contains("truncated"), "{turn}");
    assert!(turn.message.contains("no memory"), "{turn}");
}

#[tokio::test]
async fn g7_a_content_filter_stop_fails_truncated() {
    let server = serve(Script::Events(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Sure"},"finish_reason":"content_filter"}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert_eq!(chunks, [Chunk::text("Sure")]);
    let turn = error
        .expect("a filtered reply is not completed")
        .turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Truncated);
    assert!(turn.message.contains("content_filter"), "{turn}");
}

#[tokio::test]
async fn a_stop_finish_reason_completes() {
    let server = serve(Script::Events(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Done."},"finish_reason":"stop"}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(chunks, [Chunk::text("Done.")]);
}

/// Found from outside: a reply its finish reason said was done, whose
/// server then ended the body without `data: [DONE]`, failed `protocol`
/// ("may be cut short"), where one that went quiet instead completed. It
/// ends as the finish reason said; with none, the missing end is still a
/// protocol error.
#[tokio::test]
async fn a_reply_said_done_then_ended_without_done_ends_as_said() {
    let stop = serve(Script::EventsThenEnd(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Done."},"finish_reason":"stop"}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&stop), &Request::prompt("hi")).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(chunks, [Chunk::text("Done.")]);
    let length = serve(Script::EventsThenEnd(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Once"},"finish_reason":"length"}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&length), &Request::prompt("hi")).await;
    assert_eq!(chunks, [Chunk::text("Once")]);
    let turn = error.expect("a cut reply").turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Truncated, "{turn}");
    let unsaid = serve(Script::EventsThenEnd(&[
        r#"{"choices":[{"index":0,"delta":{"content":"Half"}}]}"#,
    ]))
    .await;
    let (_, error) = drain(&provider(&unsaid), &Request::prompt("hi")).await;
    let turn = error.expect("no end and no finish").turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Protocol, "{turn}");
}

#[test]
fn a_base_url_without_a_scheme_is_refused_with_an_example() {
    let error = OpenAiProvider::new(OpenAiConfig::new("127.0.0.1:8080/v1", "m")).unwrap_err();
    assert!(
        matches!(error.kind(), StreamErrorKind::InvalidUrl { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("http://"), "{error}");
    let error = OpenAiProvider::new(OpenAiConfig::new("not a url", "m")).unwrap_err();
    assert_eq!(error.turn_error().kind, TurnErrorKind::Connect);
}

/// Found from outside: a server that cuts its text by UTF-16 code units
/// sends an emoji as `"\ud83d"` at the end of one event's string and
/// `"\ude00"` at the start of the next one's in the same place. Each event
/// alone holds a lone surrogate, which JSON parsers refuse, and the turn
/// failed where the `openai` package (and this package's Python bridge)
/// reads the reply whole. The halves are joined, in text and in a tool
/// call's arguments (a piece's place is its `index`); a half nothing
/// completes is still refused, as any lone surrogate.
#[tokio::test]
async fn g7_a_character_split_across_two_events_is_joined() {
    let server = serve(Script::Events(&[
        r#"{"choices":[{"index":0,"delta":{"content":"smile \ud83d"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"\ude00 and \ud83d"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":""}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"\ude03!"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"say","arguments":"{\"t\":\"\ud83d"}},{"index":1,"id":"c2","type":"function","function":{"name":"say","arguments":"{}"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":""}},{"function":{"arguments":"\ude00\"}"},"index":0}]},"finish_reason":"tool_calls"}]}"#,
    ]))
    .await;
    let (chunks, error) = drain(&provider(&server), &Request::prompt("hi")).await;
    assert!(error.is_none(), "{error:?}");
    let text: String = chunks.iter().filter_map(Chunk::as_text).collect();
    assert_eq!(text, "smile \u{1f600} and \u{1f603}!");
    // Each call's pieces, in order, by its `index`.
    let mut arguments = [String::new(), String::new()];
    for call in chunks.iter().filter(|c| c.kind() == ChunkKind::ToolCall) {
        let call = call.to_json();
        let index = call["index"].as_u64().unwrap() as usize;
        arguments[index].push_str(call["function"]["arguments"].as_str().unwrap());
    }
    assert_eq!(arguments, ["{\"t\":\"\u{1f600}\"}", "{}"]);

    // Halves nothing completes fail the turn, as a lone surrogate does.
    const LONE: [&[&str]; 4] = [
        // A high half the next string in its place does not complete.
        &[
            r#"{"choices":[{"delta":{"content":"a\ud83d"}}]}"#,
            r#"{"choices":[{"delta":{"content":"b"}}]}"#,
        ],
        // A low half with no high half before it.
        &[r#"{"choices":[{"delta":{"content":"\ude00b"}}]}"#],
        // A high half in the middle of a string.
        &[r#"{"choices":[{"delta":{"content":"a\ud83db"}}]}"#],
        // A high half at the reply's end.
        &[r#"{"choices":[{"delta":{"content":"a\ud83d"}}]}"#],
    ];
    for events in LONE {
        let server = serve(Script::Events(events)).await;
        let (_, error) = drain(&provider(&server), &Request::prompt("hi")).await;
        let turn = error
            .expect("a lone surrogate must fail the turn")
            .turn_error();
        assert_eq!(turn.kind, TurnErrorKind::Protocol, "{events:?}: {turn}");
        assert!(turn.message.contains("surrogate"), "{events:?}: {turn}");
    }
}
