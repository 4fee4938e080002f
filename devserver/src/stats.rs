//! Request counters of the admin API: for each route template
//! (`GET /api/v3/secrets/raw/:secretName`) the number of answers per status
//! code, faulted and refused requests included, and the number of requests
//! the rate limits refused, per route; and how many distinct folders were
//! read (listed with a `200` or a `304`), so that a benchmark can tell when
//! every folder of a workload has been checked.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

/// Counts per route, then per status.
pub(crate) type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    counts: Counts,
    limited: BTreeMap<String, u64>,
    /// Folders read: project, environment and path.
    folders: HashSet<String>,
}

impl Stats {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count one answer.
    pub fn record(&self, route: String, status: String) {
        *self
            .lock()
            .counts
            .entry(route)
            .or_default()
            .entry(status)
            .or_default() += 1;
    }

    /// Count one request refused by the rate limits.
    pub fn record_limited(&self, route: String) {
        *self.lock().limited.entry(route).or_default() += 1;
    }

    /// Count a successful read of `folder` (counted once until a reset).
    pub fn record_folder_read(&self, folder: String) {
        self.lock().folders.insert(folder);
    }

    /// The counts so far, the rate-limited requests per route, and the
    /// number of distinct folders read.
    pub fn snapshot(&self) -> (Counts, BTreeMap<String, u64>, usize) {
        let inner = self.lock();
        (
            inner.counts.clone(),
            inner.limited.clone(),
            inner.folders.len(),
        )
    }

    /// Start again from zero.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.counts.clear();
        inner.limited.clear();
        inner.folders.clear();
    }
}
