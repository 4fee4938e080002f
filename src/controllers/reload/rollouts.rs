//! Argo Rollouts (`argoproj.io/v1alpha1` `Rollout`) as auto-reload
//! workloads.
//!
//! - **Only when served.** The operator watches the one CRD
//!   `rollouts.argoproj.io` (its metadata, by name) when `--argo-rollouts`
//!   is on, and watches Rollouts while that CRD exists: installed while the
//!   operator runs, Rollouts are picked up without a restart; removed, the
//!   watch stops and its Rollouts are forgotten.
//! - **What a Rollout uses** is read from its pod template, or, with
//!   `spec.workloadRef` (a Deployment whose template the Rollout runs), from
//!   that Deployment's template. A change of the referenced Deployment
//!   re-reads the Rollouts that reference it.
//! - **Restart** sets `spec.restartAt` to the current time, as `kubectl argo
//!   rollouts restart` does: the Rollout controller replaces the pods
//!   created before it, through the Rollout's own strategy. The versions are
//!   recorded in the Rollout's metadata annotations, in the same patch. A
//!   Rollout's pod template is never written (that would start a new
//!   revision with its canary steps).
//!
//! Only the fields auto-reload reads are decoded; the rest of a Rollout is
//! ignored.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock, RwLock};

use k8s_openapi::api::apps::v1::Deployment;

use k8s_openapi::api::core::v1::{ObjectReference, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::controllers::stores::Scoped;

/// The CRD whose presence turns the Rollout watch on.
pub const CRD_NAME: &str = "rollouts.argoproj.io";

/// The part of a Rollout's spec auto-reload reads.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "argoproj.io",
    version = "v1alpha1",
    kind = "Rollout",
    plural = "rollouts",
    namespaced,
    status = "RolloutStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// The pod template (absent with `workloadRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// The Deployment whose template the Rollout runs (`apiVersion`,
    /// `kind`, `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<ObjectReference>,
    /// The restart asked for (pods created before it are replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_at: Option<Time>,
}

/// The part of a Rollout's status gradual reload reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// `Healthy`, `Progressing`, `Paused` or `Degraded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why, in the controller's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The last restart the controller carried out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<Time>,
}

impl Rollout {
    /// The Deployment it takes its template from, if any.
    pub fn referenced_deployment(&self) -> Option<&str> {
        let r = self.spec.workload_ref.as_ref()?;
        let api_version = r.api_version.as_deref().unwrap_or_default();
        (r.kind.as_deref() == Some("Deployment") && api_version.starts_with("apps/"))
            .then_some(r.name.as_deref()?)
            .filter(|name| !name.is_empty())
    }
}

/// Which Rollouts reference which Deployments, both ways (a Rollout's
/// change replaces its one entry without a scan).
#[derive(Default)]
struct References {
    /// (namespace, Deployment) → the Rollouts that reference it.
    by_deployment: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, Rollout) → the Deployment it references.
    by_rollout: HashMap<(String, String), String>,
}

/// The Rollouts while their CRD is served, and which Deployments they
/// reference.
#[derive(Default)]
pub struct ArgoRollouts {
    store: RwLock<Option<Scoped<Rollout>>>,
    /// The Deployments' store (a `workloadRef`'s template is read there).
    deployments: OnceLock<Scoped<Deployment>>,
    /// Which Rollouts reference which Deployments.
    refs: Mutex<References>,
    /// The running watch's tasks.
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl ArgoRollouts {
    /// The Rollout watch's store, while it runs.
    pub fn store(&self) -> Option<Scoped<Rollout>> {
        self.store.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the watch runs.
    pub fn running(&self) -> bool {
        self.store().is_some()
    }

    /// Set the Deployments' store, once its watch exists.
    pub fn set_deployments(&self, deployments: Scoped<Deployment>) {
        let _ = self.deployments.set(deployments);
    }

    /// The Deployments' store, once set.
    pub fn deployments(&self) -> Option<&Scoped<Deployment>> {
        self.deployments.get()
    }

    /// A Rollout, if watched.
    pub fn get(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Rollout>> {
        self.store()?.get(Some(namespace), name)
    }

    /// Every watched Rollout.
    pub fn all(&self) -> Vec<std::sync::Arc<Rollout>> {
        self.store().map(|s| s.all()).unwrap_or_default()
    }

    /// The watch started: its store and its tasks.
    pub fn started(&self, store: Scoped<Rollout>, tasks: Vec<tokio::task::AbortHandle>) {
        *self.store.write().unwrap_or_else(|e| e.into_inner()) = Some(store);
        *self.tasks.lock().unwrap_or_else(|e| e.into_inner()) = tasks;
    }

    /// Stop the watch; returns the Rollouts it held (to forget them).
    pub fn stop(&self) -> Vec<std::sync::Arc<Rollout>> {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
        let held = self.all();
        *self.store.write().unwrap_or_else(|e| e.into_inner()) = None;
        *self.refs.lock().unwrap_or_else(|e| e.into_inner()) = References::default();
        held
    }

    /// Record which Deployment a Rollout references (`None`: none, or it
    /// is gone).
    pub fn set_reference(&self, namespace: &str, rollout: &str, deployment: Option<&str>) {
        let mut refs = self.refs.lock().unwrap_or_else(|e| e.into_inner());
        let id = (namespace.to_owned(), rollout.to_owned());
        if let Some(old) = refs.by_rollout.remove(&id) {
            let key = (namespace.to_owned(), old);
            if let Some(names) = refs.by_deployment.get_mut(&key) {
                names.remove(rollout);
                if names.is_empty() {
                    refs.by_deployment.remove(&key);
                }
            }
        }
        if let Some(d) = deployment {
            refs.by_deployment
                .entry((namespace.to_owned(), d.to_owned()))
                .or_default()
                .insert(rollout.to_owned());
            refs.by_rollout.insert(id, d.to_owned());
        }
    }

    /// The Rollouts that reference a Deployment.
    pub fn referencing(&self, namespace: &str, deployment: &str) -> Vec<String> {
        let refs = self.refs.lock().unwrap_or_else(|e| e.into_inner());
        refs.by_deployment
            .get(&(namespace.to_owned(), deployment.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_decodes_its_template_or_its_reference_and_ignores_the_rest() {
        let inline: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"replicas": 3, "strategy": {"canary": {"steps": [{"setWeight": 20}]}},
                     "template": {"spec": {"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "s"}}]}]}}}
        }))
        .unwrap();
        assert!(inline.spec.template.is_some());
        assert_eq!(inline.referenced_deployment(), None);
        let by_ref: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}
        }))
        .unwrap();
        assert_eq!(by_ref.referenced_deployment(), Some("web"));
        let other: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"workloadRef": {"apiVersion": "v1", "kind": "ReplicaSet", "name": "web"}}
        }))
        .unwrap();
        assert_eq!(other.referenced_deployment(), None);
    }

    #[test]
    fn references_follow_their_rollouts() {
        let r = ArgoRollouts::default();
        r.set_reference("ns", "a", Some("web"));
        r.set_reference("ns", "b", Some("web"));
        r.set_reference("other", "a", Some("web"));
        assert_eq!(r.referencing("ns", "web"), vec!["a", "b"]);
        r.set_reference("ns", "a", Some("api"));
        assert_eq!(r.referencing("ns", "web"), vec!["b"]);
        assert_eq!(r.referencing("ns", "api"), vec!["a"]);
        r.set_reference("ns", "b", None);
        assert!(r.referencing("ns", "web").is_empty());
        assert_eq!(r.referencing("other", "web"), vec!["a"]);
    }
}
