//! Store-level tests: real databases in temporary directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::codec::{LEASE_SCHEMA, SYNC_SCHEMA, TOKEN_SCHEMA};
use crate::*;

const TOKEN: &str = "eyJhbGciOiJIUzI1NiJ9.token-plaintext-4f1c9e";
const SECRET_VALUE: &str = "hunter2-very-secret-value-77a3";
const IDENTITY: &str = "universal-auth/client-id-5d2e";

fn key(byte: u8) -> EncryptionKey {
    EncryptionKey::from_bytes([byte; 32])
}

fn opts(encryption: Option<u8>) -> Options {
    Options {
        encryption_key: encryption.map(key),
        ..Options::default()
    }
}

/// Open, waiting while a store of this process that was just dropped still
/// holds the engine's lock (sled releases it from a background thread,
/// which a loaded machine may run late).
fn open(dir: &Path, encryption: Option<u8>) -> (Store, OpenReport) {
    open_with(dir, || opts(encryption))
}

/// [`open`] with other options.
fn open_with(dir: &Path, options: impl Fn() -> Options) -> (Store, OpenReport) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match Store::open(dir, options()) {
            Err(StorageError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other.expect("open"),
        }
    }
}

fn sync_record(generation: i64) -> SyncRecord {
    SyncRecord {
        generation,
        etag: Some(format!("W/\"etag-{generation}\"")),
        target_hashes: BTreeMap::from([
            ("Secret/ns/app".to_string(), [generation as u8; 32]),
            ("Secret/ns/other".to_string(), [0xAB; 32]),
        ]),
        last_sync_unix_ms: 1_700_000_000_000 + generation,
        next_due_unix_ms: 1_700_000_600_000 + generation,
        synced_keys: 4,
    }
}

fn lease_record() -> LeaseRecord {
    LeaseRecord {
        lease_id: "lease-marker-0c7d11".into(),
        version: 3,
        expires_at_unix_ms: 1_700_003_600_000,
    }
}

fn token_record() -> TokenRecord {
    TokenRecord {
        access_token: AccessToken::new(TOKEN),
        expires_at_unix_ms: 4_000_000_000_000,
        max_expires_at_unix_ms: 4_100_000_000_000,
    }
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn files_contain(dir: &Path, needle: &[u8]) -> bool {
    files_under(dir).iter().any(|file| {
        let bytes = std::fs::read(file).unwrap();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

fn db_files(dir: &Path) -> Vec<PathBuf> {
    files_under(&dir.join("db"))
}

#[test]
fn store_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Store>();
    check::<DataHasher>();
    check::<EncryptionKey>();
    fn check_send<T: Send>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), None);
    check_send(&store.flush_async());
}

#[test]
fn fresh_open_reports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, report) = open(&dir.path().join("nested/cache"), None);
    assert_eq!(report, OpenReport::default());
    assert!(!store.encrypts_tokens());
    for kind in RecordKind::ALL {
        assert_eq!(store.len(kind), 0);
    }
    assert!(store.path().ends_with("nested/cache"));
}

/// Every directory under the cache is 0700 and every file 0600, whatever
/// the process umask (tests run with the usual 022), after opening, after
/// writes and a flush, after the store is dropped, and after a recovery.
#[cfg(unix)]
#[test]
fn cache_files_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    fn modes(dir: &Path, out: &mut Vec<(PathBuf, u32)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
            out.push((entry.path(), mode));
            if entry.file_type().unwrap().is_dir() {
                modes(&entry.path(), out);
            }
        }
    }
    fn check(dir: &Path, when: &str) {
        let mut all = Vec::new();
        modes(dir, &mut all);
        assert!(all.len() > 2, "{when}: {all:?}");
        for (path, mode) in all {
            let want = if path.is_dir() { 0o700 } else { 0o600 };
            assert_eq!(mode, want, "{when}: {} is {mode:o}", path.display());
        }
    }
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("cache");
    let (store, report) = open(&dir, Some(1));
    assert_eq!(report.permissions, None);
    let dir_mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    check(&dir, "after open");
    for i in 0..200 {
        store
            .put_sync(&format!("uid-{i}"), &sync_record(i))
            .unwrap();
    }
    store.flush().unwrap();
    check(&dir, "after a flush");
    drop(store);
    let (store, _) = open(&dir, Some(1));
    check(&dir, "after a reopen");
    drop(store);
    // A database the engine cannot read is moved aside and recreated.
    for f in files_under(&dir.join("db")) {
        std::fs::write(f, b"garbage").unwrap();
    }
    let (_store, report) = open(&dir, Some(1));
    assert!(report.recovered.is_some());
    check(&dir, "after a recovery");
}

