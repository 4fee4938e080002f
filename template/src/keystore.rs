//! Reading PKCS#12 bundles with bounded work.
//!
//! A bundle says how much work its password costs: every key derivation
//! (the MAC key, the key of each encrypted safe, of each shrouded private
//! key) runs as many iterations as the bundle asks for, and a bundle can
//! hold many of them. So the reader checks every derivation before running
//! it: more than [`MAX_ITERATIONS`] is refused, scrypt is refused, and each
//! derivation is charged to the render's fuel (and the render's canceller
//! checked) before it runs. Nothing is derived for bags the helpers do not
//! use (secret bags, CRL bags).
//!
//! Supported: PBES2 (PBKDF2 with HMAC-SHA-1/224/256/384/512, AES-CBC) and
//! the legacy PKCS#12 schemes (`pbeWithSHAAnd3-KeyTripleDES-CBC`,
//! `pbeWithSHAAnd40BitRC2-CBC`), MACs with SHA-1 and the SHA-2 family,
//! bundles without a MAC.
//!
//! Why the cap is 100,000: OpenSSL 3 writes 2,048 iterations by default,
//! Java's keytool 10,000 (JDK 8 wrote 50,000 for keys and 100,000 for the
//! MAC), Windows 2,000, this crate's writers 10,000. At the cap one
//! derivation takes about 15 ms (PBKDF2-HMAC-SHA256), so a cancelled render
//! stops promptly, and a bundle costs half a render's fuel; one exported
//! with a million iterations (a third of a second to read) is refused, and
//! re-exported with `openssl pkcs12 -export -iter 2048 …`.

use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockCipherDecrypt, BlockModeDecrypt, KeyInit as CipherKeyInit, KeyIvInit};
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Decode, Encode};
use hmac::{KeyInit, Mac};
use minijinja::{Error, State};
use pkcs5::pbes2;
use pkcs12::cms::cert::x509::spki::AlgorithmIdentifierOwned;
use pkcs12::cms::content_info::CmsVersion;
use pkcs12::cms::encrypted_data::EncryptedData;
use pkcs12::pbe_params::{EncryptedPrivateKeyInfo, Pkcs12PbeParams};
use pkcs12::pfx::{Pfx, Version};
use pkcs12::safe_bag::{PrivateKeyInfo, SafeContents};
use pkcs12::{AuthenticatedSafe, CertBag, MacData, SafeBag};

use crate::args::{fail, work};
use crate::cost;

/// Most iterations a key derivation of a bundle may ask for.
pub(crate) const MAX_ITERATIONS: u32 = 100_000;

/// PBKDF2 iterations (per output block) one fuel pays for, with HMAC over
/// SHA-1, SHA-224 or SHA-256 (two hashes each, about 160 ns). A bundle at
/// the cap ([`MAX_ITERATIONS`] for its MAC and both its encryptions, as
/// `openssl pkcs12 -export -iter 100000` writes it) costs half a render's
/// fuel.
const PBKDF2_ITERATIONS_PER_FUEL: u64 = 2;

/// How much more a PBKDF2 iteration costs with HMAC over SHA-384 or
/// SHA-512 (no CPU instructions for them: about 820 ns).
const PBKDF2_WIDE_WEIGHT: u64 = 5;

/// PKCS#12-KDF iterations (per output block) one fuel pays for, with SHA-1
/// or SHA-256 (one hash each, about 60 ns).
const PKCS12_KDF_ITERATIONS_PER_FUEL: u64 = 4;

/// How much more a PKCS#12-KDF iteration costs with SHA-384 or SHA-512
/// (about 500 ns).
const PKCS12_KDF_WIDE_WEIGHT: u64 = 8;

const DATA_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ENCRYPTED_DATA_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.6");
const PBES2_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.5.13");
const TDES_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.1.3");
const RC2_40_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.1.6");
const KEY_BAG_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.10.1.1");
const SHROUDED_KEY_BAG_OID: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.10.1.2");
const CERT_BAG_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.12.10.1.3");
const X509_CERT_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.22.1");
const LOCAL_KEY_ID_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.21");
const SHA1_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.14.3.2.26");
const SHA224_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.4");
const SHA256_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const SHA384_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");
const SHA512_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.3");
const SHA512_224_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.5");
const SHA512_256_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.6");

