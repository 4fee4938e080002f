//! The I/O shell around [`crate::decide`]: one task per coordinator that
//! watches the installation's Leases, decides, writes (create or
//! compare-and-swap only), hands shards over, and publishes ownership, events
//! and a view. Everything the operator needs goes through [`Coordinator`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{Config, ConfigError, ROLE_MEMBER, ROLE_SHARD};
use crate::decide::{Held, Inputs, Phase, Plan, decide};
use crate::events::{Event, LossReason, Mismatch, ShardStatus, View};
use crate::lease;
use crate::ring::{HASH_VERSION, Ring};
use crate::store::Store;

/// The future a drain hook returns.
pub type DrainFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

type DrainHook = Arc<dyn Fn(u32) -> DrainFuture + Send + Sync>;

/// Shortest pause before retrying after a conflict (the state was re-read, so
/// the retry is informed; the pause only bounds the rate).
const CONFLICT_PAUSE: Duration = Duration::from_millis(100);

/// Capacity of the event channel; slow subscribers see `Lagged`.
const EVENT_CAPACITY: usize = 256;

/// Why a coordinator could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `start` was called outside a Tokio runtime.
    #[error("the shard coordinator must be started inside a Tokio runtime")]
    NoRuntime,
}

/// Shard ownership of one replica. Cheap to clone; all clones share the same
/// coordinator. Dropping the handles does not stop it: call
/// [`Coordinator::shutdown`] (graceful) or [`Coordinator::abort`].
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("identity", &self.inner.config.identity)
            .field("shards", &self.inner.config.shards)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: Config,
    ring: Ring,
    shared: Mutex<Shared>,
    /// What this replica publishes as its demand (see
    /// [`Coordinator::set_demand`]).
    demand: std::sync::atomic::AtomicU32,
    owned_tx: watch::Sender<Vec<u32>>,
    /// Bumped whenever the view may have changed (members, assignment,
    /// holders, ownership, the first list).
    changes: watch::Sender<u64>,
    events_tx: broadcast::Sender<Event>,
    drain: RwLock<DrainHook>,
    stop: CancellationToken,
    wake: Notify,
    done: watch::Sender<bool>,
    tasks: Mutex<Vec<AbortHandle>>,
}

/// What the handles read; written by the driver task.
#[derive(Default)]
struct Shared {
    /// Active shards: their token and last successful renewal.
    owned: BTreeMap<u32, Owned>,
    members: Vec<String>,
    /// The demand each live member published (0 when it published none).
    demands: BTreeMap<String, u32>,
    /// Members with a member Lease, live or lapsed (a member that left
    /// gracefully deleted its Lease).
    member_leases: BTreeSet<String>,
    mismatches: Vec<Mismatch>,
    status: BTreeMap<u32, Seen>,
    synced: bool,
    stopping: bool,
    aborted: bool,
}

struct Owned {
    token: CancellationToken,
    renewed_at: Instant,
}

/// One shard as last observed: holder, assigned member, when it changed.
#[derive(Clone, Default)]
struct Seen {
    holder: Option<String>,
    assigned: Option<String>,
    changed_at: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    fn emit(&self, event: Event) {
        // No subscriber is fine.
        let _ = self.events_tx.send(event);
    }

    /// Tell those who wait on [`Coordinator::changes`] that the view may
    /// have changed.
    fn touched(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn publish_owned(&self, shared: &Shared) {
        self.touched();
        let owned: Vec<u32> = shared.owned.keys().copied().collect();
        self.owned_tx.send_if_modified(|current| {
            if *current == owned {
                false
            } else {
                *current = owned;
                true
            }
        });
    }

    fn drain_hook(&self) -> DrainHook {
        self.drain
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn track(&self, handle: AbortHandle) {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|h| !h.is_finished());
        tasks.push(handle);
    }
}

impl Coordinator {
    /// Validate `config` and start coordinating in the current Tokio runtime.
    /// Returns at once; shards are acquired in the background (see
    /// [`Coordinator::subscribe`] and [`Coordinator::events`]).
    pub fn start(client: Client, config: Config) -> Result<Self, Error> {
        Self::start_with_drain_hook(client, config, |_| async {})
    }

