//! The I/O half of reload: watched workloads, the reload queue's
//! reconcile, and the rollout budget.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::gradual::{self, Progress, Strategy, Turn};
use super::rollouts::{ArgoRollouts, Rollout};
use super::{ConsumerIndex, Current, Source, WorkloadKey, WorkloadKind, plan_stamps, stamp_key};
use crate::controllers::context::Context;
use crate::controllers::error::SyncError;
use crate::controllers::queue::Queue;
use crate::controllers::registry::{Kind, WorkQueue};
use crate::controllers::stores::Scoped;
use crate::controllers::target::{
    self as target, MANAGED_LABEL, VERSION_ANNOTATION, go_equivalents,
};
use crate::controllers::workers::{Action, Job, Reconciler, spawn_workers};
use crate::kms::limiter::Limiter;
use crate::sharding::Ownership;

/// The controller's metric label.
pub const CONTROLLER: &str = "reload";
/// Field manager of stamp patches.
const FIELD_MANAGER: &str = "kms-operator-reload";

/// The watched workloads.
#[derive(Clone)]
pub struct Workloads {
    /// Deployments.
    pub deployments: Scoped<Deployment>,
    /// StatefulSets.
    pub stateful_sets: Scoped<StatefulSet>,
    /// DaemonSets.
    pub daemon_sets: Scoped<DaemonSet>,
    /// Argo Rollouts, while their CRD is served (and `--argo-rollouts`).
    pub rollouts: Arc<ArgoRollouts>,
}

/// What reload needs beside the shared context.
pub struct Reloader {
    /// Watched workloads.
    pub workloads: Workloads,
    /// Which workloads use which objects.
    pub index: Arc<ConsumerIndex>,
    /// Rollouts per second (shared by replicas).
    pub budget: Arc<Limiter>,
    /// Delay between a change and the rollout it causes.
    pub debounce: Duration,
    /// The registered kinds (a held reload sends the object's resource
    /// round).
    pub registry: crate::controllers::registry::Registry,
}

/// A workload's annotations, its pod template's, and its rollout's
/// progress, whatever its kind.
struct Observed {
    annotations: BTreeMap<String, String>,
    /// The pod template's annotations (empty for a Rollout: its template
    /// is never stamped).
    template: BTreeMap<String, String>,
    reference: k8s_openapi::api::core::v1::ObjectReference,
    progress: Progress,
    /// Whether the kind has a progress deadline of its own (else a gradual
    /// reload applies [`gradual::DEFAULT_TIMEOUT`]).
    own_deadline: bool,
}

fn template_annotations(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default()
}

fn observed<K: Resource<DynamicType = ()>>(
    o: &K,
    template: BTreeMap<String, String>,
    progress: Progress,
    own_deadline: bool,
) -> Observed {
    Observed {
        annotations: o.annotations().clone(),
        template,
        reference: o.object_ref(&()),
        progress,
        own_deadline,
    }
}

fn observe(reloader: &Reloader, key: &WorkloadKey) -> Option<Observed> {
    let (ns, name) = (Some(key.namespace.as_str()), key.name.as_str());
    let w = &reloader.workloads;
    Some(match key.kind {
        WorkloadKind::Deployment => {
            let o = w.deployments.get(ns, name)?;
            let t = template_annotations(&o.spec.template);
            observed(o.as_ref(), t, gradual::deployment_progress(&o), true)
        }
        WorkloadKind::StatefulSet => {
            let o = w.stateful_sets.get(ns, name)?;
            let t = template_annotations(&o.spec.template);
            observed(o.as_ref(), t, gradual::stateful_set_progress(&o), false)
        }
        WorkloadKind::DaemonSet => {
            let o = w.daemon_sets.get(ns, name)?;
            let t = template_annotations(&o.spec.template);
            observed(o.as_ref(), t, gradual::daemon_set_progress(&o), false)
        }
        WorkloadKind::Rollout => {
            let o = w.rollouts.get(&key.namespace, name)?;
            observed(
                o.as_ref(),
                BTreeMap::new(),
                gradual::rollout_progress(&o),
                true,
            )
        }
    })
}

