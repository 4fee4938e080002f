//! Keys, keyed hashes and token encryption (all through `ring`).
//!
//! Every cache has a random 32-byte *cache key* created at its first open and
//! kept in its `meta` tree. Working keys are derived from it with
//! HMAC-SHA256 and a label, and — when an [`EncryptionKey`] is configured —
//! from that key too, so that the database files alone are enough neither to
//! decrypt a token nor to test a guessed secret value against a stored hash:
//!
//! | working key | without encryption key | with encryption key `E` |
//! |---|---|---|
//! | data hash | `HMAC(R, "data-hash")` | `HMAC(E, "data-hash" ‖ R)` |
//! | token DB key | — | `HMAC(E, "token-id" ‖ R)` |
//! | token AES-256-GCM | — | `HMAC(E, "token-aead" ‖ R)` |
//! | key check | — | `HMAC(E, "key-check" ‖ R)` |
//!
//! (`R` is the cache key; every label is prefixed with
//! `kms-operator-cache/` and followed by a zero byte.)

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use base64::Engine as _;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::codec::DecodeFailure;
use crate::error::StorageError;
use crate::records::wipe;

/// Length of every key the cache uses.
pub(crate) const KEY_LEN: usize = 32;
const NONCE_LEN: usize = aead::NONCE_LEN;
const TAG_LEN: usize = 16;

/// The key that encrypts persisted access tokens (AES-256-GCM).
///
/// 32 random bytes. Its `Debug` output never shows them, and its memory is
/// overwritten with zeros on drop.
#[derive(Clone)]
pub struct EncryptionKey([u8; KEY_LEN]);

impl EncryptionKey {
    /// Uses 32 bytes as the key.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        EncryptionKey(bytes)
    }

    /// Reads a key file: exactly 32 raw bytes, or the base64 of 32 bytes
    /// (standard or URL-safe alphabet, padding optional, surrounding
    /// whitespace ignored). A file of exactly 32 bytes is always taken raw.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        let path = path.as_ref();
        let mut contents = std::fs::read(path).map_err(|e| StorageError::io(path, e))?;
        let key = Self::parse(&contents).map_err(|reason| StorageError::Key {
            path: path.to_path_buf(),
            reason,
        });
        wipe(&mut contents);
        key
    }

    fn parse(contents: &[u8]) -> Result<Self, String> {
        if let Ok(raw) = <[u8; KEY_LEN]>::try_from(contents) {
            return Ok(EncryptionKey(raw));
        }
        let text = contents.trim_ascii();
        let engines = [
            &base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT,
            &base64::engine::general_purpose::URL_SAFE_PAD_INDIFFERENT,
        ];
        for engine in engines {
            if let Ok(mut decoded) = engine.decode(text) {
                let key = <[u8; KEY_LEN]>::try_from(decoded.as_slice()).ok();
                let len = decoded.len();
                wipe(&mut decoded);
                return match key {
                    Some(raw) => Ok(EncryptionKey(raw)),
                    None => Err(format!(
                        "base64 decodes to {len} bytes; the key must be {KEY_LEN} bytes"
                    )),
                };
            }
        }
        Err(format!(
            "holds {} bytes that are neither {KEY_LEN} raw bytes nor base64 of {KEY_LEN} bytes",
            contents.len()
        ))
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncryptionKey([redacted])")
    }
}