#[test]
fn records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), Some(1));

    assert_eq!(store.get_sync("uid-1"), Lookup::Miss);
    store.put_sync("uid-1", &sync_record(1)).unwrap();
    assert_eq!(store.get_sync("uid-1"), Lookup::Hit(sync_record(1)));
    store.put_sync("uid-1", &sync_record(2)).unwrap();
    assert_eq!(store.get_sync("uid-1"), Lookup::Hit(sync_record(2)));

    store.put_lease("uid-1", &lease_record()).unwrap();
    assert_eq!(store.get_lease("uid-1"), Lookup::Hit(lease_record()));
    assert_eq!(store.get_lease("uid-2"), Lookup::Miss);

    assert!(store.encrypts_tokens());
    assert!(store.put_token(IDENTITY, &token_record()).unwrap());
    assert_eq!(store.get_token(IDENTITY), Lookup::Hit(token_record()));
    assert_eq!(store.get_token("another identity"), Lookup::Miss);

    assert_eq!(store.len(RecordKind::Sync), 1);
    assert_eq!(store.len(RecordKind::Lease), 1);
    assert_eq!(store.len(RecordKind::Token), 1);

    store.remove_lease("uid-1").unwrap();
    store.remove_token(IDENTITY).unwrap();
    store.remove_lease("never-there").unwrap();
    assert_eq!(store.get_sync("uid-1"), Lookup::Hit(sync_record(2)));
    assert_eq!(store.get_lease("uid-1"), Lookup::Miss);
    assert_eq!(store.get_token(IDENTITY), Lookup::Miss);
}

#[test]
fn other_schema_byte_is_an_error_and_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), Some(1));

    store.put_sync("uid-s", &sync_record(5)).unwrap();
    let mut bytes = crate::codec::encode(SYNC_SCHEMA, &sync_record(5)).unwrap();
    bytes[0] = SYNC_SCHEMA + 1;
    store.raw_insert(RecordKind::Sync, b"uid-s", &bytes);
    let lookup = store.get_sync("uid-s");
    let Lookup::Error(reason) = &lookup else {
        panic!("expected an error, got {lookup:?}");
    };
    assert!(reason.contains("schema version 2, expected 1"), "{reason}");
    assert!(reason.contains("removed"), "{reason}");
    assert_eq!(store.get_sync("uid-s"), Lookup::Miss);

    let mut bytes = crate::codec::encode(LEASE_SCHEMA, &lease_record()).unwrap();
    bytes[0] = 0;
    store.raw_insert(RecordKind::Lease, b"uid-l", &bytes);
    assert!(store.get_lease("uid-l").is_error());
    assert!(store.get_lease("uid-l").is_miss());

    store.put_token(IDENTITY, &token_record()).unwrap();
    let slot = store.token_db_key(IDENTITY).unwrap();
    let mut sealed = store.inner_token_raw(&slot).unwrap();
    assert_eq!(sealed[0], TOKEN_SCHEMA);
    sealed[0] = TOKEN_SCHEMA + 7;
    store.raw_insert(RecordKind::Token, &slot, &sealed);
    assert!(store.get_token(IDENTITY).is_error());
    assert!(store.get_token(IDENTITY).is_miss());
}

impl Store {
    fn inner_token_raw(&self, slot: &[u8]) -> Option<Vec<u8>> {
        self.tree_for_tests(RecordKind::Token)
            .get(slot)
            .unwrap()
            .map(|v| v.to_vec())
    }
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), Some(1));
    let garbage: [&[u8]; 5] = [
        b"",
        &[SYNC_SCHEMA],
        &[SYNC_SCHEMA, 0xFF, 0xFF, 0xFF, 0xFF],
        &[
            SYNC_SCHEMA,
            0xFD,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
        ],
        b"\x01completely unrelated bytes, far too many of them",
    ];
    for bytes in garbage {
        store.raw_insert(RecordKind::Sync, b"g", bytes);
        assert!(store.get_sync("g").is_error(), "{bytes:?}");
        store.raw_insert(RecordKind::Lease, b"g", bytes);
        assert!(store.get_lease("g").is_error(), "{bytes:?}");
        let slot = store.token_db_key(IDENTITY).unwrap();
        store.raw_insert(RecordKind::Token, &slot, bytes);
        assert!(store.get_token(IDENTITY).is_error(), "{bytes:?}");
    }
    // A well-formed record of the other kind is not mistaken for this one.
    let lease = crate::codec::encode(LEASE_SCHEMA, &lease_record()).unwrap();
    store.raw_insert(RecordKind::Sync, b"x", &lease);
    assert!(store.get_sync("x").is_error());
}

