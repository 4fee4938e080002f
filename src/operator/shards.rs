//! What a replica does when shard ownership moves: drain a shard's work
//! before its Lease is given up, watch and cache a shard it gains (and
//! stop when it goes), queue everything of a shard once it is cached,
//! publish each change as an Event on its pod and in the metrics, and share
//! the KMS budget by demand and the rollout budget equally among the live
//! replicas.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::events::Recorder;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tokio::task::JoinHandle;

use crate::controllers::context::Context;
use crate::controllers::registry::Registry;
use crate::controllers::stores::ShardScopes;
use crate::controllers::workers::worker_scale;
use crate::kms::limiter::Limiter;
use crate::sharding::Ownership;

use super::shard_labels::Labeler;

/// How long a drain waits for the shard's reconciles in flight.
const DRAIN_WAIT: Duration = Duration::from_secs(25);

/// Before a shard's Lease is given up: stop its instant-update streams,
/// drop its queued work, wait for its reconciles in flight, flush the cache.
/// The hook is called on the coordinator's runtime; the drain runs on the
/// runtime of the workers (the one this is called on).
pub fn set_drain_hook(coordinator: &shard::Coordinator, registry: Registry, ctx: Arc<Context>) {
    let workers = tokio::runtime::Handle::current();
    coordinator.set_drain_hook(move |shard| {
        let (registry, cache) = (registry.clone(), ctx.cache.clone());
        let drain = workers.spawn(async move {
            for kind in registry.kinds() {
                kind.shard_lost(shard);
            }
            let dropped: usize = registry
                .kinds()
                .iter()
                .map(|k| k.queue().drop_shard(shard))
                .sum();
            // Woken as each reconcile of the shard ends.
            let idle = futures::future::join_all(
                registry.kinds().iter().map(|k| k.queue().idle_for(shard)),
            );
            let _ = tokio::time::timeout(DRAIN_WAIT, idle).await;
            if let Some(store) = &cache
                && let Err(e) = store.flush_async().await
            {
                tracing::warn!(error = %e, "could not flush the cache");
            }
            tracing::info!(shard, dropped, "shard drained");
        });
        async move {
            let _ = drain.await;
        }
    });
}

/// Queue everything of `shard` in every kind.
pub fn full_pass(registry: &Registry, gate: &dyn Ownership, shard: u32) {
    for kind in registry.kinds() {
        kind.full_pass(shard, gate);
    }
}

/// The coordinator's ownership narrowed to shards whose caches are
/// complete: work on a gained shard waits until its watches have listed it.
pub struct CachedGate {
    inner: shard::Coordinator,
    scopes: Arc<ShardScopes>,
}

impl CachedGate {
    /// `inner`'s ownership, for shards `scopes` has cached.
    pub fn new(inner: shard::Coordinator, scopes: Arc<ShardScopes>) -> Self {
        Self { inner, scopes }
    }
}

impl Ownership for CachedGate {
    fn shard_count(&self) -> u32 {
        self.inner.shard_count()
    }
    fn shard_of(&self, namespace: &str) -> u32 {
        self.inner.shard_of(namespace)
    }
    fn owns(&self, shard: u32) -> bool {
        self.scopes.is_cached(shard) && self.inner.owns(shard)
    }
    fn holds(&self, shard: u32) -> bool {
        self.inner.holds(shard)
    }
    fn cancellation(&self, shard: u32) -> tokio_util::sync::CancellationToken {
        self.inner.cancellation(shard)
    }
    fn members(&self) -> u32 {
        self.inner.members()
    }
    fn identity(&self) -> &str {
        Ownership::identity(&self.inner)
    }
    fn publish_demand(&self, demand: u32) {
        self.inner.set_demand(demand);
    }
    fn demands(&self) -> BTreeMap<String, u32> {
        self.inner.demands()
    }
    fn member_leases(&self) -> BTreeSet<String> {
        self.inner.member_leases()
    }
}

