//! TLS on the gRPC listener (envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`),
//! and towards an xDS server.
//!
//! The listener's certificate, key and client CA are read from files and
//! read again when a file changes (a Kubernetes secret rotating swaps its
//! files): each new connection is accepted with the newest readable set,
//! and connections already open keep the one they were accepted with. A set
//! that cannot be read is logged and the previous one stays. With a client
//! CA, client certificates are required and verified; with a client name,
//! the certificate must also be valid for that DNS name (as upstream's
//! `GRPC_CLIENT_TLS_SAN`).
//!
//! The xDS client reads its files at each connection, so a rotated
//! certificate is used from the next reconnect on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The listener's certificate files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The certificate chain, PEM (`GRPC_SERVER_TLS_CERT`).
    pub cert: PathBuf,
    /// Its private key, PEM (`GRPC_SERVER_TLS_KEY`).
    pub key: PathBuf,
    /// The CA client certificates must chain to; with it, clients must
    /// present one (`GRPC_CLIENT_TLS_CACERT`, or `GRPC_SERVER_TLS_CA_CERT`
    /// as Envoy Gateway names it).
    pub client_ca: Option<PathBuf>,
    /// A DNS name the client certificate must be valid for (`GRPC_CLIENT_TLS_SAN`).
    pub client_san: Option<String>,
}

/// A client's certificate files (the xDS client's, `CONFIG_GRPC_XDS_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// The client certificate chain, PEM.
    pub cert: Option<PathBuf>,
    /// Its private key, PEM.
    pub key: Option<PathBuf>,
    /// The CA the server's certificate must chain to (else the system's roots).
    pub ca: Option<PathBuf>,
    /// The name the server's certificate must be valid for (else the URL's host).
    pub server_name: Option<String>,
}

/// A file that cannot be used, named.
fn unreadable(path: &Path, error: impl std::fmt::Display) -> String {
    format!("{}: {error}", path.display())
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| unreadable(path, error))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| unreadable(path, error))?;
    if certificates.is_empty() {
        return Err(unreadable(path, "no PEM certificate in it"));
    }
    Ok(certificates)
}

/// The certificates of the PEM file at `path` (a CA's, to trust).
///
/// # Errors
///
/// A file that cannot be read or holds no PEM certificate: the message
/// names the file.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    certificates(path)
}

fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path)? {
        roots.add(certificate).map_err(|error| unreadable(path, error))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl ServerTls {
    /// A rustls configuration from the files as they are now.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, holds no certificate or key, or a key
    /// that does not fit: the message names the file.
    pub fn server_config(&self) -> Result<ServerConfig, String> {
        let chain = certificates(&self.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|error| unreadable(&self.key, error))?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|error| unreadable(ca, error))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|error| format!("{} and {}: {error}", self.cert.display(), self.key.display()))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// The files' modification times and lengths: what says they changed.
    fn stamp(&self) -> Stamp {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|path| {
                std::fs::metadata(path)
                    .ok()
                    .and_then(|meta| Some((meta.modified().ok()?, meta.len())))
            })
            .collect()
    }
}

/// Each file's modification time and length, when it can be read.
type Stamp = Vec<Option<(SystemTime, u64)>>;

/// Accepts TLS connections with the newest readable certificate files.
pub struct Acceptor {
    tls: ServerTls,
    current: Mutex<(Stamp, TlsAcceptor)>,
}

impl Acceptor {
    /// An acceptor over `tls`'s files.
    ///
    /// # Errors
    ///
    /// When the files cannot be used now (see [`ServerTls::server_config`]).
    pub fn new(tls: ServerTls) -> Result<Self, String> {
        let stamp = tls.stamp();
        let acceptor = TlsAcceptor::from(Arc::new(tls.server_config()?));
        Ok(Self {
            tls,
            current: Mutex::new((stamp, acceptor)),
        })
    }

    /// The acceptor for a new connection: rebuilt when a file changed.
    fn acceptor(&self) -> TlsAcceptor {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let stamp = self.tls.stamp();
        if stamp != current.0 {
            current.0 = stamp;
            match self.tls.server_config() {
                Ok(config) => {
                    tracing::info!(cert = %self.tls.cert.display(), "gRPC TLS: certificate files changed, now in use");
                    current.1 = TlsAcceptor::from(Arc::new(config));
                }
                Err(error) => {
                    tracing::error!(%error, "gRPC TLS: changed certificate files refused; the previous ones stay");
                }
            }
        }
        current.1.clone()
    }

    /// The TLS handshake on `stream`, and the client name check.
    ///
    /// # Errors
    ///
    /// A failed handshake (no or an untrusted client certificate), or a
    /// client certificate not valid for the required name.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let stream = self.acceptor().accept(stream).await?;
        if let Some(name) = &self.tls.client_san {
            let (_, connection) = stream.get_ref();
            let valid = connection
                .peer_certificates()
                .and_then(|chain| chain.first())
                .is_some_and(|certificate| valid_for(certificate, name));
            if !valid {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("the client certificate is not valid for {name}"),
                ));
            }
        }
        Ok(stream)
    }
}

/// Whether `certificate` names `name` (a DNS name or an IP address).
fn valid_for(certificate: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(name) = ServerName::try_from(name) else {
        return false;
    };
    webpki::EndEntityCert::try_from(certificate).is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

impl ClientTls {
    /// tonic's client configuration from the files as they are now.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, or a certificate without its key.
    pub fn tonic_config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        let mut config = tonic::transport::ClientTlsConfig::new();
        match &self.ca {
            Some(ca) => {
                config = config.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
            }
            None => config = config.with_webpki_roots(),
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                config = config.identity(tonic::transport::Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => return Err("a client certificate needs both its certificate and its key".to_owned()),
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}
