//! Identifiers and random material: deterministic UUIDv5 ids for objects
//! the seed creates (stable across runs), random UUIDv4 ids for objects
//! created at run time, and random strings for minted credentials.

use ring::rand::{SecureRandom, SystemRandom};
use uuid::Uuid;

/// Namespace of every derived id (a fixed random UUID of this project).
const NAMESPACE: Uuid = Uuid::from_u128(0x6b1f_4a0e_93c2_4d57_8e61_2f0c_d4a9_b735);

/// The id of an object of `kind` named by `parts` (for example the project
/// id, the environment and the path of a folder).
pub(crate) fn derived(kind: &str, parts: &[&str]) -> String {
    let mut name = String::from(kind);
    for part in parts {
        name.push('\u{1f}');
        name.push_str(part);
    }
    Uuid::new_v5(&NAMESPACE, name.as_bytes()).to_string()
}

/// Fill `buf` from the operating system's generator.
pub(crate) fn fill(buf: &mut [u8]) {
    SystemRandom::new()
        .fill(buf)
        .expect("the operating system's random generator failed");
}

/// A random (version 4) UUID.
pub(crate) fn random_uuid() -> String {
    let mut bytes = [0u8; 16];
    fill(&mut bytes);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// A random u64.
pub(crate) fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// A random string of `len` characters drawn uniformly from `alphabet`.
pub(crate) fn random_string(len: usize, alphabet: &[u8]) -> String {
    let n = alphabet.len();
    // Largest multiple of n that fits in a byte, for rejection sampling.
    let limit = 256 - 256 % n;
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        fill(&mut buf);
        for &b in &buf {
            if (b as usize) < limit && out.len() < len {
                out.push(char::from(alphabet[b as usize % n]));
            }
        }
    }
    out
}

/// Letters and digits.
pub(crate) const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
/// Lower-case letters and digits.
pub(crate) const LOWER_ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let a = derived("project", &["demo"]);
        assert_eq!(a, derived("project", &["demo"]));
        assert_ne!(a, derived("project", &["demo2"]));
        assert_ne!(
            derived("folder", &["a", "bc"]),
            derived("folder", &["ab", "c"])
        );
        assert_eq!(Uuid::parse_str(&a).map(|u| u.get_version_num()), Ok(5));
    }

    #[test]
    fn random_values() {
        let id = random_uuid();
        assert_eq!(Uuid::parse_str(&id).map(|u| u.get_version_num()), Ok(4));
        assert_ne!(id, random_uuid());
        let s = random_string(40, LOWER_ALNUM);
        assert_eq!(s.len(), 40);
        assert!(s.bytes().all(|b| LOWER_ALNUM.contains(&b)));
    }
}
