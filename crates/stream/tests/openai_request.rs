//! What the OpenAI-compatible provider sends, checked where it lands: on
//! the server side of a local HTTP server. Tools, tool choice, structured
//! output, sampling, the usage request, extra headers and query parameters,
//! a shared client, tool messages; and what a custom provider reuses
//! (`OpenAiStream::from_response`), the tool calls it streams put together.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use settle_stream::{
    Guarded, Message, ModelOptions, OpenAiConfig, OpenAiProvider, OpenAiStream, Provider, Reply,
    ReplyBuilder, Request, Role, StreamErrorKind, StreamEvent, ToolCall, DEFAULT_MAX_EVENT_BYTES,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

#[path = "support/http.rs"]
#[allow(dead_code)]
mod http;

/// A server of one connection that answers these `data:` events and
/// `[DONE]`; returns its base URL and the request it got.
async fn serve(events: Vec<String>) -> (String, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let connection = http::serve_one(listener, move |mut wr| async move {
        wr.write_all(http::SSE_HEAD).await?;
        for data in events {
            wr.write_all(&http::chunked(&format!("data: {data}\n\n")))
                .await?;
        }
        wr.write_all(&http::chunked("data: [DONE]\n\n")).await?;
        wr.write_all(b"0\r\n\r\n").await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    (base_url, connection.request)
}

/// The request's head (lowercased) and its JSON body.
fn split(request: &str) -> (String, Value) {
    let at = request.find("\r\n\r\n").unwrap();
    let body = serde_json::from_str(&request[at + 4..]).unwrap();
    (request[..at].to_lowercase(), body)
}

async fn drain(provider: &dyn Provider, request: &Request) -> Reply {
    let mut stream = Guarded::new(provider.open(request).await.unwrap());
    let mut reply = ReplyBuilder::default();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
    {
        if let StreamEvent::Chunk(chunk) = event.unwrap() {
            reply.push(&chunk);
        }
    }
    reply.finish()
}

fn tool_events() -> Vec<String> {
    [
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "ls", "arguments": ""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"path\":"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "\"/tmp\"}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}),
    ]
    .iter()
    .map(Value::to_string)
    .collect()
}

#[tokio::test]
async fn a_request_carries_tools_options_headers_query_and_tool_messages() {
    let (base_url, request) = serve(tool_events()).await;
    let provider = OpenAiProvider::new(
        OpenAiConfig::new(&base_url, "test-model")
            .api_key("secret-key")
            .header("OpenAI-Organization", "org-7")
            .query("api-version", "2024-10-21"),
    )
    .unwrap();
    let tools = json!([{"type": "function", "function": {
        "name": "ls", "description": "list a folder",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    let schema = json!({"type": "json_schema", "json_schema": {"name": "listing",
        "schema": {"type": "object"}}});
    let calls = json!([{"id": "call_0", "type": "function",
        "function": {"name": "pwd", "arguments": "{}"}}]);
    let sent = Request::new(vec![
        Message::new(Role::System, "be brief"),
        Message::new(Role::User, "what is in /tmp?"),
        Message::new(Role::Assistant, "").tool_calls(calls.clone()),
        Message::tool_result("call_0", "/home"),
    ])
    .options(
        ModelOptions::default()
            .tools(tools.clone())
            .tool_choice(json!("required"))
            .response_format(schema.clone())
            .temperature(0.25)
            .max_tokens(321)
            .extra("seed", json!(7))
            // The provider's own fields are not the caller's to replace.
            .extra("model", json!("other-model"))
            .extra("stream", json!(false)),
    );
    let reply = drain(&provider, &sent).await;

    let (head, body) = split(&request.await.unwrap());
    assert!(
        head.starts_with("post /v1/chat/completions?api-version=2024-10-21 "),
        "{head}"
    );
    assert!(head.contains("\r\nopenai-organization: org-7"), "{head}");
    assert!(
        head.contains("\r\nauthorization: bearer secret-key"),
        "{head}"
    );
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["tools"], tools);
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(body["response_format"], schema);
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(body["max_tokens"], 321);
    assert_eq!(body["seed"], 7);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is in /tmp?"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "/home", "tool_call_id": "call_0"},
        ])
    );

    // The tool call came in three pieces; it is whole here.
    assert_eq!(
        reply.tool_calls,
        [ToolCall::new("call_1", "ls", r#"{"path":"/tmp"}"#)]
    );
    assert_eq!(reply.total_tokens(), 25);
    // And goes back to the model as it would expect it.
    let back = reply.to_message();
    assert_eq!(back.tool_calls.unwrap()[0]["function"]["name"], "ls");
}

#[tokio::test]
async fn a_plain_request_sends_no_option_it_was_not_given() {
    let (base_url, request) = serve(vec![]).await;
    let provider =
        OpenAiProvider::new(OpenAiConfig::new(&base_url, "m").include_usage(false)).unwrap();
    let _ = drain(&provider, &Request::prompt("hi")).await;
    let (head, body) = split(&request.await.unwrap());
    assert!(head.starts_with("post /v1/chat/completions "), "{head}");
    assert_eq!(
        body,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true})
    );
}

#[tokio::test]
async fn a_shared_client_is_the_one_that_sends() {
    let (base_url, request) = serve(vec![]).await;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-from-shared-client", "yes".parse().unwrap());
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let provider =
        OpenAiProvider::with_client(OpenAiConfig::new(&base_url, "m"), client.clone()).unwrap();
    let _ = drain(&provider, &Request::prompt("hi")).await;
    let (head, _) = split(&request.await.unwrap());
    assert!(head.contains("\r\nx-from-shared-client: yes"), "{head}");
}

/// A custom provider: its own request, the crate's event-stream decoding.
struct Custom {
    url: String,
}

#[async_trait::async_trait]
impl Provider for Custom {
    async fn open(
        &self,
        request: &Request,
    ) -> Result<settle_stream::ProviderStream, settle_stream::StreamError> {
        let body = json!({"input": request.messages, "signed": true});
        let response = reqwest::Client::new()
            .post(&self.url)
            .json(&body)
            .send()
            .await
            .map_err(|source| StreamErrorKind::Connect {
                url: self.url.clone(),
                source,
            })?;
        Ok(Box::new(OpenAiStream::from_response(
            response,
            DEFAULT_MAX_EVENT_BYTES,
        )))
    }
}

#[tokio::test]
async fn a_custom_provider_reuses_the_event_stream_decoding() {
    let (base_url, request) = serve(tool_events()).await;
    let provider = Custom {
        url: format!("{base_url}/responses"),
    };
    let reply = drain(&provider, &Request::prompt("hi")).await;
    assert_eq!(reply.tool_calls[0].arguments, r#"{"path":"/tmp"}"#);
    assert_eq!(reply.usage.len(), 1);
    let (head, body) = split(&request.await.unwrap());
    assert!(head.starts_with("post /v1/responses "), "{head}");
    assert_eq!(body["signed"], true);
}

/// What a 429 answered with `Retry-After: value` reports it asked for.
async fn retry_after_of(value: &str) -> Option<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let body = r#"{"error":{"message":"slow down"}}"#;
    let headers = format!("retry-after: {value}\r\ncontent-type: application/json\r\n");
    let _connection = http::answer_once(listener, "429 Too Many Requests", &headers, body);
    let provider = OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap();
    let error = match provider.open(&Request::prompt("hi")).await {
        Err(error) => error,
        Ok(_) => panic!("a 429 opened a stream"),
    };
    match error.kind() {
        StreamErrorKind::Status {
            status,
            retry_after,
            ..
        } => {
            assert_eq!(*status, 429);
            *retry_after
        }
        other => panic!("expected a status error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_429_reports_the_servers_retry_after() {
    assert_eq!(retry_after_of("7").await, Some(Duration::from_secs(7)));
    // As an HTTP date: the time until then (a date past is no wait).
    let then = std::time::SystemTime::now() + Duration::from_secs(40);
    let asked = retry_after_of(&httpdate::fmt_http_date(then))
        .await
        .unwrap();
    assert!(
        (Duration::from_secs(38)..=Duration::from_secs(40)).contains(&asked),
        "{asked:?}"
    );
    let past = std::time::SystemTime::now() - Duration::from_secs(5);
    assert_eq!(
        retry_after_of(&httpdate::fmt_http_date(past)).await,
        Some(Duration::ZERO)
    );
    assert_eq!(retry_after_of("soon").await, None);
}

/// A server of several connections: the first `failures` requests get
/// these statuses (with `Retry-After: 0` on a 429), the next one a reply.
async fn flaky_server(
    failures: Vec<u16>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let status = failures.get(n).copied();
            tokio::spawn(async move {
                // Read the request's head and body (small: one read or two).
                let mut buf = vec![0u8; 16 * 1024];
                let mut got = Vec::new();
                while !String::from_utf8_lossy(&got).contains("\"stream\":true") {
                    let read = socket.read(&mut buf).await.unwrap_or(0);
                    if read == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..read]);
                }
                match status {
                    Some(status) => {
                        let extra = if status == 429 {
                            "retry-after: 0\r\n"
                        } else {
                            ""
                        };
                        let response = format!(
                            "HTTP/1.1 {status} Busy\r\n{extra}content-length: 0\r\nconnection: close\r\n\r\n"
                        );
                        let _ = socket.write_all(response.as_bytes()).await;
                    }
                    None => {
                        let data = http::chunk_json("at last");
                        let _ = socket.write_all(http::SSE_HEAD).await;
                        let _ = socket
                            .write_all(&http::chunked(&format!("data: {data}\n\ndata: [DONE]\n\n")))
                            .await;
                        let _ = socket.write_all(b"0\r\n\r\n").await;
                    }
                }
            });
        }
    });
    (base_url, requests)
}

