//! The status a controller last wrote per resource, with the
//! resourceVersion that write made. Until the watch delivers the write,
//! the cached copy of the resource is an older version (the one the write
//! was made over, or another writer's change that came between): a
//! reconcile reads the resource with the written status laid over it
//! ([`WrittenStatus::freshest`]), so it never writes an older status back
//! (dropping conditions, announcing `Ready` again) nor acts again on what
//! the write recorded as done (a `force-sync` value handled). Once the
//! watch shows the write's version or a later one, the cached copy is used
//! as it is, and the entry is dropped ([`WrittenStatus::seen`]): at any
//! time it holds only the writes the watch has not delivered yet, not a
//! copy of every resource's status.
//!
//! Versions are compared as numbers, as the watch caches compare them
//! ([`packed::version_of`](super::packed::version_of)); a version that is
//! not a number leaves the cached copy as it is.
//!
//! [`OwnWrites`] does the same for the targets (Secrets, ConfigMaps) a
//! replica writes: the watch event of its own write is not a change to
//! react to, so it does not send the owner round again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::packed::{older, version_of};
use super::target::TargetKind;

/// Statuses written, by resource UID: `(resourceVersion the write made,
/// status)`.
pub struct WrittenStatus<S> {
    inner: Mutex<HashMap<String, (u64, S)>>,
}

impl<S> Default for WrittenStatus<S> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Clone> WrittenStatus<S> {
    /// `status` was written over the resource `uid`, making
    /// `resource_version`.
    pub fn written(&self, uid: &str, resource_version: &str, status: S) {
        let made = version_of(Some(resource_version));
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if made == 0 {
            inner.remove(uid);
            return;
        }
        inner.insert(uid.to_owned(), (made, status));
    }

    /// The status to read the resource `uid` with, when its cached copy (at
    /// `cached_version`) is older than the last write.
    pub fn freshest(&self, uid: &str, cached_version: &str) -> Option<S> {
        let cached = version_of(Some(cached_version));
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .filter(|(made, _)| older(cached, *made))
            .map(|(_, s)| s.clone())
    }

