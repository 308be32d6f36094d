//! TLS for the client listener (`tls_cert_file`, `tls_key_file`) and for node RPC (`[cluster] peer_tls_*`), on
//! rustls with the `ring` provider, driven over glommio's sockets by `futures-rustls`. Nothing here is on the data
//! path of a plain-text listener: `Stream::Plain` forwards every call to the socket.
//!
//! - Certificates and keys are PEM files read once at start; a file that is missing, empty or not PEM stops the
//!   server with its path in the message.
//! - The client listener offers ALPN `http/1.1` (curl and browsers then speak HTTP/1.1, the only version berth
//!   serves). Node RPC offers `berth-node-rpc`; each node checks its peer's certificate against `peer_tls_ca_file`
//!   and the host the peer is published under, and with `peer_tls_client_auth` the accepting node requires a
//!   certificate from its peer too, signed by the same CA.
//! - The handshake runs within the limits that bound a connection before it is authenticated: the HTTP header-read
//!   deadline and `max_tls_handshakes_per_core`, node RPC's handshake timeout and its cap on connections still
//!   handshaking. Before the handshake completes, rustls holds at most one handshake message of what a peer sends
//!   (it reassembles up to 64 KiB), hence the caps on connections handshaking at once.
//! - No session resumption (no shared session cache, no tickets): a reconnecting client pays a full handshake.

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The ALPN protocol of the client listener.
pub const ALPN_HTTP: &[u8] = b"http/1.1";
/// The ALPN protocol of node RPC.
pub const ALPN_NODE_RPC: &[u8] = b"berth-node-rpc";

/// Node RPC's TLS, both ends: what this node presents when it accepts a peer's connection, and how it checks the
/// peers it connects to.
#[derive(Debug, Clone)]
pub struct PeerTls {
    pub accept: Arc<ServerConfig>,
    pub connect: Arc<ClientConfig>,
}

/// A connection, in plain text or TLS. Every read and write goes through it; the socket itself stays reachable for
/// what TLS does not change (peeking for a hang-up, socket options, shutting down on a deadline).
pub enum Stream {
    Plain(TcpStream),
    /// Accepted on a TLS listener, handshake done.
    Accepted(Box<futures_rustls::server::TlsStream<TcpStream>>),
    /// Connected to a TLS peer, handshake done.
    Connected(Box<futures_rustls::client::TlsStream<TcpStream>>),
}

impl Stream {
    /// The socket under the stream.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Accepted(s) => s.get_ref().0,
            Stream::Connected(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        !matches!(self, Stream::Plain(_))
    }
}

/// Completes the server side of a TLS handshake on an accepted socket.
pub async fn accept(config: &Arc<ServerConfig>, tcp: TcpStream) -> io::Result<Stream> {
    let tls = futures_rustls::TlsAcceptor::from(config.clone())
        .accept(tcp)
        .await?;
    Ok(Stream::Accepted(Box::new(tls)))
}

/// Completes the client side of a TLS handshake with `host` (a DNS name or an IP address, as the peer's
/// certificate must name it) on a connected socket.
pub async fn connect(config: &Arc<ClientConfig>, host: &str, tcp: TcpStream) -> io::Result<Stream> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host} is not a name a certificate can hold: {e}"),
        )
    })?;
    let tls = futures_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await?;
    Ok(Stream::Connected(Box::new(tls)))
}

/// The host part of `host:port` (`[v6]:port` gives `v6`), the name a peer's certificate is checked against.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Connected(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Connected(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Connected(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    /// TLS: sends `close_notify`, then shuts the socket's sending side.
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_close(cx),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_close(cx),
            Stream::Connected(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file, in order (a chain: the leaf first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a PEM private key from {}: {e}", path.display()))
}

fn roots(ca: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
    }
    Ok(Arc::new(roots))
}

/// The server side: the certificate chain and key presented, the ALPN protocol offered, and, with `client_ca`,
/// the CA a client's certificate must be signed by (a client without one is refused).
pub fn server_config(
    cert: &Path,
    key: &Path,
    alpn: &[u8],
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                    .build()
                    .map_err(|e| format!("TLS client verification with {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .map_err(|e| {
            format!(
                "{} and {} are not a certificate and its key: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![alpn.to_vec()];
    // No session resumption: its cache is one lock shared by every core (one config serves them all), and its
    // tickets would be kept for clients that hold their connections open anyway.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The client side: the CA the server's certificate must be signed by, the ALPN protocol asked for, and
/// optionally the certificate and key presented to a server that asks for one.
pub fn client_config(
    ca: &Path,
    alpn: Option<&[u8]>,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots(ca)?);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| {
                format!(
                    "{} and {} are not a certificate and its key: {e}",
                    cert.display(),
                    key.display()
                )
            })?,
    };
    if let Some(alpn) = alpn {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    Ok(Arc::new(config))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A CA and a certificate it signed for `127.0.0.1` and `localhost`, written as PEM files into `dir`:
    /// (ca.pem, cert.pem, key.pem).
    pub(crate) fn write_test_pki(
        dir: &Path,
    ) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let paths = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        std::fs::write(&paths.0, ca.pem()).unwrap();
        std::fs::write(&paths.1, cert.pem()).unwrap();
        std::fs::write(&paths.2, key.serialize_pem()).unwrap();
        paths
    }

    #[test]
    fn host_of_strips_the_port_and_brackets() {
        assert_eq!(host_of("127.0.0.1:7170"), "127.0.0.1");
        assert_eq!(host_of("node-a.example:7170"), "node-a.example");
        assert_eq!(host_of("[::1]:7170"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }

    #[test]
    fn configs_load_from_pem_files_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = write_test_pki(dir.path());
        server_config(&cert, &key, ALPN_HTTP, None).unwrap();
        server_config(&cert, &key, ALPN_NODE_RPC, Some(&ca)).unwrap();
        client_config(&ca, Some(ALPN_NODE_RPC), Some((&cert, &key))).unwrap();
        let missing = dir.path().join("missing.pem");
        let e = server_config(&missing, &key, ALPN_HTTP, None).unwrap_err();
        assert!(e.contains("missing.pem"), "{e}");
        let e = server_config(&key, &key, ALPN_HTTP, None).unwrap_err();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = server_config(&cert, &cert, ALPN_HTTP, None).unwrap_err();
        assert!(e.contains("private key"), "{e}");
    }
}
