//! Errors of the cache.
//!
//! Messages name paths, record kinds and object UIDs, never a token, a key or
//! any other secret. Engine errors are carried as text so that no type of the
//! underlying database shows in the public API.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong when opening or writing the cache.
///
/// A failed *read* is not an error of this type: lookups return
/// [`Lookup::Error`](crate::Lookup::Error) instead, so that a bad record is a
/// cache miss for the caller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Another process (or another [`Store`](crate::Store) in this process)
    /// has the cache directory open. The caller should run without a cache
    /// rather than retry in a loop.
    #[error("cache directory {path} is locked by another process or store; running without it")]
    Locked {
        /// The cache directory.
        path: PathBuf,
    },
    /// A file-system operation failed (permissions, disk full, ...).
    #[error("cache I/O error at {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The database engine reported an error that is not a corruption.
    #[error("cache database error: {0}")]
    Database(String),
    /// A new record was refused because the database is at or over
    /// [`Options::max_bytes`](crate::Options::max_bytes). Replacing or removing
    /// existing records is still allowed.
    #[error("cache is full: {size} bytes on disk, limit {limit} bytes; new record refused")]
    Full {
        /// Bytes on disk when the write was refused.
        size: u64,
        /// The configured limit.
        limit: u64,
    },
    /// A record could not be encoded (for example larger than the record size
    /// limit).
    #[error("cache record could not be encoded: {0}")]
    Encode(String),
    /// The encryption key file could not be used.
    #[error("cache encryption key file {path}: {reason}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why it was rejected (never its contents).
        reason: String,
    },
    /// The database was unreadable and could not be moved aside or recreated.
    #[error("cache recovery failed: {0}")]
    Recovery(String),
}

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io {
            path: path.into(),
            source,
        }
    }
}
