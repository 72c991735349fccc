//! A server-sent event of several MiB, from a real HTTP server on
//! 127.0.0.1: within the maximum event size it is one chunk; over it the
//! stream fails with a protocol error and its connection is closed. (That
//! the decoding is linear in the event's size is checked where it is
//! counted, in the decoder's own tests.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures_util::StreamExt;
use settle_core::TurnErrorKind;
use settle_stream::{
    Chunk, Guarded, OpenAiConfig, OpenAiProvider, Provider, Request, StreamError, StreamErrorKind,
    StreamEvent, DEFAULT_MAX_EVENT_BYTES,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::time::timeout;

// The request a server got is not looked at here.
#[allow(dead_code)]
#[path = "support/http.rs"]
mod http;

/// Generous for a debug build on a busy machine; a quadratic decoder takes
/// far longer than this for the sizes below.
const BOUND: Duration = Duration::from_secs(60);

/// How the server cuts its body: like a network would, in small pieces.
const PIECE: usize = 16 * 1024;

/// Serves one reply whose only event carries `text` (of `len` bytes) as
/// its content, on one `data:` line, then `[DONE]`.
async fn serve_one_long_event(len: usize) -> (String, http::OneConnection) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let connection = http::serve_one(listener, move |mut wr| async move {
        wr.write_all(http::SSE_HEAD).await?;
        let event = format!("data: {}\n\n", http::chunk_json(&"x".repeat(len)));
        for piece in event.as_bytes().chunks(PIECE) {
            let piece = std::str::from_utf8(piece).unwrap();
            wr.write_all(&http::chunked(piece)).await?;
        }
        wr.write_all(&http::chunked("data: [DONE]\n\n")).await?;
        wr.write_all(b"0\r\n\r\n").await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    (base_url, connection)
}

async fn drain(config: OpenAiConfig) -> (Vec<Chunk>, Option<StreamError>) {
    let provider = OpenAiProvider::new(config).unwrap();
    let mut stream = Guarded::new(provider.open(&Request::prompt("hi")).await.unwrap());
    let mut chunks = Vec::new();
    while let Some(event) = timeout(BOUND, stream.next()).await.expect("stalled") {
        match event {
            Ok(StreamEvent::Chunk(chunk)) => chunks.push(chunk),
            Ok(StreamEvent::KeepAlive | StreamEvent::Finished(_)) => {}
            Err(error) => return (chunks, Some(error)),
        }
    }
    (chunks, None)
}

#[tokio::test]
async fn an_event_of_several_mib_within_the_maximum_is_one_chunk() {
    let len = 3 * 1024 * 1024;
    let (base_url, _server) = serve_one_long_event(len).await;
    let (chunks, error) = drain(OpenAiConfig::new(&base_url, "m")).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(chunks.len(), 1);
    let text = chunks[0].as_text().unwrap();
    assert_eq!(text.len(), len);
    assert!(text.bytes().all(|b| b == b'x'));
}

#[tokio::test]
async fn an_event_over_the_default_maximum_fails_protocol_and_closes() {
    let (base_url, server) = serve_one_long_event(DEFAULT_MAX_EVENT_BYTES + 1).await;
    let (chunks, error) = drain(OpenAiConfig::new(&base_url, "m")).await;
    assert!(chunks.is_empty());
    let error = error.expect("an oversized event must fail the stream");
    assert!(
        matches!(error.kind(), StreamErrorKind::Protocol(_)),
        "{error}"
    );
    let turn = error.turn_error();
    assert_eq!(turn.kind, TurnErrorKind::Protocol);
    assert!(turn.message.contains("maximum event size"), "{turn}");
    assert!(turn.message.contains(&base_url), "{turn}");
    timeout(BOUND, server.closed)
        .await
        .expect("server saw no close")
        .unwrap();
}

#[tokio::test]
async fn the_maximum_event_size_is_configurable() {
    let (base_url, _server) = serve_one_long_event(64 * 1024).await;
    let config = OpenAiConfig::new(&base_url, "m").max_event_bytes(16 * 1024);
    let (chunks, error) = drain(config).await;
    assert!(chunks.is_empty());
    let error = error.expect("over the configured maximum");
    assert_eq!(error.turn_error().kind, TurnErrorKind::Protocol);
    assert!(error.to_string().contains("16384"), "{error}");

    let (base_url, _server) = serve_one_long_event(64 * 1024).await;
    let config = OpenAiConfig::new(&base_url, "m").max_event_bytes(128 * 1024);
    let (chunks, error) = drain(config).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(chunks.len(), 1);
}