/// The current version of a managed object, if the operator manages it,
/// with the Go operators' versions of the same data.
fn managed_version(ctx: &Context, ns: &str, source: Source, name: &str) -> Option<Current> {
    let (kind, observed) = match source {
        Source::Secret => (
            "Secret",
            target::Observed::from_secret(ctx.secrets.get(Some(ns), name)?.as_ref()),
        ),
        Source::ConfigMap => (
            "ConfigMap",
            target::Observed::from_config_map(ctx.config_maps.get(Some(ns), name)?.as_ref()),
        ),
    };
    if observed.labels.get(MANAGED_LABEL).map(String::as_str) != Some("true") {
        return None;
    }
    Some(Current {
        object: format!("{kind} {name}"),
        version: observed.annotations.get(VERSION_ANNOTATION)?.clone(),
        equivalent: go_equivalents(&observed.annotations, &observed.data),
    })
}

/// Reload as a registered kind: its queue of workloads and its
/// reconciler.
pub struct Registration {
    /// The reconciler.
    pub reloader: Arc<Reloader>,
    /// Its queue.
    pub queue: Arc<Queue<WorkloadKey>>,
}

impl Kind for Registration {
    fn controller(&self) -> &'static str {
        CONTROLLER
    }

    fn spends_kms_budget(&self) -> bool {
        false
    }

    fn wait_ready(&self) -> BoxFuture<'_, ()> {
        let w = &self.reloader.workloads;
        Box::pin(async move {
            w.deployments.wait_ready().await;
            w.stateful_sets.wait_ready().await;
            w.daemon_sets.wait_ready().await;
            if let Some(rollouts) = w.rollouts.store() {
                rollouts.wait_ready().await;
            }
        })
    }

    /// Every workload of the shard that opted in.
    fn full_pass(&self, shard: u32, gate: &dyn Ownership) {
        let w = &self.reloader.workloads;
        let add = |kind: WorkloadKind, o: &dyn ResourceLike| {
            let namespace = o.namespace_or_empty();
            if o.opted_in() && gate.shard_of(&namespace) == shard {
                self.queue.add(
                    WorkloadKey {
                        kind,
                        namespace,
                        name: o.name(),
                    },
                    shard,
                );
            }
        };
        for o in w.deployments.all() {
            add(WorkloadKind::Deployment, o.as_ref());
        }
        for o in w.stateful_sets.all() {
            add(WorkloadKind::StatefulSet, o.as_ref());
        }
        for o in w.daemon_sets.all() {
            add(WorkloadKind::DaemonSet, o.as_ref());
        }
        for o in w.rollouts.all() {
            add(WorkloadKind::Rollout, o.as_ref());
        }
    }

    fn queue(&self) -> &dyn WorkQueue {
        self.queue.as_ref()
    }

    fn start(self: Arc<Self>, ctx: Arc<Context>) -> JoinHandle<()> {
        spawn_workers(ctx, &self.queue, CONTROLLER, &self.reloader)
    }
}

/// What a full pass reads of a workload, whatever its kind.
trait ResourceLike {
    fn namespace_or_empty(&self) -> String;
    fn name(&self) -> String;
    fn opted_in(&self) -> bool;
}

impl<T: Resource> ResourceLike for T {
    fn namespace_or_empty(&self) -> String {
        self.namespace().unwrap_or_default()
    }
    fn name(&self) -> String {
        self.name_any()
    }
    fn opted_in(&self) -> bool {
        super::opted_in(self.annotations())
    }
}

impl Reconciler<WorkloadKey> for Reloader {
    async fn reconcile(&self, job: Job<'_, WorkloadKey>) -> Result<Action, SyncError> {
        reconcile(job.ctx, self, job.key, job.shard, job.cancel).await
    }
}

