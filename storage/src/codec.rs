//! Record encoding: one schema-version byte, then bincode 2 (standard
//! configuration: little endian, variable-length integers).
//!
//! The schema byte is bumped whenever a record type changes shape; a record
//! written under another schema then decodes as an error (a miss for the
//! caller) instead of being misread. Decoding is bounded
//! ([`MAX_RECORD_BYTES`]) and rejects trailing bytes, so garbage never
//! allocates without limit and never decodes "by accident" into a shorter value.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::StorageError;

/// Schema of [`SyncRecord`](crate::SyncRecord) values.
pub(crate) const SYNC_SCHEMA: u8 = 1;
/// Schema of the times records that move a sync record's times on.
pub(crate) const TIMES_SCHEMA: u8 = 1;
/// Schema of [`LeaseRecord`](crate::LeaseRecord) values.
pub(crate) const LEASE_SCHEMA: u8 = 1;
/// Schema of [`TokenRecord`](crate::TokenRecord) values (the plaintext inside
/// the encryption, and the byte in front of the nonce).
pub(crate) const TOKEN_SCHEMA: u8 = 1;

/// Upper bound of one encoded record; larger lengths in the input are refused
/// before anything is allocated.
pub(crate) const MAX_RECORD_BYTES: usize = 1 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_RECORD_BYTES>()
}

/// Why a stored value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeFailure {
    /// Zero bytes: not even a schema byte.
    Empty,
    /// Written under another schema version.
    Schema { found: u8, expected: u8 },
    /// The payload is not a valid encoding of the record.
    Payload(String),
    /// The payload decoded but bytes were left over.
    Trailing(usize),
    /// The token could not be decrypted (other key, or tampered).
    Decrypt,
}

impl fmt::Display for DecodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeFailure::Empty => f.write_str("empty value"),
            DecodeFailure::Schema { found, expected } => {
                write!(f, "schema version {found}, expected {expected}")
            }
            DecodeFailure::Payload(reason) => write!(f, "undecodable payload: {reason}"),
            DecodeFailure::Trailing(n) => write!(f, "{n} trailing bytes after the record"),
            DecodeFailure::Decrypt => {
                f.write_str("token could not be decrypted (encryption key changed?)")
            }
        }
    }
}

/// Encodes `value` behind `schema`.
pub(crate) fn encode<T: Serialize>(schema: u8, value: &T) -> Result<Vec<u8>, StorageError> {
    let payload = encode_payload(value)?;
    let mut out = Vec::with_capacity(1 + payload.len());
    out.push(schema);
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Encodes `value` without a schema byte (for the encrypted token plaintext).
pub(crate) fn encode_payload<T: Serialize>(value: &T) -> Result<Vec<u8>, StorageError> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| StorageError::Encode(e.to_string()))
}

/// Checks the schema byte and returns the payload behind it.
pub(crate) fn split_schema(expected: u8, bytes: &[u8]) -> Result<&[u8], DecodeFailure> {
    match bytes.split_first() {
        None => Err(DecodeFailure::Empty),
        Some((&found, rest)) if found == expected => Ok(rest),
        Some((&found, _)) => Err(DecodeFailure::Schema { found, expected }),
    }
}

/// Decodes a value written by [`encode`] under `expected`.
pub(crate) fn decode<T: DeserializeOwned>(expected: u8, bytes: &[u8]) -> Result<T, DecodeFailure> {
    decode_payload(split_schema(expected, bytes)?)
}

/// Decodes a payload written by [`encode_payload`]; the whole slice must be used.
pub(crate) fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, DecodeFailure> {
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(payload, config())
        .map_err(|e| DecodeFailure::Payload(e.to_string()))?;
    if used != payload.len() {
        return Err(DecodeFailure::Trailing(payload.len() - used));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::{LeaseRecord, SyncRecord};

    fn sync_record() -> impl Strategy<Value = SyncRecord> {
        (
            any::<i64>(),
            proptest::option::of(".{0,40}"),
            proptest::collection::btree_map(".{0,30}", any::<[u8; 32]>(), 0..6),
            any::<i64>(),
            any::<i64>(),
            any::<u32>(),
        )
            .prop_map(
                |(generation, etag, target_hashes, last, next, keys)| SyncRecord {
                    generation,
                    etag,
                    target_hashes,
                    last_sync_unix_ms: last,
                    next_due_unix_ms: next,
                    synced_keys: keys,
                },
            )
    }

    fn lease_record() -> impl Strategy<Value = LeaseRecord> {
        (".{0,60}", any::<i64>(), any::<i64>()).prop_map(|(lease_id, version, expires)| {
            LeaseRecord {
                lease_id,
                version,
                expires_at_unix_ms: expires,
            }
        })
    }

    proptest! {
        #[test]
        fn sync_records_round_trip(record in sync_record()) {
            let bytes = encode(SYNC_SCHEMA, &record).unwrap();
            prop_assert_eq!(bytes[0], SYNC_SCHEMA);
            prop_assert_eq!(decode::<SyncRecord>(SYNC_SCHEMA, &bytes), Ok(record));
        }

        #[test]
        fn lease_records_round_trip(record in lease_record()) {
            let bytes = encode(LEASE_SCHEMA, &record).unwrap();
            prop_assert_eq!(decode::<LeaseRecord>(LEASE_SCHEMA, &bytes), Ok(record));
        }

        #[test]
        fn another_schema_byte_never_decodes(record in sync_record(), other in any::<u8>()) {
            prop_assume!(other != SYNC_SCHEMA);
            let mut bytes = encode(SYNC_SCHEMA, &record).unwrap();
            bytes[0] = other;
            prop_assert_eq!(
                decode::<SyncRecord>(SYNC_SCHEMA, &bytes),
                Err(DecodeFailure::Schema { found: other, expected: SYNC_SCHEMA })
            );
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<SyncRecord>(SYNC_SCHEMA, &bytes);
            let _ = decode::<LeaseRecord>(LEASE_SCHEMA, &bytes);
        }

        #[test]
        fn truncation_is_an_error(record in sync_record(), cut in 1usize..64) {
            let bytes = encode(SYNC_SCHEMA, &record).unwrap();
            let keep = bytes.len().saturating_sub(cut).max(1);
            prop_assume!(keep < bytes.len());
            prop_assert!(decode::<SyncRecord>(SYNC_SCHEMA, &bytes[..keep]).is_err());
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode(LEASE_SCHEMA, &LeaseRecord::default()).unwrap();
        bytes.push(0);
        assert_eq!(
            decode::<LeaseRecord>(LEASE_SCHEMA, &bytes),
            Err(DecodeFailure::Trailing(1))
        );
    }

    #[test]
    fn empty_and_huge_lengths_are_refused() {
        assert_eq!(
            decode::<LeaseRecord>(LEASE_SCHEMA, &[]),
            Err(DecodeFailure::Empty)
        );
        // Schema byte, then a varint length prefix of u64::MAX for the string.
        let mut bytes = vec![LEASE_SCHEMA, 253];
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode::<LeaseRecord>(LEASE_SCHEMA, &bytes),
            Err(DecodeFailure::Payload(_))
        ));
    }

    #[test]
    fn map_of_hashes_encodes_compactly() {
        let record = SyncRecord {
            target_hashes: BTreeMap::from([("Secret/ns/a".to_string(), [7u8; 32])]),
            ..SyncRecord::default()
        };
        let bytes = encode(SYNC_SCHEMA, &record).unwrap();
        // schema + i64 + option tag + map len + key len + key + 32 + 3 small ints
        assert!(bytes.len() < 64, "{} bytes", bytes.len());
    }
}
