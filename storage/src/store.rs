//! The store: opening (with recovery), typed reads and writes, pruning, the
//! size bound.
//!
//! On-disk layout under the cache directory:
//!
//! ```text
//! <dir>/LOCK                 advisory lock held while a Store is open
//! <dir>/db/                  the database (sled)
//! <dir>/db.corrupt-<unix>/   the last database that was moved aside, if any
//! ```
//!
//! The database lives one level below the directory the caller names so that
//! recovery can move it aside even when that directory is a volume mount
//! (which cannot be renamed).
//!
//! Trees and keys (format version 1):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `meta` | `format` | `kms-operator-cache` ‖ format version byte |
//! | `meta` | `cache_key` | 32 random bytes, created at first open |
//! | `meta` | `key_check` | empty, or a keyed check value of the encryption key |
//! | `sync` | object UID (UTF-8) | schema byte ‖ bincode([`SyncRecord`]) |
//! | `times` | object UID (UTF-8) | schema byte ‖ bincode(ETag, last sync, next due) |
//! | `lease` | object UID (UTF-8) | schema byte ‖ bincode([`LeaseRecord`]) |
//! | `token` | HMAC of the identity (32 bytes) | schema byte ‖ nonce (12) ‖ AES-256-GCM(bincode(token)) ‖ tag (16) |
//!
//! A `times` record moves the times of the sync record of the same UID on
//! without rewriting it (see [`Store::touch_sync`]); it was added within
//! format version 1, as a tree that a build without it never opens.
//!
//! The token ciphertext is bound (as associated data) to its schema byte and
//! its key, so it cannot be moved to another identity.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::codec::{self, DecodeFailure, LEASE_SCHEMA, SYNC_SCHEMA, TIMES_SCHEMA, TOKEN_SCHEMA};
use crate::crypto::{self, DataHasher, EncryptionKey, KEY_LEN, Keys, TokenCipher};
use crate::error::StorageError;
use crate::records::{AccessToken, LeaseRecord, Lookup, RecordKind, SyncRecord, TokenRecord, wipe};

/// Default size of the database's page cache in memory (4 MiB).
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 20;
/// Default bound of the database on disk (256 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// How often the engine writes dirty data in the background (milliseconds).
const FLUSH_EVERY_MS: u64 = 500;
/// How long a measured size on disk stands for the bound on new records.
const MEASURE_EVERY: Duration = Duration::from_secs(1);

const LOCK_FILE: &str = "LOCK";
const DB_DIR: &str = "db";
const CORRUPT_PREFIX: &str = "db.corrupt-";

const META_TREE: &[u8] = b"meta";
const SYNC_TREE: &[u8] = b"sync";
const TIMES_TREE: &[u8] = b"times";
const LEASE_TREE: &[u8] = b"lease";
const TOKEN_TREE: &[u8] = b"token";

const META_FORMAT: &[u8] = b"format";
const META_CACHE_KEY: &[u8] = b"cache_key";
const META_KEY_CHECK: &[u8] = b"key_check";
/// Version of the database layout (trees, key layout, meta entries). Another
/// value found on disk means the database is moved aside and recreated.
const FORMAT_VERSION: u8 = 1;
const FORMAT_MAGIC: &[u8] = b"kms-operator-cache";

/// How to open a [`Store`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Size of the in-memory page cache in bytes (default
    /// [`DEFAULT_CACHE_BYTES`]).
    pub cache_bytes: u64,
    /// Key for persisting access tokens. Without one, tokens are never
    /// written and token records left from an earlier run are deleted.
    pub encryption_key: Option<EncryptionKey>,
    /// Bound of the database on disk in bytes (default
    /// [`DEFAULT_MAX_BYTES`]; `None` for no bound). When the database is at
    /// or over it, writes that would add a record fail with
    /// [`StorageError::Full`]; replacing or removing records still works.
    /// The size is measured at most once a second, so the bound may be
    /// passed by the records added within that second.
    ///
    /// Refusing rather than evicting is deliberate: the engine is
    /// log-structured and gives space back only when it rewrites segments,
    /// so deleting old records would not bring the size down promptly and
    /// eviction would empty the cache chasing a number. A refused write
    /// costs one future KMS call; [`Store::retain`] is what frees room.
    pub max_bytes: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_bytes: DEFAULT_CACHE_BYTES,
            encryption_key: None,
            max_bytes: Some(DEFAULT_MAX_BYTES),
        }
    }
}