#[test]
fn reopen_keeps_records_and_the_hash_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = BTreeMap::from([("password".to_string(), SECRET_VALUE.as_bytes().to_vec())]);
    let hash = {
        let (store, _) = open(dir.path(), Some(1));
        store.put_sync("uid-a", &sync_record(1)).unwrap();
        store.put_sync("uid-b", &sync_record(2)).unwrap();
        store.put_lease("uid-a", &lease_record()).unwrap();
        store.put_token(IDENTITY, &token_record()).unwrap();
        store.data_hasher().hash_map(&data)
    };
    let (store, report) = open(dir.path(), Some(1));
    assert_eq!(report.recovered, None);
    assert_eq!(report.records, 4);
    assert_eq!(report.dropped, 0);
    assert!(!report.key_changed);
    assert_eq!(store.get_sync("uid-a"), Lookup::Hit(sync_record(1)));
    assert_eq!(store.get_sync("uid-b"), Lookup::Hit(sync_record(2)));
    assert_eq!(store.get_lease("uid-a"), Lookup::Hit(lease_record()));
    assert_eq!(store.get_token(IDENTITY), Lookup::Hit(token_record()));
    assert_eq!(store.data_hasher().hash_map(&data), hash);
}

/// `touch_sync` moves a sync record's times on without rewriting it: only
/// forward, only for the ETag the record holds, pending until a batch or
/// the store's drop writes it, across a reopen, and gone with the record.
#[test]
fn touched_times_move_a_record_on_for_its_etag_alone() {
    let dir = tempfile::tempdir().unwrap();
    let times = |store: &Store, uid: &str| match store.get_sync(uid) {
        Lookup::Hit(r) => (r.last_sync_unix_ms, r.next_due_unix_ms),
        other => panic!("{other:?}"),
    };
    let base = sync_record(1);
    let etag = base.etag.clone().unwrap();
    let (last, next) = (base.last_sync_unix_ms, base.next_due_unix_ms);
    {
        let (store, _) = open(dir.path(), None);
        store.put_sync("uid-a", &base).unwrap();
        store.put_sync("uid-b", &base).unwrap();
        store.touch_sync("uid-a", &etag, last + 60_000, next + 60_000);
        // Pending, and read as such.
        let Lookup::Hit(moved) = store.get_sync("uid-a") else {
            panic!()
        };
        let moved_on = SyncRecord {
            last_sync_unix_ms: last + 60_000,
            next_due_unix_ms: next + 60_000,
            ..base.clone()
        };
        assert_eq!(moved, moved_on, "only the times move");
        store.touch_sync("uid-b", &etag, last + 1, next + 1);
        assert_eq!(store.write_touched(1).unwrap(), 1, "at most what is asked");
        assert_eq!(store.write_touched(5).unwrap(), 1);
        assert_eq!(store.write_touched(5).unwrap(), 0, "written once");
        assert_eq!(store.get_sync("uid-a"), Lookup::Hit(moved_on));
        // Left pending: the store's drop writes it.
        store.touch_sync("uid-b", &etag, last + 30_000, next + 30_000);
        // An orphan: times with no sync record are no record.
        store.touch_sync("uid-orphan", &etag, last, next);
        assert_eq!(store.get_sync("uid-orphan"), Lookup::Miss);
    }
    let (store, report) = open(dir.path(), None);
    assert_eq!(
        (report.records, report.dropped),
        (2, 0),
        "times are not records"
    );
    assert_eq!(times(&store, "uid-a"), (last + 60_000, next + 60_000));
    assert_eq!(times(&store, "uid-b"), (last + 30_000, next + 30_000));
    // The orphan was dropped at open: a record written now keeps its own times.
    let own = SyncRecord {
        last_sync_unix_ms: 5,
        ..base.clone()
    };
    store.put_sync("uid-orphan", &own).unwrap();
    assert_eq!(times(&store, "uid-orphan"), (5, next));

    // Never backwards, never for another ETag, pending or written.
    store.touch_sync("uid-a", &etag, last - 1, next - 1);
    assert_eq!(times(&store, "uid-a"), (last, next));
    store.write_touched(100).unwrap();
    assert_eq!(times(&store, "uid-a"), (last, next));
    store.touch_sync("uid-a", "W/\"other\"", last + 120_000, next + 120_000);
    assert_eq!(times(&store, "uid-a"), (last, next));
    // A later sync record supersedes earlier times; later times move it on.
    store.touch_sync("uid-a", &etag, last + 60_000, next + 60_000);
    store.write_touched(100).unwrap();
    let later = SyncRecord {
        last_sync_unix_ms: last + 90_000,
        next_due_unix_ms: next + 90_000,
        ..base.clone()
    };
    store.put_sync("uid-a", &later).unwrap();
    assert_eq!(store.get_sync("uid-a"), Lookup::Hit(later.clone()));

    // Unreadable times are ignored; the record's own stand.
    store.raw_insert_times(b"uid-a", b"\x01\xff\xff");
    assert_eq!(store.get_sync("uid-a"), Lookup::Hit(later.clone()));

    // Gone with the record, written or pending.
    store.touch_sync("uid-a", &etag, last + 200_000, next + 200_000);
    store.write_touched(100).unwrap();
    store.touch_sync("uid-b", &etag, last + 200_000, next + 200_000);
    assert_eq!(
        store
            .retain(|_, uid| uid != "uid-a" && uid != "uid-b")
            .unwrap(),
        2
    );
    store.put_sync("uid-a", &base).unwrap();
    store.put_sync("uid-b", &base).unwrap();
    assert_eq!(store.get_sync("uid-a"), Lookup::Hit(base.clone()));
    assert_eq!(store.get_sync("uid-b"), Lookup::Hit(base));
}

