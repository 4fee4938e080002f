//! The worker pool of a controller: workers take keys of the shards this
//! replica owns from its queue, reconcile them under the shard's
//! cancellation token, and requeue them (at the due time the reconcile asks
//! for; after an error, with backoff or at the resync interval, by kind of
//! error). How many of them reconcile at once follows this replica's part of
//! the replicas' work ([`worker_scale`], [`Slots`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::error::SyncError;
use super::queue::{self, Mark, Queue};
use crate::kms::limiter::{Urgency, with_urgency};

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reconcile again at this time.
    RequeueAt(SystemTime),
    /// Nothing more until something changes.
    Done,
}

/// One reconcile's arguments.
pub struct Job<'a, K> {
    /// What every kind shares.
    pub ctx: &'a Context,
    /// The resource.
    pub key: &'a K,
    /// Its shard.
    pub shard: u32,
    /// Fires when the shard is lost (or the operator stops).
    pub cancel: &'a CancellationToken,
    /// How the key came to be handed out (a scheduled resync, an event, a
    /// change heard from the KMS).
    pub mark: Mark,
}

/// One controller's reconcile, as the worker pool calls it.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// Reconcile `job.key` of `job.shard`; stop early when `job.cancel`
    /// fires.
    fn reconcile(
        &self,
        job: Job<'_, K>,
    ) -> impl std::future::Future<Output = Result<Action, SyncError>> + Send;

    /// When `key` is tried again after an error that only a change can fix
    /// (its spec, a reference, a target, a refusal of the KMS): its resync
    /// interval. `None`: the longest backoff (`Settings::max_backoff`).
    fn retry_interval(&self, _ctx: &Context, _key: &K) -> Option<Duration> {
        None
    }

    /// Whether `key` is in step (its current spec synced, `Ready`). When
    /// the KMS throttles, such a resource is tried again after those that
    /// have never synced (see [`retry_delay`]). Default: not in step.
    fn in_step(&self, _ctx: &Context, _key: &K) -> bool {
        false
    }

    /// `shard` is being given up: drop what is kept for its resources
    /// beyond the queue (which the wiring drains).
    fn shard_lost(&self, _shard: u32) {}

    /// Publish the kind's own gauges (every 5 s).
    fn report(&self, _ctx: &Context) {}
}

/// [`run_workers`] as a task of its own.
pub fn spawn_workers<K, R>(
    ctx: Arc<Context>,
    queue: &Arc<Queue<K>>,
    controller: &'static str,
    reconciler: &Arc<R>,
) -> tokio::task::JoinHandle<()>
where
    K: Clone + Eq + std::hash::Hash + Ord + std::fmt::Display + Send + Sync + 'static,
    R: Reconciler<K>,
{
    tokio::spawn(run_workers(
        ctx,
        queue.clone(),
        controller,
        reconciler.clone(),
    ))
}

