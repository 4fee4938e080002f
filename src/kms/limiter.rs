//! The KMS request budget: one token bucket per endpoint (scheme, host and
//! port: two KMS servers on one host name are two endpoints),
//! `--kms-rate-limit` requests per second for the whole operator divided
//! among live replicas; a burst of twice the rate, split evenly among them
//! (earned: a new bucket holds one request). A `429` pauses its endpoint
//! until its `Retry-After` has passed, so no request of this replica adds
//! to a storm; a request that meets a
//! pause longer than a moment does not wait for it but is refused at once
//! ([`Limiter::acquire_unless_paused`]), so the reconcile that made it gives
//! its worker back and comes round again when the pause ends.
//!
//! Replicas share the rate in proportion to the demand each publishes
//! (`share`): a larger part applies only after the others have seen it, a
//! member that left keeps its weight for a while. The burst does not follow
//! the demand: a replica that idles while the others work refills an even
//! part of it at its small rate, and has it when a change comes its way.
//!
//! Within a replica, urgent requests go first ([`Urgency`], set for a task
//! with [`with_urgency`]): a request made for a scheduled resync of a
//! resource already in step takes a token only while no urgent request
//! (an event's, a first sync's, a changed spec's) waits for one at the same
//! endpoint. A change heard from the KMS is thus not queued behind the
//! resyncs that keep the budget busy; resyncs, the safety net, wait for the
//! changes. Routine requests also leave half the burst alone: they take a
//! token only while more than half a burst is left, so they still run at
//! the full rate while nothing else does, but changes that come together (a
//! folder's event wakes many resources at once) find tokens there, not a
//! bucket the resyncs just emptied. Routine requests, and the catch-up of
//! a full pass ([`Urgency::CatchUp`]: after a restart every resource is
//! overdue at once), keep their own pace: each spends a token of it too,
//! earned at the same rate, at most two saved, so they never run ahead of
//! the rate on what the bucket saved (no 10 s of the catch-up hold more
//! than ten seconds of the rate and two tokens). A catch-up leaves no part
//! of the burst: it runs at the rate from its first second.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::share::Share;

/// Per-host token buckets sharing one configured rate.
pub struct Limiter {
    /// Requests per second for the whole operator, as f64 bits.
    total_rate_bits: AtomicU64,
    /// This replica's part of it.
    share: Mutex<Share>,
    hosts: Mutex<HashMap<String, Bucket>>,
}

/// How long after a pause that refused urgent work routine requests still
/// stand back: the refused work comes back within a few seconds of the
/// pause's end (the work queue's retry of a change or a first sync), the
/// resyncs later.
pub const URGENT_AFTER_PAUSE: Duration = Duration::from_secs(10);

/// The name this replica has among the members of [`Limiter::set_members`].
const SELF: &str = "";

struct Bucket {
    tokens: f64,
    last: Instant,
    paused_until: Option<Instant>,
    /// Urgent requests waiting for a token (routine ones let them go first).
    urgent_waiting: u32,
    /// The own pace of routine and catch-up requests: earned at the
    /// bucket's rate, at most [`ROUTINE_SAVED`]; each such request spends
    /// one of these as well as a token.
    routine: f64,
    /// Until when routine requests stand back for urgent work that a pause
    /// refused (see [`URGENT_AFTER_PAUSE`]).
    urgent_parked_until: Option<Instant>,
}

impl Bucket {
    /// Urgent work was refused by a pause that ends at `pause_end`: routine
    /// requests stand back until [`URGENT_AFTER_PAUSE`] after it.
    fn park_routine(&mut self, pause_end: Instant) {
        let until = pause_end + URGENT_AFTER_PAUSE;
        self.urgent_parked_until = Some(self.urgent_parked_until.map_or(until, |u| u.max(until)));
    }

    fn new(tokens: f64, now: Instant) -> Self {
        Self {
            tokens,
            last: now,
            paused_until: None,
            urgent_waiting: 0,
            urgent_parked_until: None,
            routine: 1.0,
        }
    }
}