impl Drop for EncryptionKey {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// HMAC-SHA256 of `label ‖ 0 ‖ context` under `key`.
fn derive(key: &[u8], label: &str, context: &[u8]) -> [u8; KEY_LEN] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(b"kms-operator-cache/");
    ctx.update(label.as_bytes());
    ctx.update(&[0]);
    ctx.update(context);
    let mut out = [0u8; KEY_LEN];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

/// Fills a fresh random cache key.
pub(crate) fn random_key(rng: &SystemRandom) -> Result<[u8; KEY_LEN], StorageError> {
    let mut key = [0u8; KEY_LEN];
    rng.fill(&mut key)
        .map_err(|_| StorageError::Database("the system random generator failed".into()))?;
    Ok(key)
}

/// The working keys of one open store.
pub(crate) struct Keys {
    pub(crate) hasher: DataHasher,
    pub(crate) tokens: Option<TokenCipher>,
    /// What `meta/key_check` must hold: empty without an encryption key.
    pub(crate) key_check: Vec<u8>,
}

impl Keys {
    pub(crate) fn derive(cache_key: &[u8; KEY_LEN], encryption: Option<&EncryptionKey>) -> Self {
        match encryption {
            None => Keys {
                hasher: DataHasher::new(&derive(cache_key, "data-hash", &[])),
                tokens: None,
                key_check: Vec::new(),
            },
            Some(EncryptionKey(e)) => {
                let mut aead_key = derive(e, "token-aead", cache_key);
                let unbound = UnboundKey::new(&aead::AES_256_GCM, &aead_key)
                    .expect("AES-256-GCM takes a 32-byte key");
                wipe(&mut aead_key);
                Keys {
                    hasher: DataHasher::new(&derive(e, "data-hash", cache_key)),
                    tokens: Some(TokenCipher {
                        id_key: hmac::Key::new(
                            hmac::HMAC_SHA256,
                            &derive(e, "token-id", cache_key),
                        ),
                        aead: LessSafeKey::new(unbound),
                        rng: SystemRandom::new(),
                    }),
                    key_check: derive(e, "key-check", cache_key).to_vec(),
                }
            }
        }
    }
}

/// A keyed hash (HMAC-SHA256) of rendered secret data.
///
/// The key belongs to one cache (and to its encryption key, if any), so the
/// same data hashes alike within a cache and across its restarts, and
/// differently in another cache. The cache stores these hashes, never values.
#[derive(Clone)]
pub struct DataHasher {
    key: hmac::Key,
}

impl DataHasher {
    fn new(key: &[u8; KEY_LEN]) -> Self {
        DataHasher {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    /// Hashes a map of keys to values.
    ///
    /// The encoding is unambiguous: the entry count, then per entry (in the
    /// map's order) the key and the value, each preceded by its length as a
    /// little-endian `u64`; so `{"a": "bc"}` and `{"ab": "c"}` differ.
    pub fn hash_map<K, V>(&self, data: &BTreeMap<K, V>) -> [u8; 32]
    where
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"map\0");
        ctx.update(&(data.len() as u64).to_le_bytes());
        for (key, value) in data {
            let key = key.as_ref().as_bytes();
            let value = value.as_ref();
            ctx.update(&(key.len() as u64).to_le_bytes());
            ctx.update(key);
            ctx.update(&(value.len() as u64).to_le_bytes());
            ctx.update(value);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// Hashes one byte string (domain-separated from [`DataHasher::hash_map`]).
    pub fn hash_bytes(&self, data: &[u8]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"bytes\0");
        ctx.update(&(data.len() as u64).to_le_bytes());
        ctx.update(data);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }
}

impl fmt::Debug for DataHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataHasher([redacted])")
    }
}

/// Seals and opens token records.
pub(crate) struct TokenCipher {
    id_key: hmac::Key,
    aead: LessSafeKey,
    rng: SystemRandom,
}