    /// Like [`Coordinator::start`], with the drain hook set from the first
    /// moment (see [`Coordinator::set_drain_hook`]).
    pub fn start_with_drain_hook<F, Fut>(
        client: Client,
        config: Config,
        hook: F,
    ) -> Result<Self, Error>
    where
        F: Fn(u32) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let ring = Ring::new(config.shards).ok_or(ConfigError::Shards(config.shards))?;
        let inner = Arc::new(Inner {
            ring,
            shared: Mutex::new(Shared::default()),
            demand: std::sync::atomic::AtomicU32::new(0),
            owned_tx: watch::channel(Vec::new()).0,
            changes: watch::channel(0).0,
            events_tx: broadcast::channel(EVENT_CAPACITY).0,
            drain: RwLock::new(boxed_hook(hook)),
            stop: CancellationToken::new(),
            wake: Notify::new(),
            done: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
            config,
        });
        let driver = Driver::new(inner.clone(), client);
        let handle = runtime.spawn(driver.run());
        inner.track(handle.abort_handle());
        Ok(Self { inner })
    }

    /// Changes of the [`view`](Self::view): the value is bumped whenever
    /// it may have changed, so a caller waiting for a state of the view
    /// looks again then instead of polling.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Number of shards.
    pub fn shard_count(&self) -> u32 {
        self.inner.config.shards
    }

    /// The shard of `namespace` (cluster-scoped objects: the empty string).
    pub fn shard_of(&self, namespace: &str) -> u32 {
        self.inner.ring.shard_of(namespace)
    }

    /// Whether this replica may work on `shard` now: it holds the shard's
    /// Lease, is not handing it over, and its last successful renewal is
    /// younger than the renew deadline.
    pub fn owns(&self, shard: u32) -> bool {
        let shared = lock(&self.inner.shared);
        !shared.aborted
            && shared
                .owned
                .get(&shard)
                .is_some_and(|o| Instant::now() < o.renewed_at + self.inner.config.renew_deadline)
    }

    /// Whether `shard` is held, even when its last renewal is older than the
    /// renew deadline (a renewal that is only late: [`Self::owns`] is false
    /// meanwhile, but the shard has not been lost).
    pub fn holds(&self, shard: u32) -> bool {
        let shared = lock(&self.inner.shared);
        !shared.aborted && shared.owned.contains_key(&shard)
    }

    /// A token cancelled when `shard` is lost (already cancelled when it is
    /// not owned now). Each call returns a child token: cancelling it does not
    /// affect the shard.
    pub fn cancellation(&self, shard: u32) -> CancellationToken {
        if self.owns(shard)
            && let Some(owned) = lock(&self.inner.shared).owned.get(&shard)
        {
            return owned.token.child_token();
        }
        let token = CancellationToken::new();
        token.cancel();
        token
    }

    /// The owned shards (sorted); the receiver changes whenever they change.
    pub fn subscribe(&self) -> watch::Receiver<Vec<u32>> {
        self.inner.owned_tx.subscribe()
    }

    /// Number of live members, this replica included (at least 1).
    pub fn members(&self) -> u32 {
        let n = lock(&self.inner.shared).members.len();
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }

    /// Publish this replica's demand (the work it has waiting, in any unit
    /// every replica of the installation shares) on its member Lease, from
    /// its next renewal on.
    pub fn set_demand(&self, demand: u32) {
        self.inner
            .demand
            .store(demand, std::sync::atomic::Ordering::Relaxed);
    }

    /// The demand each live member published, this replica's as the API
    /// server has it (0 for a member that published none).
    pub fn demands(&self) -> BTreeMap<String, u32> {
        lock(&self.inner.shared).demands.clone()
    }