/// What [`Store::open`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenReport {
    /// Set when the database was unusable and has been replaced by an empty
    /// one: why (for one warning in the log).
    pub recovered: Option<String>,
    /// Where the unusable database was moved (only the latest such copy is
    /// kept).
    pub moved_to: Option<PathBuf>,
    /// Usable records found, all kinds together.
    pub records: usize,
    /// Records deleted while opening: undecodable, of another schema
    /// version, undecryptable, or invalidated by a change of the encryption
    /// key. Each one is a cache error for metrics.
    pub dropped: usize,
    /// The encryption key differs from the last open (added, removed or
    /// replaced): token and sync records were deleted, as their keys and
    /// hashes depend on it.
    pub key_changed: bool,
    /// Set when the cache directory itself could not be made private
    /// (mode 0700), e.g. a volume root owned by another user; the database
    /// inside it is private all the same. For one warning in the log.
    pub permissions: Option<String>,
}

/// The persistent cache. Cheap to clone (one shared handle); `Send + Sync`.
///
/// Dropping the last clone flushes the database and releases the directory.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    db_path: PathBuf,
    db: sled::Db,
    sync: sled::Tree,
    times: sled::Tree,
    lease: sled::Tree,
    token: sled::Tree,
    keys: Keys,
    max_bytes: Option<u64>,
    /// The size on disk last measured for the bound, and when.
    measured: std::sync::Mutex<Option<(Instant, u64)>>,
    /// Times moved on by [`Store::touch_sync`] and not written yet.
    touched: std::sync::Mutex<BTreeMap<Box<str>, TimesWire<Box<str>>>>,
    // Declared last: released only after the database above is closed.
    _lock: File,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The database itself flushes as it closes, after this.
        let pending = std::mem::take(self.touched.get_mut().unwrap_or_else(|e| e.into_inner()));
        let _ = write_times(&self.times, &pending);
    }
}

/// Reads and decodes the record of `key` in `tree`; an unusable record is
/// deleted (unless it was replaced meanwhile) and reported as
/// [`Lookup::Error`], naming the record's `kind` and `label`.
fn read_record<T>(
    tree: &sled::Tree,
    kind: &str,
    key: &[u8],
    label: &str,
    decode: impl FnOnce(&[u8]) -> Result<T, DecodeFailure>,
) -> Lookup<T> {
    let value = match tree.get(key) {
        Ok(Some(value)) => value,
        Ok(None) => return Lookup::Miss,
        Err(e) => return Lookup::Error(format!("{kind} record {label}: read failed: {e}")),
    };
    match decode(&value) {
        Ok(record) => Lookup::Hit(record),
        Err(failure) => {
            let removal = match tree.compare_and_swap(key, Some(&value), None::<&[u8]>) {
                Ok(_) => "removed",
                Err(_) => "could not be removed",
            };
            Lookup::Error(format!("{kind} record {label}: {failure}; {removal}"))
        }
    }
}

/// Writes times records, in the order given; returns how many.
fn write_times<'a>(
    tree: &sled::Tree,
    entries: impl IntoIterator<Item = (&'a Box<str>, &'a TimesWire<Box<str>>)>,
) -> Result<usize, StorageError> {
    let mut written = 0;
    for (uid, times) in entries {
        tree.insert(uid.as_bytes(), codec::encode(TIMES_SCHEMA, times)?)
            .map_err(db_error)?;
        written += 1;
    }
    Ok(written)
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .field("encrypts_tokens", &self.encrypts_tokens())
            .field("max_bytes", &self.inner.max_bytes)
            .finish_non_exhaustive()
    }
}

/// The token plaintext as encoded before encryption.
#[derive(Serialize)]
struct TokenWire<'a> {
    access_token: &'a str,
    expires_at_unix_ms: i64,
    max_expires_at_unix_ms: i64,
}

/// What [`Store::touch_sync`] writes: the times of a sync record, for as
/// long as its ETag is this one.
#[derive(Clone, Serialize, Deserialize)]
struct TimesWire<E> {
    etag: E,
    last_sync_unix_ms: i64,
    next_due_unix_ms: i64,
}

#[derive(Deserialize)]
struct TokenWireOwned {
    access_token: String,
    expires_at_unix_ms: i64,
    max_expires_at_unix_ms: i64,
}

/// Why one attempt to open the database failed.
enum OpenFailure {
    /// Unusable contents: move aside and recreate.
    Corrupt(String),
    /// Anything else (lock held, permissions, ...): report to the caller.
    Fatal(StorageError),
}

struct Opened {
    db: sled::Db,
    sync: sled::Tree,
    times: sled::Tree,
    lease: sled::Tree,
    token: sled::Tree,
    keys: Keys,
    records: usize,
    dropped: usize,
    key_changed: bool,
}