#[tokio::test]
async fn a_local_server_answering_429_and_503_is_retried_until_it_streams() {
    use settle_stream::{
        FnSink, Keyed, RetryPolicy, SinkError, TurnOptions, Work, WorkEnd, WorkSignal,
    };
    let (base_url, requests) = flaky_server(vec![429, 503]).await;
    let provider =
        std::sync::Arc::new(OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap());
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink_got = got.clone();
    let sink = FnSink(
        move |chunk: settle_stream::Chunk| -> Result<(), SinkError> {
            sink_got.lock().unwrap().push(chunk.payload().to_owned());
            Ok(())
        },
    );
    let retry = RetryPolicy::default()
        .retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(50));
    let tracker = tokio_util::task::TaskTracker::new();
    let (tx, mut signals) = tokio::sync::mpsc::unbounded_channel();
    let _control = Work::new(provider, Request::prompt("hi"))
        .options(TurnOptions::default().retry(retry))
        .spawn(&tracker, sink, Keyed::new((), tx));
    let mut retried = Vec::new();
    let end = loop {
        let signal = tokio::time::timeout(Duration::from_secs(10), signals.recv())
            .await
            .unwrap()
            .unwrap()
            .1;
        match signal {
            WorkSignal::Retrying { delay, error, .. } => retried.push((delay, error.message)),
            WorkSignal::Ended(end) => break end,
            _ => {}
        }
    };
    assert_eq!(end, WorkEnd::Completed);
    assert_eq!(*got.lock().unwrap(), ["at last"]);
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(retried.len(), 2);
    // The 429's Retry-After (0 s) was honoured; the 503 waited its backoff.
    assert_eq!(retried[0].0, Duration::ZERO);
    assert!(retried[0].1.contains("429"), "{}", retried[0].1);
    assert_eq!(retried[1].0, Duration::from_millis(10));
    assert!(retried[1].1.contains("503"), "{}", retried[1].1);
}

