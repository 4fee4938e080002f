//! Writing managed objects. Every write is made from the resourceVersion it
//! was planned from, so a replica that lost its shard cannot overwrite a newer
//! owner's write:
//!
//! 1. entries the apply cannot remove (data keys and previously copied
//!    labels/annotations that another field manager may own) are removed by
//!    a merge patch carrying the resourceVersion;
//! 2. the desired object is server-side applied (field manager
//!    `kms-operator`, forced), with the resourceVersion it was observed at;
//!    an object not observed (absent from the caches) is created instead,
//!    create-only: when it exists already the write fails with
//!    [`SyncError::Exists`] and the caller reads it and decides again, so
//!    the usual first sync costs no read and never overwrites an object it
//!    did not check.
//!
//! Ownership of the shard is checked right before each write.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::ObjectMeta;
use serde_json::{Map, Value, json};

use super::context::Context;
use super::error::SyncError;
use super::stores::{NAMESPACE_SHARD_LABEL, SHARD_LABEL, shard_label_value};
use super::target::{
    Desired, GO_VERSIONS_ANNOTATION, MANAGED_ANNOTATIONS_ANNOTATION, MANAGED_BY_LABEL,
    MANAGED_LABEL, MANAGED_LABELS_ANNOTATION, OWNER_ANNOTATION, Observed, Removals, TargetKind,
    VERSION_ANNOTATION,
};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "kms-operator";

/// Fails with [`SyncError::NotOwner`] unless this replica still owns `shard`
/// and the work was not cancelled.
pub fn ensure_owner(
    ctx: &Context,
    shard: u32,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<(), SyncError> {
    if cancel.is_cancelled() || !ctx.gate.owns(shard) {
        return Err(SyncError::NotOwner);
    }
    Ok(())
}

fn describe(kind: TargetKind, ns: &str, name: &str) -> String {
    format!("{} {ns}/{name}", kind.as_str())
}

/// Remove `removals` from an object with a merge patch preconditioned on
/// `resource_version`; returns the new resourceVersion.
async fn remove_entries(
    ctx: &Context,
    kind: TargetKind,
    ns: &str,
    name: &str,
    resource_version: &str,
    removals: &Removals,
) -> Result<String, SyncError> {
    let nulls = |keys: &[String]| -> Value {
        Value::Object(
            keys.iter()
                .map(|k| (k.clone(), Value::Null))
                .collect::<Map<_, _>>(),
        )
    };
    let mut patch = json!({"metadata": {"resourceVersion": resource_version}});
    if !removals.labels.is_empty() {
        patch["metadata"]["labels"] = nulls(&removals.labels);
    }
    if !removals.annotations.is_empty() {
        patch["metadata"]["annotations"] = nulls(&removals.annotations);
    }
    if !removals.data.is_empty() {
        patch["data"] = nulls(&removals.data);
    }
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let context = format!("cleaning up {}", describe(kind, ns, name));
    let meta = match kind {
        TargetKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .patch(name, &pp, &Patch::Merge(&patch))
            .await
            .map(|o| o.metadata),
        TargetKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .patch(name, &pp, &Patch::Merge(&patch))
            .await
            .map(|o| o.metadata),
    }
    .map_err(|e| SyncError::kube(context, e))?;
    Ok(meta.resource_version.unwrap_or_default())
}

/// Bring one object to its desired state (create, or update from the
/// resourceVersion it was observed at). Returns the resulting object.
pub async fn write(
    ctx: &Context,
    desired: &Desired,
    observed: Option<&Observed>,
    removals: &Removals,
    shard: u32,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<Observed, SyncError> {
    let (ns, name) = (desired.namespace.as_str(), desired.name.as_str());
    let mut resource_version = observed.map(|o| o.resource_version.clone());
    if let (Some(rv), false) = (resource_version.as_deref(), removals.is_empty()) {
        ensure_owner(ctx, shard, cancel)?;
        resource_version = Some(remove_entries(ctx, desired.kind, ns, name, rv, removals).await?);
    }
    let metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        labels: Some(with_shard_labels(ctx, &desired.meta.labels, ns, shard)),
        annotations: Some(desired.meta.annotations.clone()),
        owner_references: desired.owner_reference.clone().map(|r| vec![r]),
        resource_version,
        ..ObjectMeta::default()
    };
    let what = describe(desired.kind, ns, name);
    ensure_owner(ctx, shard, cancel)?;
    match desired.kind {
        TargetKind::Secret => {
            let secret = Secret {
                metadata,
                data: Some(
                    desired
                        .data
                        .iter()
                        .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                        .collect(),
                ),
                // The type is immutable: keep the existing one.
                type_: observed
                    .and_then(|o| o.secret_type.clone())
                    .or_else(|| desired.secret_type.clone()),
                ..Secret::default()
            };
            let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
            let written =
                Observed::from_secret(&put(&api, &secret, observed.is_some(), what).await?);
            ctx.own_writes
                .wrote(desired.kind, ns, name, &written.resource_version);
            Ok(written)
        }
        TargetKind::ConfigMap => {
            let data: BTreeMap<String, String> = desired
                .data
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            let cm = ConfigMap {
                metadata,
                data: Some(data),
                ..ConfigMap::default()
            };
            let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns);
            let written =
                Observed::from_config_map(&put(&api, &cm, observed.is_some(), what).await?);
            ctx.own_writes
                .wrote(desired.kind, ns, name, &written.resource_version);
            Ok(written)
        }
    }
}

