//! What the work of the helpers costs in fuel, in one place.
//!
//! Fuel is meant to track CPU time: minijinja charges one fuel per
//! instruction and one per 64 bytes of data it produces, which is about
//! 20–50 ns of CPU each (key derivations, charged at the rates of
//! `keystore`, run at up to about 300 ns a fuel). The helpers of both engines charge for their
//! work on the same scale, before doing it: bytes read, hashed, encoded or
//! produced, nodes of a nested value walked, key derivations of a PKCS#12
//! bundle. Sizes are computed with saturating arithmetic, so a huge
//! argument costs more fuel than any render has instead of overflowing.

/// Bytes of data one fuel pays for (minijinja's rate).
pub(crate) const BYTES_PER_FUEL: u64 = 64;

/// Fuel for one node of a nested value (a list item, a map entry) visited
/// by a walk: printing, comparing, encoding.
pub(crate) const NODE: u64 = 1;

/// Fuel for one node of a nested value built by a walk: converting between
/// the engines' values, to or from JSON, copying (each node is an
/// allocation, about 100 ns).
pub(crate) const VALUE_NODE: u64 = 4;

/// Fuel of a render before its first instruction, besides its source and
/// data: state, scope, output buffer.
pub(crate) const RENDER_SETUP: u64 = 16;

/// Fuel of parsing one byte of template source (minijinja compiles about
/// 50 ns a byte; Go templates parse as slowly).
pub(crate) const PARSE_FUEL_PER_BYTE: u64 = 2;

/// Bytes of secret data one fuel pays for when the data is copied into a
/// render's values (a copy, cheaper than building data).
pub(crate) const DATA_BYTES_PER_FUEL: u64 = 256;

/// Fuel of each secret copied into a render's values (its map, its
/// allocations).
pub(crate) const SECRET_FUEL: u64 = 8;

/// Fuel of compiling one regular expression (the compiled program is at
/// most [`REGEX_PROGRAM_BYTES`]; Unicode classes alone take a few hundred
/// microseconds to build).
pub(crate) const REGEX_COMPILE: u64 = 24_000;

/// Largest compiled program of a regular expression.
pub(crate) const REGEX_PROGRAM_BYTES: usize = 256 * 1024;

/// Largest lazy-DFA cache of a regular expression.
pub(crate) const REGEX_DFA_BYTES: usize = 512 * 1024;

/// Haystack bytes one fuel pays for when a regular expression searches it.
pub(crate) const REGEX_BYTES_PER_FUEL: u64 = 2;

/// Fuel of each match a regular expression finds (resolving captures).
pub(crate) const REGEX_MATCH: u64 = 4;

/// Fuel for `n` bytes of data (at least one).
pub(crate) fn bytes(n: u64) -> u64 {
    n.div_ceil(BYTES_PER_FUEL).max(1)
}

/// Fuel for `n` bytes of data, `n` a `usize`.
pub(crate) fn bytes_usize(n: usize) -> u64 {
    bytes(n as u64)
}

/// Bytes that `fuel` pays for (saturating).
pub(crate) fn bytes_for(fuel: u64) -> u64 {
    fuel.saturating_mul(BYTES_PER_FUEL)
}

/// Fuel for hashing `n` bytes (or a transform as slow, byte by byte):
/// `wide` for SHA-512 and the slower transforms (16 bytes a fuel), else
/// SHA-1 and SHA-256, which CPUs accelerate (32 bytes a fuel).
pub(crate) fn hash(n: usize, wide: bool) -> u64 {
    let per_fuel = if wide { 16 } else { 32 };
    (n as u64).div_ceil(per_fuel).max(1)
}

/// Fuel for a regular expression searching `n` bytes.
pub(crate) fn regex_scan(n: usize) -> u64 {
    (n as u64).div_ceil(REGEX_BYTES_PER_FUEL).max(1)
}

/// Fuel for `n` nodes.
pub(crate) fn nodes(n: u64) -> u64 {
    n.saturating_mul(NODE)
}

/// Fuel of parsing `source_bytes` bytes of template.
pub(crate) fn parse(source_bytes: usize) -> u64 {
    (source_bytes as u64).saturating_mul(PARSE_FUEL_PER_BYTE)
}

/// Fuel of a render's setup: its source parsed once, its `secrets`
/// secrets of `data_bytes` bytes copied into the engine's values.
pub(crate) fn render_setup(source_bytes: usize, secrets: usize, data_bytes: u64) -> u64 {
    RENDER_SETUP
        .saturating_add(parse(source_bytes))
        .saturating_add((secrets as u64).saturating_mul(SECRET_FUEL))
        .saturating_add(data_bytes.div_ceil(DATA_BYTES_PER_FUEL))
}
