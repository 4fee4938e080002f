//! Auto-reload: roll Deployments, StatefulSets and DaemonSets that opted in
//! (`secrets.hanzo.ai/auto-reload: "true"`) when a managed Secret or ConfigMap
//! they use really changed.
//!
//! - **Consumers** are found in the pod template: `env[].valueFrom`
//!   (`secretKeyRef`, `configMapKeyRef`), `envFrom[]`, `volumes[]` (`secret`,
//!   `configMap`, `projected` sources), in containers and init containers. An
//!   index maps each object to the workloads that use it; nothing lists all
//!   workloads on a change.
//! - **Versions.** A managed object's `secrets.hanzo.ai/version` is a hash of
//!   its data, so it changes only when the data does (never because of list
//!   order, an unrelated key, or a restart).
//! - **Stamps.** The workload records the version it runs with in its own
//!   metadata annotations (`secrets.hanzo.ai/managed-secret.<name>`, or
//!   `…/managed-configmap.<name>`): writing those does not roll it. A rollout
//!   sets the same key on the pod template as well. The first time a workload
//!   is seen with a consumed object, the version is only recorded: opting in
//!   does not roll.
//! - **Debounce and budget.** A change queues the consumers after a short
//!   delay, so several objects changing together cause one rollout; rollouts
//!   started per second are limited cluster-wide (shared by live replicas).
//!
//! Writes are merge patches of the annotations only, never full updates.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// Opt-in annotation on a workload.
pub const AUTO_RELOAD_ANNOTATION: &str = "secrets.hanzo.ai/auto-reload";
/// Prefix of the stamp of a Secret.
pub const SECRET_STAMP_PREFIX: &str = "secrets.hanzo.ai/managed-secret.";
/// Prefix of the stamp of a ConfigMap.
pub const CONFIG_MAP_STAMP_PREFIX: &str = "secrets.hanzo.ai/managed-configmap.";

/// Kinds that can be reloaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    /// apps/v1 Deployment.
    Deployment,
    /// apps/v1 StatefulSet.
    StatefulSet,
    /// apps/v1 DaemonSet.
    DaemonSet,
}

impl WorkloadKind {
    /// The kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
        }
    }
}

/// A workload.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    /// Kind.
    pub kind: WorkloadKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// Secret or ConfigMap consumed by a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

/// An object a workload uses: kind and name (same namespace as the workload).
pub type Consumed = (Source, String);

fn from_container(c: &Container, out: &mut BTreeSet<Consumed>) {
    for e in c.env.iter().flatten() {
        if let Some(from) = &e.value_from {
            if let Some(r) = &from.secret_key_ref {
                out.insert((Source::Secret, r.name.clone()));
            }
            if let Some(r) = &from.config_map_key_ref {
                out.insert((Source::ConfigMap, r.name.clone()));
            }
        }
    }
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.secret_ref {
            out.insert((Source::Secret, r.name.clone()));
        }
        if let Some(r) = &e.config_map_ref {
            out.insert((Source::ConfigMap, r.name.clone()));
        }
    }
}

/// Every Secret and ConfigMap a pod spec uses.
pub fn consumed(spec: &PodSpec) -> BTreeSet<Consumed> {
    let mut out = BTreeSet::new();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        from_container(c, &mut out);
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            out.insert((Source::Secret, name));
        }
        if let Some(cm) = &v.config_map {
            out.insert((Source::ConfigMap, cm.name.clone()));
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &p.secret {
                out.insert((Source::Secret, s.name.clone()));
            }
            if let Some(cm) = &p.config_map {
                out.insert((Source::ConfigMap, cm.name.clone()));
            }
        }
    }
    out.retain(|(_, name)| !name.is_empty());
    out
}