/// Watch the shards this replica holds, and only those: for a shard gained,
/// label its managed objects that lack the label, start its watches, and once they
/// have listed it let its work run and queue all of it; for a shard that
/// goes, stop its watches and drop its caches. Nothing starts until the
/// replica has settled (see [`settled`]; a replica that starts beside
/// others holds every shard for a moment, and must not list them all).
pub fn follow_scopes(
    coordinator: &shard::Coordinator,
    scopes: Arc<ShardScopes>,
    labeler: Arc<Labeler>,
    registry: Registry,
    gate: Arc<dyn Ownership>,
    settle: Settle,
) -> JoinHandle<()> {
    let mut held = coordinator.subscribe();
    let coordinator = coordinator.clone();
    tokio::spawn(async move {
        let began = tokio::time::Instant::now();
        settled(&coordinator, settle).await;
        if !settle.at_most.is_zero() {
            tracing::info!(
                seconds = began.elapsed().as_secs_f64(),
                members = coordinator.view().members.len(),
                "settled; watching the shards held"
            );
        }
        let mut started: BTreeMap<u32, tokio::task::AbortHandle> = BTreeMap::new();
        loop {
            let want: BTreeSet<u32> = held.borrow_and_update().iter().copied().collect();
            let gone: Vec<u32> = started
                .keys()
                .filter(|s| !want.contains(s))
                .copied()
                .collect();
            for shard in gone {
                if let Some(task) = started.remove(&shard) {
                    task.abort();
                }
                labeler.lost(shard);
                scopes.stop(shard);
                tracing::info!(shard, "stopped watching shard");
            }
            for shard in want {
                if started.contains_key(&shard) {
                    continue;
                }
                scopes.want(shard);
                let (scopes, labeler, registry, gate) = (
                    scopes.clone(),
                    labeler.clone(),
                    registry.clone(),
                    gate.clone(),
                );
                let task = tokio::spawn(async move {
                    let began = tokio::time::Instant::now();
                    labeler.gained(shard).await;
                    for ready in scopes.start(shard) {
                        ready.wait().await;
                    }
                    if scopes.mark_cached(shard) {
                        full_pass(&registry, gate.as_ref(), shard);
                        tracing::info!(
                            shard,
                            seconds = began.elapsed().as_secs_f64(),
                            "shard cached; its work runs"
                        );
                    }
                });
                started.insert(shard, task.abort_handle());
            }
            if held.changed().await.is_err() {
                break;
            }
        }
    })
}

/// How long a replica that starts fresh waits before it watches what it
/// holds.
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    /// The longest wait (zero: none, for a replica resuming its shards).
    pub at_most: Duration,
    /// How long the live member set must stay the same, when no count of
    /// replicas is expected.
    pub quiet: Duration,
    /// How many live members to wait for instead of a quiet member set
    /// (`--expected-replicas`).
    pub expected: Option<usize>,
}

impl Settle {
    /// No wait: a replica resuming its shards after a crash.
    pub fn at_once() -> Self {
        Self {
            at_most: Duration::ZERO,
            quiet: Duration::ZERO,
            expected: None,
        }
    }

    /// The wait of a replica that starts fresh: two retry periods at most,
    /// for `expected` live members (`--expected-replicas`; 0 is none) or
    /// else for a member set unchanged for half a retry period.
    pub fn fresh(retry_period: Duration, expected: Option<u32>) -> Self {
        Self {
            at_most: retry_period * 2,
            quiet: retry_period / 2,
            expected: expected.filter(|n| *n > 0).map(|n| n as usize),
        }
    }
}

/// Wait until this replica's view has settled: the Leases are listed, the
/// live member set has not changed for `settle.quiet` (or has
/// `settle.expected` members), and the shards this replica holds are
/// exactly those the member set assigns to it (nothing left to hand over or
/// take); or until `settle.at_most` has passed. Replicas started together
/// see each other within a moment and hand over within a renewal, so they
/// start watching about `quiet` after the last of them arrived (at once
/// when they know how many to wait for), each only its own shards, instead
/// of after a fixed wait.
async fn settled(coordinator: &shard::Coordinator, settle: Settle) {
    let deadline = tokio::time::Instant::now() + settle.at_most;
    let mut changes = coordinator.changes();
    let mut last: Option<(Vec<String>, tokio::time::Instant)> = None;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        changes.borrow_and_update();
        let view = coordinator.view();
        let since = match &last {
            Some((members, since)) if *members == view.members => *since,
            _ => {
                last = Some((view.members.clone(), now));
                now
            }
        };
        if view_settled(&view) && complete(view.members.len(), now.duration_since(since), &settle) {
            return;
        }
        // Look again when the view changes, or when the member set has
        // been quiet long enough, or at the deadline.
        let quiet_at = (settle.expected.is_none() && view_settled(&view))
            .then(|| since + settle.quiet)
            .filter(|at| *at > now)
            .unwrap_or(deadline)
            .min(deadline);
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(quiet_at) => {}
        }
    }
}