/// Bring a workload's stamps in line with the versions of the managed
/// objects it uses: record new ones, roll for changed ones.
pub async fn reconcile(
    ctx: &Context,
    reloader: &Reloader,
    key: &WorkloadKey,
    shard: u32,
    cancel: &CancellationToken,
) -> Result<Action, SyncError> {
    let Some(o) = observe(reloader, key) else {
        reloader.index.remove(key);
        return Ok(Action::Done);
    };
    if !super::opted_in(&o.annotations) {
        return Ok(Action::Done);
    }
    let uses = reloader.index.uses(key);
    let mut versions = BTreeMap::new();
    let mut objects = BTreeMap::new();
    for (source, name) in &uses {
        if let Some(current) = managed_version(ctx, &key.namespace, *source, name) {
            let stamp = stamp_key(*source, name);
            versions.insert(stamp.clone(), current);
            objects.insert(stamp, (*source, name.clone()));
        }
    }
    let mut patch = plan_stamps(&o.annotations, &o.template, &versions);
    let next = if patch.template.is_empty() {
        None
    } else {
        gate(ctx, reloader, key, &o, &objects, &versions, &mut patch).await
    };
    let then = next.map_or(Action::Done, |t| Action::RequeueAt(t.into()));
    if patch.is_empty() {
        return Ok(then);
    }
    if !patch.template.is_empty() {
        patch.metadata.insert(
            gradual::RELOADED_AT_ANNOTATION.to_owned(),
            rfc3339(k8s_openapi::jiff::Timestamp::now()),
        );
    }
    if !patch.template.is_empty() {
        // The cluster-wide rollout budget.
        tokio::select! {
            _ = reloader.budget.acquire("rollouts") => {}
            () = cancel.cancelled() => return Err(SyncError::NotOwner),
        }
    }
    crate::controllers::apply::ensure_owner(ctx, shard, cancel)?;
    let mut body = json!({"metadata": {"annotations": patch.metadata}});
    if !patch.template.is_empty() {
        body["spec"] = match key.kind {
            // As `kubectl argo rollouts restart`: pods created before
            // `restartAt` are replaced.
            WorkloadKind::Rollout => {
                json!({"restartAt": restart_at(k8s_openapi::jiff::Timestamp::now())})
            }
            _ => json!({"template": {"metadata": {"annotations": patch.template}}}),
        };
    }
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let context = format!("stamping {key}");
    let result = match key.kind {
        WorkloadKind::Deployment => {
            Api::<Deployment>::namespaced(ctx.client.clone(), &key.namespace)
                .patch(&key.name, &pp, &Patch::Merge(&body))
                .await
                .map(|_| ())
        }
        WorkloadKind::StatefulSet => {
            Api::<StatefulSet>::namespaced(ctx.client.clone(), &key.namespace)
                .patch(&key.name, &pp, &Patch::Merge(&body))
                .await
                .map(|_| ())
        }
        WorkloadKind::DaemonSet => Api::<DaemonSet>::namespaced(ctx.client.clone(), &key.namespace)
            .patch(&key.name, &pp, &Patch::Merge(&body))
            .await
            .map(|_| ()),
        WorkloadKind::Rollout => Api::<Rollout>::namespaced(ctx.client.clone(), &key.namespace)
            .patch(&key.name, &pp, &Patch::Merge(&body))
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::Done),
        Err(e) => return Err(SyncError::kube(context, e)),
    }
    if patch.template.is_empty() {
        tracing::info!(workload = %key, "recorded the versions of the objects it uses");
    } else {
        ctx.metrics
            .reloads
            .with_label_values(&[key.kind.as_str()])
            .inc();
        let note = format!("Rolling out because {} changed", patch.changed.join(", "));
        tracing::info!(workload = %key, changed = ?patch.changed, "rolling out");
        let event = Event {
            type_: EventType::Normal,
            reason: "SecretChanged".to_owned(),
            note: Some(note),
            action: "Reload".to_owned(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&event, &o.reference).await {
            tracing::warn!(error = %e, "could not publish an Event");
        }
    }
    Ok(then)
}

/// `restartAt` as the Rollout controller reads it (a `metav1.Time`:
/// RFC 3339, UTC, whole seconds).
fn restart_at(now: k8s_openapi::jiff::Timestamp) -> serde_json::Value {
    json!(rfc3339(now))
}

/// A time as the API server writes one: RFC 3339, UTC, whole seconds.
fn rfc3339(t: k8s_openapi::jiff::Timestamp) -> String {
    let whole = k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t);
    whole.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Gradual reload: take out of `patch` every changed object whose gradual
