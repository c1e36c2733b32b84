//! A private certificate authority for tests of TLS: its CA, a server
//! certificate for 127.0.0.1 and localhost, a client certificate, and
//! whatever odd certificate a test asks for (another host, expired, from
//! another CA), as PEM files in a directory of its own.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::error::LaunchError;

/// A private CA and the certificates it issued (see the module docs).
pub struct TestCa {
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("dir", &self.dir).finish()
    }
}

/// What a certificate [`TestCa::issue`] makes is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A server's (`serverAuth`, and `clientAuth` for replication and a
    /// cluster's bus).
    Server,
    /// A client's (`clientAuth`).
    Client,
}

fn failed(what: &str, e: impl std::fmt::Display) -> LaunchError {
    LaunchError::Failed(format!("{what}: {e}"))
}

impl TestCa {
    /// Makes a CA in `dir` (created), and with it `server.crt`/`server.key`
    /// (for 127.0.0.1, ::1 and localhost) and `client.crt`/`client.key`.
    ///
    /// # Errors
    /// [`LaunchError`] if a key or certificate cannot be made or written.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self, LaunchError> {
        let dir = dir.as_ref().to_owned();
        std::fs::create_dir_all(&dir)
            .map_err(|e| LaunchError::io("creating the CA's directory", e))?;
        let ca = Self::new_issuer("hasp test CA")?;
        let this = Self { dir, issuer: ca };
        this.write("ca.crt", &this.issuer.pem())?;
        this.issue(
            "server",
            Use::Server,
            &["127.0.0.1", "::1", "localhost"],
            false,
        )?;
        this.issue("client", Use::Client, &["hasp-test-client"], false)?;
        Ok(this)
    }

    fn new_issuer(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, LaunchError> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("CA", e))?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
        CertifiedIssuer::self_signed(params, key).map_err(|e| failed("CA certificate", e))
    }

    /// Issues `<name>.crt` and `<name>.key` for `hosts` (DNS names or IP
    /// addresses) and `purpose`; an `expired` one was valid in 2020 only.
    /// Returns the certificate's and the key's paths.
    ///
    /// # Errors
    /// [`LaunchError`] if it cannot be made or written.
    pub fn issue(
        &self,
        name: &str,
        purpose: Use,
        hosts: &[&str],
        expired: bool,
    ) -> Result<(PathBuf, PathBuf), LaunchError> {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let mut params = CertificateParams::new(hosts).map_err(|e| failed(name, e))?;
        params
            .distinguished_name
            .push(DnType::CommonName, name.to_owned());
        params.extended_key_usages = match purpose {
            // A server is a client too: of its master when it replicates,
            // and of the other nodes on a cluster's bus.
            Use::Server => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Use::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        let key = KeyPair::generate().map_err(|e| failed(name, e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| failed(name, e))?;
        let cert_file = self.write(&format!("{name}.crt"), &cert.pem())?;
        let key_file = self.write(&format!("{name}.key"), &key.serialize_pem())?;
        Ok((cert_file, key_file))
    }

    /// Another CA, in `other/` below this one's directory, with its own
    /// server certificate for 127.0.0.1: one this CA's clients must refuse.
    ///
    /// # Errors
    /// As [`TestCa::create`].
    pub fn another(&self) -> Result<TestCa, LaunchError> {
        let dir = self.dir.join("other");
        std::fs::create_dir_all(&dir)
            .map_err(|e| LaunchError::io("creating the CA's directory", e))?;
        let other = Self {
            dir,
            issuer: Self::new_issuer("another test CA")?,
        };
        other.write("ca.crt", &other.issuer.pem())?;
        other.issue(
            "server",
            Use::Server,
            &["127.0.0.1", "::1", "localhost"],
            false,
        )?;
        Ok(other)
    }

    fn write(&self, file: &str, pem: &str) -> Result<PathBuf, LaunchError> {
        let path = self.dir.join(file);
        std::fs::write(&path, pem).map_err(|e| LaunchError::io("writing a certificate", e))?;
        Ok(path)
    }

    /// The CA's certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The server certificate for 127.0.0.1, ::1 and localhost.
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// Its key.
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The client certificate (mutual TLS).
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// Its key.
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// TLS options for a server with this CA's server certificate,
    /// asking clients for certificates of this CA when `client_certs`.
    pub fn server_options(&self, client_certs: bool) -> crate::redis::TlsOptions {
        crate::redis::TlsOptions {
            cert: self.server_cert_file(),
            key: self.server_key_file(),
            ca: self.ca_file(),
            client_certs,
        }
    }

    /// TLS options for a server with a certificate of its own, issued now
    /// as `<name>.crt` for `hosts` ([`TestCa::issue`]); clients are not
    /// asked for certificates.
    ///
    /// # Errors
    /// As [`TestCa::issue`].
    pub fn issue_server_options(
        &self,
        name: &str,
        hosts: &[&str],
        expired: bool,
    ) -> Result<crate::redis::TlsOptions, LaunchError> {
        let (cert, key) = self.issue(name, Use::Server, hosts, expired)?;
        Ok(crate::redis::TlsOptions {
            cert,
            key,
            ca: self.ca_file(),
            client_certs: false,
        })
    }
}

/// A key pair to sign JSON Web Tokens with in tests: its private key
/// (PKCS#8 PEM) and its public key as a JWK (RFC 7517) under a key id.
#[derive(Debug, Clone)]
pub struct JwtKey {
    /// The private key, PKCS#8 PEM.
    pub pem: String,
    /// The public key as a JWK (JSON), with `kid`.
    pub jwk: String,
    /// The key id.
    pub kid: String,
}

/// The kind of a [`JwtKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtKeyKind {
    /// P-256, signing ES256.
    P256,
    /// Ed25519, signing EdDSA.
    Ed25519,
}

impl JwtKey {
    /// A fresh key of `kind` named `kid`.
    ///
    /// # Errors
    /// [`LaunchError`] if it cannot be made.
    pub fn generate(kind: JwtKeyKind, kid: &str) -> Result<Self, LaunchError> {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use base64::Engine;
        let algorithm = match kind {
            JwtKeyKind::P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            JwtKeyKind::Ed25519 => &rcgen::PKCS_ED25519,
        };
        let key = KeyPair::generate_for(algorithm).map_err(|e| failed("JWT key", e))?;
        let raw = key.public_key_raw();
        let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        let jwk = match kind {
            // An uncompressed point: 0x04, then x and y.
            JwtKeyKind::P256 => format!(
                r#"{{"kty":"EC","crv":"P-256","x":"{}","y":"{}","kid":"{kid}","use":"sig","alg":"ES256"}}"#,
                b64(&raw[1..33]),
                b64(&raw[33..65])
            ),
            JwtKeyKind::Ed25519 => format!(
                r#"{{"kty":"OKP","crv":"Ed25519","x":"{}","kid":"{kid}","use":"sig","alg":"EdDSA"}}"#,
                b64(raw)
            ),
        };
        Ok(Self {
            pem: key.serialize_pem(),
            jwk,
            kid: kid.to_owned(),
        })
    }

    /// A JWKS document (`{"keys": [...]}`) of `keys`.
    pub fn set(keys: &[&JwtKey]) -> String {
        let keys: Vec<&str> = keys.iter().map(|k| k.jwk.as_str()).collect();
        format!(r#"{{"keys":[{}]}}"#, keys.join(","))
    }
}