/// Copies the database files as they are now, as a crash would leave them.
fn snapshot(dir: &Path, to: &Path) {
    for file in db_files(dir) {
        let rel = file.strip_prefix(dir).unwrap();
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&file, &dest).unwrap();
    }
}

#[test]
fn flush_makes_writes_durable() {
    let dir = tempfile::tempdir().unwrap();
    let crash = tempfile::tempdir().unwrap();
    // No background flushing: only an explicit flush writes.
    let (store, _) = Store::open_with(dir.path(), opts(None), None).unwrap();
    store.put_sync("uid-durable", &sync_record(9)).unwrap();
    store.flush().unwrap();
    // The store stays open (no flush on drop); a copy of its files is what
    // a crash right now would leave behind.
    snapshot(dir.path(), crash.path());
    let (copy, report) = open(crash.path(), None);
    assert_eq!(report.recovered, None, "{report:?}");
    assert_eq!(copy.get_sync("uid-durable"), Lookup::Hit(sync_record(9)));
    drop(store);
}

#[test]
fn flush_async_completes() {
    let dir = tempfile::tempdir().unwrap();
    let crash = tempfile::tempdir().unwrap();
    let (store, _) = Store::open_with(dir.path(), opts(None), None).unwrap();
    store.put_lease("uid-async", &lease_record()).unwrap();
    block_on(store.flush_async()).unwrap();
    snapshot(dir.path(), crash.path());
    let (copy, _) = open(crash.path(), None);
    assert_eq!(copy.get_lease("uid-async"), Lookup::Hit(lease_record()));
}

/// Polls a future to completion on this thread.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn corrupt_and_reopen(name: &str, damage: impl Fn(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path(), None);
        for i in 0..50 {
            store
                .put_sync(&format!("uid-{i}"), &sync_record(i))
                .unwrap();
        }
        store.flush().unwrap();
    }
    damage(&dir.path().join("db"));
    let (store, report) = open(dir.path(), None);
    let reason = report
        .recovered
        .clone()
        .unwrap_or_else(|| panic!("{name}: no recovery reported: {report:?}"));
    assert!(!reason.is_empty());
    let moved = report.moved_to.clone().expect("moved aside");
    assert!(moved.exists(), "{name}: {moved:?}");
    assert!(
        moved
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("db.corrupt-"),
        "{moved:?}"
    );
    assert_eq!(report.records, 0, "{name}");
    // The recreated store works and survives a reopen.
    store.put_sync("after", &sync_record(1)).unwrap();
    drop(store);
    let (store, report) = open(dir.path(), None);
    assert_eq!(report.recovered, None, "{name}: {report:?}");
    assert_eq!(store.get_sync("after"), Lookup::Hit(sync_record(1)));
}

#[test]
fn corrupt_files_are_moved_aside() {
    corrupt_and_reopen("all files garbage", |db| {
        for file in files_under(db) {
            let len = std::fs::metadata(&file).unwrap().len().max(64) as usize;
            let garbage: Vec<u8> = (0..len).map(|i| (i * 7 + 13) as u8).collect();
            std::fs::write(&file, garbage).unwrap();
        }
    });
    corrupt_and_reopen("all files truncated", |db| {
        for file in files_under(db) {
            std::fs::write(&file, b"").unwrap();
        }
    });
    corrupt_and_reopen("conf garbage", |db| {
        std::fs::write(db.join("conf"), b"this is not a config\n").unwrap();
    });
    corrupt_and_reopen("data file garbage", |db| {
        let len = std::fs::metadata(db.join("db")).unwrap().len() as usize;
        std::fs::write(db.join("db"), vec![0xA5; len]).unwrap();
    });
    corrupt_and_reopen("data file zeroed", |db| {
        let len = std::fs::metadata(db.join("db")).unwrap().len() as usize;
        std::fs::write(db.join("db"), vec![0; len]).unwrap();
    });
    corrupt_and_reopen("database path is a file", |db| {
        std::fs::remove_dir_all(db).unwrap();
        std::fs::write(db, b"garbage").unwrap();
    });
}

