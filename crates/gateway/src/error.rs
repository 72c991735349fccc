//! The errors of the gateway's library API (a client's errors are JSON-RPC
//! errors: see [`ErrorKind`](crate::ErrorKind)).

use std::path::PathBuf;

/// Why the gateway could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The server failed while serving.
    #[error("the gateway's server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Why a script book could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
pub struct ScriptBookError {
    /// The file, when it was read from one.
    pub path: Option<PathBuf>,
    /// What is wrong, naming the key at fault.
    pub message: String,
}
