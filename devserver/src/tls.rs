//! HTTPS: the certificate chain and private key of `--tls-cert` and
//! `--tls-key` (PEM files), served with rustls and its ring provider.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::Error;

/// The acceptor of a certificate chain and its key.
pub(crate) fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, Error> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| Error::Tls(format!("{}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Tls(format!("{}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(Error::Tls(format!(
            "{}: no certificate in the file",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::Tls(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Error::Tls(format!("the certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