#[test]
fn a_truncated_config_alone_loses_nothing() {
    // The engine rewrites a configuration file of 8 bytes or less; the data
    // file is intact, so nothing is recovered and the records stay.
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path(), None);
        store.put_sync("uid", &sync_record(1)).unwrap();
    }
    std::fs::write(dir.path().join("db/conf"), b"short").unwrap();
    let (store, report) = open(dir.path(), None);
    assert_eq!(report.recovered, None);
    assert_eq!(store.get_sync("uid"), Lookup::Hit(sync_record(1)));
}

#[test]
fn only_the_latest_corrupt_copy_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        drop(open(dir.path(), None));
        std::fs::write(dir.path().join("db/conf"), b"garbage, longer than a header").unwrap();
        let (_store, report) = open(dir.path(), None);
        assert!(report.recovered.is_some(), "round {round}");
    }
    let copies: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("db.corrupt-"))
        .collect();
    assert_eq!(copies.len(), 1);
}

/// The engine opened directly (to damage it), waiting like `open` while a
/// store that was just dropped still holds its lock.
fn raw_engine(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(path) {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other.expect("open the engine"),
        }
    }
}

#[test]
fn unknown_format_or_lost_marker_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), None));
    {
        let db = raw_engine(&dir.path().join("db"));
        let meta = db.open_tree("meta").unwrap();
        meta.insert("format", &b"kms-operator-cache\x09"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let (_store, report) = open(dir.path(), None);
    let reason = report.recovered.expect("recovered");
    assert!(reason.contains("format version 9"), "{reason}");
    drop(_store);

    {
        let db = raw_engine(&dir.path().join("db"));
        db.open_tree("meta").unwrap().remove("format").unwrap();
        db.flush().unwrap();
    }
    let (_store, report) = open(dir.path(), None);
    let reason = report.recovered.expect("recovered");
    assert!(reason.contains("no format marker"), "{reason}");
}

#[test]
fn bad_records_are_dropped_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path(), None);
        store.put_sync("good", &sync_record(1)).unwrap();
        store.put_lease("good", &lease_record()).unwrap();
        store.raw_insert(RecordKind::Sync, b"bad", b"\x01\xff");
        store.raw_insert(RecordKind::Lease, b"old-schema", b"\x00");
        store.raw_insert(
            RecordKind::Sync,
            b"\xff\xfe",
            &crate::codec::encode(SYNC_SCHEMA, &sync_record(1)).unwrap(),
        );
    }
    let (store, report) = open(dir.path(), None);
    assert_eq!(report.recovered, None);
    assert_eq!(report.records, 2);
    assert_eq!(report.dropped, 3);
    assert_eq!(store.len(RecordKind::Sync), 1);
    assert_eq!(store.len(RecordKind::Lease), 1);
}

#[test]
fn second_open_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), None);
    store.put_sync("uid", &sync_record(1)).unwrap();
    let err = Store::open(dir.path(), opts(None)).unwrap_err();
    assert!(matches!(err, StorageError::Locked { .. }), "{err:?}");
    assert!(err.to_string().contains("locked"), "{err}");
    // The refused open did not disturb the open store.
    assert_eq!(store.get_sync("uid"), Lookup::Hit(sync_record(1)));
    // A clone keeps it open; dropping the last handle releases it.
    let clone = store.clone();
    drop(store);
    assert!(matches!(
        Store::open(dir.path(), opts(None)),
        Err(StorageError::Locked { .. })
    ));
    drop(clone);
    let (store, report) = open(dir.path(), None);
    assert_eq!(report.recovered, None);
    assert_eq!(store.get_sync("uid"), Lookup::Hit(sync_record(1)));
}

#[test]
fn a_foreign_engine_lock_is_reported_as_locked_not_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), None));
    // Something holding the database itself without our lock file.
    let foreign = raw_engine(&dir.path().join("db"));
    let err = Store::open(dir.path(), opts(None)).unwrap_err();
    assert!(matches!(err, StorageError::Locked { .. }), "{err:?}");
    drop(foreign);
    let (_store, report) = open(dir.path(), None);
    assert_eq!(report.recovered, None, "nothing was moved aside");
}

