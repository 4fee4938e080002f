//! Auto-reload: roll Deployments, StatefulSets, DaemonSets and Argo Rollouts
//! ([`rollouts`]) that opted in
//! (`secrets.hanzo.ai/auto-reload: "true"`, or the Go operators' spellings
//! `secrets.infisical.com/auto-reload` and `kms.hanzo.ai/auto-reload`, which
//! are honoured the same way) when a managed Secret or ConfigMap they use
//! really changed.
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
//! - **Go operators' stamps.** The Go operators stamp the same key (with the
//!   seed documents' group) with their own version format `W/"secrets-…"`. A
//!   stamp in that format counts as current when it stands for the object's
//!   current data (recomputed from the data, or bound by the Secret's
//!   `secrets.hanzo.ai/go-versions` at the hand-over), so a workload the Go
//!   operator stamped does not roll when kms-operator takes over; it rolls at
//!   the first real change.
//! - **Debounce and budget.** A change queues the consumers after a short
//!   delay, so several objects changing together cause one rollout; rollouts
//!   started per second are limited cluster-wide (shared by live replicas).
//!
//! Writes are merge patches of the annotations only, never full updates.

pub mod gradual;
pub mod rollouts;
pub mod runtime;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, PodSpec};

/// Opt-in annotation on a workload.
pub const AUTO_RELOAD_ANNOTATION: &str = "secrets.hanzo.ai/auto-reload";
/// Every opt-in annotation honoured: ours, upstream Infisical's and the Hanzo
/// Go operator's (at its HEAD).
pub const AUTO_RELOAD_ANNOTATIONS: [&str; 3] = [
    AUTO_RELOAD_ANNOTATION,
    "secrets.infisical.com/auto-reload",
    "kms.hanzo.ai/auto-reload",
];

/// Whether a workload opted in: one of [`AUTO_RELOAD_ANNOTATIONS`] is
/// exactly `"true"`.
pub fn opted_in(annotations: &BTreeMap<String, String>) -> bool {
    AUTO_RELOAD_ANNOTATIONS
        .iter()
        .any(|k| annotations.get(*k).map(String::as_str) == Some("true"))
}
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
    /// argoproj.io/v1alpha1 Rollout (restarted through `spec.restartAt`).
    Rollout,
}

impl WorkloadKind {
    /// The kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::Rollout => "Rollout",
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

/// A managed object's current version, as auto-reload compares it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Current {
    /// The object, for the Event (`Secret app`).
    pub object: String,
    /// Its version (`secrets.hanzo.ai/version`).
    pub version: String,
    /// The Go operators' versions that stand for the same data
    /// ([`crate::controllers::target::go_equivalents`]).
    pub equivalent: BTreeSet<String>,
}

/// Decide the stamps of a workload: `versions` maps stamp keys of the managed
/// objects it uses to their current version. A key the workload has not
/// recorded yet is recorded without rolling; a recorded key with another
/// version rolls, unless it is a Go operator's version of the same data
/// (then it is only recorded).
pub fn plan_stamps(
    recorded: &BTreeMap<String, String>,
    template: &BTreeMap<String, String>,
    versions: &BTreeMap<String, Current>,
) -> StampPatch {
    let mut patch = StampPatch::default();
    for (key, current) in versions {
        let version = &current.version;
        match recorded.get(key) {
            None => {
                patch.metadata.insert(key.clone(), version.clone());
            }
            Some(v) if v != version && current.equivalent.contains(v) => {
                patch.metadata.insert(key.clone(), version.clone());
            }
            Some(v) if v != version => {
                patch.metadata.insert(key.clone(), version.clone());
                patch.template.insert(key.clone(), version.clone());
                patch.changed.push(current.object.clone());
            }
            Some(_) => {
                // Recorded and current; a template that lags (an earlier
                // rollout was interrupted) is brought in line. A Go
                // operator's stamp on the template is its last rollout, not
                // an interrupted one of ours: it stays until a real change.
                if template.get(key).is_some_and(|t| {
                    t != version
                        && !current.equivalent.contains(t)
                        && !crate::controllers::target::is_go_version(t)
                }) {
                    patch.template.insert(key.clone(), version.clone());
                }
            }
        }
    }
    patch
}