impl TokenCipher {
    /// The database key of an identity: a keyed hash, so the identity itself
    /// is not on disk.
    pub(crate) fn db_key(&self, identity: &str) -> [u8; 32] {
        let tag = hmac::sign(&self.id_key, identity.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    fn aad(schema: u8, db_key: &[u8]) -> Vec<u8> {
        let mut aad = b"kms-operator-cache/token\0".to_vec();
        aad.push(schema);
        aad.extend_from_slice(db_key);
        aad
    }

    /// `schema ‖ nonce ‖ AES-256-GCM(plaintext) ‖ tag`, bound to `db_key`.
    pub(crate) fn seal(
        &self,
        schema: u8,
        db_key: &[u8],
        plaintext: &[u8],
    ) -> Result<Vec<u8>, StorageError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| StorageError::Database("the system random generator failed".into()))?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + plaintext.len() + TAG_LEN);
        out.push(schema);
        out.extend_from_slice(&nonce);
        let mut in_out = plaintext.to_vec();
        let sealed = self.aead.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(Self::aad(schema, db_key)),
            &mut in_out,
        );
        if sealed.is_err() {
            wipe(&mut in_out);
            return Err(StorageError::Encode("token encryption failed".into()));
        }
        out.extend_from_slice(&in_out);
        Ok(out)
    }

    /// Reverses [`TokenCipher::seal`]; the caller wipes the returned plaintext.
    pub(crate) fn open(
        &self,
        schema: u8,
        db_key: &[u8],
        stored: &[u8],
    ) -> Result<Vec<u8>, DecodeFailure> {
        let body = crate::codec::split_schema(schema, stored)?;
        if body.len() < NONCE_LEN + TAG_LEN {
            return Err(DecodeFailure::Payload("sealed token too short".into()));
        }
        let (nonce, ciphertext) = body.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| DecodeFailure::Payload("bad nonce".into()))?;
        let mut in_out = ciphertext.to_vec();
        match self
            .aead
            .open_in_place(nonce, Aad::from(Self::aad(schema, db_key)), &mut in_out)
        {
            Ok(plain) => {
                let len = plain.len();
                in_out.truncate(len);
                Ok(in_out)
            }
            Err(_) => {
                wipe(&mut in_out);
                Err(DecodeFailure::Decrypt)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;

    fn keys(cache: u8, enc: Option<u8>) -> Keys {
        let enc = enc.map(|b| EncryptionKey::from_bytes([b; 32]));
        Keys::derive(&[cache; 32], enc.as_ref())
    }

    #[test]
    fn key_file_raw_and_base64() {
        let dir = tempfile::tempdir().unwrap();
        let raw: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ b'\n');
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("raw", raw.to_vec()),
            (
                "b64",
                base64::engine::general_purpose::STANDARD
                    .encode(raw)
                    .into_bytes(),
            ),
            (
                "b64-newline",
                format!(
                    "  {}\n",
                    base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)
                )
                .into_bytes(),
            ),
            (
                "b64-url",
                base64::engine::general_purpose::URL_SAFE
                    .encode(raw)
                    .into_bytes(),
            ),
        ];
        for (name, contents) in cases {
            let path = dir.path().join(name);
            std::fs::File::create(&path)
                .unwrap()
                .write_all(&contents)
                .unwrap();
            let key = EncryptionKey::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(key.0, raw, "{name}");
        }
    }

    #[test]
    fn key_file_errors_do_not_leak_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, "c2VjcmV0LXRoYXQtaXMtc2hvcnQ=\n").unwrap();
        let err = EncryptionKey::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("must be 32 bytes"), "{err}");
        assert!(!err.contains("c2VjcmV0"), "{err}");
        assert!(err.contains("20 bytes"), "{err}");
        let path = dir.path().join("junk");
        std::fs::write(&path, "not a key at all!").unwrap();
        let err = EncryptionKey::from_file(&path).unwrap_err().to_string();
        assert!(!err.contains("not a key"), "{err}");
        assert!(EncryptionKey::from_file(dir.path().join("missing")).is_err());
        assert_eq!(
            format!("{:?}", EncryptionKey::from_bytes([9; 32])),
            "EncryptionKey([redacted])"
        );
    }

    #[test]
    fn hash_is_keyed_and_unambiguous() {
        let a = keys(1, None).hasher;
        let b = keys(2, None).hasher;
        let with_enc = keys(1, Some(5)).hasher;
        let other_enc = keys(1, Some(6)).hasher;
        let data = BTreeMap::from([("k".to_string(), b"v".to_vec())]);
        assert_eq!(a.hash_map(&data), keys(1, None).hasher.hash_map(&data));
        assert_ne!(a.hash_map(&data), b.hash_map(&data));
        assert_ne!(a.hash_map(&data), with_enc.hash_map(&data));
        assert_ne!(with_enc.hash_map(&data), other_enc.hash_map(&data));

        let split1 = BTreeMap::from([("a", "bc")]);
        let split2 = BTreeMap::from([("ab", "c")]);
        assert_ne!(a.hash_map(&split1), a.hash_map(&split2));
        let two = BTreeMap::from([("a", ""), ("b", "")]);
        let one = BTreeMap::from([("a", "\0\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0b")]);
        assert_ne!(a.hash_map(&two), a.hash_map(&one));
        let empty: BTreeMap<&str, &str> = BTreeMap::new();
        assert_ne!(a.hash_map(&empty), a.hash_bytes(b""));
        assert_ne!(
            a.hash_map(&split1),
            a.hash_map(&BTreeMap::from([("a", "bd")]))
        );
    }

    #[test]
    fn sealed_tokens_open_only_with_the_same_key_and_slot() {
        let cipher = keys(1, Some(5)).tokens.unwrap();
        let slot = cipher.db_key("identity-a");
        let sealed = cipher.seal(1, &slot, b"plain token").unwrap();
        assert_eq!(sealed[0], 1);
        assert_eq!(sealed.len(), 1 + NONCE_LEN + 11 + TAG_LEN);
        assert_eq!(cipher.open(1, &slot, &sealed).unwrap(), b"plain token");
        // Fresh nonce per write.
        assert_ne!(sealed, cipher.seal(1, &slot, b"plain token").unwrap());
        // Another slot, another key, another cache, a flipped bit: all refused.
        let other_slot = cipher.db_key("identity-b");
        assert_eq!(
            cipher.open(1, &other_slot, &sealed),
            Err(DecodeFailure::Decrypt)
        );
        let wrong = keys(1, Some(6)).tokens.unwrap();
        assert_eq!(wrong.open(1, &slot, &sealed), Err(DecodeFailure::Decrypt));
        let other_cache = keys(2, Some(5)).tokens.unwrap();
        assert_eq!(
            other_cache.open(1, &slot, &sealed),
            Err(DecodeFailure::Decrypt)
        );
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(cipher.open(1, &slot, &flipped), Err(DecodeFailure::Decrypt));
        assert!(matches!(
            cipher.open(2, &slot, &sealed),
            Err(DecodeFailure::Schema { .. })
        ));
        assert!(cipher.open(1, &slot, &sealed[..10]).is_err());
    }

    #[test]
    fn key_check_depends_on_the_encryption_key() {
        assert!(keys(1, None).key_check.is_empty());
        assert_eq!(keys(1, Some(5)).key_check, keys(1, Some(5)).key_check);
        assert_ne!(keys(1, Some(5)).key_check, keys(1, Some(6)).key_check);
        assert_ne!(keys(1, Some(5)).key_check, keys(2, Some(5)).key_check);
    }

    proptest! {
        #[test]
        fn seal_open_round_trip(key in any::<[u8; 32]>(), cache in any::<[u8; 32]>(),
                                identity in ".{0,40}", plain in proptest::collection::vec(any::<u8>(), 0..200)) {
            let enc = EncryptionKey::from_bytes(key);
            let cipher = Keys::derive(&cache, Some(&enc)).tokens.unwrap();
            let slot = cipher.db_key(&identity);
            let sealed = cipher.seal(3, &slot, &plain).unwrap();
            prop_assert_eq!(cipher.open(3, &slot, &sealed).unwrap(), plain);
        }
    }
}
