//! The work queue of a controller, split by shard.
//!
//! Like client-go's workqueue: a key is queued at most once; a key being
//! processed is never handed out twice, and a key added while it is processed
//! is queued again when processing ends; delayed keys become ready at their
//! due time (an earlier due time wins). Changes heard from the KMS
//! ([`Queue::add_change`]) go to a lane of their own that is served first:
//! when resyncs fall behind a busy budget, thousands of keys may wait in
//! line, and a change must not wait behind them. Every entry carries its shard, so a
//! shard that is lost can be dropped as a whole, and depth and age are
//! reported per shard.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How a key came to be handed out, which decides how urgent its work is
/// (see `controllers::workers`). Ordered: an entry added twice keeps the
/// stronger mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mark {
    /// It came due at a scheduled time (a resync, the retry of a resync).
    Scheduled,
    /// Put in line with every resource of its shard (the shard's first
    /// list, its full pass: [`Queue::add_in_line`]): waiting work, counted
    /// in the replica's demand like work added as due, but for a resource
    /// in step it is a resync (after a restart every resource is overdue at
    /// once), so its KMS requests are a paced catch-up, behind urgent ones
    /// (`kms::limiter::Urgency::CatchUp`).
    InLine,
    /// Added as due (a watch event, a new resource, a stream's opening).
    Added,
    /// A change heard from the KMS, or the retry of one: served from the
    /// lane of changes.
    Change,
}

/// A queued key's place.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// In the ready FIFO since the instant, and how it is handed out: as
    /// scheduled work (a resync, a retry), in line (a full pass), or added
    /// as due (an event, a new resource).
    Ready(Instant, Mark),
    /// Waiting until the instant (with a sequence number for ordering),
    /// and how it is handed out when it comes due.
    Delayed(Instant, u64, Mark),
    /// In the lane of changes (served before the ready FIFO) since the
    /// instant.
    Change(Instant),
}

struct Inner<K> {
    /// Keys of changes heard from the KMS, handed out before `ready`.
    changes: VecDeque<K>,
    ready: VecDeque<K>,
    delayed: BTreeSet<(Instant, u64, K)>,
    queued: HashMap<K, (u32, Place)>,
    /// Keys being processed, with their shard.
    processing: HashMap<K, u32>,
    /// Keys added while processing: shard, when they become ready, and
    /// the strongest mark of the adds.
    dirty: HashMap<K, (u32, Instant, Mark)>,
    seq: u64,
    closed: bool,
    /// Consecutive transient failures per key (the backoff state).
    failures: HashMap<K, u32>,
}

/// How long an entry of a held shard whose renewal is late waits before
/// the next look.
pub const PARK: Duration = Duration::from_secs(1);

/// A deduplicating, delaying, per-shard work queue.
pub struct Queue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
    /// Woken whenever a key's processing ends (see [`Queue::idle_for`]).
    finished: Notify,
}

