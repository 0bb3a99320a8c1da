//! TLS on the gRPC listener (envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`),
//! and towards an xDS server.
//!
//! The listener's certificate, key and client CA are read from files and
//! read again when their directories change (a file watcher; a Kubernetes
//! secret rotating swaps its files): each new connection is accepted with
//! the newest readable set, and connections already open keep the one they
//! were accepted with. A set that cannot be read is logged and the previous
//! one stays. With a client
//! CA, client certificates are required and verified; with a client name,
//! the certificate must also be valid for that DNS name (as upstream's
//! `GRPC_CLIENT_TLS_SAN`).
//!
//! The xDS client reads its files at each connection, so a rotated
//! certificate is used from the next reconnect on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher as _};

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

/// Why TLS files cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file whose PEM does not read.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rustls::pki_types::pem::Error,
    },
    /// A file without a certificate.
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A certificate, key or CA rustls refuses.
    #[error("{what}: {source}")]
    Refused {
        /// The file or files.
        what: String,
        /// Why.
        source: rustls::Error,
    },
    /// A client certificate verifier that cannot be built from a CA.
    #[error("{}: {source}", path.display())]
    Verifier {
        /// The CA file.
        path: PathBuf,
        /// Why.
        source: rustls::server::VerifierBuilderError,
    },
    /// A client certificate without its key, or a key without it.
    #[error("a client certificate needs both its certificate and its key")]
    HalfIdentity,
    /// The files' directories cannot be watched.
    #[error("watching the certificate files: {0}")]
    Watch(#[from] notify::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(certificates)
}

/// The certificates of the PEM file at `path` (a CA's, to trust).
///
/// # Errors
///
/// A file that cannot be read or holds no PEM certificate: the error names
/// the file.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certificates(path)
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path)? {
        roots.add(certificate).map_err(|source| TlsError::Refused {
            what: path.display().to_string(),
            source,
        })?;
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
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let chain = certificates(&self.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|source| TlsError::Pem {
            path: self.key.clone(),
            source,
        })?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Refused {
                what: "the TLS versions".to_owned(),
                source,
            })?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|source| TlsError::Verifier {
                        path: ca.clone(),
                        source,
                    })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|source| TlsError::Refused {
                what: format!("{} and {}", self.cert.display(), self.key.display()),
                source,
            })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// Accepts TLS connections with the newest readable certificate files:
/// read again by a file watcher when their directories change, never on a
/// connection's path.
pub struct Acceptor {
    shared: Arc<Shared>,
    /// Kept for as long as the acceptor: dropping it stops the watching.
    _watcher: notify::RecommendedWatcher,
}

struct Shared {
    tls: ServerTls,
    current: ArcSwap<TlsAcceptor>,
}

impl Shared {
    /// Reads the files again; the previous set stays if they cannot be used.
    fn reload(&self) {
        match self.tls.server_config() {
            Ok(config) => {
                self.current.store(Arc::new(TlsAcceptor::from(Arc::new(config))));
                tracing::info!(cert = %self.tls.cert.display(), "gRPC TLS: certificate files read again");
            }
            Err(error) => {
                tracing::error!(%error, "gRPC TLS: changed certificate files refused; the previous ones stay");
            }
        }
    }
}

impl Acceptor {
    /// An acceptor over `tls`'s files, which it watches.
    ///
    /// # Errors
    ///
    /// When the files cannot be used now (see [`ServerTls::server_config`]),
    /// or their directories cannot be watched.
    pub fn new(tls: ServerTls) -> Result<Self, TlsError> {
        let current = ArcSwap::from_pointee(TlsAcceptor::from(Arc::new(tls.server_config()?)));
        let shared = Arc::new(Shared { tls, current });
        let watched = Arc::downgrade(&shared);
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Any change in the files' directories: a secret's swapped
            // link changes names other than the files'.
            if event.is_ok_and(|event| !event.kind.is_access()) {
                if let Some(shared) = watched.upgrade() {
                    shared.reload();
                }
            }
        })?;
        let files = [
            Some(&shared.tls.cert),
            Some(&shared.tls.key),
            shared.tls.client_ca.as_ref(),
        ];
        let mut directories: Vec<PathBuf> = files
            .into_iter()
            .flatten()
            .map(|file| match file.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
                _ => PathBuf::from("."),
            })
            .collect();
        directories.sort();
        directories.dedup();
        for directory in &directories {
            watcher.watch(directory, RecursiveMode::NonRecursive)?;
        }
        Ok(Self {
            shared,
            _watcher: watcher,
        })
    }

    /// The TLS handshake on `stream`, and the client name check.
    ///
    /// # Errors
    ///
    /// A failed handshake (no or an untrusted client certificate), or a
    /// client certificate not valid for the required name.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let acceptor = TlsAcceptor::clone(&self.shared.current.load());
        let stream = acceptor.accept(stream).await?;
        if let Some(name) = &self.shared.tls.client_san {
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
    pub fn tonic_config(&self) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
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
            _ => return Err(TlsError::HalfIdentity),
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}