/// The stamp annotation key of an object. The name part of an annotation key
/// is at most 63 characters: long object names are cut and suffixed with a
/// hash so keys stay valid and distinct.
pub fn stamp_key(source: Source, name: &str) -> String {
    let prefix = match source {
        Source::Secret => SECRET_STAMP_PREFIX,
        Source::ConfigMap => CONFIG_MAP_STAMP_PREFIX,
    };
    let local = &prefix["secrets.hanzo.ai/".len()..];
    if local.len() + name.len() <= 63 {
        return format!("{prefix}{name}");
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hash = crate::kms::endpoint::hex(&digest.as_ref()[..4]);
    let keep = 63 - local.len() - hash.len() - 1;
    let mut cut = name[..keep.min(name.len())].to_owned();
    while cut.ends_with(['-', '.']) {
        cut.pop();
    }
    format!("{prefix}{cut}-{hash}")
}

/// The annotations to write on a workload.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StampPatch {
    /// On the workload's metadata (recording, does not roll).
    pub metadata: BTreeMap<String, String>,
    /// On the pod template (rolls the workload).
    pub template: BTreeMap<String, String>,
    /// Objects whose change rolls the workload (for the Event).
    pub changed: Vec<String>,
}

impl StampPatch {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.metadata.is_empty() && self.template.is_empty()
    }
}

/// Decide the stamps of a workload: `versions` maps stamp keys of the managed
/// objects it uses to their current version. A key the workload has not
/// recorded yet is recorded without rolling; a recorded key with another
/// version rolls.
pub fn plan_stamps(
    recorded: &BTreeMap<String, String>,
    template: &BTreeMap<String, String>,
    versions: &BTreeMap<String, (String, String)>,
) -> StampPatch {
    let mut patch = StampPatch::default();
    for (key, (object, version)) in versions {
        match recorded.get(key) {
            None => {
                patch.metadata.insert(key.clone(), version.clone());
            }
            Some(v) if v != version => {
                patch.metadata.insert(key.clone(), version.clone());
                patch.template.insert(key.clone(), version.clone());
                patch.changed.push(object.clone());
            }
            Some(_) => {
                // Recorded and current; a template that lags (an earlier
                // rollout was interrupted) is brought in line.
                if template.get(key).is_some_and(|t| t != version) {
                    patch.template.insert(key.clone(), version.clone());
                }
            }
        }
    }
    patch
}

/// Which workloads use which objects. Only opted-in workloads are indexed.
#[derive(Default)]
pub struct ConsumerIndex {
    inner: Mutex<IndexInner>,
}

#[derive(Default)]
struct IndexInner {
    by_object: HashMap<(String, Source, String), HashSet<WorkloadKey>>,
    by_workload: HashMap<WorkloadKey, BTreeSet<Consumed>>,
}

