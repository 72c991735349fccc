//! [`Tls`]: `wss://` without a proxy, with rustls (and the ring provider
//! that the model client's HTTPS already builds).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A server certificate chain and its key, to serve `wss://` and `https://`.
/// Cheap to clone.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// Why a certificate or key was refused. Never quotes the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct TlsError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl Tls {
    /// Reads the certificate chain (PEM, the server's certificate first) at
    /// `cert` and its private key (PEM: PKCS #8, PKCS #1 or SEC1) at `key`.
    ///
    /// # Errors
    /// When a file cannot be read, holds no certificate or key, or the key
    /// does not fit the certificate.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let refuse = |path: &Path, message: String| TlsError {
            path: path.to_owned(),
            message,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| refuse(cert, format!("cannot read the certificate: {e}")))?
            .collect::<Result<_, _>>()
            .map_err(|e| refuse(cert, format!("not a PEM certificate chain: {e}")))?;
        if chain.is_empty() {
            return Err(refuse(cert, "no PEM certificate in this file".into()));
        }
        let private = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| refuse(key, format!("no PEM private key could be read: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| refuse(cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| refuse(key, format!("does not fit the certificate: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The server's side of a TLS handshake on `io`.
    pub(crate) async fn accept<I>(&self, io: I) -> std::io::Result<TlsStream<I>>
    where
        I: AsyncRead + AsyncWrite + Unpin,
    {
        self.acceptor.accept(io).await
    }
}
