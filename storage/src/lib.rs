//! The persistent local cache of kms-operator.
//!
//! Typed records (last sync per object, dynamic leases, identity tokens) kept in
//! an embedded database under `--cache-dir`, encoded behind a one-byte schema
//! version so that an unreadable record is a cache miss, never a crash. It knows
//! nothing about Kubernetes: keys are object UIDs and values are plain structs.
//!
//! The API lands with the cache issue; until then the operator runs without a
//! persistent cache.
