//! Private keys: reading PEM keys in the usual encodings (PKCS#8
//! `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY`, SEC1 `EC PRIVATE KEY`),
//! normalising them to PKCS#8, and checking that a key belongs to a
//! certificate.
//!
//! Supported algorithms: RSA, ECDSA on P-256, P-384 and P-521, Ed25519.

use minijinja::Error;
use pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use rsa::pkcs1::DecodeRsaPrivateKey;

use crate::args::fail;
use crate::pemutil;

/// A private key in PKCS#8 form with its public key (SubjectPublicKeyInfo).
pub(crate) struct PrivateKey {
    /// PKCS#8 DER.
    pub pkcs8: Vec<u8>,
    /// SubjectPublicKeyInfo DER, canonical encoding.
    pub spki: Vec<u8>,
}

/// PKCS#8 and SPKI of an EC secret key (same code for every curve crate).
macro_rules! ec_key {
    ($func:expr, $secret:expr) => {{
        let secret = $secret;
        let pkcs8 = secret
            .to_pkcs8_der()
            .map_err(|_| fail($func, "the private key cannot be encoded"))?;
        let spki = secret
            .public_key()
            .to_public_key_der()
            .map_err(|_| fail($func, "the public key cannot be encoded"))?;
        Ok(PrivateKey {
            pkcs8: pkcs8.as_bytes().to_vec(),
            spki: spki.into_vec(),
        })
    }};
}

fn rsa_key(func: &str, key: rsa::PrivateKey) -> Result<PrivateKey, Error> {
    let pkcs8 = key
        .to_pkcs8_der()
        .map_err(|_| fail(func, "the private key cannot be encoded"))?;
    let spki = key
        .to_public_key()
        .to_public_key_der()
        .map_err(|_| fail(func, "the public key cannot be encoded"))?;
    Ok(PrivateKey {
        pkcs8: pkcs8.as_bytes().to_vec(),
        spki: spki.into_vec(),
    })
}

/// PKCS#8 v1 (RFC 8410) of an Ed25519 key, without the optional public
/// key: the form OpenSSL 3.0 and Go read (ed25519-dalek writes v2).
fn ed25519_pkcs8(key: &ed25519_dalek::SigningKey) -> pkcs8::Result<pkcs8::SecretDocument> {
    ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    }
    .to_pkcs8_der()
}

/// PEM of [`ed25519_pkcs8`].
pub(crate) fn ed25519_pkcs8_pem(key: &ed25519_dalek::SigningKey) -> pkcs8::Result<String> {
    Ok(ed25519_pkcs8(key)?
        .to_pem("PRIVATE KEY", pkcs8::LineEnding::LF)?
        .to_string())
}

fn ed25519_key(func: &str, key: ed25519_dalek::SigningKey) -> Result<PrivateKey, Error> {
    let pkcs8 = ed25519_pkcs8(&key).map_err(|_| fail(func, "the private key cannot be encoded"))?;
    let spki = key
        .verifying_key()
        .to_public_key_der()
        .map_err(|_| fail(func, "the public key cannot be encoded"))?;
    Ok(PrivateKey {
        pkcs8: pkcs8.as_bytes().to_vec(),
        spki: spki.into_vec(),
    })
}

/// Reads a PKCS#8 DER private key of a supported algorithm.
pub(crate) fn from_pkcs8(func: &str, der: &[u8]) -> Result<PrivateKey, Error> {
    if let Ok(key) = p256::SecretKey::from_pkcs8_der(der) {
        return ec_key!(func, key);
    }
    if let Ok(key) = p384::SecretKey::from_pkcs8_der(der) {
        return ec_key!(func, key);
    }
    if let Ok(key) = p521::SecretKey::from_pkcs8_der(der) {
        return ec_key!(func, key);
    }
    if let Ok(key) = ed25519_dalek::SigningKey::from_pkcs8_der(der) {
        return ed25519_key(func, key);
    }
    if let Ok(key) = rsa::PrivateKey::from_pkcs8_der(der) {
        return rsa_key(func, key);
    }
    Err(fail(
        func,
        "the private key is not a valid RSA, EC (P-256/P-384/P-521) or Ed25519 key",
    ))
}

fn from_sec1(func: &str, der: &[u8]) -> Result<PrivateKey, Error> {
    if let Ok(key) = p256::SecretKey::from_sec1_der(der) {
        return ec_key!(func, key);
    }
    if let Ok(key) = p384::SecretKey::from_sec1_der(der) {
        return ec_key!(func, key);
    }
    if let Ok(key) = p521::SecretKey::from_sec1_der(der) {
        return ec_key!(func, key);
    }
    Err(fail(
        func,
        "the EC private key is not valid or not on P-256, P-384 or P-521",
    ))
}

fn from_pkcs1(func: &str, der: &[u8]) -> Result<PrivateKey, Error> {
    let key = rsa::PrivateKey::from_pkcs1_der(der)
        .map_err(|_| fail(func, "the RSA private key is not valid"))?;
    rsa_key(func, key)
}

/// Reads the first private key block of a PEM text.
pub(crate) fn from_pem(func: &str, input: &str) -> Result<PrivateKey, Error> {
    for block in pemutil::parse(func, input)? {
        let tag = block.tag().to_ascii_uppercase();
        match tag.as_str() {
            "PRIVATE KEY" => return from_pkcs8(func, block.contents()),
            "RSA PRIVATE KEY" => {
                if block.headers().get("Proc-Type").is_some() {
                    return Err(fail(
                        func,
                        "the private key is encrypted; only unencrypted keys are supported",
                    ));
                }
                return from_pkcs1(func, block.contents());
            }
            "EC PRIVATE KEY" => {
                if block.headers().get("Proc-Type").is_some() {
                    return Err(fail(
                        func,
                        "the private key is encrypted; only unencrypted keys are supported",
                    ));
                }
                return from_sec1(func, block.contents());
            }
            "ENCRYPTED PRIVATE KEY" => {
                return Err(fail(
                    func,
                    "the private key is encrypted; only unencrypted keys are supported",
                ));
            }
            _ => {}
        }
    }
    Err(fail(func, "the key input holds no private key PEM block"))
}

/// The canonical DER of a SubjectPublicKeyInfo of a supported algorithm, so
/// a certificate's key compares equal to the one derived from a private key
/// whatever encoding details the certificate used.
pub(crate) fn canonical_spki(spki: &[u8]) -> Option<Vec<u8>> {
    fn reencode<K: DecodePublicKey + EncodePublicKey>(spki: &[u8]) -> Option<Vec<u8>> {
        let key = K::from_public_key_der(spki).ok()?;
        Some(key.to_public_key_der().ok()?.into_vec())
    }
    reencode::<p256::PublicKey>(spki)
        .or_else(|| reencode::<p384::PublicKey>(spki))
        .or_else(|| reencode::<p521::PublicKey>(spki))
        .or_else(|| reencode::<ed25519_dalek::VerifyingKey>(spki))
        .or_else(|| reencode::<rsa::PublicKey>(spki))
}

/// Whether the private key belongs to the certificate's public key.
pub(crate) fn matches(key: &PrivateKey, cert_spki: &[u8]) -> bool {
    canonical_spki(cert_spki).is_some_and(|spki| spki == key.spki)
}
