//! Private keys: reading PEM keys in the usual encodings (PKCS#8
//! `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY`, SEC1 `EC PRIVATE KEY`),
//! normalising them to PKCS#8, and checking that a key belongs to a
//! certificate.
//!
//! Supported algorithms: RSA, ECDSA on P-256, P-384 and P-521, Ed25519.

use minijinja::{Error, State};
use pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use rsa::pkcs1::DecodeRsaPrivateKey;

use crate::args::{fail, work};
use crate::pemutil;

/// Fuel of an EC key on P-256 (reading it and deriving its public key:
/// a scalar multiplication or two, about 0.6 ms).
pub(crate) const P256_FUEL: u64 = 20_000;

/// Fuel of an EC key on P-384 (about 2 ms).
pub(crate) const P384_FUEL: u64 = 72_000;

/// Fuel of an EC key on P-521 (about 1.5 ms).
pub(crate) const P521_FUEL: u64 = 48_000;

/// Fuel of an Ed25519 key (about 40 µs).
pub(crate) const ED25519_FUEL: u64 = 2_000;

/// Fuel of an RSA key besides its size.
const RSA_BASE_FUEL: u64 = 2_000;

/// Fuel per KiB³ of an RSA key's DER: reading it checks it with
/// arithmetic on its modulus, which grows with the cube of its size (a
/// 4096-bit key, 2.3 KiB, takes about 0.4 ms; a 16384-bit one, 28 ms).
const RSA_KIB3_FUEL: u64 = 1_000;

/// Fuel of an RSA key of `der_len` bytes of DER.
pub(crate) fn rsa_fuel(der_len: usize) -> u64 {
    let kib = (der_len as u64).div_ceil(1024);
    RSA_BASE_FUEL.saturating_add(kib.saturating_pow(3).saturating_mul(RSA_KIB3_FUEL))
}

/// The most an EC key costs, when its curve is not known yet.
const EC_FUEL: u64 = P384_FUEL;

const RSA_OID: pkcs8::ObjectIdentifier =
    pkcs8::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const ED25519_OID: pkcs8::ObjectIdentifier = pkcs8::ObjectIdentifier::new_unwrap("1.3.101.112");
const P256_OID: pkcs8::ObjectIdentifier =
    pkcs8::ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const P384_OID: pkcs8::ObjectIdentifier = pkcs8::ObjectIdentifier::new_unwrap("1.3.132.0.34");
const P521_OID: pkcs8::ObjectIdentifier = pkcs8::ObjectIdentifier::new_unwrap("1.3.132.0.35");

/// Fuel of reading the PKCS#8 key `der`, from its algorithm (read without
/// any arithmetic), before the key itself is read.
fn pkcs8_fuel(der: &[u8]) -> u64 {
    let Ok(info) = pkcs8::PrivateKeyInfoRef::try_from(der) else {
        return RSA_BASE_FUEL;
    };
    let curve = info
        .algorithm
        .parameters
        .and_then(|p| p.decode_as::<pkcs8::ObjectIdentifier>().ok());
    match (info.algorithm.oid, curve) {
        (RSA_OID, _) => rsa_fuel(der.len()),
        (ED25519_OID, _) => ED25519_FUEL,
        (_, Some(P256_OID)) => P256_FUEL,
        (_, Some(P384_OID)) => P384_FUEL,
        (_, Some(P521_OID)) => P521_FUEL,
        _ => EC_FUEL,
    }
}

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

/// Reads a PKCS#8 DER private key of a supported algorithm (charged first).
pub(crate) fn from_pkcs8(state: &State, func: &str, der: &[u8]) -> Result<PrivateKey, Error> {
    work(state, pkcs8_fuel(der))?;
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

fn from_sec1(state: &State, func: &str, der: &[u8]) -> Result<PrivateKey, Error> {
    work(state, EC_FUEL)?;
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

fn from_pkcs1(state: &State, func: &str, der: &[u8]) -> Result<PrivateKey, Error> {
    work(state, rsa_fuel(der.len()))?;
    let key = rsa::PrivateKey::from_pkcs1_der(der)
        .map_err(|_| fail(func, "the RSA private key is not valid"))?;
    rsa_key(func, key)
}

/// Reads the first private key block of a PEM text.
pub(crate) fn from_pem(state: &State, func: &str, input: &str) -> Result<PrivateKey, Error> {
    for block in pemutil::parse(state, func, input)? {
        let tag = block.tag().to_ascii_uppercase();
        match tag.as_str() {
            "PRIVATE KEY" => return from_pkcs8(state, func, block.contents()),
            "RSA PRIVATE KEY" => {
                if block.headers().get("Proc-Type").is_some() {
                    return Err(fail(
                        func,
                        "the private key is encrypted; only unencrypted keys are supported",
                    ));
                }
                return from_pkcs1(state, func, block.contents());
            }
            "EC PRIVATE KEY" => {
                if block.headers().get("Proc-Type").is_some() {
                    return Err(fail(
                        func,
                        "the private key is encrypted; only unencrypted keys are supported",
                    ));
                }
                return from_sec1(state, func, block.contents());
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