    /// The event stream (from now on).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.inner.events_tx.subscribe()
    }

    /// The members that have a member Lease, live or lapsed: a member that
    /// is not live but still listed here may only be cut off (its Lease
    /// lapsed); one that is not listed left gracefully (it deleted its
    /// Lease after giving up its shards).
    pub fn member_leases(&self) -> BTreeSet<String> {
        lock(&self.inner.shared).member_leases.clone()
    }

    /// A snapshot of what this replica observes.
    pub fn view(&self) -> View {
        let now = Instant::now();
        let shared = lock(&self.inner.shared);
        let config = &self.inner.config;
        View {
            identity: config.identity.clone(),
            shards: config.shards,
            hash_version: HASH_VERSION,
            owned: shared
                .owned
                .iter()
                .filter(|(_, o)| !shared.aborted && now < o.renewed_at + config.renew_deadline)
                .map(|(s, _)| *s)
                .collect(),
            members: shared.members.clone(),
            status: (0..config.shards)
                .map(|shard| {
                    let seen = shared.status.get(&shard).cloned().unwrap_or_default();
                    let status = ShardStatus {
                        holder: seen.holder,
                        assigned: seen.assigned,
                        unchanged_for: seen.changed_at.map(|c| now.saturating_duration_since(c)),
                    };
                    (shard, status)
                })
                .collect(),
            mismatches: shared.mismatches.clone(),
            synced: shared.synced,
            stopping: shared.stopping,
        }
    }

    /// Register the drain hook: called with a shard after its token was
    /// cancelled, before its Lease is released; it should return once the
    /// shard's in-flight work has finished or been cancelled and its cache
    /// records are flushed. Replaces the previous hook (default: returns at
    /// once). A hook that takes longer than the drain timeout makes the
    /// replica stop renewing the shard and let its Lease expire instead of
    /// clearing it.
    pub fn set_drain_hook<F, Fut>(&self, hook: F)
    where
        F: Fn(u32) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        *self
            .inner
            .drain
            .write()
            .unwrap_or_else(PoisonError::into_inner) = boxed_hook(hook);
    }

    /// Stop gracefully: stop acquiring; for every owned shard cancel its
    /// token, await the drain hook, clear the Lease holder by
    /// compare-and-swap; then delete the member Lease. Returns when done (or
    /// at once when the coordinator already stopped). Safe to call more than
    /// once and from several tasks.
    pub async fn shutdown(&self) {
        lock(&self.inner.shared).stopping = true;
        self.inner.stop.cancel();
        self.inner.wake.notify_one();
        let mut done = self.inner.done.subscribe();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Stop at once without writing anything, as if the process died: every
    /// token is cancelled, the tasks end, and the Leases expire on the other
    /// replicas' clocks.
    pub fn abort(&self) {
        for handle in lock(&self.inner.tasks).drain(..) {
            handle.abort();
        }
        let mut shared = lock(&self.inner.shared);
        shared.aborted = true;
        shared.stopping = true;
        for (shard, owned) in std::mem::take(&mut shared.owned) {
            owned.token.cancel();
            self.inner.emit(Event::Lost {
                shard,
                reason: LossReason::Aborted,
            });
        }
        self.inner.publish_owned(&shared);
        drop(shared);
        self.inner.done.send_replace(true);
    }

    /// Whether the coordinator has stopped (shut down or aborted).
    pub fn is_stopped(&self) -> bool {
        *self.inner.done.borrow()
    }
}

fn boxed_hook<F, Fut>(hook: F) -> DrainHook
where
    F: Fn(u32) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |shard| Box::pin(hook(shard)) as DrainFuture)
}

/// A write's failure, as the driver cares about it.
#[derive(Debug)]
enum WriteError {
    /// 409: the Lease changed since we read it (or already exists).
    Conflict,
    /// 404: the Lease is gone.
    NotFound,
    /// Anything else, timeouts included.
    Other(String),
}

impl From<kube::Error> for WriteError {
    fn from(e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => Self::Conflict,
            kube::Error::Api(s) if s.is_not_found() => Self::NotFound,
            _ => Self::Other(e.to_string()),
        }
    }
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Conflict => f.write_str("conflict: the Lease changed since it was read"),
            Self::NotFound => f.write_str("the Lease does not exist"),
            Self::Other(e) => f.write_str(e),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Member,
    Acquire(u32),
    Renew(u32),
    Clear(u32),
    ReleaseUnheld(u32),
}

