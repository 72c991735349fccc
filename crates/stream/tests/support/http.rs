//! A bare HTTP/1.1 server of one connection, for tests of provider streams
//! against a real socket on 127.0.0.1: it reads the request, lets the test
//! write the response, and tells when the client closed the connection, as
//! the server sees it. Shared by the stream crate's OpenAI tests and the
//! runtime's loopback test (`#[path]`), so both servers behave the same.

use std::future::Future;

use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The ends of a test server: the request it got, and when the client closed.
pub struct OneConnection {
    /// The request's head and body, as text.
    pub request: oneshot::Receiver<String>,
    /// When the server saw the client close the connection (a read of zero
    /// bytes, a read error, or a failed write).
    pub closed: oneshot::Receiver<Instant>,
}

/// Accepts one connection on `listener`, reads its request, then runs
/// `respond` on the write half while watching the read half for the close.
pub fn serve_one<F, Fut>(listener: TcpListener, respond: F) -> OneConnection
where
    F: FnOnce(OwnedWriteHalf) -> Fut + Send + 'static,
    Fut: Future<Output = std::io::Result<()>> + Send,
{
    let (request_tx, request) = oneshot::channel();
    let (closed_tx, closed) = oneshot::channel();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (mut rd, wr) = socket.into_split();
        let _ = request_tx.send(read_request(&mut rd).await);
        let watcher = tokio::spawn(async move {
            let mut tmp = [0u8; 64];
            loop {
                match rd.read(&mut tmp).await {
                    Ok(0) | Err(_) => return Instant::now(),
                    Ok(_) => {}
                }
            }
        });
        tokio::select! {
            at = watcher => { let _ = closed_tx.send(at.unwrap()); }
            // A failed write also means the client closed.
            _ = respond(wr) => { let _ = closed_tx.send(Instant::now()); }
        }
    });
    OneConnection { request, closed }
}

/// Accepts one connection on `listener` and answers it with `status` (a
/// status line's code and reason), the `headers` lines and `body` (its
/// `content-length` added), then keeps the connection open.
#[allow(dead_code)] // Not every test binary that shares this file answers so.
pub fn answer_once(
    listener: TcpListener,
    status: &str,
    headers: &str,
    body: &str,
) -> OneConnection {
    let response = format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    serve_one(listener, move |mut wr| async move {
        use tokio::io::AsyncWriteExt;
        wr.write_all(response.as_bytes()).await?;
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// Reads one request: its head, then its body by `Content-Length`.
async fn read_request(rd: &mut OwnedReadHalf) -> String {
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
        assert!(n > 0, "client closed in the middle of its request");
        buf.extend_from_slice(&tmp[..n]);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// The head of a streamed (chunked) server-sent-events reply.
pub const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
    cache-control: no-cache\r\nconnection: keep-alive\r\n\
    transfer-encoding: chunked\r\n\r\n";

/// `text` as one chunk of a chunked body.
pub fn chunked(text: &str) -> Vec<u8> {
    format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
}

/// The `data:` payload of a chat completion chunk carrying `text`.
pub fn chunk_json(text: &str) -> String {
    format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}]}}"#)
}
