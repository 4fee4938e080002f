//! PKCS#12 helpers.
//!
//! Readers (`pkcs12key`, `pkcs12keyPass`, `pkcs12cert`, `pkcs12certPass`)
//! take the binary bundle (a bytes value, usually from
//! `decodeBase64ToBytes`) and decode it with [`crate::keystore`]: modern
//! (PBES2/AES) and legacy (RC2, 3DES) encryption, with or without MAC, at
//! most [`keystore::MAX_ITERATIONS`] iterations per key derivation, each
//! derivation charged before it runs.
//!
//! Writers (`pemToPkcs12`, `pemToPkcs12Pass`, `fullPemToPkcs12`,
//! `fullPemToPkcs12Pass`) return the bundle base64-encoded. They build it
//! from the library's ASN.1 types (`pkcs12`, `cms`, `pkcs5`, `der`) rather
//! than with `p12-keystore`'s writer, because the output must be
//! deterministic: a template that renders different bytes for the same
//! inputs would change the Secret, and roll the workloads, on every sync.
//! Salts and IVs are derived from the inputs (certificates, key, password)
//! with HMAC-SHA256, so they are as unpredictable as the private key to
//! anyone who does not hold it, and identical inputs give identical bytes.
//! Encryption: PBES2 (PBKDF2-HMAC-SHA256, AES-256-CBC), MAC HMAC-SHA256,
//! both with [`ITERATIONS`] iterations — what OpenSSL 3 and Java read by
//! default. The derivations are charged before they run, like the
//! readers'.

use der::asn1::{ObjectIdentifier, OctetString, OctetStringRef, SetOfVec};
use der::{Any, Decode, Encode};
use hmac::{KeyInit, Mac};
use minijinja::{Error, State, Value};
use pkcs5::pbes2;
use pkcs12::cms::cert::x509::attr::{Attribute, AttributeValue, Attributes};
use pkcs12::cms::cert::x509::spki::AlgorithmIdentifierOwned;
use pkcs12::cms::content_info::{CmsVersion, ContentInfo};
use pkcs12::cms::encrypted_data::EncryptedData;
use pkcs12::cms::enveloped_data::EncryptedContentInfo;
use pkcs12::pbe_params::EncryptedPrivateKeyInfo;
use pkcs12::pfx::{Pfx, Version};
use pkcs12::{CertBag, DigestInfo, MacData, SafeBag};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::args::{arity, binary, fail, reserve_usize, text, work};
use crate::encoding::encode_base64;
use crate::keystore::{self, Archive, WRITER_HASH, pbkdf2_fuel, pkcs12_kdf_fuel};
use crate::pemutil::{self, CertInfo};
use crate::{cost, keys};

/// Key-derivation and MAC iterations of the bundles we write.
pub(crate) const ITERATIONS: u32 = 10_000;

/// Largest bundle the readers accept (a Secret holds at most 1 MiB).
const MAX_BUNDLE_BYTES: usize = 1024 * 1024;

const DATA_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ENCRYPTED_DATA_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.6");
const PBES2_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.5.13");
const X509_CERT_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.22.1");
const LOCAL_KEY_ID_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.21");
const SHA256_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const CERT_BAG_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.10.1.3");
const SHROUDED_KEY_BAG_OID: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.10.1.2");

// ---------------------------------------------------------------- readers

fn read(state: &State, func: &str, password: &str, bundle: &Value) -> Result<Archive, Error> {
    let data = binary(state, func, "the bundle", bundle)?;
    if data.len() > MAX_BUNDLE_BYTES {
        return Err(fail(func, "the bundle is larger than 1 MiB"));
    }
    keystore::read(state, func, data, password)
}

/// The (password, bundle) arguments of a reader.
fn reader_args<'a>(
    state: &State,
    func: &str,
    args: &'a [Value],
    with_password: bool,
) -> Result<(String, &'a Value), Error> {
    if with_password {
        arity(func, args, 2, 2)?;
        Ok((
            text(state, func, "the password", &args[0])?.into_owned(),
            &args[1],
        ))
    } else {
        arity(func, args, 1, 1)?;
        Ok((String::new(), &args[0]))
    }
}

fn key_of(func: &str, archive: &Archive) -> Result<usize, Error> {
    match archive.keys.len() {
        0 => Err(fail(func, "the bundle holds no private key")),
        1 => Ok(0),
        n => Err(fail(
            func,
            format!("the bundle holds {n} private keys; only bundles with one key are supported"),
        )),
    }
}