struct HeldShard {
    held: Held,
    token: CancellationToken,
    /// Distinguishes this holding from earlier ones of the same shard (a
    /// late drain report of an earlier hand-over must not count).
    epoch: u64,
}

/// The state of the driver task.
struct Driver {
    inner: Arc<Inner>,
    api: Api<Lease>,
    store: Store,
    held: BTreeMap<u32, HeldShard>,
    backoff: BTreeMap<u32, Instant>,
    member_due: Instant,
    /// When the last member Lease write that succeeded was sent.
    member_renewed_at: Option<Instant>,
    synced: bool,
    stopping: bool,
    drained_tx: mpsc::UnboundedSender<(u32, u64, bool)>,
    drained_rx: mpsc::UnboundedReceiver<(u32, u64, bool)>,
    epochs: u64,
    last_members: Vec<String>,
    last_mismatches: Vec<Mismatch>,
}

impl Driver {
    fn new(inner: Arc<Inner>, client: Client) -> Self {
        let api = Api::namespaced(client, &inner.config.namespace);
        let (drained_tx, drained_rx) = mpsc::unbounded_channel();
        Self {
            inner,
            api,
            store: Store::default(),
            held: BTreeMap::new(),
            backoff: BTreeMap::new(),
            member_due: Instant::now(),
            member_renewed_at: None,
            synced: false,
            stopping: false,
            drained_tx,
            drained_rx,
            epochs: 0,
            last_members: Vec::new(),
            last_mismatches: Vec::new(),
        }
    }

    fn config(&self) -> &Config {
        &self.inner.config
    }

    fn request_timeout(&self) -> Duration {
        self.config().retry_period
    }

    /// How long `action`'s write may wait for its answer. A renewal (of a
    /// shard, or of the member Lease) waits until its renew deadline: an API
    /// server that answers late but within it keeps the shard, as client-go's
    /// leader election does, instead of losing it to two slow answers in a
    /// row. Every other write waits one retry period.
    fn request_limit(&self, action: Action, now: Instant) -> Duration {
        let config = self.config();
        let renewed_at = match action {
            Action::Renew(shard) => self.held.get(&shard).map(|h| h.held.renewed_at),
            Action::Member => self.member_renewed_at,
            _ => None,
        };
        renewal_limit(renewed_at, now, config.renew_deadline, config.retry_period)
    }

    async fn run(mut self) {
        let config = self.inner.config.clone();
        info!(
            identity = %config.identity,
            shards = config.shards,
            namespace = %config.namespace,
            "shard coordinator starting"
        );
        let stream = watcher(
            self.api.clone(),
            watcher::Config::default().labels(&config.label_selector()),
        )
        .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut listing: Option<(Instant, BTreeSet<String>)> = None;

        loop {
            self.stopping = self.inner.stop.is_cancelled();
            let mut wake_at = Instant::now() + config.retry_period;
            if self.stopping && !self.synced {
                break;
            }
            if self.synced {
                let now = Instant::now();
                let plan = self.plan(now);
                self.apply_local(&plan);
                if self.stopping && self.held.is_empty() && plan.release_unheld.is_empty() {
                    self.delete_member().await;
                    break;
                }
                if self.execute(&plan).await {
                    continue;
                }
                if let Some(at) = plan.wake_at {
                    wake_at = wake_at.min(at);
                }
            }
            tokio::select! {
                biased;
                _ = self.inner.stop.cancelled(), if !self.stopping => {}
                Some((shard, epoch, finished)) = self.drained_rx.recv() => {
                    self.drained(shard, epoch, finished);
                }
                event = stream.next() => match event {
                    Some(Ok(event)) => self.watched(event, &mut listing),
                    Some(Err(e)) => warn!(error = %e, "watching shard Leases failed; retrying"),
                    None => {
                        warn!("the Lease watch ended");
                        break;
                    }
                },
                _ = self.inner.wake.notified() => {}
                _ = sleep_until(wake_at) => {}
            }
        }

        // Whatever is still held (a stop before the first list, or a broken
        // watch) is given up locally; the Leases expire elsewhere.
        let remaining: Vec<u32> = self.held.keys().copied().collect();
        for shard in remaining {
            self.drop_shard(shard, LossReason::Shutdown);
        }
        info!(identity = %config.identity, "shard coordinator stopped");
        self.inner.done.send_replace(true);
    }

