//! Request counters of the admin API: for each route template
//! (`GET /api/v3/secrets/raw/:secretName`) the number of answers per status
//! code, faulted and refused requests included.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Counts per route, then per status.
pub(crate) type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    counts: Mutex<Counts>,
}

impl Stats {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count one answer.
    pub fn record(&self, route: String, status: String) {
        *self
            .lock()
            .entry(route)
            .or_default()
            .entry(status)
            .or_default() += 1;
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Counts {
        self.lock().clone()
    }

    /// Start again from zero.
    pub fn reset(&self) {
        self.lock().clear();
    }
}
