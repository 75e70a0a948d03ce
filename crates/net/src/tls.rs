//! TLS for peer links and the client port (rustls, ring provider), configured like Redis:
//! `tls_cert_file`, `tls_key_file`, `tls_ca_cert_file`.
//!
//! * **Peer links** (`tls_cluster`) are mutual TLS: every node presents its certificate both
//!   when it dials (as a client certificate) and when it accepts, and requires the other side's
//!   to chain to the CA. A dialer checks that the acceptor's certificate names the IP address
//!   it dialed (a subjectAltName IP entry). The challenge-response handshake (crate::handshake)
//!   still runs inside TLS: the cluster token and the certificates must both match.
//! * **Clients** (`tls_port`): the node presents its certificate; with `tls_auth_clients`
//!   (the default, as in Redis) clients must present one signed by the CA too.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
pub use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Where a node's certificate, key and CA live (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Verifies the other side: peers (always) and clients (with `tls_auth_clients`).
    pub ca_cert_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<_, _>>())
        .map_err(|error| TlsError(format!("{field} {}: {error}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsError(format!("{field} {}: no PEM certificate in it", path.display())));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|error| TlsError(format!("tls_key_file {}: {error}", path.display())))
}

fn roots(files: &TlsFiles, needed_for: &str) -> Result<Arc<RootCertStore>, TlsError> {
    let Some(path) = &files.ca_cert_file else {
        return Err(TlsError(format!("{needed_for} needs tls_ca_cert_file to verify the other side")));
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, "tls_ca_cert_file")? {
        roots.add(cert).map_err(|error| TlsError(format!("tls_ca_cert_file {}: {error}", path.display())))?;
    }
    Ok(Arc::new(roots))
}

/// A server side that presents `files`' certificate; `client_roots`: require client
/// certificates chaining to them.
fn server_config(
    files: &TlsFiles,
    client_roots: Option<Arc<RootCertStore>>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError(error.to_string()))?;
    let builder = match client_roots {
        None => builder.with_no_client_auth(),
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|error| TlsError(format!("tls_ca_cert_file: {error}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let certs = certificates(&files.cert_file, "tls_cert_file")?;
    builder
        .with_single_cert(certs, private_key(&files.key_file)?)
        .map_err(|error| TlsError(format!("tls_cert_file/tls_key_file: {error}")))
}

/// The client port's TLS side (`tls_port`).
pub fn client_acceptor(files: &TlsFiles, auth_clients: bool) -> Result<TlsAcceptor, TlsError> {
    let client_roots = auth_clients.then(|| roots(files, "tls_auth_clients")).transpose()?;
    Ok(TlsAcceptor::from(Arc::new(server_config(files, client_roots)?)))
}

/// Both ends of mutual TLS on peer links (`tls_cluster`).
#[derive(Clone)]
pub struct PeerTls {
    pub connector: TlsConnector,
    pub acceptor: TlsAcceptor,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

impl PeerTls {
    pub fn load(files: &TlsFiles) -> Result<PeerTls, TlsError> {
        let roots = roots(files, "tls_cluster")?;
        let acceptor = TlsAcceptor::from(Arc::new(server_config(files, Some(roots.clone()))?));
        let certs = certificates(&files.cert_file, "tls_cert_file")?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError(error.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, private_key(&files.key_file)?)
            .map_err(|error| TlsError(format!("tls_cert_file/tls_key_file: {error}")))?;
        Ok(PeerTls { connector: TlsConnector::from(Arc::new(client)), acceptor })
    }

    /// The name a dialer checks in the acceptor's certificate: the IP it dialed.
    pub fn server_name(ip: IpAddr) -> ServerName<'static> {
        ServerName::IpAddress(ip.into())
    }
}