/// The most of their own pace routine requests save: two, not one, so that
/// a request whose timer runs late loses nothing of the rate.
const ROUTINE_SAVED: f64 = 2.0;

/// How urgent the KMS requests of a task are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// Acting on a change: an event, a new or changed resource, a first
    /// sync, a retry of one. The default.
    Urgent,
    /// A scheduled resync of a resource that is in step: it waits while
    /// urgent requests wait, keeps its own pace and leaves half the burst.
    Routine,
    /// A check of a resource in step that a shard's full pass put in line
    /// (after a restart or a hand-over every resource of the shard is
    /// overdue at once): as routine, except that it leaves no part of the
    /// burst, so the catch-up runs at the rate from its first second rather
    /// than once the bucket has saved half a burst (its own pace still
    /// keeps it from spending what the bucket saved).
    CatchUp,
}

tokio::task_local! {
    static URGENCY: Urgency;
}

/// Run `f` with its KMS requests taking the budget as `urgency` says.
pub async fn with_urgency<F: std::future::Future>(urgency: Urgency, f: F) -> F::Output {
    URGENCY.scope(urgency, f).await
}

/// The urgency of the current task ([`Urgency::Urgent`] outside
/// [`with_urgency`]).
fn current_urgency() -> Urgency {
    URGENCY.try_with(|u| *u).unwrap_or(Urgency::Urgent)
}

/// An urgent request counted as waiting at a host until dropped.
struct UrgentWait<'a> {
    hosts: &'a Mutex<HashMap<String, Bucket>>,
    host: &'a str,
}

impl Drop for UrgentWait<'_> {
    fn drop(&mut self) {
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = hosts.get_mut(self.host) {
            b.urgent_waiting = b.urgent_waiting.saturating_sub(1);
        }
    }
}

/// What `acquire` had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// A token was free.
    Immediately,
    /// The request waited for the budget or a pause.
    AfterWaiting,
}

impl Limiter {
    /// A limiter for `rate` requests per second in total (0 or less disables
    /// the budget; 429 pauses still apply).
    pub fn new(rate: f64) -> Self {
        Self {
            total_rate_bits: AtomicU64::new(rate.to_bits()),
            share: Mutex::new(Share::new(Instant::now())),
            hosts: Mutex::new(HashMap::new()),
        }
    }

    fn share(&self) -> std::sync::MutexGuard<'_, Share> {
        self.share.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Share the budget equally among `members` replicas.
    pub fn set_members(&self, members: u32) {
        let live: BTreeMap<String, f64> = (0..members.max(1))
            .map(|i| {
                let name = if i == 0 {
                    SELF.to_owned()
                } else {
                    i.to_string()
                };
                (name, 1.0)
            })
            .collect();
        self.share().set(SELF, &live, None, Instant::now());
    }

    /// Share the budget among the live members by the weight each
    /// published (`own` is this replica). A member that is no longer live
    /// keeps its weight for a while if it still has a member Lease (in
    /// `leases`: it may only be cut off), and gives it up at once if it
    /// has none (it left gracefully).
    pub fn set_weights(
        &self,
        own: &str,
        live: &BTreeMap<String, f64>,
        leases: &std::collections::BTreeSet<String>,
    ) {
        self.share().set(own, live, Some(leases), Instant::now());
    }

    /// The control plane could not be reached (a Lease renewal failed): the
    /// others' member Leases lapse for the same reason, so members that left
    /// keep their weight for a full hold from now.
    pub fn hold_members(&self) {
        self.share().hold(Instant::now());
    }

    /// How many replicas share the budget now (for tests).
    #[cfg(test)]
    pub fn members(&self) -> u32 {
        u32::try_from(self.share().members(Instant::now())).unwrap_or(u32::MAX)
    }

    /// This replica's part of the rate, requests per second.
    pub fn rate(&self) -> f64 {
        self.rate_and_burst(Instant::now()).0
    }