/// Whether the member set is the one to start with: as many members as
/// expected, or, with no count expected, a set unchanged for `settle.quiet`.
/// With a count expected, fewer members wait (for `at_most`) even when
/// quiet: pods of one StatefulSet start seconds apart, and the first must
/// not take every shard's objects into its caches meanwhile.
fn complete(members: usize, unchanged_for: Duration, settle: &Settle) -> bool {
    match settle.expected {
        Some(expected) => members >= expected,
        None => unchanged_for >= settle.quiet,
    }
}

/// Whether `view` has its Leases listed, knows itself as a member, has an
/// assignment for every shard, and holds exactly the shards assigned to it.
fn view_settled(view: &shard::View) -> bool {
    if !view.synced
        || !view.mismatches.is_empty()
        || !view.members.contains(&view.identity)
        || view.status.values().any(|st| st.assigned.is_none())
    {
        return false;
    }
    let assigned: BTreeSet<u32> = view
        .status
        .iter()
        .filter(|(_, st)| st.assigned.as_deref() == Some(view.identity.as_str()))
        .map(|(s, _)| *s)
        .collect();
    let owned: BTreeSet<u32> = view.owned.iter().copied().collect();
    assigned == owned
}

/// Follow the coordinator's events until it stops: a full pass for every
/// shard gained (unless `scoped`: then [`follow_scopes`] queues a shard
/// once it is cached), metrics (`kms_operator_shard_owned` set at once,
/// not on the 5 s tick) and an Event on the operator's pod for every change,
/// budget shares held on a failed renewal and recomputed when the live
/// replicas change.
pub fn follow(
    mut events: tokio::sync::broadcast::Receiver<shard::Event>,
    registry: Registry,
    ctx: Arc<Context>,
    budget: Arc<Limiter>,
    pod: ObjectReference,
    scoped: bool,
) -> JoinHandle<()> {
    let publish = {
        let recorder: Recorder = ctx.recorder.clone();
        move |reason: &'static str, note: String| {
            let (recorder, pod) = (recorder.clone(), pod.clone());
            tokio::spawn(async move {
                let event = Event {
                    type_: EventType::Normal,
                    reason: reason.to_owned(),
                    note: Some(note),
                    action: "Shard".to_owned(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&event, &pod).await {
                    tracing::debug!(error = %e, "could not publish a shard Event");
                }
            });
        }
    };
    tokio::spawn(async move {
        let (metrics, kms) = (&ctx.metrics, &ctx.kms);
        loop {
            match events.recv().await {
                Ok(shard::Event::Gained(s)) => {
                    metrics
                        .shard_owned
                        .with_label_values(&[&s.to_string()])
                        .set(1);
                    metrics
                        .shard_handovers
                        .with_label_values(&[&s.to_string(), "gained"])
                        .inc();
                    if !scoped {
                        full_pass(&registry, ctx.gate.as_ref(), s);
                    }
                    publish("ShardGained", format!("Owns shard {s}"));
                }
                Ok(shard::Event::Lost { shard, reason }) => {
                    metrics
                        .shard_owned
                        .with_label_values(&[&shard.to_string()])
                        .set(0);
                    metrics
                        .shard_handovers
                        .with_label_values(&[&shard.to_string(), "lost"])
                        .inc();
                    tracing::info!(shard, reason = reason.as_str(), "shard lost");
                    publish(
                        "ShardLost",
                        format!("Gave up shard {shard} ({})", reason.as_str()),
                    );
                }
                Ok(shard::Event::RenewFailed { shard, error }) => {
                    if let Some(s) = shard {
                        metrics
                            .lease_renew_failures
                            .with_label_values(&[&s.to_string()])
                            .inc();
                        tracing::warn!(shard = s, %error, "shard Lease renewal failed");
                    }
                    kms.hold_members();
                    budget.hold_members();
                }
                Ok(shard::Event::MembersChanged(members)) => {
                    let n = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
                    budget.set_members(n);
                    tracing::info!(?members, "live replicas changed");
                }
                Ok(shard::Event::ConfigMismatch(m)) => {
                    tracing::warn!(%m, "not acquiring shards")
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    // Events were missed: read ownership from the gate.
                    for shard in 0..ctx.gate.shard_count() {
                        metrics
                            .shard_owned
                            .with_label_values(&[&shard.to_string()])
                            .set(i64::from(ctx.gate.holds(shard)));
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    })
}

/// How often the demand is published and the KMS budget shared again.
const SHARE_EVERY: Duration = Duration::from_secs(1);

/// Publish this replica's demand (the KMS-bound work of its shards added as
/// due, waiting or in progress; see `Queue::demand`) on its member Lease,
/// and take its part of the KMS budget in proportion to what every live
/// replica published; its workers follow the same part
/// (`workers::worker_scale`).
pub fn share_kms_budget(registry: Registry, ctx: Arc<Context>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SHARE_EVERY);
        loop {
            tick.tick().await;
            let gate = ctx.gate.as_ref();
            let waiting: usize = registry
                .kinds()
                .iter()
                .filter(|k| k.spends_kms_budget())
                .map(|k| k.queue().demand(&|s| gate.owns(s)))
                .sum();
            let demand = u32::try_from(waiting).unwrap_or(u32::MAX);
            gate.publish_demand(demand);
            let live: BTreeMap<String, f64> = gate
                .demands()
                .into_iter()
                .map(|(member, d)| (member, f64::from(d)))
                .collect();
            if !live.is_empty() {
                ctx.kms
                    .set_weights(gate.identity(), &live, &gate.member_leases());
            }
            let scale = worker_scale(demand, gate.identity(), &live);
            ctx.worker_scale.send_if_modified(|now| {
                let changed = (*now - scale).abs() > 0.01;
                if changed {
                    *now = scale;
                }
                changed
            });
            ctx.metrics.demand.set(f64::from(demand));
            ctx.metrics.worker_scale.set(scale);
            ctx.metrics.kms_budget_rate.set(ctx.kms.rate());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(members: &[&str], assigned: &[(u32, Option<&str>)], owned: &[u32]) -> shard::View {
        shard::View {
            identity: "a".to_owned(),
            shards: assigned.len() as u32,
            hash_version: shard::HASH_VERSION,
            owned: owned.to_vec(),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
            status: assigned
                .iter()
                .map(|(s, m)| {
                    (
                        *s,
                        shard::ShardStatus {
                            holder: None,
                            assigned: m.map(str::to_owned),
                            unchanged_for: None,
                        },
                    )
                })
                .collect(),
            mismatches: Vec::new(),
            synced: true,
            stopping: false,
        }
    }

    #[test]
    fn a_view_settles_when_it_holds_what_is_assigned_to_it() {
        let both = [(0, Some("a")), (1, Some("b")), (2, Some("a"))];
        assert!(view_settled(&view(&["a", "b"], &both, &[0, 2])));
        // Still holding a shard that goes to another member.
        assert!(!view_settled(&view(&["a", "b"], &both, &[0, 1, 2])));
        // Not yet holding one of its own.
        assert!(!view_settled(&view(&["a", "b"], &both, &[0])));
        // Alone, before its first renewal: nothing held yet.
        let alone = [(0, Some("a")), (1, Some("a"))];
        assert!(!view_settled(&view(&["a"], &alone, &[])));
        // An assignment not known yet, or itself not among the members.
        assert!(!view_settled(&view(&["a"], &[(0, None)], &[])));
        assert!(!view_settled(&view(&["b"], &[(0, Some("b"))], &[])));
        // More members than shards: holding nothing is settled.
        assert!(view_settled(&view(&["a", "b"], &[(0, Some("b"))], &[])));
        let mut unsynced = view(&["a"], &alone, &[0, 1]);
        assert!(view_settled(&unsynced));
        unsynced.synced = false;
        assert!(!view_settled(&unsynced));
    }

    #[test]
    fn the_member_set_is_complete_when_quiet_or_when_all_expected_are_live() {
        let quiet = Settle::fresh(Duration::from_secs(2), None);
        assert_eq!(
            (quiet.at_most, quiet.quiet),
            (Duration::from_secs(4), Duration::from_secs(1))
        );
        // A release scaled to zero renders 0: no count.
        assert_eq!(
            Settle::fresh(Duration::from_secs(2), Some(0)).expected,
            None
        );
        assert!(!complete(1, Duration::from_millis(999), &quiet));
        assert!(complete(1, Duration::from_secs(1), &quiet));
        let three = Settle {
            expected: Some(3),
            ..quiet
        };
        // All three live: no quiet moment needed.
        assert!(complete(3, Duration::ZERO, &three));
        // A rolling update's extra pod counts too.
        assert!(complete(4, Duration::ZERO, &three));
        // Two of three, however long quiet: wait for the third (at most
        // `at_most`, which `settled` enforces).
        assert!(!complete(2, Duration::from_secs(3), &three));
    }
}