impl Store {
    /// Opens (or creates) the cache in `dir`.
    ///
    /// An unusable database — corrupt files, an unknown format, contents the
    /// engine cannot read — is moved aside to `<dir>/db.corrupt-<unix>` and
    /// replaced by an empty one; [`OpenReport::recovered`] says why. Bad
    /// single records are deleted and counted in [`OpenReport::dropped`].
    ///
    /// Fails with [`StorageError::Locked`] if another process or another
    /// `Store` in this process has `dir` open, and with
    /// [`StorageError::Io`] if `dir` cannot be created or read; the caller
    /// should then run without a cache.
    ///
    /// Opening reads and checks every record (about 70 ms for 10 000 sync
    /// records in an optimised build), so corruption shows here rather than
    /// at a later lookup. A panic of the engine while opening is caught and
    /// treated as corruption (not with `panic = "abort"`).
    pub fn open(dir: &Path, options: Options) -> Result<(Store, OpenReport), StorageError> {
        Self::open_with(dir, options, Some(FLUSH_EVERY_MS))
    }

    /// [`Store::open`] with a chosen background flush interval (`None`:
    /// only explicit flushes and the final one on drop write).
    pub(crate) fn open_with(
        dir: &Path,
        options: Options,
        flush_every_ms: Option<u64>,
    ) -> Result<(Store, OpenReport), StorageError> {
        fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
        // The cache is for this process alone: the directory 0700 when it is
        // ours to change (a mounted volume's root may not be), everything
        // inside it 0700/0600 whatever the umask.
        let mut report = OpenReport {
            permissions: set_mode(dir, DIR_MODE)
                .err()
                .map(|e| format!("could not make {} private: {e}", dir.display())),
            ..OpenReport::default()
        };
        let lock = lock_dir(dir)?;
        let db_path = dir.join(DB_DIR);

        let opened = match open_db(dir, &db_path, &options, flush_every_ms) {
            Ok(opened) => opened,
            Err(OpenFailure::Fatal(e)) => return Err(e),
            Err(OpenFailure::Corrupt(reason)) => {
                report.moved_to = move_aside(dir, &db_path)?;
                report.recovered = Some(reason);
                match open_db(dir, &db_path, &options, flush_every_ms) {
                    Ok(opened) => opened,
                    Err(OpenFailure::Fatal(e)) => return Err(e),
                    Err(OpenFailure::Corrupt(reason)) => {
                        return Err(StorageError::Recovery(format!(
                            "the recreated database is unusable too: {reason}"
                        )));
                    }
                }
            }
        };

        restrict(dir).map_err(|e| StorageError::io(dir, e))?;
        report.records = opened.records;
        report.dropped = opened.dropped;
        report.key_changed = opened.key_changed;
        let store = Store {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                db_path,
                db: opened.db,
                sync: opened.sync,
                times: opened.times,
                lease: opened.lease,
                token: opened.token,
                keys: opened.keys,
                max_bytes: options.max_bytes,
                measured: std::sync::Mutex::new(None),
                touched: std::sync::Mutex::new(BTreeMap::new()),
                _lock: lock,
            }),
        };
        Ok((store, report))
    }

    /// The cache directory this store was opened on.
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether access tokens are persisted (an encryption key is configured).
    pub fn encrypts_tokens(&self) -> bool {
        self.inner.keys.tokens.is_some()
    }

    /// The keyed hasher for rendered data; see [`DataHasher`].
    pub fn data_hasher(&self) -> DataHasher {
        self.inner.keys.hasher.clone()
    }

    // ----- sync records -------------------------------------------------

    /// The sync record of the object with this UID, with the times
    /// [`Store::touch_sync`] last moved on when they are later than its own
    /// and were written for the ETag it holds.
    pub fn get_sync(&self, uid: &str) -> Lookup<SyncRecord> {
        let mut record = match self.get_plain::<SyncRecord>(RecordKind::Sync, uid, SYNC_SCHEMA) {
            Lookup::Hit(record) => record,
            other => return other,
        };
        if let Some(times) = self.times_of(uid)
            && record.etag.as_deref() == Some(&*times.etag)
            && times.last_sync_unix_ms > record.last_sync_unix_ms
        {
            record.last_sync_unix_ms = times.last_sync_unix_ms;
            record.next_due_unix_ms = times.next_due_unix_ms;
        }
        Lookup::Hit(record)
    }

    /// Moves the times of `uid`'s sync record on (a resync that found the
    /// KMS answering `etag` unchanged) without reading or rewriting the
    /// record: a few dozen bytes, kept in memory until
    /// [`Store::write_touched`] (or a flush, or the last clone's drop)
    /// writes those pending, in key order, to a tree of their own.
    /// [`Store::get_sync`] applies them while the record's ETag is `etag`;
    /// a later [`Store::put_sync`] with later times supersedes them.
    ///
    /// One write per resync as it happened, each looking its page up in
    /// the database's files, was most of the cost of a resync left alone;
    /// written together in key order, each page is looked up once. What a
    /// crash loses is the times moved on since the last write: those
    /// resources are checked again sooner.
    ///
    /// These records are not measured against the bound on the size: there
    /// is at most one per sync record, and [`Store::retain`] removes it with
    /// its sync record.
    pub fn touch_sync(&self, uid: &str, etag: &str, last_sync_unix_ms: i64, next_due_unix_ms: i64) {
        self.touched().insert(
            uid.into(),
            TimesWire {
                etag: etag.into(),
                last_sync_unix_ms,
                next_due_unix_ms,
            },
        );
    }

    /// Writes up to `max` of the times [`Store::touch_sync`] keeps pending,
    /// the first in key order (consecutive keys share the tree's pages, so
    /// each page is looked up once for all of its keys); returns how many.
    /// Call it every few seconds, as many times as it writes something,
    /// with a `max` that keeps each call short. A failed write loses the
    /// times taken for it: those resources are checked again sooner after
    /// a restart.
    pub fn write_touched(&self, max: usize) -> Result<usize, StorageError> {
        let taken: Vec<_> = {
            let mut touched = self.touched();
            std::iter::from_fn(|| touched.pop_first())
                .take(max)
                .collect()
        };
        write_times(&self.inner.times, taken.iter().map(|(k, v)| (k, v)))
    }

    fn touched(&self) -> std::sync::MutexGuard<'_, BTreeMap<Box<str>, TimesWire<Box<str>>>> {
        self.inner.touched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The times last moved on by [`Store::touch_sync`] for `uid`, pending
    /// or written (an unreadable record is deleted and ignored: the sync
    /// record's own times stand).
    fn times_of(&self, uid: &str) -> Option<TimesWire<Box<str>>> {
        if let Some(times) = self.touched().get(uid) {
            return Some(times.clone());
        }
        read_record(&self.inner.times, "times", uid.as_bytes(), uid, |value| {
            codec::decode(TIMES_SCHEMA, value)
        })
        .hit()
    }

    /// Stores (replaces wholly) the sync record of `uid`.
    pub fn put_sync(&self, uid: &str, record: &SyncRecord) -> Result<(), StorageError> {
        self.put_plain(RecordKind::Sync, uid, SYNC_SCHEMA, record)
    }

    // ----- lease records ------------------------------------------------

    /// The lease record of the custom resource with this UID.
    pub fn get_lease(&self, uid: &str) -> Lookup<LeaseRecord> {
        self.get_plain(RecordKind::Lease, uid, LEASE_SCHEMA)
    }

    /// Stores (replaces wholly) the lease record of `uid`.
    pub fn put_lease(&self, uid: &str, record: &LeaseRecord) -> Result<(), StorageError> {
        self.put_plain(RecordKind::Lease, uid, LEASE_SCHEMA, record)
    }

    /// Deletes the lease record of `uid` (no error if there is none).
    pub fn remove_lease(&self, uid: &str) -> Result<(), StorageError> {
        self.remove_raw(RecordKind::Lease, uid.as_bytes())
    }

    // ----- token records ------------------------------------------------

    /// The persisted token of an identity (`identity` is any string that
    /// names it, e.g. auth method and client id). Always a miss without an
    /// encryption key; an error if the token cannot be decrypted.
    pub fn get_token(&self, identity: &str) -> Lookup<TokenRecord> {
        let Some(cipher) = &self.inner.keys.tokens else {
            return Lookup::Miss;
        };
        let key = cipher.db_key(identity);
        self.get_with(RecordKind::Token, &key, "(identity)", |bytes| {
            open_token(cipher, &key, bytes)
        })
    }

    /// Persists the token of an identity, encrypted, replacing any earlier
    /// one. Returns `Ok(false)` and stores nothing when no encryption key is
    /// configured.
    pub fn put_token(&self, identity: &str, record: &TokenRecord) -> Result<bool, StorageError> {
        let Some(cipher) = &self.inner.keys.tokens else {
            return Ok(false);
        };
        let key = cipher.db_key(identity);
        let sealed = seal_token(cipher, &key, record)?;
        self.insert_checked(RecordKind::Token, &key, sealed)?;
        Ok(true)
    }

    /// Deletes the persisted token of an identity (no error if there is none).
    pub fn remove_token(&self, identity: &str) -> Result<(), StorageError> {
        match &self.inner.keys.tokens {
            Some(cipher) => self.remove_raw(RecordKind::Token, &cipher.db_key(identity)),
            None => Ok(()),
        }
    }

    /// Deletes every token record that has expired (`expires_at_unix_ms
    /// <= now_unix_ms`) or cannot be decrypted; without an encryption key,
    /// every token record. Returns how many were deleted.
    pub fn prune_tokens(&self, now_unix_ms: i64) -> Result<usize, StorageError> {
        let tree = &self.inner.token;
        let Some(cipher) = &self.inner.keys.tokens else {
            let count = tree.len();
            tree.clear().map_err(db_error)?;
            return Ok(count);
        };
        self.prune_kind(RecordKind::Token, |key, value| {
            open_token(cipher, key, value).is_ok_and(|token| token.expires_at_unix_ms > now_unix_ms)
        })
    }

    // ----- maintenance --------------------------------------------------

    /// Deletes the sync and lease records for which `keep(kind, uid)` is
    /// false (objects that no longer exist). Token records are not visited
    /// (their keys are one-way hashes); see [`Store::prune_tokens`]. A record
    /// rewritten while this runs is kept. Returns how many were deleted.
    pub fn retain<F>(&self, mut keep: F) -> Result<usize, StorageError>
    where
        F: FnMut(RecordKind, &str) -> bool,
    {
        let mut removed = 0;
        for kind in [RecordKind::Sync, RecordKind::Lease] {
            removed += self.prune_kind(kind, |key, _| match std::str::from_utf8(key) {
                Ok(uid) => keep(kind, uid),
                Err(_) => false,
            })?;
        }
        // The times of a sync record go with it.
        let sync = &self.inner.sync;
        self.touched()
            .retain(|uid, _| sync.contains_key(uid.as_bytes()).unwrap_or(true));
        prune_tree(&self.inner.times, |key, _| {
            sync.contains_key(key).unwrap_or(true)
        })?;
        Ok(removed)
    }

    /// Writes all changes to disk and waits for it (a hand-over or shutdown
    /// point), the times [`Store::touch_sync`] keeps pending included.
    /// Changes are also written in the background every 500 ms and when the
    /// last clone is dropped.
    pub fn flush(&self) -> Result<(), StorageError> {
        self.write_touched(usize::MAX)?;
        self.inner.db.flush().map(drop).map_err(db_error)?;
        self.restrict()
    }

    /// Files the engine created since the last check become private too
    /// (0600; directories 0700).
    fn restrict(&self) -> Result<(), StorageError> {
        restrict(&self.inner.dir).map_err(|e| StorageError::io(&self.inner.dir, e))
    }

    /// Like [`Store::flush`], without blocking the calling task.
    pub async fn flush_async(&self) -> Result<(), StorageError> {
        self.write_touched(usize::MAX)?;
        self.inner
            .db
            .flush_async()
            .await
            .map(drop)
            .map_err(db_error)?;
        self.restrict()
    }

    /// Bytes the database occupies on disk (all its files; 0 if they cannot
    /// be read). Copies moved aside by recovery are not counted.
    pub fn size_on_disk(&self) -> u64 {
        dir_size(&self.inner.db_path, 0)
    }

    /// Number of records of one kind (walks the tree: O(n)).
    pub fn len(&self, kind: RecordKind) -> usize {
        self.tree(kind).len()
    }

    // ----- internals ----------------------------------------------------

    fn tree(&self, kind: RecordKind) -> &sled::Tree {
        match kind {
            RecordKind::Sync => &self.inner.sync,
            RecordKind::Lease => &self.inner.lease,
            RecordKind::Token => &self.inner.token,
        }
    }

    fn get_plain<T: serde::de::DeserializeOwned>(
        &self,
        kind: RecordKind,
        uid: &str,
        schema: u8,
    ) -> Lookup<T> {
        self.get_with(kind, uid.as_bytes(), uid, |bytes| {
            codec::decode(schema, bytes)
        })
    }

    /// Reads and decodes one record; an unusable record is deleted (unless
    /// it was replaced meanwhile) and reported as [`Lookup::Error`].
    fn get_with<T>(
        &self,
        kind: RecordKind,
        key: &[u8],
        label: &str,
        decode: impl FnOnce(&[u8]) -> Result<T, DecodeFailure>,
    ) -> Lookup<T> {
        read_record(self.tree(kind), kind.as_str(), key, label, decode)
    }

    fn put_plain<T: Serialize>(
        &self,
        kind: RecordKind,
        uid: &str,
        schema: u8,
        record: &T,
    ) -> Result<(), StorageError> {
        let bytes = codec::encode(schema, record)?;
        self.insert_checked(kind, uid.as_bytes(), bytes)
    }

    fn insert_checked(
        &self,
        kind: RecordKind,
        key: &[u8],
        value: Vec<u8>,
    ) -> Result<(), StorageError> {
        let tree = self.tree(kind);
        self.check_room(tree, key)?;
        tree.insert(key, value).map(drop).map_err(db_error)
    }

    /// Refuses a record that would be new while the database is over its
    /// bound. A replacement is never measured (a resync rewrites every
    /// record once per interval); a new record takes the size measured at
    /// most [`MEASURE_EVERY`] ago, because measuring walks the database's
    /// files (at a first sync of thousands of resources, one walk a record
    /// was most of the cost of a write).
    fn check_room(&self, tree: &sled::Tree, key: &[u8]) -> Result<(), StorageError> {
        let Some(limit) = self.inner.max_bytes else {
            return Ok(());
        };
        if tree.contains_key(key).map_err(db_error)? {
            return Ok(());
        }
        let size = self.recent_size();
        if size < limit {
            return Ok(());
        }
        Err(StorageError::Full { size, limit })
    }

    /// [`Store::size_on_disk`] as measured at most [`MEASURE_EVERY`] ago.
    fn recent_size(&self) -> u64 {
        let mut measured = self
            .inner
            .measured
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match *measured {
            Some((at, size)) if at.elapsed() < MEASURE_EVERY => size,
            _ => {
                let size = self.size_on_disk();
                *measured = Some((Instant::now(), size));
                size
            }
        }
    }

    fn remove_raw(&self, kind: RecordKind, key: &[u8]) -> Result<(), StorageError> {
        self.tree(kind).remove(key).map(drop).map_err(db_error)
    }

    /// Deletes the records of `kind` for which `keep(key, value)` is false;
    /// a record changed since it was read is left alone.
    fn prune_kind(
        &self,
        kind: RecordKind,
        keep: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<usize, StorageError> {
        prune_tree(self.tree(kind), keep)
    }

    /// Writes raw bytes under a key, bypassing encoding (tests only).
    #[cfg(test)]
    pub(crate) fn raw_insert(&self, kind: RecordKind, key: &[u8], value: &[u8]) {
        self.tree(kind).insert(key, value).unwrap();
    }

    /// Writes raw bytes as the times of `uid` (tests only).
    #[cfg(test)]
    pub(crate) fn raw_insert_times(&self, uid: &[u8], value: &[u8]) {
        self.inner.times.insert(uid, value).unwrap();
    }

    /// The tree of one kind (tests only).
    #[cfg(test)]
    pub(crate) fn tree_for_tests(&self, kind: RecordKind) -> &sled::Tree {
        self.tree(kind)
    }

    /// The database key of an identity's token (tests only).
    #[cfg(test)]
    pub(crate) fn token_db_key(&self, identity: &str) -> Option<[u8; 32]> {
        self.inner.keys.tokens.as_ref().map(|c| c.db_key(identity))
    }
}