#[test]
fn tokens_are_encrypted_at_rest() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, [7u8; 32]).unwrap();
    let cache = dir.path().join("cache");
    let hasher;
    {
        let options = Options {
            encryption_key: Some(EncryptionKey::from_file(&key_file).unwrap()),
            ..Options::default()
        };
        let (store, _) = Store::open(&cache, options).unwrap();
        assert!(store.put_token(IDENTITY, &token_record()).unwrap());
        assert_eq!(store.get_token(IDENTITY), Lookup::Hit(token_record()));
        hasher = store.data_hasher();
        let data = BTreeMap::from([("password".to_string(), SECRET_VALUE.as_bytes().to_vec())]);
        let mut record = sync_record(1);
        record
            .target_hashes
            .insert("Secret/ns/app".into(), hasher.hash_map(&data));
        store.put_sync("uid-1", &record).unwrap();
        store.put_lease("uid-1", &lease_record()).unwrap();
        store.flush().unwrap();
        // The sealed token did reach the files, and the scan can find it ...
        let sealed = store
            .inner_token_raw(&store.token_db_key(IDENTITY).unwrap())
            .unwrap();
        assert!(files_contain(&cache, &sealed));
        // ... while the token itself is nowhere, open or closed.
        assert!(!files_contain(&cache, TOKEN.as_bytes()));
    }
    // The scan sees what is on disk: a plain field is found ...
    assert!(files_contain(&cache, lease_record().lease_id.as_bytes()));
    // ... but neither the token, nor a part of it, nor the identity, nor the
    // secret value, nor the encryption key.
    assert!(!files_contain(&cache, TOKEN.as_bytes()));
    assert!(!files_contain(&cache, b"token-plaintext"));
    assert!(!files_contain(&cache, IDENTITY.as_bytes()));
    assert!(!files_contain(&cache, SECRET_VALUE.as_bytes()));
    assert!(!files_contain(&cache, &[7u8; 32]));

    let (store, report) = open_with(&cache, || Options {
        encryption_key: Some(EncryptionKey::from_file(&key_file).unwrap()),
        ..Options::default()
    });
    assert!(!report.key_changed);
    assert_eq!(store.get_token(IDENTITY), Lookup::Hit(token_record()));
}

#[test]
fn a_token_sealed_under_another_key_is_an_error() {
    let one = tempfile::tempdir().unwrap();
    let (store_a, _) = open(one.path(), Some(1));
    store_a.put_token(IDENTITY, &token_record()).unwrap();
    let sealed = store_a
        .inner_token_raw(&store_a.token_db_key(IDENTITY).unwrap())
        .unwrap();

    let two = tempfile::tempdir().unwrap();
    let (store_b, _) = open(two.path(), Some(2));
    let slot = store_b.token_db_key(IDENTITY).unwrap();
    store_b.raw_insert(RecordKind::Token, &slot, &sealed);
    let lookup = store_b.get_token(IDENTITY);
    let Lookup::Error(reason) = &lookup else {
        panic!("expected an error, got {lookup:?}");
    };
    assert!(reason.contains("could not be decrypted"), "{reason}");
    assert!(!reason.contains(IDENTITY), "{reason}");
    assert_eq!(store_b.get_token(IDENTITY), Lookup::Miss);
}

#[test]
fn changing_the_key_drops_tokens_and_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let data = BTreeMap::from([("k", "v")]);
    let hash1 = {
        let (store, _) = open(dir.path(), Some(1));
        store.put_token(IDENTITY, &token_record()).unwrap();
        store.put_sync("uid", &sync_record(1)).unwrap();
        store.put_lease("uid", &lease_record()).unwrap();
        store.data_hasher().hash_map(&data)
    };
    // Wrong key: tokens and sync records are gone, leases stay.
    let hash2 = {
        let (store, report) = open(dir.path(), Some(2));
        assert!(report.key_changed);
        assert_eq!(report.dropped, 2);
        assert_eq!(report.records, 1);
        assert_eq!(report.recovered, None);
        assert_eq!(store.get_token(IDENTITY), Lookup::Miss);
        assert_eq!(store.get_sync("uid"), Lookup::Miss);
        assert_eq!(store.get_lease("uid"), Lookup::Hit(lease_record()));
        store.put_token(IDENTITY, &token_record()).unwrap();
        store.data_hasher().hash_map(&data)
    };
    assert_ne!(hash1, hash2);
    // Key removed: tokens are deleted, nothing is stored any more.
    let (store, report) = open(dir.path(), None);
    assert!(report.key_changed);
    assert_eq!(store.len(RecordKind::Token), 0);
    assert!(!store.put_token(IDENTITY, &token_record()).unwrap());
    assert_eq!(store.len(RecordKind::Token), 0);
    assert_eq!(store.get_token(IDENTITY), Lookup::Miss);
    store.remove_token(IDENTITY).unwrap();
    drop(store);
    let (_, report) = open(dir.path(), None);
    assert!(!report.key_changed);
}