    /// This replica's part of the rate (by demand) and the most its
    /// buckets hold: an even part of twice the whole rate, whatever the
    /// demand, so that a replica idle while the others work saves up a
    /// burst for the change that comes to it (at the pace of its small
    /// part), and the buckets of all replicas together still hold no more
    /// than twice the rate.
    fn rate_and_burst(&self, now: Instant) -> (f64, f64) {
        let total = f64::from_bits(self.total_rate_bits.load(Ordering::Relaxed));
        let mut share = self.share();
        let members = share.members(now).max(1) as f64;
        (total * share.part(now), (total * 2.0 / members).max(1.0))
    }

    /// Wait until a request to `host` may be sent (urgent requests first:
    /// see [`Urgency`]).
    pub async fn acquire(&self, host: &str) -> Acquired {
        match self.acquire_within(host, None).await {
            Ok(acquired) | Err((acquired, _)) => acquired,
        }
    }

    /// [`Limiter::acquire`], except that a pause with more than
    /// `longest_wait` left, met at any time while waiting (a `429` that
    /// came while this request waited for a token), is not waited out:
    /// `Err` says how long it lasts.
    async fn acquire_within(
        &self,
        host: &str,
        longest_wait: Option<Duration>,
    ) -> Result<Acquired, (Acquired, Duration)> {
        let urgency = current_urgency();
        let urgent = urgency == Urgency::Urgent;
        let mut waited = false;
        // Counted among the urgent waiters from its first wait to its token.
        let mut counted: Option<UrgentWait<'_>> = None;
        loop {
            let wait = {
                let now = Instant::now();
                let (rate, burst) = self.rate_and_burst(now);
                let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
                // A new bucket holds one request, not a burst: replicas that
                // start together (or come back together after a control-plane
                // outage) must not spend a burst each at the same moment.
                let b = hosts
                    .entry(host.to_owned())
                    .or_insert_with(|| Bucket::new(1.0_f64.min(burst), now));
                let wait = if let Some(until) = b.paused_until {
                    if until > now {
                        let left = until - now;
                        if longest_wait.is_some_and(|longest| left > longest) {
                            if urgent {
                                b.park_routine(now + left);
                            }
                            return Err((Acquired::AfterWaiting, left));
                        }
                        Some(left)
                    } else {
                        b.paused_until = None;
                        None
                    }
                } else {
                    None
                }
                .or_else(|| {
                    if rate <= 0.0 {
                        return None;
                    }
                    let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
                    b.tokens = (b.tokens + elapsed * rate).min(burst);
                    b.routine = (b.routine + elapsed * rate).min(ROUTINE_SAVED);
                    b.last = now;
                    // A routine request lets the urgent ones that wait go
                    // first, and looks again after about one token's time.
                    let yields = !urgent && b.urgent_waiting > 0;
                    // A routine request leaves half the burst for the
                    // changes.
                    let need = if urgency == Urgency::Routine {
                        (burst / 2.0 + 1.0).min(burst)
                    } else {
                        1.0
                    };
                    // A routine or catch-up request also spends its own
                    // pace.
                    let paced = urgent || b.routine >= 1.0 - 1e-9;
                    if yields {
                        Some(Duration::from_secs_f64(1.0 / rate))
                    } else if b.tokens >= need - 1e-9 && paced {
                        // (A token earned in steps of elapsed × rate may
                        // fall short by a rounding error: it counts.)
                        b.tokens = (b.tokens - 1.0).max(0.0);
                        if !urgent {
                            b.routine = (b.routine - 1.0).max(0.0);
                        }
                        None
                    } else {
                        let short =
                            (need - b.tokens).max(if urgent { 0.0 } else { 1.0 - b.routine });
                        Some(Duration::from_secs_f64(short.max(0.0) / rate))
                    }
                });
                if urgent && wait.is_some() && counted.is_none() {
                    b.urgent_waiting += 1;
                    counted = Some(UrgentWait {
                        hosts: &self.hosts,
                        host,
                    });
                }
                wait
            };
            match wait {
                None => {
                    return Ok(if waited {
                        Acquired::AfterWaiting
                    } else {
                        Acquired::Immediately
                    });
                }
                Some(d) => {
                    waited = true;
                    // Look again at least every second: the part of the
                    // budget may have grown meanwhile.
                    tokio::time::sleep(d.min(Duration::from_secs(1))).await;
                }
            }
        }
    }