    fn watched(
        &mut self,
        event: watcher::Event<Lease>,
        listing: &mut Option<(Instant, BTreeSet<String>)>,
    ) {
        let now = Instant::now();
        match event {
            watcher::Event::Init => *listing = Some((now, BTreeSet::new())),
            watcher::Event::InitApply(lease) => {
                if let (Some((_, names)), Some(name)) =
                    (listing.as_mut(), lease.metadata.name.clone())
                {
                    names.insert(name);
                }
                self.observe(lease, now);
            }
            watcher::Event::InitDone => {
                if let Some((since, names)) = listing.take() {
                    self.store.retain_listed(&names, since);
                }
                if !self.synced {
                    debug!("initial list of Leases received");
                }
                self.synced = true;
                lock(&self.inner.shared).synced = true;
                self.inner.touched();
            }
            watcher::Event::Apply(lease) => self.observe(lease, now),
            watcher::Event::Delete(lease) => {
                self.store.delete(&lease);
            }
        }
    }

    /// Record a Lease read at `now`; news about a shard ends its backoff.
    fn observe(&mut self, lease: Lease, now: Instant) {
        let shard = lease
            .metadata
            .name
            .as_deref()
            .and_then(|n| self.inner.config.shard_of_lease(n));
        if self.store.apply(lease, now)
            && let Some(shard) = shard
            && !self.held.contains_key(&shard)
        {
            self.backoff.remove(&shard);
        }
    }

    fn plan(&self, now: Instant) -> Plan {
        let config = self.config();
        let members = self.store.members(config);
        let leases = self.store.shard_leases(config);
        let held: BTreeMap<u32, Held> = self.held.iter().map(|(s, h)| (*s, h.held)).collect();
        decide(
            &Inputs {
                identity: &config.identity,
                shards: config.shards,
                hash_version: HASH_VERSION,
                renew_deadline: config.renew_deadline,
                stopping: self.stopping,
                members: &members,
                leases: &leases,
                held: &held,
                backoff: &self.backoff,
                member_due: self.member_due,
            },
            now,
        )
    }

    /// Local consequences of a plan: drops, hand-over starts, reports.
    fn apply_local(&mut self, plan: &Plan) {
        for &(shard, reason) in &plan.drop {
            self.drop_shard(shard, reason);
        }
        for &(shard, reason) in &plan.hand_over {
            self.start_hand_over(shard, reason);
        }

        if plan.live != self.last_members {
            info!(members = ?plan.live, "live members changed");
            self.last_members = plan.live.clone();
            self.inner.emit(Event::MembersChanged(plan.live.clone()));
        }
        if plan.mismatches != self.last_mismatches {
            for m in &plan.mismatches {
                if !self.last_mismatches.contains(m) {
                    warn!(member = %m.member, "{m}");
                    self.inner.emit(Event::ConfigMismatch(m.clone()));
                }
            }
            if plan.mismatches.is_empty() {
                info!("all live members agree on the shard configuration again");
                self.inner.emit(Event::ConfigAgreed);
            }
            self.last_mismatches = plan.mismatches.clone();
        }

        let leases = self.store.shard_leases(self.config());
        let mut shared = lock(&self.inner.shared);
        shared.members = plan.live.clone();
        let published: BTreeMap<String, u32> = self
            .store
            .members(self.config())
            .into_iter()
            .map(|m| (m.identity, m.demand.unwrap_or(0)))
            .collect();
        shared.member_leases = published.keys().cloned().collect();
        shared.demands = plan
            .live
            .iter()
            .map(|m| (m.clone(), published.get(m).copied().unwrap_or(0)))
            .collect();
        shared.mismatches = plan.mismatches.clone();
        shared.status = (0..self.config().shards)
            .map(|shard| {
                let lease = leases.get(&shard);
                let seen = Seen {
                    holder: lease.and_then(|l| l.holder.clone()),
                    assigned: plan.assignment.get(&shard).cloned(),
                    changed_at: lease.map(|l| l.changed_at),
                };
                (shard, seen)
            })
            .collect();
        drop(shared);
        self.inner.touched();
    }

