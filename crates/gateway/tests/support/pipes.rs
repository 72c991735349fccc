//! In-memory connections for a gateway under test: each test hands the
//! gateway one end of a duplex pipe as an accepted connection, and speaks
//! raw HTTP and WebSocket frames on the other (on tokio's paused clock,
//! where a real socket would not do).

use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// In-memory connections, as an axum listener.
pub struct Pipes(pub mpsc::UnboundedReceiver<DuplexStream>);

impl axum::serve::Listener for Pipes {
    type Io = DuplexStream;
    type Addr = ();

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.0.recv().await {
            Some(io) => (io, ()),
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(())
    }
}