fn key_pem(state: &State, func: &str, args: &[Value], with_password: bool) -> Result<Value, Error> {
    let (password, bundle) = reader_args(state, func, args, with_password)?;
    let archive = read(state, func, &password, bundle)?;
    let key = &archive.keys[key_of(func, &archive)?];
    reserve_usize(state, key.der.len().saturating_mul(2))?;
    Ok(Value::from(pemutil::encode("PRIVATE KEY", &key.der)))
}

fn cert_pem(
    state: &State,
    func: &str,
    args: &[Value],
    with_password: bool,
) -> Result<Value, Error> {
    let (password, bundle) = reader_args(state, func, args, with_password)?;
    let archive = read(state, func, &password, bundle)?;
    let mut certs: Vec<CertInfo> = Vec::new();
    let mut key_ids: Vec<Option<Vec<u8>>> = Vec::new();
    for bag in &archive.certs {
        let der = bag.der.as_slice();
        work(state, cost::nodes(certs.len() as u64))?;
        if certs.iter().any(|c| c.der == der) {
            continue;
        }
        certs.push(CertInfo::from_der(state, func, der)?);
        key_ids.push(bag.local_key_id.clone());
    }
    if certs.is_empty() {
        return Err(fail(func, "the bundle holds no certificate"));
    }
    // The leaf is the certificate of the key: same local key id, else same
    // public key.
    let leaf = match archive.keys.as_slice() {
        [key] => {
            let by_id = key.local_key_id.as_ref().and_then(|id| {
                key_ids
                    .iter()
                    .position(|k| k.as_deref() == Some(id.as_ref()))
            });
            by_id.or_else(|| {
                let parsed = keys::from_pkcs8(state, func, &key.der).ok()?;
                certs.iter().position(|c| keys::matches(&parsed, &c.spki))
            })
        }
        _ => None,
    };
    work(state, pemutil::order_fuel(certs.len()))?;
    let ordered = pemutil::order(&certs, leaf);
    let der_bytes: usize = certs.iter().map(|c| c.der.len()).sum();
    reserve_usize(state, der_bytes.saturating_mul(2))?;
    let mut out = String::new();
    for i in ordered.order {
        out.push_str(&pemutil::encode("CERTIFICATE", &certs[i].der));
    }
    Ok(Value::from(out))
}

/// `pkcs12key(p12)`: the private key as PKCS#8 `PRIVATE KEY` PEM.
pub(crate) fn pkcs12key(state: &State, args: &[Value]) -> Result<Value, Error> {
    key_pem(state, "pkcs12key", args, false)
}

/// `pkcs12keyPass(pass, p12)`.
pub(crate) fn pkcs12key_pass(state: &State, args: &[Value]) -> Result<Value, Error> {
    key_pem(state, "pkcs12keyPass", args, true)
}

/// `pkcs12cert(p12)`: the certificates, leaf → intermediates → root.
pub(crate) fn pkcs12cert(state: &State, args: &[Value]) -> Result<Value, Error> {
    cert_pem(state, "pkcs12cert", args, false)
}

/// `pkcs12certPass(pass, p12)`.
pub(crate) fn pkcs12cert_pass(state: &State, args: &[Value]) -> Result<Value, Error> {
    cert_pem(state, "pkcs12certPass", args, true)
}

// ---------------------------------------------------------------- writers

/// Derives the salts and IVs of one bundle from its inputs.
struct Derivation {
    seed: [u8; 32],
}

impl Derivation {
    fn new(password: &str, key: &[u8], certs: &[&CertInfo]) -> Derivation {
        let mut h = Sha256::new();
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        part(b"kms-template pkcs12 v1");
        part(password.as_bytes());
        part(key);
        for cert in certs {
            part(&cert.der);
        }
        Derivation {
            seed: h.finalize().into(),
        }
    }

    /// `N` (at most 32) bytes for `label`.
    fn bytes<const N: usize>(&self, func: &str, label: &str) -> Result<[u8; N], Error> {
        let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&self.seed)
            .map_err(|_| fail(func, "the bundle cannot be encrypted"))?;
        mac.update(label.as_bytes());
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; N];
        out.copy_from_slice(&full[..N]);
        Ok(out)
    }
}