    /// Stop holding `shard` without writing.
    fn drop_shard(&mut self, shard: u32, reason: LossReason) {
        let Some(held) = self.held.remove(&shard) else {
            return;
        };
        held.token.cancel();
        let mut shared = lock(&self.inner.shared);
        let was_owned = shared.owned.remove(&shard).is_some();
        self.inner.publish_owned(&shared);
        drop(shared);
        if held.held.phase == Phase::Active && was_owned {
            warn!(shard, %reason, "lost shard");
            self.inner.emit(Event::Lost { shard, reason });
        } else {
            warn!(shard, %reason, "gave up a shard during its hand-over");
        }
    }

    /// Cancel the shard's work and run the drain hook in the background.
    fn start_hand_over(&mut self, shard: u32, reason: LossReason) {
        let Some(held) = self.held.get_mut(&shard) else {
            return;
        };
        held.held.phase = Phase::Draining;
        held.token.cancel();
        let epoch = held.epoch;
        let mut shared = lock(&self.inner.shared);
        shared.owned.remove(&shard);
        self.inner.publish_owned(&shared);
        drop(shared);
        info!(shard, %reason, "handing shard over");
        self.inner.emit(Event::Lost { shard, reason });

        let hook = self.inner.drain_hook();
        let tx = self.drained_tx.clone();
        let limit = self.config().drain_timeout;
        let task = tokio::spawn(async move {
            // A hook that panics or overruns counts as not finished.
            let run = AssertUnwindSafe(async { hook(shard).await }).catch_unwind();
            let finished = matches!(timeout(limit, run).await, Ok(Ok(())));
            let _ = tx.send((shard, epoch, finished));
        });
        self.inner.track(task.abort_handle());
    }

    fn drained(&mut self, shard: u32, epoch: u64, finished: bool) {
        let now = Instant::now();
        let Some(held) = self.held.get_mut(&shard) else {
            return;
        };
        if held.held.phase != Phase::Draining || held.epoch != epoch {
            return;
        }
        if finished {
            held.held.phase = Phase::Drained;
            held.held.next_attempt = now;
        } else {
            warn!(
                shard,
                "the drain hook failed or did not finish within the drain timeout; \
                 letting the Lease expire"
            );
            self.held.remove(&shard);
            self.backoff
                .insert(shard, now + self.inner.config.lease_duration);
        }
    }

    /// Run the plan's writes concurrently. Returns whether any was made.
    async fn execute(&mut self, plan: &Plan) -> bool {
        let mut actions = Vec::new();
        if plan.renew_member && !(self.stopping && self.held.is_empty()) {
            actions.push(Action::Member);
        }
        actions.extend(plan.acquire.iter().map(|&s| Action::Acquire(s)));
        actions.extend(plan.renew.iter().map(|&s| Action::Renew(s)));
        actions.extend(plan.clear.iter().map(|&s| Action::Clear(s)));
        actions.extend(
            plan.release_unheld
                .iter()
                .map(|&s| Action::ReleaseUnheld(s)),
        );
        if actions.is_empty() {
            return false;
        }

        let mut requests = Vec::new();
        for action in actions {
            match self.body(action) {
                Some((create, body)) => requests.push((action, create, body)),
                // Nothing to write from (no Lease read): try again later.
                None => self.postpone(action, Instant::now() + self.config().retry_period),
            }
        }
        if requests.is_empty() {
            return false;
        }
        let api = self.api.clone();
        let now = Instant::now();
        let outcomes =
            futures::future::join_all(requests.into_iter().map(|(action, create, body)| {
                let api = api.clone();
                let limit = self.request_limit(action, now);
                async move {
                    let sent = Instant::now();
                    let name = body.metadata.name.clone().unwrap_or_default();
                    let call = async {
                        if create {
                            api.create(&PostParams::default(), &body).await
                        } else {
                            api.replace(&name, &PostParams::default(), &body).await
                        }
                    };
                    let result = match timeout(limit, call).await {
                        Ok(result) => result.map_err(WriteError::from),
                        Err(_) => Err(WriteError::Other(format!("no answer within {limit:?}"))),
                    };
                    (action, name, sent, result)
                }
            }))
            .await;

        for (action, name, sent, result) in outcomes {
            self.outcome(action, &name, sent, result).await;
        }
        true
    }