    /// The watch delivered the resource `uid` at `resource_version`: the
    /// last write or a later version (whose status includes the write) no
    /// longer needs the written status.
    pub fn seen(&self, uid: &str, resource_version: &str) {
        let delivered = version_of(Some(resource_version));
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner
            .get(uid)
            .is_some_and(|(made, _)| !older(delivered, *made))
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

/// The targets this replica wrote, by kind, namespace and name: the
/// resourceVersion each write made, until the watch delivers it. The
/// owner's reconcile that wrote a target needs no second reconcile for the
/// watch event of its own write (at a first sync of 100,000 resources that
/// was 100,000 reconciles that decided nothing); a version anyone else
/// made still sends the owner round.
#[derive(Default)]
pub struct OwnWrites {
    inner: Mutex<HashMap<TargetId, (String, Instant)>>,
}

/// A target: kind, namespace, name.
type TargetId = (TargetKind, String, String);

/// Past this many entries a write drops those older than [`STALE`] (a
/// write whose event never came: its shard was lost, or a relist showed a
/// later version).
const PRUNE_ABOVE: usize = 4096;
const STALE: Duration = Duration::from_secs(120);

impl OwnWrites {
    /// This replica's write of the target made `resource_version`.
    pub fn wrote(&self, kind: TargetKind, ns: &str, name: &str, resource_version: &str) {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.len() >= PRUNE_ABOVE {
            inner.retain(|_, (_, at)| now.duration_since(*at) < STALE);
        }
        inner.insert(
            (kind, ns.to_owned(), name.to_owned()),
            (resource_version.to_owned(), now),
        );
    }

    /// The watch delivered the target at `resource_version`: whether that
    /// is this replica's last write of it (the entry is then dropped).
    pub fn delivered(
        &self,
        kind: TargetKind,
        ns: &str,
        name: &str,
        resource_version: &str,
    ) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let key = (kind, ns.to_owned(), name.to_owned());
        let own = inner
            .get(&key)
            .is_some_and(|(written, _)| written == resource_version);
        if own {
            inner.remove(&key);
        }
        own
    }

    /// The target was deleted.
    pub fn forget(&self, kind: TargetKind, ns: &str, name: &str) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(kind, ns.to_owned(), name.to_owned()));
    }

    /// Writes the watch has not delivered yet.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_status_stands_until_the_watch_shows_the_write() {
        let w: WrittenStatus<&str> = WrittenStatus::default();
        assert_eq!(w.freshest("u", "5"), None);
        // Written over version 5, making 7.
        w.written("u", "7", "Ready");
        // The cache still holds the copy the write was made over, or a
        // change someone made between (6): the write is fresher.
        assert_eq!(w.freshest("u", "5"), Some("Ready"));
        assert_eq!(w.freshest("u", "6"), Some("Ready"));
        assert_eq!(w.freshest("other", "5"), None);
        // The cache shows the write, or anything later.
        assert_eq!(w.freshest("u", "7"), None);
        assert_eq!(w.freshest("u", "8"), None);
        w.written("u", "9", "Failed");
        assert_eq!(w.freshest("u", "8"), Some("Failed"));
        w.retain(|uid| uid != "u");
        assert_eq!(w.freshest("u", "8"), None);
        // A version that is not a number cannot be ordered: the cache wins.
        w.written("v", "x1", "Ready");
        assert_eq!((w.pending(), w.freshest("v", "5")), (0, None));
        w.written("v", "7", "Ready");
        assert_eq!(w.freshest("v", "x1"), None);
    }

    #[test]
    fn an_entry_lasts_only_until_the_watch_delivers_the_write() {
        let w: WrittenStatus<&str> = WrittenStatus::default();
        w.written("a", "7", "Ready");
        w.written("b", "9", "Ready");
        // The copy written over, and a change someone made before the
        // write landed: still needed.
        w.seen("a", "5");
        w.seen("a", "6");
        assert_eq!((w.pending(), w.freshest("a", "6")), (2, Some("Ready")));
        // The write (or a later change) arrived: gone.
        w.seen("a", "7");
        w.seen("unknown", "1");
        assert_eq!((w.pending(), w.freshest("a", "6")), (1, None));
        w.seen("b", "10");
        assert_eq!((w.pending(), w.freshest("b", "8")), (0, None));
    }

    #[test]
    fn only_the_event_of_a_replicas_own_last_write_is_its_own() {
        let w = OwnWrites::default();
        let secret = TargetKind::Secret;
        w.wrote(secret, "ns", "out", "7");
        // Someone else's version (an edit before or after ours) is a change.
        assert!(!w.delivered(secret, "ns", "out", "6"));
        assert!(!w.delivered(TargetKind::ConfigMap, "ns", "out", "7"));
        assert!(!w.delivered(secret, "other", "out", "7"));
        // Ours, once; the next event of that version (a relist) is not.
        assert!(w.delivered(secret, "ns", "out", "7"));
        assert!(!w.delivered(secret, "ns", "out", "7"));
        assert_eq!(w.pending(), 0);
        // A deleted target leaves nothing behind.
        w.wrote(secret, "ns", "gone", "9");
        w.forget(secret, "ns", "gone");
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn writes_whose_event_never_comes_are_dropped_in_time() {
        let w = OwnWrites::default();
        for i in 0..PRUNE_ABOVE {
            w.wrote(TargetKind::Secret, "ns", &format!("s{i}"), "1");
        }
        // All recent: kept.
        w.wrote(TargetKind::Secret, "ns", "next", "1");
        assert_eq!(w.pending(), PRUNE_ABOVE + 1);
        let long_ago = Instant::now()
            .checked_sub(STALE + Duration::from_secs(1))
            .expect("the clock is past the stale age");
        for v in w.inner.lock().unwrap().values_mut() {
            v.1 = long_ago;
        }
        w.wrote(TargetKind::Secret, "ns", "last", "1");
        assert_eq!(w.pending(), 1);
        assert!(w.delivered(TargetKind::Secret, "ns", "last", "1"));
    }
}