impl<K: Clone + Eq + Hash + Ord> Default for Queue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Ord> Queue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                changes: VecDeque::new(),
                ready: VecDeque::new(),
                delayed: BTreeSet::new(),
                queued: HashMap::new(),
                processing: HashMap::new(),
                dirty: HashMap::new(),
                seq: 0,
                closed: false,
                failures: HashMap::new(),
            }),
            notify: Notify::new(),
            finished: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `key` now.
    pub fn add(&self, key: K, shard: u32) {
        self.add_at(key, shard, Instant::now());
    }

    /// Queue `key` now, in line with every resource of its shard
    /// (`Mark::InLine`): the first list of a shard and its full pass. After
    /// a restart or a hand-over they are all overdue at once; a resource in
    /// step among them spends the KMS budget as a resync does, behind every
    /// change.
    pub fn add_in_line(&self, key: K, shard: u32) {
        self.add_marked(key, shard, Instant::now(), Mark::InLine);
    }

    /// Queue `key` now for a change heard from outside (an event of the
    /// KMS), in the lane of changes: it is handed out before every key of
    /// the ready FIFO, and wherever it was waiting (in line as a scheduled
    /// resync, or delayed) it leaves that place. It counts as added as due
    /// (its KMS requests are urgent, see [`Queue::next_entry`]). A key being
    /// processed goes to the lane when processing ends. Echoes of the
    /// operator's own writes use [`Queue::add`]: they must not jump the line.
    pub fn add_change(&self, key: K, shard: u32) {
        let now = Instant::now();
        let mut q = self.lock();
        if q.closed {
            return;
        }
        if q.processing.contains_key(&key) {
            let entry = q.dirty.entry(key).or_insert((shard, now, Mark::Change));
            entry.1 = entry.1.min(now);
            entry.2 = Mark::Change;
            return;
        }
        match q.queued.get(&key).copied() {
            Some((_, Place::Change(_))) => return,
            // Its entry in the ready FIFO stays behind, skipped when it
            // comes up (no search through a line of thousands).
            Some((_, Place::Ready(..))) => {}
            Some((_, Place::Delayed(at, seq, _))) => {
                q.delayed.remove(&(at, seq, key.clone()));
            }
            None => {}
        }
        q.changes.push_back(key.clone());
        q.queued.insert(key, (shard, Place::Change(now)));
        drop(q);
        self.notify.notify_one();
    }

    /// Queue `key` again after `delay` to retry work that failed, handed
    /// out as `mark` says when it comes due: a change refused by the KMS
    /// (`Mark::Change`) goes back to the lane of changes, still ahead of
    /// the resyncs; anything else comes due as scheduled work.
    pub fn retry_after(&self, key: K, shard: u32, delay: Duration, mark: Mark) {
        let mark = if mark == Mark::Change {
            Mark::Change
        } else {
            Mark::Scheduled
        };
        self.add_marked(key, shard, Instant::now() + delay, mark);
    }

    /// Queue `key` after `delay`.
    pub fn add_after(&self, key: K, shard: u32, delay: Duration) {
        self.add_at(key, shard, Instant::now() + delay);
    }

    /// Queue `key` at `due` (now or later). An entry that is already due
    /// earlier keeps its time. Added for later, it is handed out as
    /// scheduled work when it comes due.
    pub fn add_at(&self, key: K, shard: u32, due: Instant) {
        let mark = if due > Instant::now() {
            Mark::Scheduled
        } else {
            Mark::Added
        };
        self.add_marked(key, shard, due, mark);
    }

    fn add_marked(&self, key: K, shard: u32, due: Instant, mark: Mark) {
        let now = Instant::now();
        let mut q = self.lock();
        if q.closed {
            return;
        }
        if q.processing.contains_key(&key) {
            let entry = q.dirty.entry(key).or_insert((shard, due, mark));
            entry.1 = entry.1.min(due);
            entry.2 = entry.2.max(mark);
            return;
        }
        match q.queued.get(&key).copied() {
            Some((_, Place::Ready(..) | Place::Change(_))) => return,
            Some((_, Place::Delayed(at, seq, _))) => {
                if at <= due {
                    return;
                }
                q.delayed.remove(&(at, seq, key.clone()));
            }
            None => {}
        }
        if due <= now {
            Self::make_ready(&mut q, key, shard, now, mark);
        } else {
            q.seq += 1;
            let seq = q.seq;
            q.delayed.insert((due, seq, key.clone()));
            q.queued
                .insert(key, (shard, Place::Delayed(due, seq, mark)));
        }
        drop(q);
        self.notify.notify_one();
    }

    /// Put `key` (not queued) where `mark` sends it: the lane of changes,
    /// or the ready FIFO.
    fn make_ready(q: &mut Inner<K>, key: K, shard: u32, since: Instant, mark: Mark) {
        if mark == Mark::Change {
            q.changes.push_back(key.clone());
            q.queued.insert(key, (shard, Place::Change(since)));
        } else {
            q.ready.push_back(key.clone());
            q.queued.insert(key, (shard, Place::Ready(since, mark)));
        }
    }

    /// Move due delayed entries to the ready FIFO; return the next due time.
    fn promote(q: &mut Inner<K>, now: Instant) -> Option<Instant> {
        while let Some((at, seq, key)) = q.delayed.first().cloned() {
            if at > now {
                return Some(at);
            }
            q.delayed.remove(&(at, seq, key.clone()));
            if let Some(&(shard, Place::Delayed(.., mark))) = q.queued.get(&key) {
                Self::make_ready(q, key, shard, at, mark);
            }
        }
        None
    }

    /// Wait for the next ready key whose shard `accept` allows. Entries of
    /// other shards are kept for another look after [`PARK`] when `keep`
    /// says so (a held shard whose renewal is late), else dropped (a shard
    /// that is not ours). `None` once the queue is closed.
    pub async fn next(
        &self,
        accept: impl Fn(u32) -> bool,
        keep: impl Fn(u32) -> bool,
    ) -> Option<(K, u32)> {
        self.next_entry(accept, keep)
            .await
            .map(|(key, shard, _)| (key, shard))
    }

    /// Like [`Queue::next`], and how the key came to be handed out
    /// ([`Mark`]).
    pub async fn next_entry(
        &self,
        accept: impl Fn(u32) -> bool,
        keep: impl Fn(u32) -> bool,
    ) -> Option<(K, u32, Mark)> {
        loop {
            let notified = self.notify.notified();
            let wait_until = {
                let mut q = self.lock();
                if q.closed {
                    return None;
                }
                let now = Instant::now();
                let mut next_due = Self::promote(&mut q, now);
                let mut found = None;
                let mut parked = Vec::new();
                loop {
                    let (key, lane) = match q.changes.pop_front() {
                        Some(key) => (key, true),
                        None => match q.ready.pop_front() {
                            Some(key) => (key, false),
                            None => break,
                        },
                    };
                    // An entry left in the ready FIFO by a key that moved
                    // to the lane of changes is skipped, whatever the key
                    // has become since (in the lane, delayed, or gone).
                    let mark = match q.queued.get(&key) {
                        Some((_, Place::Ready(_, mark))) if !lane => *mark,
                        Some((_, Place::Change(_))) if lane => Mark::Change,
                        _ => continue,
                    };
                    let Some((shard, _)) = q.queued.remove(&key) else {
                        continue;
                    };
                    if accept(shard) {
                        q.processing.insert(key.clone(), shard);
                        found = Some((key, shard, mark));
                        break;
                    }
                    if keep(shard) {
                        parked.push((key, shard, mark));
                    }
                }
                if !parked.is_empty() {
                    let at = now + PARK;
                    for (key, shard, mark) in parked {
                        q.seq += 1;
                        let seq = q.seq;
                        q.delayed.insert((at, seq, key.clone()));
                        q.queued.insert(key, (shard, Place::Delayed(at, seq, mark)));
                    }
                    next_due = Some(next_due.map_or(at, |d| d.min(at)));
                }
                if let Some(item) = found {
                    // Others may be ready too.
                    if !q.ready.is_empty() || !q.changes.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(item);
                }
                next_due
            };
            match wait_until {
                Some(at) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Processing of `key` ended; queue it again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut q = self.lock();
        q.processing.remove(key);
        let dirty = q.dirty.remove(key);
        drop(q);
        self.finished.notify_waiters();
        if let Some((shard, due, mark)) = dirty {
            self.add_marked(key.clone(), shard, due, mark);
        }
    }

    /// Wait until no key of `shard` is being processed (at once when none
    /// is), woken as each one ends.
    pub async fn idle_for(&self, shard: u32) {
        loop {
            let ended = self.finished.notified();
            tokio::pin!(ended);
            // Registered before looking, so an end in between is not missed.
            ended.as_mut().enable();
            if self.in_progress_for(shard) == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Drop every entry of `shard` (the shard was lost).
    pub fn drop_shard(&self, shard: u32) -> usize {
        let mut q = self.lock();
        let keys: Vec<K> = q
            .queued
            .iter()
            .filter(|(_, (s, _))| *s == shard)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            if let Some((_, Place::Delayed(at, seq, _))) = q.queued.remove(key) {
                q.delayed.remove(&(at, seq, key.clone()));
            }
        }
        let Inner {
            ready,
            changes,
            queued,
            ..
        } = &mut *q;
        ready.retain(|k| queued.contains_key(k));
        changes.retain(|k| queued.contains_key(k));
        q.dirty.retain(|_, (s, ..)| *s != shard);
        keys.len()
    }

    /// Remove `key` wherever it waits.
    pub fn forget(&self, key: &K) {
        let mut q = self.lock();
        q.failures.remove(key);
        if let Some((_, Place::Delayed(at, seq, _))) = q.queued.remove(key) {
            q.delayed.remove(&(at, seq, key.clone()));
        }
        q.ready.retain(|k| k != key);
        q.changes.retain(|k| k != key);
        q.dirty.remove(key);
    }

    /// One more transient failure of `key`: how long it waits before the
    /// next attempt (1 s doubling to `max`, ±20 % jitter).
    pub fn failed(&self, key: &K, max: Duration) -> Duration {
        let mut q = self.lock();
        let n = q.failures.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        let base = Duration::from_secs(1)
            .saturating_mul(1u32 << (*n - 1).min(16))
            .min(max);
        base.mul_f64(0.8 + 0.4 * fastrand::f64())
    }

    /// `key` succeeded, or failed in a way retrying soon cannot fix: its
    /// backoff starts over.
    pub fn reset_backoff(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Depth per shard and age of the oldest ready entry per shard.
    pub fn stats(&self) -> HashMap<u32, (usize, Duration)> {
        let now = Instant::now();
        let mut q = self.lock();
        Self::promote(&mut q, now);
        let mut out: HashMap<u32, (usize, Duration)> = HashMap::new();
        for (shard, place) in q.queued.values() {
            let e = out.entry(*shard).or_default();
            e.0 += 1;
            if let Place::Ready(since, _) | Place::Change(since) = place {
                e.1 = e.1.max(now.saturating_duration_since(*since));
            }
        }
        out
    }

    /// Work waiting now: keys of the shards `owned` says are ours, added as
    /// due (events, new resources, full passes), that wait or are being
    /// processed. Keys that came due at a scheduled time (resyncs, retries)
    /// do not count — a replica with only those leaves the budget to
    /// replicas with new work —, nor do keys of other shards (watch events
    /// queue every object; the workers drop the ones that are not ours).
    pub fn demand(&self, owned: impl Fn(u32) -> bool) -> usize {
        let now = Instant::now();
        let mut q = self.lock();
        Self::promote(&mut q, now);
        let added = q
            .queued
            .values()
            .filter(|(shard, place)| {
                matches!(
                    place,
                    Place::Ready(_, Mark::InLine | Mark::Added) | Place::Change(_)
                ) && owned(*shard)
            })
            .count();
        added + q.processing.len()
    }

    /// Number of queued (ready or delayed) entries.
    pub fn len(&self) -> usize {
        self.lock().queued.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys of `shard` being processed right now.
    pub fn in_progress_for(&self, shard: u32) -> usize {
        self.lock()
            .processing
            .values()
            .filter(|s| **s == shard)
            .count()
    }

    /// Stop handing out work; waiting `next` calls return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }
}

/// The interval with ±10 % jitter; `r` is a uniform number in `[0, 1)`.
pub fn jittered(interval: Duration, r: f64) -> Duration {
    interval.mul_f64(JITTER_LOW + 0.2 * r)
}

/// The shortest [`jittered`] interval, as a share of the interval.
pub const JITTER_LOW: f64 = 0.9;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deduplicates_and_orders() {
        let q: Queue<&str> = Queue::new();
        q.add("a", 0);
        q.add("b", 0);
        q.add("a", 0);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next(|_| true, |_| false).await, Some(("a", 0)));
        assert_eq!(q.next(|_| true, |_| false).await, Some(("b", 0)));
    }

    #[tokio::test(start_paused = true)]
    async fn demand_counts_new_work_not_scheduled_resyncs() {
        let q: Queue<&str> = Queue::new();
        q.add("new", 0);
        q.add_after("resync", 0, Duration::from_secs(60));
        q.add("not ours", 1);
        let q = &q;
        let demand = || q.demand(|s| s == 0);
        assert_eq!(demand(), 1);
        tokio::time::advance(Duration::from_secs(61)).await;
        // Due now, but it came due at its scheduled time.
        assert_eq!(demand(), 1);
        let (k, _) = q.next(|s| s == 0, |_| false).await.unwrap();
        assert_eq!(k, "new");
        assert_eq!(demand(), 1, "in progress counts");
        q.done(&k);
        assert_eq!(demand(), 0);
        // An event for a key that is already due keeps its place in line,
        // and what it counts as.
        q.add("resync", 0);
        assert_eq!(demand(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn changes_go_before_the_line_of_resyncs() {
        let q: Queue<&str> = Queue::new();
        q.add_after("resync", 0, Duration::from_secs(5));
        q.add_after("other", 0, Duration::from_secs(6));
        q.add_after("later", 0, Duration::from_secs(60));
        q.add("busy", 0);
        let got = |e: Option<(&'static str, u32, Mark)>| e.map(|(k, _, m)| (k, m));
        let next = || q.next_entry(|_| true, |_| false);
        assert_eq!(got(next().await), Some(("busy", Mark::Added)));
        tokio::time::advance(Duration::from_secs(7)).await;
        // An echo leaves a scheduled key in line; a change takes it out of
        // the line (or out of its delay) to the front; a change for a key
        // being processed brings it to the front when it is done.
        q.add("resync", 0);
        q.add("other", 0);
        q.add_change("other", 0);
        q.add_change("later", 0);
        q.add_change("busy", 0);
        q.add_change("later", 0);
        assert_eq!(q.demand(|_| true), 3, "changes are demand");
        assert_eq!(got(next().await), Some(("other", Mark::Change)));
        assert_eq!(got(next().await), Some(("later", Mark::Change)));
        q.done(&"busy");
        assert_eq!(got(next().await), Some(("busy", Mark::Change)));
        assert_eq!(got(next().await), Some(("resync", Mark::Scheduled)));
        assert_eq!(q.len(), 0, "each key once");
        // A lost shard's changes go with it.
        q.add_change("x", 1);
        assert_eq!(q.drop_shard(1), 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(10), next())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_failed_is_retried_as_a_change() {
        let q: Queue<&str> = Queue::new();
        let next = || q.next_entry(|_| true, |_| false);
        q.add_change("change", 0);
        q.add_after("resync", 0, Duration::from_secs(1));
        q.add_after("waiting", 0, Duration::from_secs(2));
        assert_eq!(next().await, Some(("change", 0, Mark::Change)));
        // Retries are added while the key is processed (before `done`).
        q.retry_after("change", 0, Duration::from_secs(30), Mark::Change);
        q.done(&"change");
        assert_eq!(next().await, Some(("resync", 0, Mark::Scheduled)));
        q.retry_after("resync", 0, Duration::from_secs(30), Mark::Scheduled);
        q.done(&"resync");
        assert_eq!(next().await, Some(("waiting", 0, Mark::Scheduled)));
        // Work added as due and retried comes back as scheduled work.
        q.retry_after("waiting", 0, Duration::from_secs(30), Mark::Added);
        q.done(&"waiting");
        tokio::time::advance(Duration::from_secs(31)).await;
        // The change comes back in the lane of changes, first, and counts
        // as demand; the others as resyncs, in line.
        assert_eq!(q.demand(|_| true), 1);
        assert_eq!(next().await, Some(("change", 0, Mark::Change)));
        assert_eq!(next().await, Some(("resync", 0, Mark::Scheduled)));
        assert_eq!(next().await, Some(("waiting", 0, Mark::Scheduled)));
        // A retry merged with a change heard meanwhile is a change now.
        q.retry_after("resync", 0, Duration::from_secs(30), Mark::Scheduled);
        q.add_change("resync", 0);
        q.done(&"resync");
        assert_eq!(next().await, Some(("resync", 0, Mark::Change)));
        // A held shard whose renewal is late: its change waits a moment
        // and stays a change.
        q.done(&"resync");
        q.add_change("parked", 1);
        let late = q.next_entry(|s| s == 0, |s| s == 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(10), late)
                .await
                .is_err()
        );
        tokio::time::advance(PARK).await;
        assert_eq!(next().await, Some(("parked", 1, Mark::Change)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_resync_in_line_that_a_change_moves_is_handed_out_once() {
        let q: Queue<&str> = Queue::new();
        q.add_after("a", 0, Duration::from_secs(1));
        q.add_after("b", 0, Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(q.demand(|_| true), 0, "both in line as resyncs");
        q.add_change("b", 0);
        let next = || q.next_entry(|_| true, |_| false);
        assert_eq!(next().await, Some(("b", 0, Mark::Change)));
        assert_eq!(next().await, Some(("a", 0, Mark::Scheduled)));
        // The place "b" left in line is skipped, also once "b" waits for
        // its next resync: it is not handed out before that.
        q.done(&"b");
        q.add_after("b", 0, Duration::from_secs(60));
        let start = Instant::now();
        assert_eq!(next().await, Some(("b", 0, Mark::Scheduled)));
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert_eq!(q.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_entries_wait_and_earlier_wins() {
        let q: Queue<&str> = Queue::new();
        q.add_after("a", 0, Duration::from_secs(10));
        q.add_after("a", 0, Duration::from_secs(5));
        q.add_after("a", 0, Duration::from_secs(20));
        let start = Instant::now();
        assert_eq!(q.next(|_| true, |_| false).await, Some(("a", 0)));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_progress_is_requeued_after_done() {
        let q: Queue<&str> = Queue::new();
        q.add("a", 0);
        let (k, _) = q.next(|_| true, |_| false).await.unwrap();
        q.add("a", 0);
        assert_eq!(q.len(), 0, "not handed out twice while processing");
        q.done(&k);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next(|_| true, |_| false).await, Some(("a", 0)));
    }

    #[tokio::test]
    async fn idle_for_wakes_when_the_shards_last_key_is_done() {
        let q = std::sync::Arc::new(Queue::<&str>::new());
        q.add("a", 3);
        q.add("b", 4);
        let (first, _) = q.next(|_| true, |_| false).await.unwrap();
        let (second, _) = q.next(|_| true, |_| false).await.unwrap();
        let (a, b) = if first == "a" {
            (first, second)
        } else {
            (second, first)
        };
        // Another shard's key does not count; none in progress: at once.
        tokio::time::timeout(Duration::from_secs(1), q.idle_for(9))
            .await
            .expect("a shard with nothing in progress is idle");
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.idle_for(3).await })
        };
        q.done(&b);
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "shard 3 still has a key in progress"
        );
        q.done(&a);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken when its key was done")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn entries_of_a_held_shard_wait_for_its_renewal() {
        let q: Queue<&str> = Queue::new();
        q.add("a", 1);
        let renewed = std::sync::atomic::AtomicBool::new(false);
        let owns = |s: u32| s == 1 && renewed.load(std::sync::atomic::Ordering::SeqCst);
        // Shard 1 is held but its renewal is late: "a" is kept, not handed out.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), q.next(owns, |s| s == 1))
                .await
                .is_err()
        );
        assert_eq!(q.len(), 1);
        renewed.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(q.next(owns, |s| s == 1).await, Some(("a", 1)));
    }

    #[tokio::test(start_paused = true)]
    async fn shards_are_dropped_and_filtered() {
        let q: Queue<&str> = Queue::new();
        q.add("a", 1);
        q.add_after("b", 1, Duration::from_secs(3));
        q.add("c", 2);
        assert_eq!(q.stats()[&1].0, 2);
        assert_eq!(q.drop_shard(1), 2);
        assert_eq!(q.len(), 1);
        q.add("d", 3);
        // Shard 2 is not accepted: its entry is dropped, "d" is handed out.
        assert_eq!(q.next(|s| s == 3, |_| false).await, Some(("d", 3)));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn close_wakes_waiters() {
        let q = std::sync::Arc::new(Queue::<&str>::new());
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.next(|_| true, |_| false).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn ages_are_reported() {
        let q: Queue<&str> = Queue::new();
        q.add("a", 0);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let stats = q.stats();
        assert_eq!(stats[&0].0, 1);
        assert!(stats[&0].1 >= Duration::from_secs(3));
    }
}