    /// The Lease to write for an action, and whether it is a create.
    fn body(&self, action: Action) -> Option<(bool, Lease)> {
        let config = self.config();
        let now = Timestamp::now();
        match action {
            Action::Member => {
                let (create, mut body) = match self.store.get(&config.member_lease_name()) {
                    Some(entry) => (
                        false,
                        lease::renewed(&entry.lease, config, ROLE_MEMBER, now),
                    ),
                    None => (true, lease::new_member(config, now)),
                };
                let demand = self.inner.demand.load(std::sync::atomic::Ordering::Relaxed);
                lease::set_demand(&mut body, demand);
                Some((create, body))
            }
            Action::Acquire(shard) => Some(match self.store.get(&config.shard_lease_name(shard)) {
                Some(entry) => (
                    false,
                    lease::acquired(&entry.lease, config, ROLE_SHARD, now),
                ),
                None => (true, lease::new_shard(config, shard, now)),
            }),
            Action::Renew(shard) => {
                let entry = self.store.get(&config.shard_lease_name(shard))?;
                Some((false, lease::renewed(&entry.lease, config, ROLE_SHARD, now)))
            }
            Action::Clear(shard) | Action::ReleaseUnheld(shard) => {
                let entry = self.store.get(&config.shard_lease_name(shard))?;
                Some((false, lease::cleared(&entry.lease, now)))
            }
        }
        .filter(|(create, body)| *create || body.metadata.resource_version.is_some())
    }

    async fn outcome(
        &mut self,
        action: Action,
        name: &str,
        sent: Instant,
        result: Result<Lease, WriteError>,
    ) {
        let retry = self.config().retry_period;
        let now = Instant::now();
        let lease = match result {
            Ok(lease) => lease,
            Err(error) => {
                let conflict = matches!(error, WriteError::Conflict | WriteError::NotFound);
                if conflict {
                    self.refresh(name).await;
                }
                let again = Instant::now() + if conflict { CONFLICT_PAUSE } else { retry };
                self.postpone(action, again);
                match action {
                    Action::Member => {
                        if !conflict {
                            warn!(%error, "renewing the member Lease failed");
                            self.inner.emit(Event::RenewFailed {
                                shard: None,
                                error: error.to_string(),
                            });
                        }
                    }
                    Action::Acquire(shard) | Action::ReleaseUnheld(shard) => {
                        debug!(shard, ?action, %error, "Lease write failed");
                    }
                    Action::Renew(shard) | Action::Clear(shard) => {
                        warn!(shard, ?action, %error, "Lease write failed");
                        if matches!(action, Action::Renew(_)) {
                            self.inner.emit(Event::RenewFailed {
                                shard: Some(shard),
                                error: error.to_string(),
                            });
                        }
                    }
                }
                return;
            }
        };
        self.store.apply(lease, now);
        let next = sent + retry;
        match action {
            Action::Member => {
                self.member_due = next;
                self.member_renewed_at = Some(sent);
            }
            Action::Acquire(shard) => {
                let token = CancellationToken::new();
                self.epochs += 1;
                self.held.insert(
                    shard,
                    HeldShard {
                        held: Held {
                            renewed_at: sent,
                            next_attempt: next,
                            phase: Phase::Active,
                        },
                        token: token.clone(),
                        epoch: self.epochs,
                    },
                );
                self.backoff.remove(&shard);
                let mut shared = lock(&self.inner.shared);
                if shared.aborted {
                    token.cancel();
                    return;
                }
                shared.owned.insert(
                    shard,
                    Owned {
                        token,
                        renewed_at: sent,
                    },
                );
                self.inner.publish_owned(&shared);
                drop(shared);
                info!(shard, "gained shard");
                self.inner.emit(Event::Gained(shard));
            }
            Action::Renew(shard) => {
                if let Some(held) = self.held.get_mut(&shard) {
                    held.held.renewed_at = sent;
                    held.held.next_attempt = next;
                    if let Some(owned) = lock(&self.inner.shared).owned.get_mut(&shard) {
                        owned.renewed_at = sent;
                    }
                    self.inner.touched();
                }
            }
            Action::Clear(shard) => {
                self.held.remove(&shard);
                info!(shard, "released shard");
                self.inner.emit(Event::Released(shard));
            }
            Action::ReleaseUnheld(shard) => {
                info!(shard, "released a stale claim on a shard");
            }
        }
    }