#[test]
fn without_a_key_no_token_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path(), None);
        assert!(!store.encrypts_tokens());
        assert!(!store.put_token(IDENTITY, &token_record()).unwrap());
        assert_eq!(store.get_token(IDENTITY), Lookup::Miss);
        assert_eq!(store.len(RecordKind::Token), 0);
        store.put_lease("uid", &lease_record()).unwrap();
    }
    assert!(files_contain(dir.path(), b"lease-marker"));
    assert!(!files_contain(dir.path(), TOKEN.as_bytes()));
}

#[test]
fn keyed_hash_per_store() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let data = BTreeMap::from([
        ("a".to_string(), b"1".to_vec()),
        ("b".to_string(), b"2".to_vec()),
    ]);
    let (store1, _) = open(one.path(), None);
    let (store2, _) = open(two.path(), None);
    let h1 = store1.data_hasher().hash_map(&data);
    assert_eq!(h1, store1.data_hasher().hash_map(&data));
    assert_ne!(h1, store2.data_hasher().hash_map(&data));
    let mut changed = data.clone();
    changed.insert("b".into(), b"3".to_vec());
    assert_ne!(h1, store1.data_hasher().hash_map(&changed));
    // Length prefixes: moving a byte between key and value changes the hash.
    let hasher = store1.data_hasher();
    assert_ne!(
        hasher.hash_map(&BTreeMap::from([("a", "bc")])),
        hasher.hash_map(&BTreeMap::from([("ab", "c")]))
    );
    drop(store1);
    let (store1, _) = open(one.path(), None);
    assert_eq!(h1, store1.data_hasher().hash_map(&data));
    assert_eq!(format!("{hasher:?}"), "DataHasher([redacted])");
}

#[test]
fn retain_prunes_gone_objects() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), Some(1));
    for i in 0..10 {
        store
            .put_sync(&format!("uid-{i}"), &sync_record(i))
            .unwrap();
    }
    for i in 0..4 {
        store
            .put_lease(&format!("uid-{i}"), &lease_record())
            .unwrap();
    }
    store.put_token(IDENTITY, &token_record()).unwrap();
    let mut seen = Vec::new();
    let removed = store
        .retain(|kind, uid| {
            seen.push(kind);
            let n: i64 = uid.trim_start_matches("uid-").parse().unwrap();
            match kind {
                RecordKind::Sync => n % 2 == 0,
                RecordKind::Lease => n == 0,
                RecordKind::Token => unreachable!("tokens are not visited"),
            }
        })
        .unwrap();
    assert_eq!(removed, 5 + 3);
    assert_eq!(seen.len(), 14);
    assert_eq!(store.len(RecordKind::Sync), 5);
    assert_eq!(store.get_sync("uid-1"), Lookup::Miss);
    assert_eq!(store.get_sync("uid-2"), Lookup::Hit(sync_record(2)));
    assert_eq!(store.get_lease("uid-0"), Lookup::Hit(lease_record()));
    assert_eq!(store.get_lease("uid-1"), Lookup::Miss);
    assert_eq!(store.len(RecordKind::Token), 1);
    assert_eq!(store.retain(|_, _| true).unwrap(), 0);
}

#[test]
fn prune_tokens_by_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), Some(1));
    let expiring = |at: i64| TokenRecord {
        expires_at_unix_ms: at,
        ..token_record()
    };
    store.put_token("live", &expiring(2_000)).unwrap();
    store.put_token("expired", &expiring(1_000)).unwrap();
    store.put_token("also live", &expiring(2_000)).unwrap();
    store.raw_insert(
        RecordKind::Token,
        &store.token_db_key("broken").unwrap(),
        b"\x01junk",
    );
    let removed = store.prune_tokens(1_000).unwrap();
    assert_eq!(removed, 2);
    assert_eq!(store.len(RecordKind::Token), 2);
    assert!(store.get_token("live").is_hit());
    assert!(store.get_token("also live").is_hit());
}

#[test]
fn size_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), None);
    store.flush().unwrap();
    let empty = store.size_on_disk();
    assert!(empty > 0);
    for i in 0..2000 {
        store
            .put_sync(&format!("uid-{i:05}"), &sync_record(i))
            .unwrap();
    }
    store.flush().unwrap();
    assert!(
        store.size_on_disk() > empty,
        "{} <= {empty}",
        store.size_on_disk()
    );
    assert_eq!(store.len(RecordKind::Sync), 2000);
    let on_disk: u64 = db_files(dir.path())
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(store.size_on_disk(), on_disk);
}