/// A private key or a certificate of a bundle.
pub(crate) struct Entry {
    /// PKCS#8 DER of a key, X.509 DER of a certificate.
    pub der: Vec<u8>,
    /// The `localKeyId` attribute, which ties a key to its certificate.
    pub local_key_id: Option<Vec<u8>>,
}

/// The keys and certificates of a bundle, in bundle order.
#[derive(Default)]
pub(crate) struct Archive {
    pub keys: Vec<Entry>,
    pub certs: Vec<Entry>,
}

/// The hash of a PBKDF2 or PKCS#12-KDF derivation, for its cost: SHA-384
/// and SHA-512 cost several times as much per iteration (CPUs have SHA
/// instructions for SHA-1 and SHA-256 only).
#[derive(Clone, Copy)]
pub(crate) struct Hash {
    /// Output bytes.
    output: usize,
    /// A 64-bit SHA-2 (SHA-384, SHA-512 and its truncations).
    wide: bool,
}

const SHA1: Hash = Hash {
    output: 20,
    wide: false,
};
const SHA224: Hash = Hash {
    output: 28,
    wide: false,
};
const SHA256: Hash = Hash {
    output: 32,
    wide: false,
};

impl Hash {
    /// Fuel of `iterations` for a key of `key_len` bytes, `per_fuel`
    /// iterations a fuel, `wide_weight` times more for a wide hash.
    fn fuel(self, iterations: u32, key_len: usize, per_fuel: u64, wide_weight: u64) -> u64 {
        let blocks = key_len.div_ceil(self.output).max(1) as u64;
        let weight = if self.wide { wide_weight } else { 1 };
        (u64::from(iterations) * blocks * weight)
            .div_ceil(per_fuel)
            .max(1)
    }
}

/// Fuel of a PBKDF2 derivation of `key_len` bytes.
pub(crate) fn pbkdf2_fuel(hash: Hash, iterations: u32, key_len: usize) -> u64 {
    hash.fuel(
        iterations,
        key_len,
        PBKDF2_ITERATIONS_PER_FUEL,
        PBKDF2_WIDE_WEIGHT,
    )
}

/// Fuel of a PKCS#12-KDF derivation of `key_len` bytes.
pub(crate) fn pkcs12_kdf_fuel(hash: Hash, iterations: u32, key_len: usize) -> u64 {
    hash.fuel(
        iterations,
        key_len,
        PKCS12_KDF_ITERATIONS_PER_FUEL,
        PKCS12_KDF_WIDE_WEIGHT,
    )
}

/// SHA-256, for the writers' costs.
pub(crate) const WRITER_HASH: Hash = SHA256;

/// Checks an iteration count a bundle asks for.
fn check_iterations(func: &str, iterations: i64) -> Result<u32, Error> {
    if iterations < 1 {
        return Err(fail(
            func,
            "the bundle's encryption parameters are invalid (no iterations)",
        ));
    }
    if iterations > i64::from(MAX_ITERATIONS) {
        return Err(fail(
            func,
            format!(
                "the bundle asks for {iterations} key-derivation iterations, more than the \
                 {MAX_ITERATIONS} accepted; re-export it with fewer, e.g. \
                 `openssl pkcs12 -export -iter 2048 …` (OpenSSL 3's default)"
            ),
        ));
    }
    Ok(iterations as u32)
}

fn invalid(func: &str) -> Error {
    fail(func, "the input is not a valid PKCS#12 bundle")
}

fn unsupported(func: &str) -> Error {
    fail(
        func,
        "the bundle uses an unsupported encryption or MAC algorithm",
    )
}

fn wrong_password(func: &str) -> Error {
    fail(
        func,
        "decryption failed: wrong password, or the bundle is corrupted",
    )
}