/// A redirect is not followed: a streaming POST re-sent elsewhere (307,
/// 308) would carry the whole conversation to another host, and one turned
/// into a GET (301, 302, 303) would stream whatever that URL says as the
/// reply. The turn fails with the status, naming where it was sent.
#[tokio::test]
async fn a_redirect_is_not_followed_and_the_error_names_where_it_pointed() {
    for status in [
        "301 Moved Permanently",
        "303 See Other",
        "307 Temporary Redirect",
        "308 Permanent Redirect",
    ] {
        let elsewhere = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!(
            "http://{}/v1/chat/completions?key=s3cr3t-value",
            elsewhere.local_addr().unwrap()
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let location = format!("location: {target}\r\n");
        let _connection = http::answer_once(listener, status, &location, "");
        let provider = OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap();
        let error = match provider.open(&Request::prompt("hi")).await {
            Err(error) => error,
            Ok(_) => panic!("{status}: the redirect was followed to a stream"),
        };
        let code: u16 = status[..3].parse().unwrap();
        assert!(
            matches!(error.kind(), StreamErrorKind::Status { status, .. } if *status == code),
            "{error:?}"
        );
        let told = error.to_string();
        assert!(told.contains("redirect"), "{told}");
        assert!(
            told.contains(&elsewhere.local_addr().unwrap().to_string()),
            "{told}"
        );
        assert!(!told.contains("s3cr3t-value"), "{told}");
        // Nothing reached the other host.
        let reached = tokio::time::timeout(Duration::from_millis(200), elsewhere.accept()).await;
        assert!(reached.is_err(), "{status}: the request was sent on");
    }
}

/// A 200 that is not an event stream (a whole chat completion, as a
/// server answers without `stream: true`; an HTML page) is said to be one,
/// not taken for a reply cut short.
#[tokio::test]
async fn a_whole_answer_that_is_not_an_event_stream_is_said_to_be_one() {
    let bodies = [
        (
            "application/json",
            r#"{"object":"chat.completion","choices":[{"message":{"content":"hi"}}]}"#,
        ),
        (
            "text/html; charset=utf-8",
            "<html><title>Welcome</title></html>",
        ),
    ];
    for (content_type, body) in bodies {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let header = format!("content-type: {content_type}\r\n");
        let _connection = http::answer_once(listener, "200 OK", &header, body);
        let provider = OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap();
        let mut stream = provider.open(&Request::prompt("hi")).await.unwrap();
        let error = loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .unwrap()
            {
                Some(Err(error)) => break error,
                Some(Ok(_)) => continue,
                None => panic!("{content_type}: ended without an error"),
            }
        };
        let told = error.to_string();
        assert!(told.contains("not an event stream"), "{told}");
        assert!(told.contains(content_type), "{told}");
    }
}