#[test]
fn max_bytes_refuses_new_records_only() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = open(dir.path(), Some(1));
        store.put_sync("existing", &sync_record(1)).unwrap();
        store.put_lease("existing", &lease_record()).unwrap();
        store.put_token(IDENTITY, &token_record()).unwrap();
    }
    let options = Options {
        max_bytes: Some(1),
        ..opts(Some(1))
    };
    let (store, _) = Store::open(dir.path(), options).unwrap();
    let err = store.put_sync("new", &sync_record(1)).unwrap_err();
    let StorageError::Full { size, limit } = err else {
        panic!("expected Full, got {err:?}");
    };
    assert_eq!(limit, 1);
    assert!(size >= 1);
    assert!(store.put_lease("new", &lease_record()).is_err());
    assert!(store.put_token("new identity", &token_record()).is_err());
    assert_eq!(store.get_sync("new"), Lookup::Miss);
    // Replacing and removing still work.
    store.put_sync("existing", &sync_record(2)).unwrap();
    assert_eq!(store.get_sync("existing"), Lookup::Hit(sync_record(2)));
    store.put_lease("existing", &lease_record()).unwrap();
    store.put_token(IDENTITY, &token_record()).unwrap();
    store.remove_lease("existing").unwrap();
    // With no bound the same write passes.
    drop(store);
    let (store, _) = open_with(dir.path(), || Options {
        max_bytes: None,
        ..opts(Some(1))
    });
    store.put_sync("new", &sync_record(1)).unwrap();
    // A generous bound passes too.
    drop(store);
    let (store, _) = open(dir.path(), Some(1));
    store.put_sync("new-2", &sync_record(1)).unwrap();
}

#[test]
fn errors_and_debug_name_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(dir.path(), Some(1));
    let debug = format!("{store:?} {:?} {:?}", opts(Some(1)), token_record());
    assert!(!debug.contains(TOKEN), "{debug}");
    assert!(!debug.contains("1, 1, 1"), "{debug}");
    let err = StorageError::Full { size: 2, limit: 1 };
    assert!(err.to_string().contains("limit 1"));
}

// ----- format versions, with committed fixtures ------------------------------

/// The committed caches (`storage/tests/fixtures/`): one written by a
/// build of format 1 (this one) with a sync record, a lease record and an
/// encrypted token; one of a later format, 2, as a newer release would
/// leave it for a rollback to find.
fn fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tarball = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("tar");
    assert!(status.success(), "unpacking {}", tarball.display());
    dir
}

#[test]
fn a_cache_of_format_1_is_read_as_it_was_written() {
    let dir = fixture("cache-format-1.tar.gz");
    let (store, report) = open(dir.path(), Some(7));
    assert_eq!(report.recovered, None, "{report:?}");
    assert_eq!(store.get_sync("uid-a"), Lookup::Hit(sync_record(2)));
    assert_eq!(store.get_lease("uid-a"), Lookup::Hit(lease_record()));
    assert_eq!(store.get_token(IDENTITY), Lookup::Hit(token_record()));
}

#[test]
fn a_cache_of_a_later_format_is_set_aside_and_the_store_starts_empty() {
    // A rollback: the newer release wrote format 2; this build reads 1. The
    // cache is moved aside whole (nothing of it is read), the store starts
    // empty and works; resources then take their due times from their
    // statuses, so nothing is fetched that was not due.
    let dir = fixture("cache-format-2.tar.gz");
    let (store, report) = open(dir.path(), Some(7));
    let reason = report.recovered.clone().expect("recovered");
    assert!(
        reason.contains("database format version 2, this build reads 1"),
        "{reason}"
    );
    assert!(report.moved_to.is_some(), "{report:?}");
    assert_eq!(store.get_sync("uid-a"), Lookup::Miss);
    store.put_sync("uid-b", &sync_record(3)).unwrap();
    assert_eq!(store.get_sync("uid-b"), Lookup::Hit(sync_record(3)));
}

/// Writes the fixtures above (run by hand, once per format change:
/// `cargo test -p storage write_format_fixtures -- --ignored`).
#[test]
#[ignore = "writes storage/tests/fixtures/"]
fn write_format_fixtures() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::create_dir_all(&out).unwrap();
    for version in [1u8, 2] {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = open(dir.path(), Some(7));
            store.put_sync("uid-a", &sync_record(2)).unwrap();
            store.put_lease("uid-a", &lease_record()).unwrap();
            store.put_token(IDENTITY, &token_record()).unwrap();
            store.flush().unwrap();
        }
        if version != 1 {
            let db = raw_engine(&dir.path().join("db"));
            let mut marker = b"kms-operator-cache".to_vec();
            marker.push(version);
            db.open_tree("meta")
                .unwrap()
                .insert("format", marker)
                .unwrap();
            db.flush().unwrap();
        }
        let status = std::process::Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
            ])
            .arg("-czf")
            .arg(out.join(format!("cache-format-{version}.tar.gz")))
            .arg("-C")
            .arg(dir.path())
            .arg("db")
            .status()
            .unwrap();
        assert!(status.success());
    }
}