/// Reads a bundle: the MAC checked, the safes decrypted, the keys and
/// certificates collected. Every key derivation is checked and charged
/// before it runs.
pub(crate) fn read(
    state: &State,
    func: &str,
    data: &[u8],
    password: &str,
) -> Result<Archive, Error> {
    work(state, cost::bytes_usize(data.len()))?;
    let pfx = Pfx::from_der(data).map_err(|_| not_a_bundle(func, data))?;
    if pfx.version != Version::V3 || pfx.auth_safe.content_type != DATA_OID {
        return Err(invalid(func));
    }
    let auth_safe = octets(func, &pfx.auth_safe.content)?;
    if let Some(mac) = &pfx.mac_data {
        verify_mac(state, func, mac, password, &auth_safe)?;
    }
    let safes = AuthenticatedSafe::from_der(&auth_safe).map_err(|_| invalid(func))?;
    let mut archive = Archive::default();
    for safe in safes {
        work(state, cost::NODE)?;
        let contents = match safe.content_type {
            DATA_OID => octets(func, &safe.content)?,
            ENCRYPTED_DATA_OID => decrypt_safe(state, func, &safe.content, password)?,
            _ => return Err(invalid(func)),
        };
        let bags = SafeContents::from_der(&contents).map_err(|_| invalid(func))?;
        for bag in &bags {
            read_bag(state, func, bag, password, &mut archive)?;
        }
    }
    Ok(archive)
}

/// The error for bytes that are not a bundle (maybe still base64).
fn not_a_bundle(func: &str, data: &[u8]) -> Error {
    let base64 = data.len() >= 16
        && data
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\r' | b'\n'));
    if base64 {
        fail(
            func,
            "the input is not a PKCS#12 bundle; it looks like base64, decode it first with decodeBase64ToBytes",
        )
    } else {
        invalid(func)
    }
}

/// The bytes of an OCTET STRING held in an `ANY`.
fn octets(func: &str, any: &der::Any) -> Result<Vec<u8>, Error> {
    let der = any.to_der().map_err(|_| invalid(func))?;
    OctetString::from_der(&der)
        .map(|o| o.into_bytes().into_vec())
        .map_err(|_| invalid(func))
}

/// Checks the bundle's MAC over the authenticated safe.
fn verify_mac(
    state: &State,
    func: &str,
    mac: &MacData,
    password: &str,
    data: &[u8],
) -> Result<(), Error> {
    let iterations = check_iterations(func, i64::from(mac.iterations))?;
    let salt = mac.mac_salt.as_bytes();
    let expected = mac.mac.digest.as_bytes();
    macro_rules! verify {
        ($digest:ty, $hash:expr) => {{
            let hash: Hash = $hash;
            work(state, pkcs12_kdf_fuel(hash, iterations, hash.output))?;
            let key = pkcs12::kdf::derive_key_utf8::<$digest>(
                password,
                salt,
                pkcs12::kdf::Pkcs12KeyType::Mac,
                iterations as i32,
                hash.output,
            )
            .map_err(|_| invalid(func))?;
            work(state, cost::hash(data.len(), hash.wide))?;
            let mut mac = <hmac::Hmac<$digest> as KeyInit>::new_from_slice(&key)
                .map_err(|_| invalid(func))?;
            mac.update(data);
            mac.verify_slice(expected)
                .map_err(|_| fail(func, "wrong password, or the bundle is corrupted"))
        }};
    }
    let wide = |output| Hash { output, wide: true };
    match mac.mac.algorithm.oid {
        SHA1_OID => verify!(sha1::Sha1, SHA1),
        SHA224_OID => verify!(sha2::Sha224, SHA224),
        SHA256_OID => verify!(sha2::Sha256, SHA256),
        SHA384_OID => verify!(sha2::Sha384, wide(48)),
        SHA512_OID => verify!(sha2::Sha512, wide(64)),
        SHA512_224_OID => verify!(sha2::Sha512_224, wide(28)),
        SHA512_256_OID => verify!(sha2::Sha512_256, wide(32)),
        _ => Err(unsupported(func)),
    }
}