fn asn1(func: &str) -> impl Fn(der::Error) -> Error + '_ {
    move |_| fail(func, "the bundle cannot be encoded")
}

/// PBES2 (PBKDF2-HMAC-SHA256, AES-256-CBC) encryption of `data`, its
/// derivation charged first.
fn encrypt(
    state: &State,
    func: &str,
    derivation: &Derivation,
    label: &str,
    password: &str,
    data: &[u8],
) -> Result<(AlgorithmIdentifierOwned, Vec<u8>), Error> {
    work(state, pbkdf2_fuel(WRITER_HASH, ITERATIONS, 32))?;
    work(state, cost::bytes_usize(data.len()))?;
    let salt: [u8; 16] = derivation.bytes(func, &format!("{label} salt"))?;
    let iv: [u8; 16] = derivation.bytes(func, &format!("{label} iv"))?;
    let params = pbes2::Parameters::generate_pbkdf2_sha256_aes256cbc(ITERATIONS, &salt, iv)
        .map_err(|_| fail(func, "the bundle cannot be encrypted"))?;
    let encrypted = params
        .encrypt(password.as_bytes(), data)
        .map_err(|_| fail(func, "the bundle cannot be encrypted"))?;
    let alg = AlgorithmIdentifierOwned {
        oid: PBES2_OID,
        parameters: Some(Any::from_der(&params.to_der().map_err(asn1(func))?).map_err(asn1(func))?),
    };
    Ok((alg, encrypted))
}

fn local_key_id_attributes(func: &str, id: &[u8]) -> Result<Attributes, Error> {
    let value: AttributeValue = Any::from_der(
        &OctetStringRef::new(id)
            .map_err(asn1(func))?
            .to_der()
            .map_err(asn1(func))?,
    )
    .map_err(asn1(func))?;
    let mut attrs = Attributes::new();
    attrs
        .insert(Attribute {
            oid: LOCAL_KEY_ID_OID,
            values: SetOfVec::from_iter([value]).map_err(asn1(func))?,
        })
        .map_err(asn1(func))?;
    Ok(attrs)
}

/// Builds the DER of a PKCS#12 bundle: the key, the leaf (`chain[0]`) and
/// the CA certificates.
fn build(
    state: &State,
    func: &str,
    password: &str,
    key: &keys::PrivateKey,
    chain: &[&CertInfo],
) -> Result<Vec<u8>, Error> {
    let derivation = Derivation::new(password, &key.pkcs8, chain);
    let local_key_id = Sha1::digest(&chain[0].der).to_vec();

    // Certificates, in an encrypted safe.
    let mut cert_bags = Vec::with_capacity(chain.len());
    for (i, cert) in chain.iter().enumerate() {
        let bag = CertBag {
            cert_id: X509_CERT_OID,
            cert_value: OctetString::new(cert.der.clone()).map_err(asn1(func))?,
        };
        cert_bags.push(SafeBag {
            bag_id: CERT_BAG_OID,
            bag_value: bag.to_der().map_err(asn1(func))?,
            bag_attributes: if i == 0 {
                Some(local_key_id_attributes(func, &local_key_id)?)
            } else {
                None
            },
        });
    }
    let (alg, encrypted) = encrypt(
        state,
        func,
        &derivation,
        "certificates",
        password,
        &cert_bags.to_der().map_err(asn1(func))?,
    )?;
    let certs_safe = ContentInfo {
        content_type: ENCRYPTED_DATA_OID,
        content: Any::from_der(
            &EncryptedData {
                version: CmsVersion::V0,
                enc_content_info: EncryptedContentInfo {
                    content_type: DATA_OID,
                    content_enc_alg: alg,
                    encrypted_content: Some(OctetString::new(encrypted).map_err(asn1(func))?),
                },
                unprotected_attrs: None,
            }
            .to_der()
            .map_err(asn1(func))?,
        )
        .map_err(asn1(func))?,
    };

    // The key, as a shrouded key bag in a plain safe.
    let (alg, encrypted) = encrypt(state, func, &derivation, "key", password, &key.pkcs8)?;
    let key_bag = SafeBag {
        bag_id: SHROUDED_KEY_BAG_OID,
        bag_value: EncryptedPrivateKeyInfo {
            encryption_algorithm: alg,
            encrypted_data: OctetString::new(encrypted).map_err(asn1(func))?,
        }
        .to_der()
        .map_err(asn1(func))?,
        bag_attributes: Some(local_key_id_attributes(func, &local_key_id)?),
    };
    let keys_safe = ContentInfo {
        content_type: DATA_OID,
        content: Any::from_der(
            &OctetString::new(vec![key_bag].to_der().map_err(asn1(func))?)
                .map_err(asn1(func))?
                .to_der()
                .map_err(asn1(func))?,
        )
        .map_err(asn1(func))?,
    };

    // The authenticated safe and its MAC.
    let safes = vec![certs_safe, keys_safe].to_der().map_err(asn1(func))?;
    let mac_salt: [u8; 16] = derivation.bytes(func, "mac salt")?;
    work(state, pkcs12_kdf_fuel(WRITER_HASH, ITERATIONS, 32))?;
    let mac_key = pkcs12::kdf::derive_key_utf8::<Sha256>(
        password,
        &mac_salt,
        pkcs12::kdf::Pkcs12KeyType::Mac,
        ITERATIONS as i32,
        32,
    )
    .map_err(asn1(func))?;
    let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&mac_key)
        .map_err(|_| fail(func, "the bundle cannot be authenticated"))?;
    mac.update(&safes);
    let digest = mac.finalize().into_bytes().to_vec();

    let pfx = Pfx {
        version: Version::V3,
        auth_safe: ContentInfo {
            content_type: DATA_OID,
            content: Any::from_der(
                &OctetString::new(safes)
                    .map_err(asn1(func))?
                    .to_der()
                    .map_err(asn1(func))?,
            )
            .map_err(asn1(func))?,
        },
        mac_data: Some(MacData {
            mac: DigestInfo {
                algorithm: AlgorithmIdentifierOwned {
                    oid: SHA256_OID,
                    parameters: None,
                },
                digest: OctetString::new(digest).map_err(asn1(func))?,
            },
            mac_salt: OctetString::new(mac_salt.to_vec()).map_err(asn1(func))?,
            iterations: ITERATIONS as i32,
        }),
    };
    pfx.to_der().map_err(asn1(func))
}