impl ConsumerIndex {
    /// Record what a workload uses (empty, or not opted in: forget it).
    /// Returns whether its set changed.
    pub fn set(&self, key: &WorkloadKey, uses: BTreeSet<Consumed>) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.by_workload.get(key) == Some(&uses) {
            return false;
        }
        Self::remove_locked(&mut inner, key);
        if uses.is_empty() {
            return true;
        }
        for (source, name) in &uses {
            inner
                .by_object
                .entry((key.namespace.clone(), *source, name.clone()))
                .or_default()
                .insert(key.clone());
        }
        inner.by_workload.insert(key.clone(), uses);
        true
    }

    fn remove_locked(inner: &mut IndexInner, key: &WorkloadKey) {
        for (source, name) in inner.by_workload.remove(key).unwrap_or_default() {
            let k = (key.namespace.clone(), source, name);
            if let Some(set) = inner.by_object.get_mut(&k) {
                set.remove(key);
                if set.is_empty() {
                    inner.by_object.remove(&k);
                }
            }
        }
    }

    /// Forget a workload.
    pub fn remove(&self, key: &WorkloadKey) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::remove_locked(&mut inner, key);
    }

    /// Workloads that use an object.
    pub fn consumers(&self, namespace: &str, source: Source, name: &str) -> Vec<WorkloadKey> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<WorkloadKey> = inner
            .by_object
            .get(&(namespace.to_owned(), source, name.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// What a workload uses.
    pub fn uses(&self, key: &WorkloadKey) -> BTreeSet<Consumed> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_workload.get(key).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> PodSpec {
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn every_reference_form_is_found() {
        let spec = pod(serde_json::json!({
            "containers": [{"name": "app", "env": [
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}},
                {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm-env", "key": "k"}}},
                {"name": "C", "value": "plain"}
            ], "envFrom": [{"secretRef": {"name": "s-envfrom"}}, {"configMapRef": {"name": "cm-envfrom"}}]}],
            "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "s-init"}}]}],
            "volumes": [
                {"name": "v1", "secret": {"secretName": "s-vol"}},
                {"name": "v2", "configMap": {"name": "cm-vol"}},
                {"name": "v3", "projected": {"sources": [{"secret": {"name": "s-proj"}}, {"configMap": {"name": "cm-proj"}}]}},
                {"name": "v4", "emptyDir": {}}
            ]
        }));
        let got = consumed(&spec);
        let secrets: Vec<&str> = got
            .iter()
            .filter(|(s, _)| *s == Source::Secret)
            .map(|(_, n)| n.as_str())
            .collect();
        let cms: Vec<&str> = got
            .iter()
            .filter(|(s, _)| *s == Source::ConfigMap)
            .map(|(_, n)| n.as_str())
            .collect();
        assert_eq!(
            secrets,
            vec!["s-env", "s-envfrom", "s-init", "s-proj", "s-vol"]
        );
        assert_eq!(cms, vec!["cm-env", "cm-envfrom", "cm-proj", "cm-vol"]);
    }

    #[test]
    fn stamp_keys_stay_valid() {
        assert_eq!(
            stamp_key(Source::Secret, "app"),
            "secrets.hanzo.ai/managed-secret.app"
        );
        assert_eq!(
            stamp_key(Source::ConfigMap, "app"),
            "secrets.hanzo.ai/managed-configmap.app"
        );
        let long = "a".repeat(200);
        let k = stamp_key(Source::Secret, &long);
        let local = k.split('/').nth(1).unwrap();
        assert!(local.len() <= 63, "{k}");
        assert_ne!(k, stamp_key(Source::Secret, &format!("{long}b")));
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn versions(pairs: &[(&str, &str)]) -> BTreeMap<String, (String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (format!("Secret {k}"), (*v).to_owned())))
            .collect()
    }

    #[test]
    fn first_sight_records_without_rolling() {
        let p = plan_stamps(&map(&[]), &map(&[]), &versions(&[("s.a", "v1")]));
        assert_eq!(p.metadata, map(&[("s.a", "v1")]));
        assert!(p.template.is_empty());
    }

    #[test]
    fn a_changed_version_rolls_once() {
        let p = plan_stamps(
            &map(&[("s.a", "v1")]),
            &map(&[("s.a", "v1")]),
            &versions(&[("s.a", "v2")]),
        );
        assert_eq!(p.template, map(&[("s.a", "v2")]));
        assert_eq!(p.metadata, map(&[("s.a", "v2")]));
        // After the patch nothing is left to do.
        let after = plan_stamps(
            &map(&[("s.a", "v2")]),
            &map(&[("s.a", "v2")]),
            &versions(&[("s.a", "v2")]),
        );
        assert!(after.is_empty());
    }

    #[test]
    fn several_changes_are_one_patch() {
        let rec = map(&[("s.a", "1"), ("s.b", "1"), ("s.c", "1")]);
        let p = plan_stamps(
            &rec,
            &rec,
            &versions(&[("s.a", "2"), ("s.b", "2"), ("s.c", "1")]),
        );
        assert_eq!(p.template.len(), 2);
        assert_eq!(p.changed.len(), 2);
    }

    #[test]
    fn index_tracks_changes() {
        let idx = ConsumerIndex::default();
        let w = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "web".into(),
        };
        let uses: BTreeSet<Consumed> = [(Source::Secret, "a".to_owned())].into();
        assert!(idx.set(&w, uses.clone()));
        assert!(!idx.set(&w, uses));
        assert_eq!(idx.consumers("ns", Source::Secret, "a"), vec![w.clone()]);
        assert!(idx.consumers("other", Source::Secret, "a").is_empty());
        idx.set(&w, [(Source::Secret, "b".to_owned())].into());
        assert!(idx.consumers("ns", Source::Secret, "a").is_empty());
        idx.remove(&w);
        assert!(idx.consumers("ns", Source::Secret, "b").is_empty());
    }
}

/// The I/O half: watched workloads, the reload queue's reconcile, and the
/// rollout budget.
pub mod runtime {
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