/// Decrypts an `EncryptedData` safe.
fn decrypt_safe(
    state: &State,
    func: &str,
    content: &der::Any,
    password: &str,
) -> Result<Vec<u8>, Error> {
    let der = content.to_der().map_err(|_| invalid(func))?;
    let data = EncryptedData::from_der(&der).map_err(|_| invalid(func))?;
    if data.version != CmsVersion::V0 {
        return Err(invalid(func));
    }
    let info = &data.enc_content_info;
    match &info.encrypted_content {
        Some(ciphertext) => decrypt(
            state,
            func,
            &info.content_enc_alg,
            ciphertext.as_bytes(),
            password,
        ),
        None => Ok(Vec::new()),
    }
}

/// Decrypts with a password-based scheme: PBES2 or a legacy PKCS#12 one.
fn decrypt(
    state: &State,
    func: &str,
    alg: &AlgorithmIdentifierOwned,
    ciphertext: &[u8],
    password: &str,
) -> Result<Vec<u8>, Error> {
    work(state, cost::bytes_usize(ciphertext.len()))?;
    let params = alg
        .parameters
        .as_ref()
        .ok_or_else(|| invalid(func))?
        .to_der()
        .map_err(|_| invalid(func))?;
    match alg.oid {
        PBES2_OID => decrypt_pbes2(state, func, &params, ciphertext, password),
        TDES_OID => decrypt_legacy::<des::TdesEde3>(state, func, &params, ciphertext, password, 24),
        RC2_40_OID => decrypt_legacy::<rc2::Rc2>(state, func, &params, ciphertext, password, 5),
        _ => Err(unsupported(func)),
    }
}

fn decrypt_pbes2(
    state: &State,
    func: &str,
    params: &[u8],
    ciphertext: &[u8],
    password: &str,
) -> Result<Vec<u8>, Error> {
    let params = pbes2::Parameters::from_der(params).map_err(|_| unsupported(func))?;
    let pbes2::Kdf::Pbkdf2(kdf) = &params.kdf else {
        return Err(fail(
            func,
            "the bundle uses scrypt key derivation, which is not supported (re-export it with PBKDF2, OpenSSL's default)",
        ));
    };
    let iterations = check_iterations(func, i64::from(kdf.iteration_count))?;
    let hash = match kdf.prf {
        pbes2::Pbkdf2Prf::HmacWithSha1 => SHA1,
        pbes2::Pbkdf2Prf::HmacWithSha224 => SHA224,
        pbes2::Pbkdf2Prf::HmacWithSha256 => SHA256,
        pbes2::Pbkdf2Prf::HmacWithSha384 => Hash {
            output: 48,
            wide: true,
        },
        pbes2::Pbkdf2Prf::HmacWithSha512 => Hash {
            output: 64,
            wide: true,
        },
        _ => return Err(unsupported(func)),
    };
    work(
        state,
        pbkdf2_fuel(hash, iterations, params.encryption.key_size()),
    )?;
    params
        .decrypt(password.as_bytes(), ciphertext)
        .map_err(|e| match e {
            pkcs5::Error::DecryptFailed => wrong_password(func),
            _ => unsupported(func),
        })
}

/// A legacy PKCS#12 scheme: key and IV from the PKCS#12 KDF with SHA-1,
/// then the block cipher `C` in CBC mode.
fn decrypt_legacy<C>(
    state: &State,
    func: &str,
    params: &[u8],
    ciphertext: &[u8],
    password: &str,
    key_len: usize,
) -> Result<Vec<u8>, Error>
where
    C: CipherKeyInit + BlockCipherDecrypt,
{
    let params = Pkcs12PbeParams::from_der(params).map_err(|_| invalid(func))?;
    let iterations = check_iterations(func, i64::from(params.iterations))?;
    let salt = params.salt.as_bytes();
    work(
        state,
        pkcs12_kdf_fuel(SHA1, iterations, key_len)
            .saturating_add(pkcs12_kdf_fuel(SHA1, iterations, 8)),
    )?;
    let derive = |kind, len| {
        pkcs12::kdf::derive_key_utf8::<sha1::Sha1>(password, salt, kind, iterations as i32, len)
            .map_err(|_| invalid(func))
    };
    let key = derive(pkcs12::kdf::Pkcs12KeyType::EncryptionKey, key_len)?;
    let iv = derive(pkcs12::kdf::Pkcs12KeyType::Iv, 8)?;
    let cipher = cbc::Decryptor::<C>::new_from_slices(&key, &iv).map_err(|_| invalid(func))?;
    cipher
        .decrypt_padded_vec::<Pkcs7>(ciphertext)
        .map_err(|_| wrong_password(func))
}

