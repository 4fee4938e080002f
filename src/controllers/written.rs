//! The status a controller last wrote per resource, with the
//! resourceVersion it was written over. Until the watch delivers the
//! write, the cached copy of the resource is that older version: a
//! reconcile reads the resource with the written status laid over it
//! ([`WrittenStatus::freshest`]), so it never writes an older status back
//! (dropping conditions, announcing `Ready` again). Once the watch shows a
//! newer version, the cached copy is used as it is, and the entry is
//! dropped ([`WrittenStatus::seen`]): at any time it holds only the writes
//! the watch has not delivered yet, not a copy of every resource's status.

use std::collections::HashMap;
use std::sync::Mutex;

/// Statuses written, by resource UID: `(resourceVersion written over,
/// status)`.
pub struct WrittenStatus<S> {
    inner: Mutex<HashMap<String, (String, S)>>,
}

impl<S> Default for WrittenStatus<S> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Clone> WrittenStatus<S> {
    /// `status` was written over the resource `uid` at `resource_version`.
    pub fn written(&self, uid: &str, resource_version: &str, status: S) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), (resource_version.to_owned(), status));
    }

    /// The status to read the resource `uid` with, when its cached copy (at
    /// `cached_version`) is still the one the last write was made over.
    pub fn freshest(&self, uid: &str, cached_version: &str) -> Option<S> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .filter(|(base, _)| base == cached_version)
            .map(|(_, s)| s.clone())
    }

    /// The watch delivered the resource `uid` at `resource_version`: a
    /// version other than the one the last write was made over is that
    /// write or a later one, so the written status is no longer needed.
    pub fn seen(&self, uid: &str, resource_version: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner
            .get(uid)
            .is_some_and(|(base, _)| base != resource_version)
        {
            inner.remove(uid);
        }
    }

    /// How many writes the watch has not delivered yet.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Keep only the resources `live` says still exist.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|uid, _| live(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_status_stands_until_the_watch_shows_a_newer_copy() {
        let w: WrittenStatus<&str> = WrittenStatus::default();
        assert_eq!(w.freshest("u", "5"), None);
        w.written("u", "5", "Ready");
        // The cache still holds the copy the write was made over.
        assert_eq!(w.freshest("u", "5"), Some("Ready"));
        assert_eq!(w.freshest("other", "5"), None);
        // The watch delivered the write (or anything newer).
        assert_eq!(w.freshest("u", "6"), None);
        w.written("u", "6", "Failed");
        assert_eq!(w.freshest("u", "6"), Some("Failed"));
        w.retain(|uid| uid != "u");
        assert_eq!(w.freshest("u", "6"), None);
    }

    #[test]
    fn an_entry_lasts_only_until_the_watch_delivers_the_write() {
        let w: WrittenStatus<&str> = WrittenStatus::default();
        w.written("a", "5", "Ready");
        w.written("b", "7", "Ready");
        // The copy written over, seen again: still needed.
        w.seen("a", "5");
        assert_eq!((w.pending(), w.freshest("a", "5")), (2, Some("Ready")));
        // The write (or a later change) arrived: gone.
        w.seen("a", "6");
        w.seen("unknown", "1");
        assert_eq!((w.pending(), w.freshest("a", "5")), (1, None));
        assert_eq!(w.freshest("b", "7"), Some("Ready"));
    }
}