    /// Like [`Limiter::acquire`], but a pause of `key` with more than
    /// `longest_wait` left is not waited out: `Err` says how long it lasts.
    ///
    /// Urgent work a pause refuses comes back when it ends; until then, and
    /// for [`URGENT_AFTER_PAUSE`] after, routine requests (resyncs of
    /// resources in step) are refused too, so that when the KMS's budget
    /// binds (a hosted KMS's per-minute limit) first syncs and changes take
    /// it before resyncs do. A pause that refuses urgent work again extends
    /// that; once urgent work stops meeting pauses, resyncs run again.
    pub async fn acquire_unless_paused(
        &self,
        key: &str,
        longest_wait: Duration,
    ) -> Result<Acquired, Duration> {
        let urgent = current_urgency() == Urgency::Urgent;
        {
            let now = Instant::now();
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(b) = hosts.get_mut(key) {
                let left = b
                    .paused_until
                    .map(|until| until.saturating_duration_since(now))
                    .filter(|left| *left > longest_wait);
                if let Some(left) = left {
                    if urgent {
                        b.park_routine(now + left);
                    }
                    return Err(left);
                }
                if let Some(until) = b.urgent_parked_until.filter(|u| *u > now)
                    && !urgent
                {
                    return Err(until - now);
                }
            }
        }
        self.acquire_within(key, Some(longest_wait))
            .await
            .map_err(|(_, left)| left)
    }

    /// Stop sending to `host` for `for_how_long` (after a 429).
    pub fn pause(&self, host: &str, for_how_long: Duration) {
        let until = Instant::now() + for_how_long;
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let b = hosts
            .entry(host.to_owned())
            .or_insert_with(|| Bucket::new(0.0, Instant::now()));
        b.tokens = 0.0;
        b.paused_until = Some(b.paused_until.map_or(until, |p| p.max(until)));
    }

    /// How long requests to `host` are paused from now, if they are.
    pub fn paused_for(&self, host: &str) -> Option<Duration> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        let until = hosts.get(host)?.paused_until?;
        let now = Instant::now();
        (until > now).then(|| until - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_starts_with_one_request_then_allows_a_burst_of_twice_the_rate() {
        let l = Limiter::new(10.0);
        assert_eq!(l.acquire("h").await, Acquired::Immediately);
        // No burst at the start: the second waits about 1/10 s.
        let start = Instant::now();
        assert_eq!(l.acquire("h").await, Acquired::AfterWaiting);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(99) && waited <= Duration::from_millis(150),
            "{waited:?}"
        );
        // After an idle spell the bucket holds twice the rate, no more.
        tokio::time::advance(Duration::from_secs(10)).await;
        for _ in 0..20 {
            assert_eq!(l.acquire("h").await, Acquired::Immediately);
        }
        assert_eq!(l.acquire("h").await, Acquired::AfterWaiting);
        // Other hosts have their own bucket.
        assert_eq!(l.acquire("other").await, Acquired::Immediately);
    }

