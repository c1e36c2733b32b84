//! TLS to the service's Redis: what its connections trust and present.
//!
//! TLS itself is asked for by the URL: `rediss://host:port/` for one
//! server, `rediss+sentinel://host:port,…/<service>` (TLS to the sentinels
//! and to the master they name) and `rediss+cluster://host:port,…` (TLS to
//! every node). Without settings a TLS connection trusts the system's root
//! certificates (the platform's store, or the file `SSL_CERT_FILE` names);
//! [`RedisTls`] gives a CA, a client certificate for servers that ask for
//! one, the name servers' certificates must carry when their addresses do
//! not (an IP address, a Sentinel's announced address), or, for
//! development only, no verification at all. The service's connections to
//! one server or a Sentinel service are hasp's ([`hasp::Connection`],
//! [`hasp::sentinel::Sentinels`]), and so are its locks: one TLS for all.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// What the service's Redis connections trust and present over TLS (see
/// the module docs); the default trusts the system's roots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM file of the CA certificates to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate chain (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// PEM file of its private key.
    pub key_file: Option<PathBuf>,
    /// The name every server's certificate must carry instead of its
    /// address's host (not for a cluster: its nodes are verified by the
    /// names they announce).
    pub server_name: Option<String>,
    /// Accept any server certificate: development only.
    pub insecure: bool,
}

impl RedisTls {
    /// The certificates for redis-rs's connections (`None`: the system's
    /// roots, no client certificate).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the setting if a file cannot be read, or a
    /// certificate is given without its key (or the other way round).
    pub fn certificates(&self) -> Result<Option<redis::TlsCertificates>> {
        let read = |file: &PathBuf, field: &'static str| {
            std::fs::read(file)
                .map_err(|e| Error::invalid(field, format!("{}: {e}", file.display())))
        };
        let root_cert = self
            .ca_file
            .as_ref()
            .map(|f| read(f, "redis_tls_ca_file"))
            .transpose()?;
        let client_tls = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert, "redis_tls_cert_file")?,
                client_key: read(key, "redis_tls_key_file")?,
            }),
            (None, None) => None,
            _ => {
                return Err(Error::invalid(
                    "redis_tls_cert_file",
                    "a client certificate needs its key (redis_tls_key_file), and a key its certificate",
                ))
            }
        };
        Ok(
            (root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }

    /// The same TLS as hasp takes it: for the service's connections to one
    /// server or a Sentinel service, and for its locks.
    ///
    /// # Errors
    /// As [`RedisTls::certificates`], and if a file does not parse or the
    /// server name is not a DNS name or an IP address.
    pub fn hasp(&self) -> Result<hasp::Tls> {
        let mut tls = hasp::Tls::new();
        if let Some(name) = &self.server_name {
            tls = tls
                .with_server_name(name)
                .map_err(|e| Error::invalid("redis_tls_server_name", e.to_string()))?;
        }
        if let Some(ca) = &self.ca_file {
            tls = tls.with_ca_file(ca)?;
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            tls = tls.with_identity_files(cert, key)?;
        }
        if self.insecure {
            tls = tls.dangerously_accept_any_certificate();
        }
        Ok(tls)
    }

    /// How redis-rs's cluster client speaks TLS, when it is asked for.
    pub(crate) fn mode(&self) -> redis::TlsMode {
        match self.insecure {
            true => redis::TlsMode::Insecure,
            false => redis::TlsMode::Secure,
        }
    }
}