/// The events of one body written in the pieces given, each piece a TCP
/// write of its own; what the stream yields until it ends: the chunks' texts
/// and the error it ended with, if any.
async fn read_pieces(pieces: Vec<Vec<u8>>) -> (Vec<String>, Option<settle_stream::StreamError>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let _connection = http::serve_one(listener, move |mut wr| async move {
        wr.write_all(http::SSE_HEAD).await?;
        for piece in pieces {
            let mut framed = format!("{:x}\r\n", piece.len()).into_bytes();
            framed.extend_from_slice(&piece);
            framed.extend_from_slice(b"\r\n");
            wr.write_all(&framed).await?;
            wr.flush().await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        wr.write_all(b"0\r\n\r\n").await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    let provider = OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap();
    let mut stream = provider.open(&Request::prompt("hi")).await.unwrap();
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap()
        {
            Some(Ok(StreamEvent::Chunk(chunk))) => texts.push(chunk.payload().to_owned()),
            Some(Ok(_)) => {}
            Some(Err(error)) => return (texts, Some(error)),
            None => return (texts, None),
        }
    }
}

fn event(data: &str) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

/// Found from outside: a chunk with `"error": null` (or `false`, or an
/// empty string), as some servers send on every event, failed the turn
/// with "the provider reported an error: null".
#[tokio::test]
async fn an_error_field_that_is_null_false_or_empty_is_no_error() {
    for error in ["null", "false", "\"\""] {
        let data =
            format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"hi"}}}}],"error":{error}}}"#);
        let (texts, failed) = read_pieces(vec![event(&data), event("[DONE]")]).await;
        assert!(failed.is_none(), "{error}: {failed:?}");
        assert_eq!(texts, ["hi"], "{error}");
    }
}

/// Found from outside: events that arrived in the same read as a line
/// that is not UTF-8 were dropped, so how much of a reply was kept
/// depended on how the server's writes were split. Every event before the
/// bad line is yielded, then the error.
#[tokio::test]
async fn the_events_before_a_bad_line_are_yielded_however_the_reads_split() {
    let good: Vec<u8> = ["a", "b", "c"]
        .iter()
        .flat_map(|t| event(&http::chunk_json(t)))
        .collect();
    let bad = b"data: \xff\xfe\n\n".to_vec();
    let together = [good.clone(), bad.clone()].concat();
    for pieces in [vec![together], vec![good, bad]] {
        let (texts, failed) = read_pieces(pieces).await;
        assert_eq!(texts, ["a", "b", "c"]);
        let failed = failed.expect("the bad line fails the stream");
        assert!(
            matches!(failed.kind(), StreamErrorKind::Protocol(_)),
            "{failed:?}"
        );
    }
}