/// order does not let this workload roll yet (an earlier wave has not
/// completed, or failed), and record each object's hold. Returns when to
/// look again (a running rollout's timeout), if any.
async fn gate(
    ctx: &Context,
    reloader: &Reloader,
    key: &WorkloadKey,
    o: &Observed,
    objects: &BTreeMap<String, (Source, String)>,
    versions: &BTreeMap<String, Current>,
    patch: &mut super::StampPatch,
) -> Option<k8s_openapi::jiff::Timestamp> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let ns = key.namespace.as_str();
    let mut next = None;
    for (stamp, (source, name)) in objects {
        let (Some(current), true) = (versions.get(stamp), patch.template.contains_key(stamp))
        else {
            continue;
        };
        let object = object_annotations(ctx, ns, *source, name);
        match gradual::strategy(&o.annotations, &object) {
            Ok(Strategy::Gradual) => {}
            Ok(Strategy::Immediate) => continue,
            Err(e) => {
                tracing::warn!(workload = %key, "{e}; rolling at once");
                continue;
            }
        }
        let mut members = members(
            reloader,
            (ns, *source, name),
            stamp,
            &current.version,
            &object,
        );
        gradual::sort(&mut members);
        next = next
            .into_iter()
            .chain(members.iter().filter_map(gradual::Member::deadline))
            .min();
        let hold = gradual::hold_of(&members, &current.object, &current.version, now);
        report_hold(ctx, reloader, (ns, *source, name), hold, &object).await;
        let turn = gradual::turn(&members, key, gradual::wave_size(&object), now);
        if turn != Turn::Go {
            tracing::info!(workload = %key, object = %current.object, ?turn, "gradual reload: not this workload's turn");
            patch.template.remove(stamp);
            patch.metadata.remove(stamp);
            patch.changed.retain(|c| *c != current.object);
        }
    }
    next
}

/// The annotations of a managed object.
fn object_annotations(
    ctx: &Context,
    ns: &str,
    source: Source,
    name: &str,
) -> BTreeMap<String, String> {
    match source {
        Source::Secret => ctx
            .secrets
            .get(Some(ns), name)
            .map(|o| o.annotations().clone()),
        Source::ConfigMap => ctx
            .config_maps
            .get(Some(ns), name)
            .map(|o| o.annotations().clone()),
    }
    .unwrap_or_default()
}

/// The gradual workloads that use an object, as their turns are decided.
fn members(
    reloader: &Reloader,
    (ns, source, name): (&str, Source, &str),
    stamp: &str,
    version: &str,
    object: &BTreeMap<String, String>,
) -> Vec<gradual::Member> {
    reloader
        .index
        .consumers(ns, source, name)
        .into_iter()
        .filter_map(|w| {
            let o = observe(reloader, &w)?;
            let gradual = super::opted_in(&o.annotations)
                && gradual::strategy(&o.annotations, object) == Ok(Strategy::Gradual);
            gradual.then(|| gradual::Member {
                order: gradual::order(&o.annotations),
                current: o.annotations.get(stamp).map(String::as_str) == Some(version),
                rolled_at: o
                    .annotations
                    .get(gradual::RELOADED_AT_ANNOTATION)
                    .and_then(|t| t.parse().ok()),
                timeout: gradual::timeout(&o.annotations, object)
                    .or((!o.own_deadline).then_some(gradual::DEFAULT_TIMEOUT)),
                progress: o.progress,
                key: w,
            })
        })
        .collect()
}

/// Record an object's hold; when it changes, send the resource that writes
/// the object round (its condition reports it) and, for a new hold, a
/// Warning Event on the workload that failed.
async fn report_hold(
    ctx: &Context,
    reloader: &Reloader,
    (ns, source, name): (&str, Source, &str),
    hold: Option<gradual::Hold>,
    object: &BTreeMap<String, String>,
) {
    if !reloader
        .index
        .set_hold(ns, source, name, hold.as_ref().map(gradual::Hold::message))
    {
        return;
    }
    if let Some(owner) = object.get(target::OWNER_ANNOTATION) {
        reloader.registry.owner(owner, ctx.gate.as_ref());
    }
    let Some(hold) = hold else {
        tracing::info!(
            namespace = ns,
            object = name,
            "gradual reload no longer held"
        );
        return;
    };
    tracing::warn!(workload = %hold.failure.workload, reason = %hold.failure.reason, "gradual reload held");
    let Some(failed) = observe(reloader, &hold.failure.workload) else {
        return;
    };
    let event = Event {
        type_: EventType::Warning,
        reason: "RolloutFailed".to_owned(),
        note: Some(hold.message()),
        action: "Reload".to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &failed.reference).await {
        tracing::warn!(error = %e, "could not publish an Event");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn restart_at_is_a_whole_second_in_utc() {
        let t = k8s_openapi::jiff::Timestamp::from_millisecond(1_796_563_530_250).unwrap();
        assert_eq!(super::restart_at(t), "2026-12-06T13:25:30Z");
    }
}