/// Deletes the records of `tree` for which `keep(key, value)` is false; a
/// record changed since it was read is left alone.
fn prune_tree(
    tree: &sled::Tree,
    mut keep: impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<usize, StorageError> {
    let mut doomed = Vec::new();
    for item in tree.iter() {
        let (key, value) = item.map_err(db_error)?;
        if !keep(&key, &value) {
            doomed.push((key, value));
        }
    }
    let mut removed = 0;
    for (key, value) in doomed {
        if tree
            .compare_and_swap(&key, Some(&value), None::<&[u8]>)
            .map_err(db_error)?
            .is_ok()
        {
            removed += 1;
        }
    }
    Ok(removed)
}

fn db_error(e: sled::Error) -> StorageError {
    StorageError::Database(e.to_string())
}

fn seal_token(
    cipher: &TokenCipher,
    key: &[u8],
    record: &TokenRecord,
) -> Result<Vec<u8>, StorageError> {
    let mut plain = codec::encode_payload(&TokenWire {
        access_token: record.access_token.expose(),
        expires_at_unix_ms: record.expires_at_unix_ms,
        max_expires_at_unix_ms: record.max_expires_at_unix_ms,
    })?;
    let sealed = cipher.seal(TOKEN_SCHEMA, key, &plain);
    wipe(&mut plain);
    sealed
}

fn open_token(
    cipher: &TokenCipher,
    key: &[u8],
    stored: &[u8],
) -> Result<TokenRecord, DecodeFailure> {
    let mut plain = cipher.open(TOKEN_SCHEMA, key, stored)?;
    let decoded = codec::decode_payload::<TokenWireOwned>(&plain);
    wipe(&mut plain);
    let wire = decoded?;
    Ok(TokenRecord {
        access_token: AccessToken::from(wire.access_token),
        expires_at_unix_ms: wire.expires_at_unix_ms,
        max_expires_at_unix_ms: wire.max_expires_at_unix_ms,
    })
}

/// Takes the advisory lock of the cache directory.
/// Mode of the cache's directories.
const DIR_MODE: u32 = 0o700;
/// Mode of the cache's files.
const FILE_MODE: u32 = 0o600;

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let current = fs::symlink_metadata(path)?.permissions().mode() & 0o7777;
    if current == mode {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> std::io::Result<()> {
    Ok(())
}

/// Create `path` (mode [`DIR_MODE`], whatever the umask) unless it exists.
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    match builder.create(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Make everything under the cache directory (not the directory itself,
/// see [`Store::open`]) private: directories [`DIR_MODE`], files
/// [`FILE_MODE`]. Links are left alone.
fn restrict(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        if kind.is_dir() {
            set_mode(&path, DIR_MODE)?;
            restrict(&path)?;
        } else if kind.is_file() {
            set_mode(&path, FILE_MODE)?;
        }
    }
    Ok(())
}

fn lock_dir(dir: &Path) -> Result<File, StorageError> {
    let path = dir.join(LOCK_FILE);
    let mut options = File::options();
    options.create(true).truncate(false).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
    let file = options
        .open(&path)
        .map_err(|e| StorageError::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(StorageError::Locked {
            path: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(e)) => Err(StorageError::io(&path, e)),
    }
}

/// Maps an engine error met while opening to "recreate" or "give up".
fn classify(e: sled::Error, dir: &Path, db_path: &Path) -> OpenFailure {
    use std::io::ErrorKind;
    match e {
        sled::Error::Io(io) => {
            if io.to_string().contains("could not acquire lock") {
                OpenFailure::Fatal(StorageError::Locked {
                    path: dir.to_path_buf(),
                })
            } else if matches!(
                io.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::InvalidData | ErrorKind::NotADirectory
            ) {
                OpenFailure::Corrupt(format!("database files unreadable: {io}"))
            } else {
                OpenFailure::Fatal(StorageError::io(db_path, io))
            }
        }
        sled::Error::Corruption { .. } => {
            OpenFailure::Corrupt("database corruption detected".to_string())
        }
        sled::Error::Unsupported(msg) => {
            OpenFailure::Corrupt(format!("database in an unsupported state: {msg}"))
        }
        sled::Error::ReportableBug(msg) => {
            OpenFailure::Corrupt(format!("database engine failure: {msg}"))
        }
        other => OpenFailure::Corrupt(format!("database engine failure: {other}")),
    }
}

/// One attempt to open, validate and scan the database.
fn open_db(
    dir: &Path,
    db_path: &Path,
    options: &Options,
    flush_every_ms: Option<u64>,
) -> Result<Opened, OpenFailure> {
    // A database directory with files in it that turns out to hold no
    // format marker has lost its contents; an absent or empty one is new.
    let existed = fs::read_dir(db_path).is_ok_and(|mut entries| entries.next().is_some());
    create_private_dir(db_path).map_err(|e| OpenFailure::Fatal(StorageError::io(db_path, e)))?;
    let attempt = catch_unwind(AssertUnwindSafe(|| {
        let db = sled::Config::new()
            .path(db_path)
            .cache_capacity(options.cache_bytes)
            .mode(sled::Mode::LowSpace)
            .flush_every_ms(flush_every_ms)
            .open()
            .map_err(|e| classify(e, dir, db_path))?;
        validate_and_scan(db, existed, options.encryption_key.as_ref()).map_err(|e| match e {
            ScanError::Engine(e) => classify(e, dir, db_path),
            ScanError::Failure(failure) => failure,
        })
    }));
    match attempt {
        Ok(result) => result,
        Err(_) => Err(OpenFailure::Corrupt(
            "database engine panicked while opening".to_string(),
        )),
    }
}

enum ScanError {
    Engine(sled::Error),
    Failure(OpenFailure),
}

impl From<sled::Error> for ScanError {
    fn from(e: sled::Error) -> Self {
        ScanError::Engine(e)
    }
}

fn corrupt(reason: impl Into<String>) -> ScanError {
    ScanError::Failure(OpenFailure::Corrupt(reason.into()))
}

fn format_marker() -> Vec<u8> {
    let mut marker = FORMAT_MAGIC.to_vec();
    marker.push(FORMAT_VERSION);
    marker
}

fn validate_and_scan(
    db: sled::Db,
    existed: bool,
    encryption: Option<&EncryptionKey>,
) -> Result<Opened, ScanError> {
    let meta = db.open_tree(META_TREE)?;
    let sync = db.open_tree(SYNC_TREE)?;
    let times = db.open_tree(TIMES_TREE)?;
    let lease = db.open_tree(LEASE_TREE)?;
    let token = db.open_tree(TOKEN_TREE)?;

    let cache_key = match meta.get(META_FORMAT)? {
        Some(found) if found == format_marker() => {
            let stored = meta
                .get(META_CACHE_KEY)?
                .ok_or_else(|| corrupt("cache key missing"))?;
            <[u8; KEY_LEN]>::try_from(stored.as_ref())
                .map_err(|_| corrupt("cache key has the wrong length"))?
        }
        Some(found) => {
            return Err(match found.strip_prefix(FORMAT_MAGIC) {
                Some([version]) => corrupt(format!(
                    "database format version {version}, this build reads {FORMAT_VERSION}"
                )),
                _ => corrupt("unrecognised format marker"),
            });
        }
        None => {
            let empty = [&meta, &sync, &times, &lease, &token]
                .iter()
                .all(|t| t.is_empty());
            if existed || !empty {
                return Err(corrupt("database contents lost (no format marker)"));
            }
            let cache_key = crypto::random_key(&ring::rand::SystemRandom::new())
                .map_err(|e| ScanError::Failure(OpenFailure::Fatal(e)))?;
            let keys = Keys::derive(&cache_key, encryption);
            let mut batch = sled::Batch::default();
            batch.insert(META_CACHE_KEY, &cache_key[..]);
            batch.insert(META_KEY_CHECK, keys.key_check.as_slice());
            batch.insert(META_FORMAT, format_marker());
            meta.apply_batch(batch)?;
            db.flush()?;
            cache_key
        }
    };

    let keys = Keys::derive(&cache_key, encryption);
    let mut dropped = 0;
    let stored_check = meta
        .get(META_KEY_CHECK)?
        .ok_or_else(|| corrupt("key check missing"))?;
    let key_changed = stored_check != keys.key_check.as_slice();
    if key_changed {
        // Hashes and token keys were derived from the old key: useless now.
        dropped += sync.len() + token.len();
        sync.clear()?;
        times.clear()?;
        token.clear()?;
        meta.insert(META_KEY_CHECK, keys.key_check.as_slice())?;
        db.flush()?;
    }

    let mut records = 0;
    let mut bad = Vec::new();
    for item in sync.iter() {
        let (key, value) = item?;
        let ok = std::str::from_utf8(&key).is_ok()
            && codec::decode::<SyncRecord>(SYNC_SCHEMA, &value).is_ok();
        if ok { records += 1 } else { bad.push(key) }
    }
    dropped += remove_all(&sync, &mut bad)?;
    // Times are part of their sync record: not counted as records of their
    // own, and dropped without one.
    for item in times.iter() {
        let (key, value) = item?;
        let ok = sync.contains_key(&key)?
            && codec::decode::<TimesWire<Box<str>>>(TIMES_SCHEMA, &value).is_ok();
        if !ok {
            bad.push(key);
        }
    }
    remove_all(&times, &mut bad)?;
    for item in lease.iter() {
        let (key, value) = item?;
        let ok = std::str::from_utf8(&key).is_ok()
            && codec::decode::<LeaseRecord>(LEASE_SCHEMA, &value).is_ok();
        if ok { records += 1 } else { bad.push(key) }
    }
    dropped += remove_all(&lease, &mut bad)?;
    for item in token.iter() {
        let (key, value) = item?;
        let ok = keys
            .tokens
            .as_ref()
            .is_some_and(|cipher| open_token(cipher, &key, &value).is_ok());
        if ok { records += 1 } else { bad.push(key) }
    }
    dropped += remove_all(&token, &mut bad)?;

    Ok(Opened {
        db,
        sync,
        times,
        lease,
        token,
        keys,
        records,
        dropped,
        key_changed,
    })
}

fn remove_all(tree: &sled::Tree, keys: &mut Vec<sled::IVec>) -> Result<usize, sled::Error> {
    let count = keys.len();
    for key in keys.drain(..) {
        tree.remove(key)?;
    }
    Ok(count)
}

/// Moves an unusable database out of the way, keeping only this latest copy.
fn move_aside(dir: &Path, db_path: &Path) -> Result<Option<PathBuf>, StorageError> {
    if fs::symlink_metadata(db_path).is_err() {
        return Ok(None);
    }
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut target = dir.join(format!("{CORRUPT_PREFIX}{stamp}"));
    let mut n = 1;
    while fs::symlink_metadata(&target).is_ok() {
        target = dir.join(format!("{CORRUPT_PREFIX}{stamp}-{n}"));
        n += 1;
    }
    let moved = match fs::rename(db_path, &target) {
        Ok(()) => Some(target),
        Err(rename_error) => {
            remove_path(db_path).map_err(|e| {
                StorageError::Recovery(format!(
                    "could not move {} aside ({rename_error}) nor delete it ({e})",
                    db_path.display()
                ))
            })?;
            None
        }
    };
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let stale = entry
                .file_name()
                .to_string_lossy()
                .starts_with(CORRUPT_PREFIX)
                && Some(&path) != moved.as_ref();
            if stale {
                let _ = remove_path(&path);
            }
        }
    }
    Ok(moved)
}

fn remove_path(path: &Path) -> std::io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// Total length of the files under `path` (a few levels deep).
fn dir_size(path: &Path, depth: usize) -> u64 {
    let Ok(entries) = fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() && depth < 4 => dir_size(&entry.path(), depth + 1),
            Ok(meta) if meta.is_file() => meta.len(),
            _ => 0,
        })
        .sum()
}