    /// Do not retry `action` before `until`.
    fn postpone(&mut self, action: Action, until: Instant) {
        match action {
            Action::Member => self.member_due = until,
            Action::Acquire(shard) | Action::ReleaseUnheld(shard) => {
                self.backoff.insert(shard, until);
            }
            Action::Renew(shard) | Action::Clear(shard) => {
                if let Some(held) = self.held.get_mut(&shard) {
                    held.held.next_attempt = until;
                }
            }
        }
    }

    /// Re-read one Lease after a conflict.
    async fn refresh(&mut self, name: &str) {
        match timeout(self.request_timeout(), self.api.get_opt(name)).await {
            Ok(Ok(Some(lease))) => self.observe(lease, Instant::now()),
            Ok(Ok(None)) => {
                self.store.forget(name);
            }
            Ok(Err(e)) => debug!(name, error = %e, "re-reading a Lease failed"),
            Err(_) => debug!(name, "re-reading a Lease timed out"),
        }
    }

    /// Delete our member Lease (the last step of a graceful stop).
    async fn delete_member(&mut self) {
        let name = self.config().member_lease_name();
        let uid = self
            .store
            .get(&name)
            .and_then(|e| e.lease.metadata.uid.clone());
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match timeout(self.request_timeout(), self.api.delete(&name, &params)).await {
            Ok(Ok(_)) => info!(name, "deleted the member Lease"),
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {}
            Ok(Err(e)) => {
                warn!(name, error = %e, "deleting the member Lease failed; it will expire")
            }
            Err(_) => warn!(name, "deleting the member Lease timed out; it will expire"),
        }
    }
}

/// How long a renewal may wait for its answer: until the renew deadline of
/// the last renewal that succeeded (sent at `renewed_at`), and never less
/// than one retry period (a first write, or one sent close to its deadline).
fn renewal_limit(
    renewed_at: Option<Instant>,
    now: Instant,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Duration {
    renewed_at
        .map(|at| (at + renew_deadline).saturating_duration_since(now))
        .unwrap_or_default()
        .max(retry_period)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_may_wait_until_its_deadline_and_never_less_than_a_retry() {
        let (deadline, retry) = (Duration::from_secs(7), Duration::from_secs(2));
        let t0 = Instant::now();
        // The usual renewal, one retry period after the last: 5 s left.
        let at = t0 + Duration::from_secs(2);
        assert_eq!(
            renewal_limit(Some(t0), at, deadline, retry),
            Duration::from_secs(5)
        );
        // Close to the deadline, or past it: one retry period.
        let late = t0 + Duration::from_secs(6);
        assert_eq!(renewal_limit(Some(t0), late, deadline, retry), retry);
        let past = t0 + Duration::from_secs(9);
        assert_eq!(renewal_limit(Some(t0), past, deadline, retry), retry);
        // Nothing renewed yet (an acquisition, a first member write).
        assert_eq!(renewal_limit(None, at, deadline, retry), retry);
    }
}