/// `labels` and the shard label of the owner's shard (`shard`): the
/// owner's replica watches the objects it manages by it. An object in a
/// namespace of another shard also names that one, for the replica that
/// rolls the workloads there.
fn with_shard_labels(
    ctx: &Context,
    labels: &BTreeMap<String, String>,
    namespace: &str,
    shard: u32,
) -> BTreeMap<String, String> {
    let count = ctx.gate.shard_count();
    let mut labels = labels.clone();
    labels.insert(SHARD_LABEL.to_owned(), shard_label_value(shard, count));
    let own = ctx.gate.shard_of(namespace);
    if own != shard {
        labels.insert(
            NAMESPACE_SHARD_LABEL.to_owned(),
            shard_label_value(own, count),
        );
    }
    labels
}

/// Write `object` (`what`, for messages): server-side apply when it was
/// observed, else create it, only if it does not exist
/// ([`SyncError::Exists`] when it does).
async fn put<K>(api: &Api<K>, object: &K, observed: bool, what: String) -> Result<K, SyncError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    if observed {
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        return api
            .patch(&name, &pp, &Patch::Apply(object))
            .await
            .map_err(|e| SyncError::kube(format!("writing {what}"), e));
    }
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match api.create(&pp, object).await {
        Ok(o) => Ok(o),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(SyncError::Exists(what)),
        Err(e) => Err(SyncError::kube(format!("creating {what}"), e)),
    }
}

/// An object a resource no longer lists, as it was seen: what deleting or
/// releasing it is preconditioned on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlisted {
    /// Secret or ConfigMap.
    pub kind: TargetKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The resourceVersion it was seen at.
    pub resource_version: String,
}

/// Delete an object the resource owns and no longer lists (precondition:
/// the resourceVersion it was seen at).
pub async fn delete(ctx: &Context, o: &Unlisted) -> Result<(), SyncError> {
    let (kind, ns, name, resource_version) = (
        o.kind,
        o.namespace.as_str(),
        o.name.as_str(),
        o.resource_version.as_str(),
    );
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(resource_version.to_owned()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let context = format!("deleting {}", describe(kind, ns, name));
    let result = match kind {
        TargetKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .delete(name, &dp)
            .await
            .map(|_| ()),
        TargetKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .delete(name, &dp)
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(SyncError::kube(context, e)),
    }
}

/// Let go of an object the resource no longer lists but does not own:
/// remove every marker of the operator — the owner and version annotations,
/// the key trackers, the managed and shard labels and
/// `app.kubernetes.io/managed-by` —
/// so that it is no longer watched or claimed, and another resource may take
/// it only with the documented opt-in (its data stays).
pub async fn release(ctx: &Context, o: &Unlisted) -> Result<(), SyncError> {
    let (kind, ns, name, resource_version) = (
        o.kind,
        o.namespace.as_str(),
        o.name.as_str(),
        o.resource_version.as_str(),
    );
    let removals = Removals {
        data: Vec::new(),
        labels: vec![
            MANAGED_LABEL.to_owned(),
            MANAGED_BY_LABEL.to_owned(),
            SHARD_LABEL.to_owned(),
            NAMESPACE_SHARD_LABEL.to_owned(),
        ],
        annotations: [
            OWNER_ANNOTATION,
            VERSION_ANNOTATION,
            GO_VERSIONS_ANNOTATION,
            MANAGED_LABELS_ANNOTATION,
            MANAGED_ANNOTATIONS_ANNOTATION,
        ]
        .map(str::to_owned)
        .to_vec(),
    };
    match remove_entries(ctx, kind, ns, name, resource_version, &removals).await {
        Err(SyncError::Kube {
            code: Some(404), ..
        }) => Ok(()),
        other => other.map(|_| ()),
    }
}
