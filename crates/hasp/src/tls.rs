//! TLS to the servers: which certificates a client trusts and presents.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::error::{Error, Result};

/// How a client's TLS connections trust servers and who they say they are.
///
/// TLS itself is asked for by the address: a `rediss://` URL
/// ([`Client::open`](crate::Client::open)), `rediss://` sentinels (TLS to
/// the sentinels and to the master they name) or `rediss://` cluster seeds
/// (TLS to every node). Without [`Settings::set_tls`](crate::Settings::set_tls)
/// such a connection trusts the system's root certificates: the
/// platform's store, or the file the `SSL_CERT_FILE` environment variable
/// names, so a private CA works without code. Every connection of a client
/// (its batching lanes, its pub/sub and query connections, the sentinels'
/// and the cluster's) uses the same settings.
///
/// A server's certificate must name the host of its address (a DNS name or
/// an IP address in its subject alternative names), or the name
/// [`Tls::with_server_name`] gives: a server reached by an address its
/// certificate does not carry (an IP address, a tunnel, a load balancer)
/// is verified by that name.
///
/// ```
/// # fn main() -> hasp::Result<()> {
/// # let dir = std::env::temp_dir().join(format!("hasp-tls-doc-{}", std::process::id()));
/// # let ca = testkit::TestCa::create(&dir).unwrap();
/// let tls = hasp::Tls::new()
///     .with_ca_file(ca.ca_file())? // a private CA instead of the system's
///     .with_identity_files(ca.client_cert_file(), ca.client_key_file())?; // mutual TLS
/// let settings = hasp::Settings::default().set_tls(tls);
/// # let _ = settings; let _ = std::fs::remove_dir_all(dir);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct Tls {
    /// Trusted roots (PEM) instead of the system's.
    pub(crate) ca: Option<Vec<u8>>,
    /// The client's certificate chain and key (PEM).
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Accept any server certificate.
    pub(crate) insecure: bool,
    /// The name every server's certificate must carry, instead of its
    /// address's host.
    pub(crate) server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.as_ref().map(|_| "<pem>"))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("insecure", &self.insecure)
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl Tls {
    /// TLS trusting the system's root certificates, without a client
    /// certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates in `pem` (one or more PEM blocks) instead
    /// of the system's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `pem` holds no certificate.
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Result<Self> {
        let pem = pem.into();
        let certs = certificates(&pem, "ca")?;
        roots(&certs).map_err(|e| Error::invalid("ca", e))?;
        self.ca = Some(pem);
        Ok(self)
    }

    /// Trusts the CA certificates in the PEM file at `path` instead of the
    /// system's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the file cannot be read or holds no
    /// certificate.
    pub fn with_ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        let pem = read(path.as_ref(), "ca")?;
        self.with_ca_pem(pem)
    }

    /// Presents the certificate chain `cert` and its private key `key`
    /// (both PEM) to servers that ask for one (mutual TLS, Redis'
    /// `tls-auth-clients`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if either does not parse.
    pub fn with_identity_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Result<Self> {
        let (cert, key) = (cert.into(), key.into());
        certificates(&cert, "client certificate")?;
        private_key(&key)?;
        self.identity = Some((cert, key));
        Ok(self)
    }

    /// [`Tls::with_identity_pem`] from the PEM files at `cert` and `key`.
    ///
    /// # Errors
    /// As [`Tls::with_identity_pem`], and if a file cannot be read.
    pub fn with_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self> {
        let cert_pem = read(cert.as_ref(), "client certificate")?;
        let key_pem = read(key.as_ref(), "client key")?;
        self.with_identity_pem(cert_pem, key_pem)
    }

    /// Verifies every server's certificate by `name` (a DNS name or an IP
    /// address), whatever host its address names, and sends `name` in the
    /// TLS hello (SNI) for a DNS name. For servers reached by an address
    /// their certificate does not carry: an IP address, a tunnel, a load
    /// balancer, a Sentinel's announced address. Every server the client
    /// speaks to must then carry `name`: a Redis Cluster's nodes, each
    /// verified by the name it announces, refuse it
    /// ([`Client::open_cluster`](crate::Client::open_cluster) fails).
    ///
    /// ```
    /// # fn main() -> hasp::Result<()> {
    /// let tls = hasp::Tls::new().with_server_name("redis.internal")?;
    /// assert!(hasp::Tls::new().with_server_name("not a name").is_err());
    /// # let _ = tls;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `name` is neither a DNS name nor an IP
    /// address.
    pub fn with_server_name(mut self, name: &str) -> Result<Self> {
        let parsed = ServerName::try_from(name.to_owned())
            .map_err(|e| Error::invalid("server_name", format!("{name:?}: {e}")))?;
        self.server_name = Some(parsed);
        Ok(self)
    }

    /// Accepts any server certificate, whoever issued it and whatever host
    /// it names: the connection is encrypted but not authenticated, so
    /// anyone on the path can read and change it. For development against a
    /// server with a self-signed certificate only; never in production.
    pub fn dangerously_accept_any_certificate(mut self) -> Self {
        self.insecure = true;
        self
    }

    /// The certificates in the form redis-rs's cluster connections take.
    #[cfg(feature = "cluster")]
    pub(crate) fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .identity
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }

    /// The connector of the client's own connections (the batching lanes):
    /// the same trust as redis-rs's, `insecure` as the settings or the
    /// address (`rediss://…#insecure`) say.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the system's roots cannot be read or
    /// a certificate does not fit.
    pub(crate) fn connector(&self, insecure: bool) -> Result<tokio_rustls::TlsConnector> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid("tls", e.to_string()))?;
        let builder = if insecure || self.insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        } else {
            let roots = match &self.ca {
                Some(pem) => roots(&certificates(pem, "ca")?),
                None => system_roots(),
            }
            .map_err(|e| Error::invalid("tls", e))?;
            builder.with_root_certificates(roots)
        };
        let config = match &self.identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(certificates(cert, "client certificate")?, private_key(key)?)
                .map_err(|e| Error::invalid("client certificate", e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }
}