/// The `localKeyId` of a bag.
fn local_key_id(bag: &SafeBag) -> Option<Vec<u8>> {
    let attrs = bag.bag_attributes.as_ref()?;
    let attr = attrs.iter().find(|a| a.oid == LOCAL_KEY_ID_OID)?;
    let value = attr.values.iter().next()?;
    let der = value.to_der().ok()?;
    OctetString::from_der(&der)
        .ok()
        .map(|o| o.into_bytes().into_vec())
}

/// The value of a bag (`[0] EXPLICIT`).
fn bag_value<'a, T: Decode<'a>>(func: &str, bag: &'a SafeBag) -> Result<T, Error> {
    der::asn1::ContextSpecific::<T>::from_der(&bag.bag_value)
        .map(|cs| cs.value)
        .map_err(|_| invalid(func))
}

/// Collects a key or a certificate; other bags are skipped.
fn read_bag(
    state: &State,
    func: &str,
    bag: &SafeBag,
    password: &str,
    archive: &mut Archive,
) -> Result<(), Error> {
    work(state, cost::NODE)?;
    match bag.bag_id {
        KEY_BAG_OID => {
            let key: PrivateKeyInfo = bag_value(func, bag)?;
            archive.keys.push(Entry {
                der: key.to_der().map_err(|_| invalid(func))?,
                local_key_id: local_key_id(bag),
            });
        }
        SHROUDED_KEY_BAG_OID => {
            let shrouded: EncryptedPrivateKeyInfo = bag_value(func, bag)?;
            let der = decrypt(
                state,
                func,
                &shrouded.encryption_algorithm,
                shrouded.encrypted_data.as_bytes(),
                password,
            )?;
            if pkcs8::PrivateKeyInfoRef::try_from(der.as_slice()).is_err() {
                return Err(wrong_password(func));
            }
            archive.keys.push(Entry {
                der,
                local_key_id: local_key_id(bag),
            });
        }
        CERT_BAG_OID => {
            let cert: CertBag = bag_value(func, bag)?;
            if cert.cert_id != X509_CERT_OID {
                return Err(invalid(func));
            }
            archive.certs.push(Entry {
                der: cert.cert_value.into_bytes().into_vec(),
                local_key_id: local_key_id(bag),
            });
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivations_cost_their_iterations() {
        // 100,000 PBKDF2-SHA-256 iterations for an AES-256 key: 50,000.
        assert_eq!(pbkdf2_fuel(SHA256, 100_000, 32), 50_000);
        // SHA-1 needs two blocks for 32 bytes.
        assert_eq!(pbkdf2_fuel(SHA1, 100_000, 32), 100_000);
        // The PKCS#12 KDF is one hash per iteration and block.
        assert_eq!(pkcs12_kdf_fuel(SHA256, 100_000, 32), 25_000);
        assert_eq!(pkcs12_kdf_fuel(SHA1, 100_000, 24), 50_000);
        // SHA-512 has no CPU instructions.
        let sha512 = Hash {
            output: 64,
            wide: true,
        };
        assert_eq!(pbkdf2_fuel(sha512, 100_000, 32), 250_000);
        assert_eq!(pkcs12_kdf_fuel(sha512, 100_000, 64), 200_000);
    }

    #[test]
    fn iteration_counts_are_capped() {
        assert!(check_iterations("f", 0).is_err());
        assert_eq!(check_iterations("f", 2048).unwrap(), 2048);
        assert_eq!(check_iterations("f", 100_000).unwrap(), 100_000);
        let e = check_iterations("f", 1_000_000).unwrap_err();
        let text = e.detail().unwrap_or_default();
        assert!(
            text.contains("1000000") && text.contains("-iter 2048"),
            "{text}"
        );
    }
}
