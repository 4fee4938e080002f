//! Request counters of the admin API: for each route template
//! (`GET /api/v3/secrets/raw/:secretName`) the number of answers per status
//! code, faulted and refused requests included, and the number of requests
//! the rate limits refused, per route.

use std::collections::BTreeMap;
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

    /// The counts so far, and the rate-limited requests per route.
    pub fn snapshot(&self) -> (Counts, BTreeMap<String, u64>) {
        let inner = self.lock();
        (inner.counts.clone(), inner.limited.clone())
    }

    /// Start again from zero.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.counts.clear();
        inner.limited.clear();
    }
}
