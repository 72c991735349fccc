//! How the gateway uses the sockets it is given: a TCP connection it
//! serves sends each frame at once (Nagle's algorithm off). A turn's
//! chunks are small frames written back to back; with Nagle's algorithm
//! on, each one after the first waits for the peer's acknowledgement of
//! the one before, which a client delays by up to 40 ms (found from
//! outside: a gateway soak read a first chunk 40 ms late at times).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::serve::Listener;
use settle_gateway::{Gateway, ScriptBook};
use settle_runtime::Kernel;
use settle_store::MemoryStore;
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener that keeps a second handle on every socket it accepts
/// (a `dup` of its descriptor: the same socket, so the options the
/// gateway sets on its handle read the same through this one).
struct Watched {
    listener: TcpListener,
    accepted: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Listener for Watched {
    type Io = TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (TcpStream, std::net::SocketAddr) {
        let (tcp, peer) = self.listener.accept().await.unwrap();
        let std = tcp.into_std().unwrap();
        self.accepted.lock().unwrap().push(std.try_clone().unwrap());
        (TcpStream::from_std(std).unwrap(), peer)
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

#[tokio::test]
async fn a_served_tcp_connection_sends_each_frame_at_once() {
    let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
        .start()
        .await
        .unwrap();
    let provider = Arc::new(ScriptBook::new());
    let gateway = Gateway::builder(kernel, provider)
        .drain_timeout(Duration::from_secs(1))
        .build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let watched = Watched {
        listener,
        accepted: accepted.clone(),
    };
    let served = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.serve(watched).await }
    });
    let (ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let nodelay: Vec<bool> = accepted
        .lock()
        .unwrap()
        .iter()
        .map(|tcp| tcp.nodelay().unwrap())
        .collect();
    assert_eq!(
        nodelay,
        [true],
        "the gateway's socket waits for acknowledgements before small frames (Nagle's algorithm on)"
    );
    drop(ws);
    gateway.shutdown();
    served.await.unwrap().unwrap();
}