/// Found from outside: a provider's `error` event whose message held line
/// breaks and terminal escapes was told as given, over several lines. A
/// provider's message is told on one line, its control characters
/// escaped.
#[tokio::test]
async fn a_providers_error_message_is_told_on_one_line_without_control_characters() {
    let data = r#"{"error":{"message":"first line\nsecond \u001b[31mred\u001b[0m\u0000 end"}}"#;
    let (_, failed) = read_pieces(vec![event(data)]).await;
    let told = failed
        .expect("the error event fails the stream")
        .to_string();
    assert!(!told.chars().any(char::is_control), "{told:?}");
    assert!(told.contains("first line second"), "{told}");
    assert!(told.contains("red"), "{told}");
}

/// Found from outside: a `delta.content` that was a number or an object
/// was dropped, and the turn ended `completed` with a reply it never had.
/// Content as a list of parts gives its text parts; anything else that is
/// not text fails the stream, after what came before it.
#[tokio::test]
async fn a_content_that_is_not_text_fails_the_stream_and_parts_give_their_text() {
    let parts = r#"{"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"in "},{"type":"image_url","image_url":{}},{"text":"parts"}]}}]}"#;
    let (texts, failed) = read_pieces(vec![event(parts), event("[DONE]")]).await;
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(texts, ["in ", "parts"]);
    for content in ["42", r#"{"text":"hidden"}"#, "true"] {
        let first = http::chunk_json("before");
        let data = format!(r#"{{"choices":[{{"index":0,"delta":{{"content":{content}}}}}]}}"#);
        let (texts, failed) = read_pieces(vec![event(&first), event(&data), event("[DONE]")]).await;
        assert_eq!(texts, ["before"], "{content}");
        let failed = failed.expect("content that is not text fails the stream");
        assert!(
            matches!(failed.kind(), StreamErrorKind::Protocol(m) if m.contains("delta.content")),
            "{content}: {failed:?}"
        );
    }
}

/// Found from outside: servers send the usage after the chunk with the
/// finish reason, and a reply cut at its length limit ended at that
/// chunk, so its usage was never read (nor counted against a budget). The
/// usage after a cut is read, then the cut is told; a whole reply's
/// finish says so (`Finished`) before its usage.
#[tokio::test]
async fn the_usage_after_a_finish_is_read_and_a_cut_is_told_at_the_end() {
    let usage = r#"{"choices":[],"usage":{"total_tokens":501}}"#;
    for (finish, cut) in [("length", true), ("content_filter", true), ("stop", false)] {
        let data = format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":"two"}},"finish_reason":"{finish}"}}]}}"#
        );
        let pieces = vec![
            event(&http::chunk_json("one ")),
            event(&data),
            event(usage),
            event("[DONE]"),
        ];
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let _connection = http::serve_one(listener, move |mut wr| async move {
            wr.write_all(http::SSE_HEAD).await?;
            for piece in pieces {
                wr.write_all(&http::chunked(std::str::from_utf8(&piece).unwrap()))
                    .await?;
            }
            wr.write_all(b"0\r\n\r\n").await?;
            std::future::pending::<()>().await;
            Ok(())
        });
        let provider = OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap();
        let mut stream = provider.open(&Request::prompt("hi")).await.unwrap();
        let mut seen = Vec::new();
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .unwrap()
            {
                Some(Ok(StreamEvent::Chunk(chunk))) => seen.push(format!("{:?}", chunk.kind())),
                Some(Ok(StreamEvent::Finished(cut))) => seen.push(format!("finished {cut:?}")),
                Some(Ok(_)) => {}
                Some(Err(error)) => break Some(error),
                None => break None,
            }
        };
        match cut {
            true => {
                assert_eq!(seen[..2], ["Text", "Text"], "{finish}");
                assert!(seen[2].starts_with("finished Some"), "{seen:?}");
                assert_eq!(seen[3], "Usage", "{finish}");
                let end = end.expect("a cut reply ends with its truncation");
                assert!(
                    matches!(end.kind(), StreamErrorKind::Truncated(_)),
                    "{end:?}"
                );
            }
            false => {
                assert_eq!(seen, ["Text", "Text", "finished None", "Usage"], "{finish}");
                assert!(end.is_none(), "{end:?}");
            }
        }
    }
}