/// `error`, from a plain TCP connection's first exchange, with the likely
/// cause said when the server cut the connection without a word: a server
/// that speaks TLS only (Redis' `tls-port`) does that to a plain client.
pub(crate) fn explain_plain(error: redis::RedisError) -> redis::RedisError {
    let cut = error.is_connection_dropped()
        || matches!(
            error.kind(),
            redis::ErrorKind::Io if !error.is_timeout() && !error.is_connection_refusal()
        );
    if !cut {
        return error;
    }
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "the server closed the connection before answering",
        format!("it may accept TLS only: use a rediss:// URL ({error})"),
    ))
}

/// The error of a first connection to `server` that got no answer within
/// the connection timeout; over TLS the likely cause is said: a server
/// that does not speak TLS on that port never answers a client's hello.
pub(crate) fn no_answer(plain_tcp: bool, server: &str) -> redis::RedisError {
    let detail = match plain_tcp {
        true => format!("{server}: no answer within the connection timeout"),
        false => format!(
            "{server}: no answer to the TLS handshake within the connection timeout: \
             does the server speak TLS on this port? (a plain one takes redis://)"
        ),
    };
    redis::RedisError::from((redis::ErrorKind::Io, "connection timed out", detail))
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::invalid(what, format!("{}: {e}", path.display())))
}

fn certificates(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid(what, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(Error::invalid(what, "no PEM certificate found"));
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| Error::invalid("client key", format!("not a PEM private key: {e}")))
}

fn roots(certs: &[CertificateDer<'static>]) -> std::result::Result<rustls::RootCertStore, String> {
    let mut store = rustls::RootCertStore::empty();
    for cert in certs {
        store.add(cert.clone()).map_err(|e| e.to_string())?;
    }
    Ok(store)
}

/// The platform's roots, or those of the file `SSL_CERT_FILE` names (as
/// OpenSSL reads them).
fn system_roots() -> std::result::Result<rustls::RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        return Err(match found.errors.first() {
            Some(e) => format!("no system root certificate could be read: {e}"),
            None => "no system root certificate found".to_owned(),
        });
    }
    let mut store = rustls::RootCertStore::empty();
    // A certificate the platform holds that rustls cannot use is skipped,
    // as the platform's own clients skip it.
    let _ = store.add_parsable_certificates(found.certs);
    Ok(store)
}

/// A verifier that accepts every certificate (see
/// [`Tls::dangerously_accept_any_certificate`]); the handshake's signatures
/// are still checked, so the session is encrypted.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client's TLS connectors (its verifying one and, if an address asks
/// for it, its accepting one), made on first use and kept: reading the
/// system's roots costs milliseconds, a connect should not.
#[derive(Clone, Default)]
pub(crate) struct Connectors {
    tls: Tls,
    verifying: std::sync::OnceLock<std::result::Result<tokio_rustls::TlsConnector, String>>,
    accepting: std::sync::OnceLock<std::result::Result<tokio_rustls::TlsConnector, String>>,
}

impl std::fmt::Debug for Connectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connectors")
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Connectors {
    /// Connectors with `tls`'s trust (the system's roots without it).
    pub(crate) fn new(tls: Option<&Tls>) -> Self {
        Self {
            tls: tls.cloned().unwrap_or_default(),
            ..Self::default()
        }
    }

    /// The name the certificate of the server at `host` must carry: the
    /// settings' server name, or else `host`.
    pub(crate) fn server_name(&self, host: &str) -> redis::RedisResult<ServerName<'static>> {
        if let Some(name) = &self.tls.server_name {
            return Ok(name.clone());
        }
        ServerName::try_from(host.to_owned()).map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "not a host name TLS can verify",
                format!("{host:?}: {e}"),
            ))
        })
    }

    /// The connector for an address that accepts any certificate
    /// (`insecure`: `rediss://…#insecure`) or not.
    pub(crate) fn get(&self, insecure: bool) -> redis::RedisResult<tokio_rustls::TlsConnector> {
        let made = match insecure {
            true => &self.accepting,
            false => &self.verifying,
        };
        made.get_or_init(|| self.tls.connector(insecure).map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "TLS settings", e))
            })
    }
}