/// Drain `queue` with `ctx.settings.workers` workers until the queue closes.
pub async fn run_workers<K, R>(
    ctx: Arc<Context>,
    queue: Arc<Queue<K>>,
    controller: &'static str,
    reconciler: Arc<R>,
) where
    K: Clone + Eq + std::hash::Hash + Ord + std::fmt::Display + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let base = ctx.settings.workers.max(1);
    let slots = Arc::new(Slots::new(slots_for(base, 1.0)));
    let follow = {
        let (slots, mut scale) = (slots.clone(), ctx.worker_scale.subscribe());
        tokio::spawn(async move {
            loop {
                let now = *scale.borrow_and_update();
                slots.set_limit(slots_for(base, now));
                if scale.changed().await.is_err() {
                    break;
                }
            }
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..slots_for(base, MAX_SCALE) {
        let (ctx, queue, reconciler, slots) = (
            ctx.clone(),
            queue.clone(),
            reconciler.clone(),
            slots.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let slot = slots.take().await;
                let Some((key, shard, mark)) = queue
                    .next_entry(|s| ctx.gate.owns(s), |s| ctx.gate.holds(s))
                    .await
                else {
                    break;
                };
                let cancel = ctx.gate.cancellation(shard);
                let started = tokio::time::Instant::now();
                let urgency = urgency(mark, || reconciler.in_step(&ctx, &key));
                let result = tokio::select! {
                    r = with_urgency(urgency, reconciler.reconcile(Job { ctx: &ctx, key: &key, shard, cancel: &cancel, mark })) => r,
                    () = cancel.cancelled() => Err(SyncError::NotOwner),
                    // The operator stops and the grace is over: dropped,
                    // as on a lost shard.
                    () = ctx.stop.cancelled() => Err(SyncError::NotOwner),
                };
                let elapsed = started.elapsed();
                tracing::debug!(%key, shard, ?mark, ms = elapsed.as_millis(), ok = result.is_ok(), "reconciled");
                match result {
                    Ok(Action::RequeueAt(at)) => {
                        queue.reset_backoff(&key);
                        let delay = at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
                        queue.add_after(key.clone(), shard, delay);
                        ctx.metrics.reconcile(controller, shard, "success", elapsed);
                    }
                    Ok(Action::Done) => {
                        queue.reset_backoff(&key);
                        ctx.metrics.reconcile(controller, shard, "success", elapsed);
                    }
                    Err(SyncError::NotOwner) => {
                        // A shard that is still held (its renewal was only
                        // late) keeps its work; a lost one drops it (the next
                        // owner does a full pass).
                        if ctx.gate.holds(shard) {
                            queue.retry_after(key.clone(), shard, queue::PARK, mark);
                        } else {
                            tracing::debug!(%key, shard, "shard lost during reconcile; dropped");
                        }
                        ctx.metrics.reconcile(controller, shard, "requeue", elapsed);
                    }
                    Err(e) => {
                        let delay = retry_delay(
                            &queue,
                            &key,
                            &e,
                            ctx.settings.max_backoff,
                            || reconciler.retry_interval(&ctx, &key),
                            // A change is retried as soon as its pause ends.
                            || mark != Mark::Change && reconciler.in_step(&ctx, &key),
                        );
                        let result = if matches!(e, SyncError::Kube { code: Some(409), .. }) { "requeue" } else { "error" };
                        let waits = if e.is_transient() { "backoff" } else { "a change or the resync interval" };
                        if e.is_throttled() {
                            // Waiting for the KMS's budget is no failure: one
                            // line a pause (the limiter's), not one a resource.
                            tracing::debug!(controller, %key, retry_in = ?delay, "waiting for the KMS's budget (429)");
                        } else {
                            tracing::warn!(controller, %key, reason = e.reason(), error = %e, retry_in = ?delay, waits, "reconcile failed");
                        }
                        // A change refused (a 429) is still a change when it
                        // comes back: it returns to the lane of changes.
                        queue.retry_after(key.clone(), shard, delay, mark);
                        ctx.metrics.reconcile(controller, shard, result, elapsed);
                    }
                }
                queue.done(&key);
                // Give the other tasks their turn. A reconcile with nothing
                // to do (not due, already in step) completes without waiting
                // on anything, so without this a worker would run through
                // thousands of queued keys (a full pass of a gained shard)
                // without ever returning to the runtime: with every runtime
                // thread in such a loop, nothing else runs — not the shard
                // Lease renewals, which then miss their deadline, lose the
                // shards and, re-acquired, start the next full pass.
                drop(slot);
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    follow.abort();
}

/// The most a replica's workers may reconcile at once, as a multiple of
/// `--workers`, when it has more of the replicas' work than its equal part.
pub const MAX_SCALE: f64 = 2.0;

/// The least, when it has less.
pub const MIN_SCALE: f64 = 0.5;

/// The multiple of `--workers` this replica reconciles at once: its part of
/// the demand every live replica published (`live`, by member; `me` is this
/// replica, whose own figure is `own`, fresher than the published one) times
/// the number of live replicas, between [`MIN_SCALE`] and [`MAX_SCALE`]; 1
/// when no replica has work or this one has none.
///
/// A first sync's reconciles mostly wait on the API server, which serves the
/// replicas' requests in flight alike: with equal worker counts each replica
/// converges at the same rate, so the replica holding 6 of 16 shards (against
/// 5 and 5) finished last and alone. With the workers following the work, as
/// the KMS budget does, the replicas finish together.
pub fn worker_scale(own: u32, me: &str, live: &BTreeMap<String, f64>) -> f64 {
    let own = f64::from(own);
    let others: f64 = live
        .iter()
        .filter(|(member, _)| member.as_str() != me)
        .map(|(_, d)| d.max(0.0))
        .sum();
    let members = live.keys().filter(|m| m.as_str() != me).count() + 1;
    let total = own + others;
    if own <= 0.0 || total <= 0.0 {
        return 1.0;
    }
    (own / total * members as f64).clamp(MIN_SCALE, MAX_SCALE)
}

/// How many of `base` workers reconcile at once at `scale` (at least one).
fn slots_for(base: usize, scale: f64) -> usize {
    ((base as f64 * scale).round() as usize).max(1)
}

/// A limit on the reconciles in flight that can change while workers wait
/// (a semaphore whose size follows [`worker_scale`]).
struct Slots {
    limit: AtomicUsize,
    busy: AtomicUsize,
    freed: Notify,
}

/// One reconcile's place; given back when dropped.
struct Slot(Arc<Slots>);

impl Slots {
    fn new(limit: usize) -> Self {
        Self {
            limit: AtomicUsize::new(limit),
            busy: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// Wait for a place under the limit.
    async fn take(self: &Arc<Self>) -> Slot {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let busy = self.busy.load(Ordering::Acquire);
            if busy < self.limit.load(Ordering::Acquire) {
                if self
                    .busy
                    .compare_exchange(busy, busy + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Slot(self.clone());
                }
                continue;
            }
            freed.await;
        }
    }

    /// Change the limit: places taken above a lower one are given back as
    /// their reconciles finish; a higher one lets waiting workers in at once.
    fn set_limit(&self, limit: usize) {
        let before = self.limit.swap(limit.max(1), Ordering::AcqRel);
        if limit > before {
            self.freed.notify_waiters();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

/// How urgent a reconcile's KMS requests are: routine for a key in step
/// that came due at a scheduled time (a resync, a retry of one); a catch-up
/// for a key in step put in line with its shard (a first list, a full
/// pass: after a restart every resource is overdue at once); urgent for a
/// key added as due (an event, a new resource), a change or its retry, or
/// one not in step (never synced, its spec changed, failing).
fn urgency(mark: Mark, in_step: impl FnOnce() -> bool) -> Urgency {
    let calm = match mark {
        Mark::Scheduled => Urgency::Routine,
        Mark::InLine => Urgency::CatchUp,
        Mark::Added | Mark::Change => return Urgency::Urgent,
    };
    if in_step() { calm } else { Urgency::Urgent }
}

/// When a failed reconcile of `key` is tried again. A transient error (the
/// KMS or the API unavailable, a conflict) backs off: 1 s doubling to the
/// maximum. A `429` (or an endpoint still paused by one) is tried again when
/// the KMS said, however often it was refused before: the pause is the
/// KMS's own answer to when, and a backoff grown by refusals during one
/// pause kept a resource away for minutes after it ended. Retries are
/// spread over 1.5 s after the pause, and a resource already in step
/// (`in_step`: a throttled resync) comes 1.5–4.5 s after it, so the
/// requests the KMS allows in its next window go to resources that have
/// never synced first: under limits tighter than the resyncs need, resyncs
/// would otherwise take the reads first syncs wait for. Any other error
/// (the spec, a reference, a target, the KMS refusing) cannot be fixed by
/// retrying soon: the watches queue the resource when it or what it
/// references changes, and otherwise it is tried at its resync interval (a
/// permission granted in the KMS changes nothing in the cluster).
fn retry_delay<K>(
    queue: &Queue<K>,
    key: &K,
    e: &SyncError,
    max_backoff: Duration,
    resync_interval: impl FnOnce() -> Option<Duration>,
    in_step: impl FnOnce() -> bool,
) -> Duration
where
    K: Clone + Eq + std::hash::Hash + Ord,
{
    if let Some(ra) = e.retry_after() {
        let spread = if in_step() { 1500..4500 } else { 0..1500 };
        return ra + Duration::from_millis(fastrand::u64(spread));
    }
    if e.is_transient() {
        return queue.failed(key, max_backoff);
    }
    queue.reset_backoff(key);
    resync_interval()
        .unwrap_or(max_backoff)
        .mul_f64(0.9 + 0.2 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_follow_the_replicas_part_of_the_work() {
        let live = |d: &[(&str, f64)]| -> BTreeMap<String, f64> {
            d.iter().map(|(m, v)| ((*m).to_owned(), *v)).collect()
        };
        // 6 of 16 shards against 5 and 5 (the 10k converge's 3,830 of
        // 10,000): 15 % more workers than the others.
        let three = live(&[("a", 3830.0), ("b", 3030.0), ("c", 3140.0)]);
        let a = worker_scale(3830, "a", &three);
        assert!((a - 1.149).abs() < 1e-9, "{a}");
        let b = worker_scale(3030, "b", &three);
        assert!((b - 0.909).abs() < 1e-9, "{b}");
        // Its own figure counts, not the one it published a moment ago.
        let stale = live(&[("a", 0.0), ("b", 3030.0), ("c", 3140.0)]);
        let fresh = worker_scale(3830, "a", &stale);
        assert!((fresh - a).abs() < 1e-9, "{fresh}");
        // The others done: as many as allowed; this one done, or nobody
        // with work, or alone: as configured.
        assert_eq!(
            worker_scale(500, "a", &live(&[("a", 500.0), ("b", 0.0), ("c", 0.0)])),
            MAX_SCALE
        );
        assert_eq!(worker_scale(0, "a", &three), 1.0);
        assert_eq!(worker_scale(0, "a", &live(&[("b", 0.0)])), 1.0);
        assert_eq!(worker_scale(40, "a", &BTreeMap::new()), 1.0);
        // Little work against a lot: never below half.
        assert_eq!(worker_scale(1, "a", &live(&[("b", 1000.0)])), MIN_SCALE);
        assert_eq!(slots_for(32, a), 37);
        assert_eq!(slots_for(32, MAX_SCALE), 64);
        assert_eq!(slots_for(1, MIN_SCALE), 1);
    }

    #[tokio::test]
    async fn slots_hold_reconciles_to_a_limit_that_can_change_while_they_wait() {
        let slots = Arc::new(Slots::new(2));
        let (one, two) = (slots.take().await, slots.take().await);
        let third = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "a third place under a limit of 2");
        // A higher limit lets the waiting one in at once.
        slots.set_limit(3);
        let three = tokio::time::timeout(Duration::from_secs(1), third)
            .await
            .expect("let in")
            .expect("task");
        // A lower one: places come back as reconciles finish, and none is
        // given until fewer than the limit are taken.
        slots.set_limit(1);
        drop(one);
        let fourth = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!fourth.is_finished(), "2 taken under a limit of 1");
        drop(two);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!fourth.is_finished(), "1 taken under a limit of 1");
        drop(three);
        tokio::time::timeout(Duration::from_secs(1), fourth)
            .await
            .expect("a place once all were given back")
            .expect("task");
    }

    #[test]
    fn only_a_resync_or_a_full_pass_of_a_resource_in_step_is_not_urgent() {
        assert_eq!(urgency(Mark::Scheduled, || true), Urgency::Routine);
        assert_eq!(urgency(Mark::InLine, || true), Urgency::CatchUp);
        assert_eq!(
            urgency(Mark::InLine, || false),
            Urgency::Urgent,
            "a first sync of a full pass"
        );
        assert_eq!(
            urgency(Mark::Scheduled, || false),
            Urgency::Urgent,
            "never synced, or failing"
        );
        for mark in [Mark::Added, Mark::Change] {
            assert_eq!(
                urgency(mark, || panic!("not asked for a key added as due")),
                Urgency::Urgent
            );
        }
    }

    #[test]
    fn transient_errors_back_off_and_the_others_wait_for_the_resync_interval() {
        let q: Queue<String> = Queue::new();
        let key = "ns/app".to_owned();
        let max = Duration::from_secs(300);
        let unavailable = SyncError::Kube {
            context: "list".into(),
            message: "etcd unavailable".into(),
            code: Some(503),
        };
        let within = |d: Duration, base: u64| {
            d >= Duration::from_millis(base * 800) && d <= Duration::from_millis(base * 1200)
        };
        // 1 s, 2 s, 4 s, … (±20 %), whatever the resync interval.
        for base in [1, 2, 4, 8] {
            let d = retry_delay(
                &q,
                &key,
                &unavailable,
                max,
                || Some(Duration::from_secs(60)),
                || false,
            );
            assert!(within(d, base), "{d:?} is not about {base} s");
        }
        // A spec error waits for a change, or the resync interval; and the
        // backoff starts over.
        let invalid = SyncError::Spec("secretsPath: not a path".into());
        let d = retry_delay(
            &q,
            &key,
            &invalid,
            max,
            || Some(Duration::from_secs(60)),
            || false,
        );
        assert!(
            d >= Duration::from_secs(54) && d <= Duration::from_secs(66),
            "{d:?}"
        );
        let d = retry_delay(&q, &key, &unavailable, max, || None, || false);
        assert!(within(d, 1), "{d:?}: the backoff did not start over");
        // Without a resync interval: the longest backoff.
        let d = retry_delay(&q, &key, &invalid, max, || None, || false);
        assert!(d >= Duration::from_secs(270), "{d:?}");
        // The KMS's Retry-After is honoured for transient errors.
        let limited = SyncError::Kms(crate::kms::KmsError::rate_limited(
            "GET /api/v3/secrets/raw",
            Duration::from_secs(30),
        ));
        let d = retry_delay(&q, &key, &limited, max, || None, || false);
        assert!(d >= Duration::from_secs(30), "{d:?}");
        // However often a pause refused it, and whatever failed before: the
        // retry is when the pause ends, not a backoff grown meanwhile.
        for _ in 0..8 {
            retry_delay(&q, &key, &unavailable, max, || None, || false);
        }
        for _ in 0..10 {
            let d = retry_delay(&q, &key, &limited, max, || None, || false);
            assert!(
                d >= Duration::from_secs(30) && d <= Duration::from_millis(31_500),
                "{d:?}"
            );
        }
        // A resource in step (a throttled resync) comes after those that
        // have never synced: after the 1.5 s their retries are spread over.
        for _ in 0..10 {
            let d = retry_delay(&q, &key, &limited, max, || None, || true);
            assert!(
                d >= Duration::from_millis(31_500) && d <= Duration::from_millis(34_500),
                "{d:?}"
            );
        }
    }

    /// A reconcile that has nothing to wait for: busy for `each`, then done.
    struct NothingToWait(std::sync::atomic::AtomicUsize, Duration);

    impl Reconciler<String> for NothingToWait {
        async fn reconcile(&self, _job: Job<'_, String>) -> Result<Action, SyncError> {
            let until = std::time::Instant::now() + self.1;
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Action::Done)
        }
    }

    /// Workers that find a long queue of keys with nothing to do still let
    /// the other tasks of their runtime thread run (here one thread, as when
    /// every runtime thread is a busy worker): a timer set for 5 ms fires
    /// long before 2,000 keys of 50 µs each (100 ms) are through. Without
    /// the yield after each key, the timer waits for the whole queue.
    #[tokio::test(flavor = "current_thread")]
    async fn workers_with_nothing_to_wait_for_leave_other_tasks_their_turn() {
        let mut ctx = Context::test();
        ctx.settings.workers = 2;
        let ctx = Arc::new(ctx);
        let queue: Arc<Queue<String>> = Arc::new(Queue::new());
        const KEYS: usize = 2000;
        for i in 0..KEYS {
            queue.add(format!("ns/key-{i}"), 0);
        }
        let reconciler = Arc::new(NothingToWait(
            std::sync::atomic::AtomicUsize::new(0),
            Duration::from_micros(50),
        ));
        let workers = tokio::spawn(run_workers(ctx, queue.clone(), "test", reconciler.clone()));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let done_when_the_timer_fired = reconciler.0.load(std::sync::atomic::Ordering::SeqCst);
        queue.close();
        workers.await.unwrap();
        assert!(
            done_when_the_timer_fired < KEYS / 2,
            "the timer ran only after {done_when_the_timer_fired} of {KEYS} keys"
        );
    }

    /// A reconcile that waits on something that never answers (a KMS
    /// holding its request); it counts its starts.
    struct Hangs(std::sync::atomic::AtomicUsize);

    impl Reconciler<String> for Hangs {
        async fn reconcile(&self, _job: Job<'_, String>) -> Result<Action, SyncError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            futures::future::pending().await
        }
    }

    /// Closing the queue takes no new work but waits for the reconciles in
    /// flight; the stop token drops them, and the workers end.
    #[tokio::test(start_paused = true)]
    async fn the_stop_drops_reconciles_still_in_flight() {
        let mut ctx = Context::test();
        ctx.settings.workers = 2;
        let ctx = Arc::new(ctx);
        let queue: Arc<Queue<String>> = Arc::new(Queue::new());
        for i in 0..3 {
            queue.add(format!("ns/key-{i}"), 0);
        }
        let reconciler = Arc::new(Hangs(std::sync::atomic::AtomicUsize::new(0)));
        let workers = tokio::spawn(run_workers(
            ctx.clone(),
            queue.clone(),
            "test",
            reconciler.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(reconciler.0.load(std::sync::atomic::Ordering::SeqCst), 2);
        queue.close();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !workers.is_finished(),
            "closing alone waits for the reconciles in flight"
        );
        ctx.stop.cancel();
        tokio::time::timeout(Duration::from_secs(1), workers)
            .await
            .expect("the workers end once their reconciles are dropped")
            .unwrap();
        // The third key was never started: the queue was closed.
        assert_eq!(reconciler.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
