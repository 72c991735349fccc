//! G4 through the kernel against a real OpenAI-compatible server on
//! 127.0.0.1: a `Turn` dropped mid-stream closes the provider's connection,
//! as the server itself sees it. Real time (sockets), generous bounds.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use settle_runtime::{Chunk, Outcome, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{OpenAiConfig, OpenAiProvider};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::time::{timeout, Instant};

use crate::common::*;

// The same one-connection server as the stream crate's HTTP tests.
#[path = "../../../stream/tests/support/http.rs"]
mod http;

/// How long the server may take to notice a close; generous for a busy box.
const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// A server that answers one streamed chat completion with `hello`,
/// ` world`, then keepalive comments every 50 ms until the client goes
/// away; returns its base URL and the request and close it will see.
async fn streaming_server() -> (String, http::OneConnection) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let connection = http::serve_one(listener, |mut wr| async move {
        wr.write_all(http::SSE_HEAD).await?;
        for text in ["hello", " world"] {
            let data = http::chunk_json(text);
            wr.write_all(&http::chunked(&format!("data: {data}\n\n")))
                .await?;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            wr.write_all(&http::chunked(": keepalive\n\n")).await?;
        }
    });
    (base_url, connection)
}

/// G4: a `Turn` read as a `Stream` and dropped after its first chunks
/// cancels the turn and closes the provider's HTTP connection: the server
/// sees the close; the turn is recorded `cancelled`, not `completed`.
#[tokio::test]
async fn g4_a_turn_dropped_mid_stream_closes_the_servers_connection() {
    let (base_url, connection) = streaming_server().await;
    let provider =
        Arc::new(OpenAiProvider::new(OpenAiConfig::new(&base_url, "test-model")).unwrap());
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let session = kernel.register("agent", None).await.unwrap();
    let mut turn = session
        .run_turn(provider, TurnRequest::prompt("hi"))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let chunk = timeout(CLOSE_BOUND, turn.next()).await.unwrap().unwrap();
        seen.push(Chunk::into_payload(chunk));
    }
    assert_eq!(seen, ["hello", " world"]);
    // The kernel asked for a stream, of the configured model, with the prompt.
    let request = connection.request.await.unwrap();
    for wanted in [
        r#""stream":true"#,
        r#""model":"test-model""#,
        r#""content":"hi""#,
    ] {
        assert!(request.contains(wanted), "{wanted} not in {request}");
    }

    let dropped = Instant::now();
    drop(turn);
    let at = timeout(CLOSE_BOUND, connection.closed)
        .await
        .expect("the server saw no close after the turn was dropped")
        .unwrap();
    assert!(at >= dropped);
    session.finish().await.unwrap();
    let d = detail(&store, session.id()).await;
    assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled), "{d:?}");
    kernel.shutdown(Duration::ZERO).await;
}

/// Back-pressure over a real socket: a turn nobody reads holds its server
/// back. The server tries to stream 1,000,000 events as fast as it can; the
/// turn's bounded chunk buffer fills, the work stops reading the body, and
/// TCP stops the server's writes, far short of what it wanted to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_nobody_reads_holds_its_server_back() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let written = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    let connection = http::serve_one(listener, move |mut wr| async move {
        wr.write_all(http::SSE_HEAD).await?;
        let data = http::chunk_json("0123456789abcdef0123456789abcdef");
        let event = http::chunked(&format!("data: {data}\n\n"));
        for _ in 0..1_000_000 {
            wr.write_all(&event).await?;
            counter.fetch_add(event.len(), Ordering::Relaxed);
        }
        Ok(())
    });
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b.chunk_buffer(16)).await;
    let agent = kernel.register("reader", None).await.unwrap();
    let provider = Arc::new(OpenAiProvider::new(OpenAiConfig::new(&base_url, "m")).unwrap());
    let mut turn = agent
        .run_turn(provider, TurnRequest::prompt("go"))
        .await
        .unwrap();
    assert!(turn.next_chunk().await.is_some());
    // Let the server write all it can; with nobody reading it stalls.
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = written.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    let wanted = 1_000_000 * 80;
    assert!(
        last < 32 << 20 && last < wanted / 2,
        "the server wrote {last} bytes for a turn nobody read"
    );
    // The store holds only what went through: the buffer's worth and what
    // the work had in hand, not the server's million events.
    let stored = detail(&store, agent.id()).await.turns[0].chunks.len();
    assert!(stored < 64, "{stored} chunks persisted");
    drop(turn);
    timeout(CLOSE_BOUND, connection.closed)
        .await
        .expect("the server saw the connection closed")
        .unwrap();
}