    #[tokio::test(start_paused = true)]
    async fn members_share_the_rate() {
        let l = Limiter::new(12.0);
        l.set_members(3);
        assert!((l.rate() - 4.0).abs() < 1e-9);
        for _ in 0..8 {
            l.acquire("h").await;
        }
        let start = Instant::now();
        for _ in 0..4 {
            l.acquire("h").await;
        }
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(990),
            "4 requests at 4/s after the burst took {waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fewer_members_grow_the_share_only_after_the_holds() {
        use crate::kms::share::{RISE_HOLD, SHARE_HOLD};
        let l = Limiter::new(12.0);
        l.set_members(3);
        l.set_members(1);
        assert_eq!(l.members(), 3, "a drop is not believed at once");
        tokio::time::advance(SHARE_HOLD / 2).await;
        l.hold_members();
        tokio::time::advance(SHARE_HOLD / 2).await;
        assert_eq!(l.members(), 3, "the hold restarts after a failed renewal");
        tokio::time::advance(SHARE_HOLD / 2).await;
        assert_eq!(l.members(), 1);
        assert!((l.rate() - 4.0).abs() < 1e-9, "then the rise waits");
        tokio::time::advance(RISE_HOLD).await;
        assert!((l.rate() - 12.0).abs() < 1e-9);
        l.set_members(4);
        assert!((l.rate() - 3.0).abs() < 1e-9, "more members apply at once");
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_follows_the_published_demand() {
        use crate::kms::share::RISE_HOLD;
        let l = Limiter::new(20.0);
        let weights = |a: f64, b: f64| -> BTreeMap<String, f64> {
            [("a".to_owned(), a), ("b".to_owned(), b)].into()
        };
        let leases = weights(1.0, 1.0).into_keys().collect();
        l.set_weights("a", &weights(1.0, 3.0), &leases);
        assert!((l.rate() - 5.0).abs() < 1e-9);
        l.set_weights("a", &weights(3.0, 1.0), &leases);
        assert!((l.rate() - 5.0).abs() < 1e-9);
        tokio::time::advance(RISE_HOLD).await;
        assert!((l.rate() - 15.0).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_pause_is_not_waited_out() {
        let l = Limiter::new(100.0);
        l.pause("http://a:1", Duration::from_secs(120));
        let start = Instant::now();
        let left = l
            .acquire_unless_paused("http://a:1", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(left > Duration::from_secs(119), "{left:?}");
        assert_eq!(start.elapsed(), Duration::ZERO, "it waited");
        // Another endpoint of the same host is not paused.
        assert_eq!(
            l.acquire_unless_paused("http://a:2", Duration::from_secs(1))
                .await,
            Ok(Acquired::Immediately)
        );
        // A pause about to end is waited out.
        tokio::time::advance(Duration::from_millis(119_500)).await;
        assert!(
            l.acquire_unless_paused("http://a:1", Duration::from_secs(1))
                .await
                .is_ok()
        );
    }

    /// A `429` that comes while requests wait for a token of the budget
    /// refuses them too: they give their workers back instead of holding
    /// them for the whole pause (with every worker so held, the queue's
    /// other resources waited a whole window of a hosted KMS's limit).
    #[tokio::test(start_paused = true)]
    async fn a_pause_that_starts_while_a_request_waits_refuses_it() {
        let l = std::sync::Arc::new(Limiter::new(1.0));
        assert_eq!(
            l.acquire_unless_paused("http://a:1", Duration::from_secs(1))
                .await,
            Ok(Acquired::Immediately)
        );
        let waiting = {
            let l = l.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let r = l
                    .acquire_unless_paused("http://a:1", Duration::from_secs(1))
                    .await;
                (r, start.elapsed())
            })
        };
        tokio::time::advance(Duration::from_millis(300)).await;
        l.pause("http://a:1", Duration::from_secs(60));
        let (r, waited) = waiting.await.unwrap();
        let left = r.unwrap_err();
        assert!(left > Duration::from_secs(58), "{left:?}");
        assert!(waited <= Duration::from_millis(1400), "held {waited:?}");
        // Plain acquire still waits the pause out.
        let start = Instant::now();
        l.acquire("http://a:1").await;
        assert!(start.elapsed() >= Duration::from_secs(58));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_pause_that_refused_urgent_work_resyncs_stand_back() {
        let l = Limiter::new(100.0);
        async fn routine(l: &Limiter) -> Result<Acquired, Duration> {
            with_urgency(
                Urgency::Routine,
                l.acquire_unless_paused("http://a:1", Duration::from_secs(1)),
            )
            .await
        }
        // A pause that refused only routine work: resyncs run when it ends.
        l.pause("http://a:1", Duration::from_secs(30));
        assert!(routine(&l).await.is_err());
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(routine(&l).await.is_ok());
        // A pause refuses a first sync: until it ends and 10 s after,
        // resyncs are refused while urgent work goes through.
        l.pause("http://a:1", Duration::from_secs(30));
        assert!(
            l.acquire_unless_paused("http://a:1", Duration::from_secs(1))
                .await
                .is_err()
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        let left = routine(&l).await.unwrap_err();
        assert!(
            left <= URGENT_AFTER_PAUSE && left > Duration::from_secs(8),
            "{left:?}"
        );
        assert!(
            l.acquire_unless_paused("http://a:1", Duration::from_secs(1))
                .await
                .is_ok()
        );
        tokio::time::advance(URGENT_AFTER_PAUSE).await;
        assert!(routine(&l).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_requests_take_the_budget_before_routine_ones() {
        use std::sync::Arc;
        let l = Arc::new(Limiter::new(10.0));
        l.acquire("h").await; // the one request a new bucket holds
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let spawn = |name: String, urgency: Urgency, host: &'static str| {
            let (l, order) = (l.clone(), order.clone());
            tokio::spawn(with_urgency(urgency, async move {
                l.acquire(host).await;
                order.lock().unwrap().push((name, Instant::now()));
            }))
        };
        let start = Instant::now();
        for i in 0..4 {
            tasks.push(spawn(format!("routine{i}"), Urgency::Routine, "h"));
        }
        // The routine requests wait first; urgent ones come 10 ms later,
        // and one for another endpoint holds nothing back at "h".
        tokio::time::sleep(Duration::from_millis(10)).await;
        tasks.push(spawn("elsewhere".into(), Urgency::Routine, "other"));
        for i in 0..3 {
            tasks.push(spawn(format!("urgent{i}"), Urgency::Urgent, "h"));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names[0..3].iter().all(|n| n.starts_with("urgent")),
            "{names:?}"
        );
        // The other endpoint's routine request waits for its own bucket to
        // hold more than half its burst (1.0 s from the one token a new
        // bucket holds), not for the urgent ones at "h".
        assert_eq!(names[3], "elsewhere");
        let elsewhere = order[3].1 - start;
        assert!(
            elsewhere >= Duration::from_millis(1000) && elsewhere <= Duration::from_millis(1050),
            "{elsewhere:?}"
        );
        assert!(
            names[4..].iter().all(|n| n.starts_with("routine")),
            "{names:?}"
        );
        // The urgent ones take the tokens as they come (10/s: the last at
        // 0.3 s); the routine ones wait until the bucket holds half its
        // burst and one more (11 tokens, 1.1 s from empty) and then go at
        // the rate: not starved.
        let urgent_last = order[2].1 - start;
        assert!(
            urgent_last >= Duration::from_millis(290) && urgent_last <= Duration::from_millis(350),
            "{urgent_last:?}"
        );
        let last = order.last().unwrap().1 - start;
        assert!(
            last >= Duration::from_millis(1650) && last <= Duration::from_millis(1800),
            "{last:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn routine_requests_run_at_the_rate_but_leave_the_burst() {
        let l = Limiter::new(10.0);
        // Routine requests alone: the first once the bucket holds 11 of
        // its 20 tokens (1.0 s from the one token a new bucket holds), then
        // one per token, 10/s.
        let start = Instant::now();
        for _ in 0..30 {
            with_urgency(Urgency::Routine, l.acquire("h")).await;
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(3850) && took <= Duration::from_millis(4000),
            "30 routine requests at 10/s took {took:?}"
        );
        // Half the burst is still there for urgent requests: 10 at once.
        for i in 0..10 {
            assert_eq!(l.acquire("h").await, Acquired::Immediately, "urgent {i}");
        }
        assert_eq!(l.acquire("h").await, Acquired::AfterWaiting);
    }

    #[tokio::test(start_paused = true)]
    async fn routine_requests_never_run_ahead_of_the_rate_on_a_saved_burst() {
        let l = Limiter::new(10.0);
        l.acquire("h").await;
        // Idle long enough for the bucket to fill: 20 tokens saved.
        tokio::time::advance(Duration::from_secs(10)).await;
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..25 {
            with_urgency(Urgency::Routine, l.acquire("h")).await;
            at.push(start.elapsed());
        }
        // Two at once (their own pace saves two), then 10/s: no 10 in
        // less than 0.8 s, where the saved burst would have let 10 go at
        // once.
        for w in at.windows(10) {
            assert!(w[9] - w[0] >= Duration::from_millis(790), "{at:?}");
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(2250) && took <= Duration::from_millis(2400),
            "25 routine requests at 10/s took {took:?}"
        );
        // And the bucket kept its burst for urgent requests meanwhile.
        for i in 0..18 {
            assert_eq!(l.acquire("h").await, Acquired::Immediately, "urgent {i}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_catch_up_runs_at_the_rate_from_the_start_and_never_above_it() {
        let l = Limiter::new(10.0);
        // From a new bucket (one token): at once, then 10/s, where routine
        // requests wait for half a burst first (1.0 s).
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..20 {
            with_urgency(Urgency::CatchUp, l.acquire("h")).await;
            at.push(start.elapsed());
        }
        assert_eq!(at[0], Duration::ZERO);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(1850) && took <= Duration::from_millis(2000),
            "20 catch-up requests at 10/s took {took:?}"
        );
        // On a saved burst: never ahead of the rate either.
        tokio::time::advance(Duration::from_secs(10)).await;
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..25 {
            with_urgency(Urgency::CatchUp, l.acquire("h")).await;
            at.push(start.elapsed());
        }
        for w in at.windows(10) {
            assert!(w[9] - w[0] >= Duration::from_millis(790), "{at:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_replica_saves_an_even_burst_at_its_small_part() {
        use crate::kms::share::RISE_HOLD;
        let l = Limiter::new(20.0);
        let weights: BTreeMap<String, f64> = [("a".to_owned(), 1.0), ("b".to_owned(), 39.0)].into();
        let leases = weights.keys().cloned().collect();
        l.set_weights("a", &weights, &leases);
        tokio::time::advance(RISE_HOLD).await;
        // b has the work: a's part is 1/40 of the rate, 0.5 requests/s.
        assert!((l.rate() - 0.5).abs() < 1e-9, "{}", l.rate());
        l.acquire("h").await;
        // Idle for 40 s at 0.5/s: a's bucket holds 20 tokens, an even part
        // (one of two members) of twice the rate, not twice its own part
        // (1 token); a change that comes now goes out at once.
        tokio::time::advance(Duration::from_secs(40)).await;
        for i in 0..20 {
            assert_eq!(l.acquire("h").await, Acquired::Immediately, "urgent {i}");
        }
        let start = Instant::now();
        assert_eq!(l.acquire("h").await, Acquired::AfterWaiting);
        assert!(start.elapsed() >= Duration::from_millis(1990), "then 0.5/s");
    }

    #[tokio::test(start_paused = true)]
    async fn outside_a_scope_requests_are_urgent() {
        assert_eq!(current_urgency(), Urgency::Urgent);
        let inner = with_urgency(Urgency::Routine, async { current_urgency() }).await;
        assert_eq!(inner, Urgency::Routine);
    }

    #[tokio::test(start_paused = true)]
    async fn pause_blocks_the_host() {
        let l = Limiter::new(100.0);
        l.pause("h", Duration::from_secs(30));
        assert!(l.paused_for("h").unwrap() > Duration::from_secs(29));
        let start = Instant::now();
        l.acquire("h").await;
        assert!(start.elapsed() >= Duration::from_secs(30));
        assert!(l.paused_for("h").is_none());
    }
}
