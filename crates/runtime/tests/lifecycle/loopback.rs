//! G4 through the kernel against a real OpenAI-compatible server on
//! 127.0.0.1: a `Turn` dropped mid-stream closes the provider's connection,
//! as the server itself sees it. Real time (sockets), generous bounds.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use settle_runtime::{Chunk, Outcome, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{OpenAiConfig, OpenAiProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

use crate::common::*;

/// How long the server may take to notice a close; generous for a busy box.
const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// A server that answers one streamed chat completion with `hello`,
/// ` world`, then keepalive comments every 50 ms until the client goes
/// away; returns its base URL and when it saw the connection closed.
async fn streaming_server() -> (String, oneshot::Receiver<Instant>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (closed_tx, closed) = oneshot::channel();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (mut rd, mut wr) = socket.into_split();
        // The request's head and body (the body by Content-Length).
        let mut buf = Vec::new();
        let mut tmp = [0u8; 4096];
        let head_end = loop {
            let n = rd.read(&mut tmp).await.unwrap();
            assert!(n > 0, "client closed before sending a request");
            buf.extend_from_slice(&tmp[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < head_end + len {
            let n = rd.read(&mut tmp).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&tmp[..n]);
        }
        let watcher = tokio::spawn(async move {
            let mut tmp = [0u8; 64];
            loop {
                match rd.read(&mut tmp).await {
                    Ok(0) | Err(_) => return Instant::now(),
                    Ok(_) => {}
                }
            }
        });
        let writer = async move {
            wr.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                  transfer-encoding: chunked\r\n\r\n",
            )
            .await?;
            let frame = |text: String| format!("{:x}\r\n{text}\r\n", text.len()).into_bytes();
            for text in ["hello", " world"] {
                let data =
                    format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}]}}"#);
                wr.write_all(&frame(format!("data: {data}\n\n"))).await?;
            }
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                wr.write_all(&frame(": keepalive\n\n".into())).await?;
            }
            #[allow(unreachable_code)]
            Ok::<_, std::io::Error>(())
        };
        tokio::select! {
            at = watcher => { let _ = closed_tx.send(at.unwrap()); }
            // A failed write also means the client closed.
            _ = writer => { let _ = closed_tx.send(Instant::now()); }
        }
    });
    (base_url, closed)
}

/// G4: a `Turn` read as a `Stream` and dropped after its first chunks
/// cancels the turn and closes the provider's HTTP connection: the server
/// sees the close; the turn is recorded `cancelled`, not `completed`.
#[tokio::test]
async fn g4_a_turn_dropped_mid_stream_closes_the_servers_connection() {
    let (base_url, closed) = streaming_server().await;
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

    let dropped = Instant::now();
    drop(turn);
    let at = timeout(CLOSE_BOUND, closed)
        .await
        .expect("the server saw no close after the turn was dropped")
        .unwrap();
    assert!(at >= dropped);
    session.finish().await.unwrap();
    let d = detail(&store, session.id()).await;
    assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled), "{d:?}");
    kernel.shutdown(Duration::ZERO).await;
}