/// What a resource reports of auto-reload: how many opted-in workloads use
/// its objects, and the messages of its objects' held gradual reloads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    /// Opted-in workloads that use the resource's objects.
    pub workloads: usize,
    /// The messages of the held gradual reloads.
    pub held: Vec<String>,
}

impl From<usize> for Reloads {
    fn from(workloads: usize) -> Self {
        Self {
            workloads,
            held: Vec::new(),
        }
    }
}

/// Which workloads use which objects (only opted-in workloads are
/// indexed), and the gradual reloads held, by object.
#[derive(Default)]
pub struct ConsumerIndex {
    inner: Mutex<IndexInner>,
    /// Held gradual reloads: their messages, by object.
    holds: Mutex<HashMap<(String, Source, String), String>>,
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

    /// Record the held gradual reload of an object, as its message
    /// (`None`: not held). Returns whether that changed.
    pub fn set_hold(
        &self,
        namespace: &str,
        source: Source,
        name: &str,
        hold: Option<String>,
    ) -> bool {
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        let id = (namespace.to_owned(), source, name.to_owned());
        match hold {
            Some(h) => holds.insert(id, h.clone()).as_ref() != Some(&h),
            None => holds.remove(&id).is_some(),
        }
    }

    /// The held gradual reload of an object, as its message.
    pub fn hold(&self, namespace: &str, source: Source, name: &str) -> Option<String> {
        let holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds
            .get(&(namespace.to_owned(), source, name.to_owned()))
            .cloned()
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

    fn versions(pairs: &[(&str, &str)]) -> BTreeMap<String, Current> {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Current {
                        object: format!("Secret {k}"),
                        version: (*v).to_owned(),
                        equivalent: BTreeSet::new(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_go_operators_opt_in_annotations_are_honoured() {
        for key in AUTO_RELOAD_ANNOTATIONS {
            assert!(opted_in(&map(&[(key, "true")])), "{key}");
            assert!(!opted_in(&map(&[(key, "True")])), "{key}");
            assert!(!opted_in(&map(&[(key, "false")])), "{key}");
        }
        assert!(!opted_in(&map(&[(
            "secrets.example.com/auto-reload",
            "true"
        )])));
    }

    #[test]
    fn a_go_stamp_of_the_current_data_is_recorded_without_rolling() {
        let go = "W/\"secrets-8-CA1AC0BD\"";
        let mut current = versions(&[("s.a", "v1")]);
        current
            .get_mut("s.a")
            .unwrap()
            .equivalent
            .insert(go.to_owned());
        // Stamped by the Go operator (metadata and template) for this data.
        let stamped = map(&[("s.a", go)]);
        let p = plan_stamps(&stamped, &stamped, &current);
        assert_eq!(p.metadata, map(&[("s.a", "v1")]));
        assert!(p.template.is_empty() && p.changed.is_empty(), "{p:?}");
        // Then: recorded; the Go stamp on the template does not count as a
        // lagging rollout.
        let after = plan_stamps(&map(&[("s.a", "v1")]), &stamped, &current);
        assert!(after.is_empty(), "{after:?}");
        // A Go stamp of other data (changed meanwhile) rolls.
        let stale = map(&[("s.a", "W/\"secrets-8-00000000\"")]);
        let p = plan_stamps(&stale, &stale, &current);
        assert_eq!(p.template, map(&[("s.a", "v1")]));
        // The first real change rolls and replaces the Go stamp.
        let p = plan_stamps(
            &map(&[("s.a", "v1")]),
            &stamped,
            &versions(&[("s.a", "v2")]),
        );
        assert_eq!(p.template, map(&[("s.a", "v2")]));
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