    use super::{ConsumerIndex, Source, WorkloadKey, WorkloadKind, plan_stamps, stamp_key};
    use crate::controllers::error::SyncError;
    use crate::controllers::queue::Queue;
    use crate::controllers::registry::{Kind, WorkQueue};
    use crate::controllers::stores::Scoped;
    use crate::controllers::target::{MANAGED_LABEL, VERSION_ANNOTATION};
    use crate::controllers::{Action, Context};
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
    }

    /// A workload's annotations and pod template, whatever its kind.
    struct Observed {
        annotations: BTreeMap<String, String>,
        template: PodTemplateSpec,
        reference: k8s_openapi::api::core::v1::ObjectReference,
    }

    fn observe(reloader: &Reloader, key: &WorkloadKey) -> Option<Observed> {
        let ns = Some(key.namespace.as_str());
        macro_rules! from {
            ($store:expr) => {{
                let o = $store.get(ns, &key.name)?;
                Observed {
                    annotations: o.annotations().clone(),
                    template: o.spec.template.clone(),
                    reference: o.object_ref(&()),
                }
            }};
        }
        Some(match key.kind {
            WorkloadKind::Deployment => from!(reloader.workloads.deployments),
            WorkloadKind::StatefulSet => from!(reloader.workloads.stateful_sets),
            WorkloadKind::DaemonSet => from!(reloader.workloads.daemon_sets),
        })
    }

    /// The current version of a managed object, if the operator manages it.
    fn managed_version(ctx: &Context, ns: &str, source: Source, name: &str) -> Option<String> {
        let (labels, annotations) = match source {
            Source::Secret => {
                let s = ctx.secrets.get(Some(ns), name)?;
                (s.labels().clone(), s.annotations().clone())
            }
            Source::ConfigMap => {
                let c = ctx.config_maps.get(Some(ns), name)?;
                (c.labels().clone(), c.annotations().clone())
            }
        };
        if labels.get(MANAGED_LABEL).map(String::as_str) != Some("true") {
            return None;
        }
        annotations.get(VERSION_ANNOTATION).cloned()
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

        fn wait_ready(&self) -> BoxFuture<'_, ()> {
            let w = &self.reloader.workloads;
            Box::pin(async move {
                w.deployments.wait_ready().await;
                w.stateful_sets.wait_ready().await;
                w.daemon_sets.wait_ready().await;
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
        }

        fn queue(&self) -> &dyn WorkQueue {
            self.queue.as_ref()
        }

        fn start(self: Arc<Self>, ctx: Arc<Context>) -> JoinHandle<()> {
            tokio::spawn(crate::controllers::run_workers(
                ctx,
                self.queue.clone(),
                CONTROLLER,
                self.reloader.clone(),
            ))
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
            self.annotations()
                .get(super::AUTO_RELOAD_ANNOTATION)
                .map(String::as_str)
                == Some("true")
        }
    }

    impl crate::controllers::Reconciler<WorkloadKey> for Reloader {
        fn reconcile<'a>(
            &'a self,
            ctx: &'a Context,
            key: &'a WorkloadKey,
            shard: u32,
            cancel: &'a CancellationToken,
        ) -> futures::future::BoxFuture<'a, Result<Action, SyncError>> {
            Box::pin(reconcile(ctx, self, key, shard, cancel))
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
        if o.annotations
            .get(super::AUTO_RELOAD_ANNOTATION)
            .map(String::as_str)
            != Some("true")
        {
            return Ok(Action::Done);
        }
        let uses = reloader.index.uses(key);
        let mut versions = BTreeMap::new();
        for (source, name) in &uses {
            if let Some(v) = managed_version(ctx, &key.namespace, *source, name) {
                let kind = match source {
                    Source::Secret => "Secret",
                    Source::ConfigMap => "ConfigMap",
                };
                versions.insert(stamp_key(*source, name), (format!("{kind} {name}"), v));
            }
        }
        let template = o
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default();
        let patch = plan_stamps(&o.annotations, &template, &versions);
        if patch.is_empty() {
            return Ok(Action::Done);
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
            body["spec"] = json!({"template": {"metadata": {"annotations": patch.template}}});
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
            WorkloadKind::DaemonSet => {
                Api::<DaemonSet>::namespaced(ctx.client.clone(), &key.namespace)
                    .patch(&key.name, &pp, &Patch::Merge(&body))
                    .await
                    .map(|_| ())
            }
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
        Ok(Action::Done)
    }
}