fn write(
    state: &State,
    func: &str,
    args: &[Value],
    with_password: bool,
    full: bool,
) -> Result<Value, Error> {
    let n = if with_password { 3 } else { 2 };
    arity(func, args, n, n)?;
    let cert_input = text(state, func, "the certificate", &args[0])?;
    let key_input = text(state, func, "the key", &args[1])?;
    let password = if with_password {
        text(state, func, "the password", &args[2])?.into_owned()
    } else {
        String::new()
    };
    let certs = pemutil::certificates(state, func, &cert_input)?;
    if certs.is_empty() {
        return Err(fail(
            func,
            "the certificate input holds no CERTIFICATE block",
        ));
    }
    let chain: Vec<&CertInfo> = if full {
        certs.iter().collect()
    } else {
        vec![&certs[0]]
    };
    let key = keys::from_pem(state, func, &key_input)?;
    if !keys::matches(&key, &chain[0].spki) {
        return Err(fail(
            func,
            "the private key does not belong to the (first) certificate",
        ));
    }
    let der = build(state, func, &password, &key, &chain)?;
    reserve_usize(state, der.len().saturating_mul(2))?;
    Ok(Value::from(encode_base64(&der)))
}

/// `pemToPkcs12(certPEM, keyPEM)`: base64 PKCS#12 of the first certificate
/// and the key, empty password.
pub(crate) fn pem_to_pkcs12(state: &State, args: &[Value]) -> Result<Value, Error> {
    write(state, "pemToPkcs12", args, false, false)
}

/// `pemToPkcs12Pass(certPEM, keyPEM, pass)`.
pub(crate) fn pem_to_pkcs12_pass(state: &State, args: &[Value]) -> Result<Value, Error> {
    write(state, "pemToPkcs12Pass", args, true, false)
}

/// `fullPemToPkcs12(chainPEM, keyPEM)`: the first certificate is the leaf,
/// the others are CA certificates, kept in the given order.
pub(crate) fn full_pem_to_pkcs12(state: &State, args: &[Value]) -> Result<Value, Error> {
    write(state, "fullPemToPkcs12", args, false, true)
}

/// `fullPemToPkcs12Pass(chainPEM, keyPEM, pass)`.
pub(crate) fn full_pem_to_pkcs12_pass(state: &State, args: &[Value]) -> Result<Value, Error> {
    write(state, "fullPemToPkcs12Pass", args, true, true)
}
