//! Managed objects (Secrets and ConfigMaps) as the planners see them: who
//! may write one (ownership, adoption, conflicts), what its metadata must be,
//! its version (a hash of its data), and the difference between what is and
//! what should be. Pure: no I/O.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::error::SyncError;
use crate::api::common::{CreationPolicy, SecretTemplate};
use crate::kms::SecretMap;

/// Annotation: hash of the object's data.
pub const VERSION_ANNOTATION: &str = "secrets.hanzo.ai/version";
/// Annotation: `<kind>/<namespace>/<name>` of the resource that writes the
/// object (defined with the caches, which keep it apart).
pub use super::stores::OWNER_ANNOTATION;
/// Label on every managed object (what the operator watches).
pub const MANAGED_LABEL: &str = "secrets.hanzo.ai/managed";
/// Annotation: keys of the labels copied from the resource.
pub const MANAGED_LABELS_ANNOTATION: &str = "secrets.hanzo.ai/managed-labels";
/// Annotation: keys of the annotations copied from the resource.
pub const MANAGED_ANNOTATIONS_ANNOTATION: &str = "secrets.hanzo.ai/managed-annotations";
/// Label on objects the operator created.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_VALUE: &str = "kms-operator";
/// On an existing object: the operator may take it over.
pub const ADOPT_ANNOTATION: &str = "secrets.hanzo.ai/adopt";
/// On a resource: the operator may take over existing targets.
pub const ADOPT_EXISTING_ANNOTATION: &str = "secrets.hanzo.ai/adopt-existing";
/// Version annotations of the Go operators: their objects may be taken over.
pub const LEGACY_VERSION_ANNOTATIONS: [&str; 3] = [
    "secrets.infisical.com/version",
    "secrets.hanzo.ai/version",
    "kms.hanzo.ai/version",
];
/// Gradual reload's strategy (`immediate`, `gradual`): on a workload, or on
/// a resource, which carries it to its objects.
pub const RELOAD_STRATEGY_ANNOTATION: &str = "secrets.hanzo.ai/auto-reload-strategy";
/// Gradual reload's wave size (on a resource, carried to its objects).
pub const RELOAD_WAVE_SIZE_ANNOTATION: &str = "secrets.hanzo.ai/auto-reload-wave-size";
/// Gradual reload's rollout timeout (on a workload, or on a resource,
/// carried to its objects).
pub const RELOAD_TIMEOUT_ANNOTATION: &str = "secrets.hanzo.ai/auto-reload-timeout";
/// The resource annotations carried to the objects it writes, though
/// their prefix is otherwise never copied.
pub const CARRIED_ANNOTATIONS: [&str; 3] = [
    RELOAD_STRATEGY_ANNOTATION,
    RELOAD_WAVE_SIZE_ANNOTATION,
    RELOAD_TIMEOUT_ANNOTATION,
];
/// Annotation prefixes never copied from a resource to its objects.
pub const SYSTEM_ANNOTATION_PREFIXES: [&str; 6] = [
    "kubectl.kubernetes.io/",
    "kubernetes.io/",
    "k8s.io/",
    "helm.sh/",
    "argocd.argoproj.io/",
    "secrets.hanzo.ai/",
];

/// Secret or ConfigMap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetKind {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

impl TargetKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Secret => "Secret",
            TargetKind::ConfigMap => "ConfigMap",
        }
    }
}

/// An object as it is in the cluster (data as bytes for both kinds).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Resource version it was read at.
    pub resource_version: String,
    /// Data.
    pub data: BTreeMap<String, Vec<u8>>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Owner references.
    pub owner_references: Vec<OwnerReference>,
    /// Secret type.
    pub secret_type: Option<String>,
}

impl Observed {
    /// From a Secret.
    pub fn from_secret(s: &Secret) -> Self {
        Self {
            resource_version: s.metadata.resource_version.clone().unwrap_or_default(),
            data: s
                .data
                .as_ref()
                .map(|d| d.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
                .unwrap_or_default(),
            labels: s.metadata.labels.clone().unwrap_or_default(),
            annotations: s.metadata.annotations.clone().unwrap_or_default(),
            owner_references: s.metadata.owner_references.clone().unwrap_or_default(),
            secret_type: s.type_.clone(),
        }
    }

    /// From a ConfigMap.
    pub fn from_config_map(c: &ConfigMap) -> Self {
        Self {
            resource_version: c.metadata.resource_version.clone().unwrap_or_default(),
            data: c
                .data
                .as_ref()
                .map(|d| {
                    d.iter()
                        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
                        .collect()
                })
                .unwrap_or_default(),
            labels: c.metadata.labels.clone().unwrap_or_default(),
            annotations: c.metadata.annotations.clone().unwrap_or_default(),
            owner_references: c.metadata.owner_references.clone().unwrap_or_default(),
            secret_type: None,
        }
    }

    /// Whether its data is what its version annotation says it is (nobody
    /// edited the data since the operator wrote it).
    pub fn data_intact(&self) -> bool {
        self.annotations.get(VERSION_ANNOTATION) == Some(&version_of(&self.data))
    }
}

/// The version of a target's data: SHA-256 over the sorted keys and values,
/// each length-prefixed, as 32 hex digits.
pub fn version_of(data: &BTreeMap<String, Vec<u8>>) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for (k, v) in data {
        ctx.update(&(k.len() as u64).to_be_bytes());
        ctx.update(k.as_bytes());
        ctx.update(&(v.len() as u64).to_be_bytes());
        ctx.update(v);
    }
    crate::kms::endpoint::hex(&ctx.finish().as_ref()[..16])
}

/// Annotation on a target adopted from a Go operator with its data
/// unchanged: our version, then the Go operator's versions that stand for
/// the same data, space-separated. Auto-reload reads it so that a workload
/// the Go operator stamped does not roll at the hand-over; it is bound to
/// our version, and dropped at the first change of the data.
pub const GO_VERSIONS_ANNOTATION: &str = "secrets.hanzo.ai/go-versions";

/// Whether a version is in the Go operators' format (`W/"secrets-…"`).
pub fn is_go_version(v: &str) -> bool {
    v.starts_with("W/\"secrets-")
}

/// The version the Go operators (upstream v0.11 and later) write for this
/// data: over the sorted keys, each key and each value followed by a NUL
/// byte, `W/"secrets-<byte length>-<CRC-32 (IEEE), 8 upper-case hex>"`
/// (the Go operators' current format). The older format (≤ v0.10) hashes the fetched list
/// with the KMS's ids and cannot be recomputed from the data: it is known
/// only through [`GO_VERSIONS_ANNOTATION`].
pub fn go_version_of(data: &BTreeMap<String, Vec<u8>>) -> String {
    let mut crc = !0u32;
    let mut len = 0usize;
    let mut feed = |bytes: &[u8]| {
        len += bytes.len();
        for b in bytes {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
    };
    for (k, v) in data {
        feed(k.as_bytes());
        feed(&[0]);
        feed(v);
        feed(&[0]);
    }
    format!("W/\"secrets-{len}-{:08X}\"", !crc)
}

/// The value of [`GO_VERSIONS_ANNOTATION`] a target written with `data` at
/// `version` keeps: what it already bound to this version; else, when it is
/// taken over from a Go operator (no owner of ours yet) and the data does
/// not change, the Go version annotations it carries; else none.
pub fn go_versions(
    observed: Option<&Observed>,
    data: &BTreeMap<String, Vec<u8>>,
    version: &str,
) -> Option<String> {
    let o = observed?;
    if let Some(bound) = o.annotations.get(GO_VERSIONS_ANNOTATION)
        && bound.split(' ').next() == Some(version)
    {
        return Some(bound.clone());
    }
    if o.annotations.contains_key(OWNER_ANNOTATION) || o.data != *data {
        return None;
    }
    let mut go: Vec<&str> = LEGACY_VERSION_ANNOTATIONS
        .iter()
        .filter_map(|k| o.annotations.get(*k))
        .map(String::as_str)
        .filter(|v| is_go_version(v) && !v.contains(' '))
        .collect();
    go.sort_unstable();
    go.dedup();
    (!go.is_empty()).then(|| format!("{version} {}", go.join(" ")))
}

/// The Go operators' versions that stand for a managed object's current
/// data: the v0.11 format computed from the data, and those bound to its
/// current version by [`GO_VERSIONS_ANNOTATION`].
pub fn go_equivalents(
    annotations: &BTreeMap<String, String>,
    data: &BTreeMap<String, Vec<u8>>,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::from([go_version_of(data)]);
    if let (Some(bound), Some(version)) = (
        annotations.get(GO_VERSIONS_ANNOTATION),
        annotations.get(VERSION_ANNOTATION),
    ) {
        let mut parts = bound.split(' ');
        if parts.next() == Some(version.as_str()) {
            out.extend(parts.filter(|p| is_go_version(p)).map(str::to_owned));
        }
    }
    out
}

/// Who may write an existing object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// It does not exist: create it.
    Missing,
    /// It is ours.
    Ours,
    /// It is not ours yet but may be taken over.
    Adoptable,
    /// It belongs to nobody we know and carries no adoption marker.
    Foreign,
    /// Another resource writes it.
    Conflict(String),
}

impl Claim {
    /// The error for a target that is not ours to write (foreign, or
    /// another resource's); `None` when it may be written. `what` names it
    /// (`Secret ns/name`), `resource` the kind asking (`KmsSecret`).
    pub fn refusal(&self, what: &str, resource: &str) -> Option<SyncError> {
        match self {
            Claim::Foreign => Some(SyncError::Target {
                reason: "TargetNotManaged",
                message: format!(
                    "{what} exists and was not created by kms-operator; nothing was written. Annotate it with \
                     secrets.hanzo.ai/adopt=true, or annotate this {resource} with \
                     secrets.hanzo.ai/adopt-existing=true, to let the operator take it over"
                ),
            }),
            Claim::Conflict(other) => Some(SyncError::Target {
                reason: "TargetConflict",
                message: format!("{what} is already managed by {other}; nothing was written"),
            }),
            Claim::Missing | Claim::Ours | Claim::Adoptable => None,
        }
    }
}

/// Decide who may write `observed`. `owner_id` is ours
/// (`KmsSecret/ns/name`) and `owner_uid` the resource's uid; `active_owner`
/// says whether another owner id is a live resource that still lists this
/// object.
///
/// An object without our owner annotation whose owner references name the
/// resource's uid is ours too: the Hanzo Go operator marks the objects it
/// writes with `creationPolicy: Owner` only by such a reference (of kind
/// `KMSSecret`), and after a hand-over in place the resource is the same
/// object, so its objects are taken over as they are (docs/migration.md).
pub fn claim(
    observed: Option<&Observed>,
    owner_id: &str,
    owner_uid: Option<&str>,
    adopt_existing: bool,
    active_owner: impl Fn(&str) -> bool,
) -> Claim {
    let Some(o) = observed else {
        return Claim::Missing;
    };
    match o.annotations.get(OWNER_ANNOTATION) {
        Some(owner) if owner == owner_id => return Claim::Ours,
        Some(owner) if active_owner(owner) => return Claim::Conflict(owner.clone()),
        // Its owner is gone or no longer lists it.
        Some(_) => return Claim::Adoptable,
        None => {}
    }
    if owned_by(o, owner_uid) {
        return Claim::Ours;
    }
    if adopt_existing
        || o.annotations.get(ADOPT_ANNOTATION).map(String::as_str) == Some("true")
        || LEGACY_VERSION_ANNOTATIONS
            .iter()
            .any(|a| o.annotations.contains_key(*a))
    {
        Claim::Adoptable
    } else {
        Claim::Foreign
    }
}

/// Whether one of `o`'s owner references is a reference, of any kind
/// spelling, to the resource with uid `uid` in our API group.
pub fn owned_by(o: &Observed, uid: Option<&str>) -> bool {
    let Some(uid) = uid.filter(|u| !u.is_empty()) else {
        return false;
    };
    o.owner_references
        .iter()
        .any(|r| r.uid == uid && r.api_version.split('/').next() == Some(crate::api::GROUP))
}

/// Labels and annotations a target must carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredMeta {
    /// Labels to set.
    pub labels: BTreeMap<String, String>,
    /// Annotations to set.
    pub annotations: BTreeMap<String, String>,
}

/// Whether an annotation key is never copied.
pub fn is_system_annotation(key: &str) -> bool {
    SYSTEM_ANNOTATION_PREFIXES
        .iter()
        .any(|p| key.starts_with(p))
}

/// The metadata of a target: the template's `metadata` if set, else the
/// resource's labels and non-system annotations; plus the resource's
/// gradual-reload settings and the operator's own markers. `created_by_us` adds `app.kubernetes.io/managed-by`.
pub fn desired_meta(
    resource_labels: &BTreeMap<String, String>,
    resource_annotations: &BTreeMap<String, String>,
    template_meta: Option<&crate::api::common::TemplateMetadata>,
    owner_id: &str,
    version: &str,
    created_by_us: bool,
) -> DesiredMeta {
    let (mut labels, mut annotations) = match template_meta {
        Some(m) => (
            m.labels.clone().unwrap_or_default(),
            m.annotations.clone().unwrap_or_default(),
        ),
        None => (
            resource_labels.clone(),
            resource_annotations
                .iter()
                .filter(|(k, _)| !is_system_annotation(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
    };
    // Our markers win over copied values of the same key; the resource's
    // own shard label is not copied (each object gets its owner's).
    labels.remove(MANAGED_LABEL);
    labels.remove(crate::controllers::stores::SHARD_LABEL);
    labels.remove(crate::controllers::stores::NAMESPACE_SHARD_LABEL);
    labels.remove(MANAGED_BY_LABEL);
    for k in [
        VERSION_ANNOTATION,
        OWNER_ANNOTATION,
        MANAGED_LABELS_ANNOTATION,
        MANAGED_ANNOTATIONS_ANNOTATION,
    ] {
        annotations.remove(k);
    }
    // The resource's gradual-reload settings reach the workloads through
    // its objects (whatever the template says).
    for k in CARRIED_ANNOTATIONS {
        if let Some(v) = resource_annotations.get(k) {
            annotations.insert(k.to_owned(), v.clone());
        }
    }
    let label_keys: Vec<&str> = labels.keys().map(String::as_str).collect();
    let annotation_keys: Vec<&str> = annotations.keys().map(String::as_str).collect();
    let (label_csv, annotation_csv) = (label_keys.join(","), annotation_keys.join(","));
    labels.insert(MANAGED_LABEL.to_owned(), "true".to_owned());
    if created_by_us {
        labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned());
    }
    annotations.insert(MANAGED_LABELS_ANNOTATION.to_owned(), label_csv);
    annotations.insert(MANAGED_ANNOTATIONS_ANNOTATION.to_owned(), annotation_csv);
    annotations.insert(OWNER_ANNOTATION.to_owned(), owner_id.to_owned());
    annotations.insert(VERSION_ANNOTATION.to_owned(), version.to_owned());
    DesiredMeta {
        labels,
        annotations,
    }
}

/// What a target should be.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// Kind.
    pub kind: TargetKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Data.
    pub data: BTreeMap<String, Vec<u8>>,
    /// Metadata.
    pub meta: DesiredMeta,
    /// Controller owner reference (creation policy `Owner`).
    pub owner_reference: Option<OwnerReference>,
    /// Secret type (used on create; an existing type is kept).
    pub secret_type: Option<String>,
}

/// Cleanup that must precede the apply: entries that the apply cannot
/// remove because another field manager may own them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removals {
    /// Data keys present but not desired.
    pub data: Vec<String>,
    /// Labels the operator copied before but no longer wants.
    pub labels: Vec<String>,
    /// Annotations the operator copied before but no longer wants.
    pub annotations: Vec<String>,
}

impl Removals {
    /// Whether nothing needs removing.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty() && self.labels.is_empty() && self.annotations.is_empty()
    }
}

fn csv(s: Option<&String>) -> Vec<String> {
    s.map(|s| {
        s.split(',')
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect()
    })
    .unwrap_or_default()
}

/// The difference between an existing object and its desired state: what to
/// remove first, and whether the apply changes anything.
pub fn diff(observed: &Observed, desired: &Desired, policy: CreationPolicy) -> (Removals, bool) {
    let removals = Removals {
        data: observed
            .data
            .keys()
            .filter(|k| !desired.data.contains_key(*k))
            .cloned()
            .collect(),
        labels: csv(observed.annotations.get(MANAGED_LABELS_ANNOTATION))
            .into_iter()
            .filter(|k| !desired.meta.labels.contains_key(k) && observed.labels.contains_key(k))
            .collect(),
        annotations: csv(observed.annotations.get(MANAGED_ANNOTATIONS_ANNOTATION))
            .into_iter()
            .filter(|k| {
                !desired.meta.annotations.contains_key(k) && observed.annotations.contains_key(k)
            })
            .collect(),
    };
    let data_differs = desired
        .data
        .iter()
        .any(|(k, v)| observed.data.get(k) != Some(v));
    let labels_differ = desired
        .meta
        .labels
        .iter()
        .any(|(k, v)| observed.labels.get(k) != Some(v));
    let annotations_differ = desired
        .meta
        .annotations
        .iter()
        .any(|(k, v)| observed.annotations.get(k) != Some(v));
    let owner_differs = match (&desired.owner_reference, policy) {
        (Some(want), CreationPolicy::Owner) => {
            !observed.owner_references.iter().any(|r| r.uid == want.uid)
        }
        _ => false,
    };
    let changed = data_differs
        || labels_differ
        || annotations_differ
        || owner_differs
        || !removals.is_empty();
    (removals, changed)
}

/// Whether `name` is a valid Secret or ConfigMap name (an RFC 1123 DNS
/// subdomain: lower-case letters, digits, `-` and `.`, starting and ending
/// with a letter or digit, at most 253 characters).
pub fn valid_object_name(name: &str) -> bool {
    name.len() <= 253
        && !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `name` is a valid namespace name (an RFC 1123 DNS label).
pub fn valid_namespace_name(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && valid_object_name(name)
}

/// Whether a data key is valid for a Secret or ConfigMap.
pub fn valid_data_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Renders a template `source` for the spec field `field` over a model of
/// secrets (each value with its folder, [`template_model`]): the bytes (text,
/// unless `binary` allows any bytes), or a message that names the field and
/// never a value. Every render of one resource draws on the same budget. The
/// KmsSecret and KmsPushSecret templates both render through it.
pub type Renderer = dyn Fn(
        &str,
        &str,
        &kms_template::SecretData,
        bool,
        &mut kms_template::Budget,
    ) -> Result<Vec<u8>, String>
    + Send
    + Sync;

/// The renderer of the template engine `engine`.
pub fn engine_renderer(engine: kms_template::Engine) -> Arc<Renderer> {
    Arc::new(
        move |field: &str,
              source: &str,
              data: &kms_template::SecretData,
              binary: bool,
              budget: &mut kms_template::Budget| {
            let result = if binary {
                engine.render_bytes_in(field, source, data, budget)
            } else {
                engine
                    .render_in(field, source, data, budget)
                    .map(String::into_bytes)
            };
            result.map_err(|e| e.to_string())
        },
    )
}

/// The model a template sees of fetched secrets: each value with the folder
/// it came from.
pub fn template_model(secrets: &SecretMap) -> kms_template::SecretData {
    use secrecy::ExposeSecret;
    secrets
        .iter()
        .map(|(k, item)| {
            (
                k.clone(),
                kms_template::SecretEntry::new(
                    item.value.expose_secret().as_bytes().to_vec(),
                    item.secret_path.clone(),
                ),
            )
        })
        .collect()
}

/// One object a resource writes (a KmsSecret's target, a
/// KmsDynamicSecret's credentials Secret).
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Secret or ConfigMap.
    pub kind: TargetKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Secret type on create.
    pub secret_type: Option<String>,
    /// Owner or Orphan.
    pub creation_policy: CreationPolicy,
    /// How the data is built.
    pub template: Option<SecretTemplate>,
    /// The spec field that names it, for messages.
    pub field: String,
}

impl Target {
    /// The Secret that `r` (the spec field `field` of a resource in
    /// `resource_ns`) names, its namespace resolved under the cross-namespace
    /// rule.
    pub fn secret(
        resource_ns: &str,
        field: String,
        r: &crate::api::common::ManagedKubeSecretConfig,
        allow_cross: bool,
    ) -> Result<Target, SyncError> {
        let namespace = super::refs::namespace_of(
            resource_ns,
            r.secret_namespace.as_deref(),
            &format!("{field}.secretNamespace"),
            allow_cross,
        )?;
        Ok(Target {
            kind: TargetKind::Secret,
            namespace,
            name: r.secret_name.clone(),
            secret_type: Some(r.secret_type.clone()).filter(|t| !t.is_empty()),
            creation_policy: r.creation_policy,
            template: r.template.clone(),
            field,
        })
    }

    /// `Kind/namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// The data of one target: every fetched secret (no template, or
/// `includeAllSecrets`), overridden by the rendered `template.data` entries.
pub fn build_data(
    target: &Target,
    secrets: &SecretMap,
    renderer: &Renderer,
    budget: &mut kms_template::Budget,
) -> Result<BTreeMap<String, Vec<u8>>, SyncError> {
    use secrecy::ExposeSecret;
    let mut out = BTreeMap::new();
    let include_all = target
        .template
        .as_ref()
        .is_none_or(|t| t.include_all_secrets);
    if include_all {
        for (k, item) in secrets {
            if !valid_data_key(k) {
                return Err(SyncError::Target {
                    reason: "InvalidSecretKey",
                    message: format!(
                        "the KMS secret {k:?} (folder {}) cannot be a key of {}: {} data keys hold only \
                         letters, digits, '-', '_' and '.'. Rename it in the KMS, or list the keys to write \
                         in template.data with includeAllSecrets: false; nothing was written",
                        item.secret_path,
                        target.id(),
                        target.kind.as_str()
                    ),
                });
            }
            out.insert(k.clone(), item.value.expose_secret().as_bytes().to_vec());
        }
    }
    if let Some(data) = target.template.as_ref().and_then(|t| t.data.as_ref()) {
        // Secrets hold bytes; ConfigMap data must be text.
        let binary = target.kind == TargetKind::Secret;
        let model = template_model(secrets);
        for (key, source) in data {
            let field = format!("{}.template.data.{key}", target.field);
            let rendered =
                renderer(&field, source, &model, binary, budget).map_err(SyncError::Template)?;
            out.insert(key.clone(), rendered);
        }
    }
    for key in out.keys() {
        if !valid_data_key(key) {
            return Err(SyncError::Spec(format!(
                "{}.template.data: the key {key:?} is not a valid {} data key (letters, digits, '-', '_' \
                 and '.' only); nothing was written",
                target.field,
                target.kind.as_str()
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_not_ours_is_refused_with_its_owner_named() {
        let what = "Secret ns/app";
        let foreign = Claim::Foreign.refusal(what, "KmsSecret").unwrap();
        assert_eq!(foreign.reason(), "TargetNotManaged");
        let text = foreign.to_string();
        assert!(
            text.contains("Secret ns/app exists and was not created by kms-operator"),
            "{text}"
        );
        assert!(
            text.contains("annotate this KmsSecret with secrets.hanzo.ai/adopt-existing=true"),
            "{text}"
        );
        let taken = Claim::Conflict("KmsSecret/ns/other".into())
            .refusal(what, "KmsDynamicSecret")
            .unwrap();
        assert_eq!(taken.reason(), "TargetConflict");
        assert!(
            taken
                .to_string()
                .contains("already managed by KmsSecret/ns/other")
        );
        for ok in [Claim::Missing, Claim::Ours, Claim::Adoptable] {
            assert!(ok.refusal(what, "KmsSecret").is_none(), "{ok:?}");
        }
    }

    fn obs(data: &[(&str, &str)], annotations: &[(&str, &str)]) -> Observed {
        Observed {
            resource_version: "1".into(),
            data: data
                .iter()
                .map(|(k, v)| ((*k).into(), v.as_bytes().to_vec()))
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            ..Default::default()
        }
    }

    fn bytes(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn the_go_version_is_the_go_operators() {
        // Computed with Go: fmt.Sprintf(`W/"secrets-%d-%08X"`, len(b),
        // crc32.ChecksumIEEE(b)) for b = "a\x001\x00b\x002\x00".
        assert_eq!(
            go_version_of(&bytes(&[("b", "2"), ("a", "1")])),
            "W/\"secrets-8-CA1AC0BD\""
        );
        assert_eq!(go_version_of(&bytes(&[])), "W/\"secrets-0-00000000\"");
        let v = go_version_of(&bytes(&[("a", "1")]));
        assert!(is_go_version(&v));
        assert!(!is_go_version(&version_of(&bytes(&[("a", "1")]))));
    }

    #[test]
    fn go_versions_are_bound_at_a_takeover_without_a_data_change() {
        let data = bytes(&[("A", "1")]);
        let go = "W/\"secrets-4-0A1B2C3D\"";
        let taken = Observed {
            data: data.clone(),
            annotations: [("secrets.hanzo.ai/version".to_owned(), go.to_owned())].into(),
            ..Observed::default()
        };
        let bound = go_versions(Some(&taken), &data, "v1").unwrap();
        assert_eq!(bound, format!("v1 {go}"));
        // A change of the data at the takeover binds nothing.
        assert_eq!(go_versions(Some(&taken), &bytes(&[("A", "2")]), "v2"), None);
        // Kept while the version stays, dropped when it changes.
        let ours = Observed {
            data: data.clone(),
            annotations: [
                (OWNER_ANNOTATION.to_owned(), "KmsSecret/ns/a".to_owned()),
                (VERSION_ANNOTATION.to_owned(), "v1".to_owned()),
                (GO_VERSIONS_ANNOTATION.to_owned(), bound.clone()),
                // A stale Go annotation left on an object that is ours.
                ("secrets.infisical.com/version".to_owned(), go.to_owned()),
            ]
            .into(),
            ..Observed::default()
        };
        assert_eq!(go_versions(Some(&ours), &data, "v1"), Some(bound));
        assert_eq!(go_versions(Some(&ours), &data, "v9"), None);
        let eq = go_equivalents(&ours.annotations, &data);
        assert!(
            eq.contains(go) && eq.contains(&go_version_of(&data)),
            "{eq:?}"
        );
        let mut changed = ours.annotations.clone();
        changed.insert(VERSION_ANNOTATION.to_owned(), "v2".to_owned());
        assert!(!go_equivalents(&changed, &data).contains(go));
    }

    #[test]
    fn version_is_order_free_and_unambiguous() {
        let a: BTreeMap<String, Vec<u8>> = [("a".into(), b"bc".to_vec())].into();
        let b: BTreeMap<String, Vec<u8>> = [("ab".into(), b"c".to_vec())].into();
        assert_ne!(version_of(&a), version_of(&b));
        assert_eq!(version_of(&a), version_of(&a.clone()));
        assert_eq!(version_of(&a).len(), 32);
    }

    #[test]
    fn claims() {
        let me = "KmsSecret/ns/a";
        assert_eq!(claim(None, me, None, false, |_| true), Claim::Missing);
        let ours = obs(&[], &[(OWNER_ANNOTATION, me)]);
        assert_eq!(claim(Some(&ours), me, None, false, |_| true), Claim::Ours);
        let other = obs(&[], &[(OWNER_ANNOTATION, "KmsSecret/ns/b")]);
        assert_eq!(
            claim(Some(&other), me, None, false, |_| true),
            Claim::Conflict("KmsSecret/ns/b".into())
        );
        assert_eq!(
            claim(Some(&other), me, None, false, |_| false),
            Claim::Adoptable
        );
        let foreign = obs(&[("k", "v")], &[]);
        assert_eq!(
            claim(Some(&foreign), me, None, false, |_| true),
            Claim::Foreign
        );
        assert_eq!(
            claim(Some(&foreign), me, None, true, |_| true),
            Claim::Adoptable
        );
        let marked = obs(&[], &[(ADOPT_ANNOTATION, "true")]);
        assert_eq!(
            claim(Some(&marked), me, None, false, |_| true),
            Claim::Adoptable
        );
        for legacy in LEGACY_VERSION_ANNOTATIONS {
            let l = obs(&[], &[(legacy, "W/\"x\"")]);
            assert_eq!(
                claim(Some(&l), me, None, false, |_| true),
                Claim::Adoptable,
                "{legacy}"
            );
        }
    }

    /// The Hanzo Go operator's Secret of a `creationPolicy: Owner` target:
    /// its owner reference (kind `KMSSecret`) names the resource's uid.
    #[test]
    fn an_object_owned_by_the_resource_uid_is_ours_whatever_the_kind_spelling() {
        let me = "KmsSecret/ns/a";
        let reference = |api_version: &str, kind: &str, uid: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "a".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let mut go = obs(&[("k", "v")], &[]);
        go.owner_references = vec![reference("secrets.hanzo.ai/v1alpha1", "KMSSecret", "u-1")];
        assert_eq!(
            claim(Some(&go), me, Some("u-1"), false, |_| true),
            Claim::Ours
        );
        // Another uid, another group or no uid known: not by this rule.
        assert_eq!(
            claim(Some(&go), me, Some("u-2"), false, |_| true),
            Claim::Foreign
        );
        assert_eq!(claim(Some(&go), me, None, false, |_| true), Claim::Foreign);
        go.owner_references = vec![reference("example.com/v1", "KMSSecret", "u-1")];
        assert_eq!(
            claim(Some(&go), me, Some("u-1"), false, |_| true),
            Claim::Foreign
        );
        // Our owner annotation naming another live resource still wins.
        let mut taken = obs(&[], &[(OWNER_ANNOTATION, "KmsSecret/ns/b")]);
        taken.owner_references = vec![reference("secrets.hanzo.ai/v1alpha1", "KMSSecret", "u-1")];
        assert_eq!(
            claim(Some(&taken), me, Some("u-1"), false, |_| true),
            Claim::Conflict("KmsSecret/ns/b".into())
        );
    }

    #[test]
    fn metadata_copies_labels_and_non_system_annotations() {
        let labels: BTreeMap<String, String> = [
            ("team".into(), "a".into()),
            (MANAGED_LABEL.into(), "no".into()),
        ]
        .into();
        let annotations: BTreeMap<String, String> = [
            ("note".into(), "x".into()),
            (
                "kubectl.kubernetes.io/last-applied-configuration".into(),
                "{}".into(),
            ),
            ("argocd.argoproj.io/tracking-id".into(), "t".into()),
            ("secrets.hanzo.ai/adopt-existing".into(), "true".into()),
        ]
        .into();
        let m = desired_meta(&labels, &annotations, None, "KmsSecret/ns/a", "v1", true);
        assert_eq!(m.labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            m.labels.get(MANAGED_LABEL).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            m.labels.get(MANAGED_BY_LABEL).map(String::as_str),
            Some(MANAGED_BY_VALUE)
        );
        assert_eq!(m.annotations.get("note").map(String::as_str), Some("x"));
        assert!(
            !m.annotations
                .keys()
                .any(|k| k.starts_with("kubectl.") || k.starts_with("argocd."))
        );
        assert_eq!(m.annotations[MANAGED_LABELS_ANNOTATION], "team");
        assert_eq!(m.annotations[MANAGED_ANNOTATIONS_ANNOTATION], "note");
        assert_eq!(m.annotations[VERSION_ANNOTATION], "v1");
        let adopted = desired_meta(&labels, &annotations, None, "KmsSecret/ns/a", "v1", false);
        assert!(!adopted.labels.contains_key(MANAGED_BY_LABEL));
    }

    #[test]
    fn template_metadata_replaces_copied_metadata() {
        let labels: BTreeMap<String, String> = [("team".into(), "a".into())].into();
        let tm = crate::api::common::TemplateMetadata {
            labels: Some([("app".into(), "web".into())].into()),
            annotations: None,
        };
        let m = desired_meta(&labels, &BTreeMap::new(), Some(&tm), "o", "v", false);
        assert!(!m.labels.contains_key("team"));
        assert_eq!(m.labels["app"], "web");
    }

    #[test]
    fn diff_finds_foreign_keys_and_dropped_labels() {
        let mut o = obs(
            &[("A", "1"), ("X", "foreign")],
            &[(MANAGED_LABELS_ANNOTATION, "old,team")],
        );
        o.labels.insert("old".into(), "1".into());
        o.labels.insert("team".into(), "a".into());
        let d = Desired {
            kind: TargetKind::Secret,
            namespace: "ns".into(),
            name: "n".into(),
            data: [("A".into(), b"1".to_vec())].into(),
            meta: DesiredMeta {
                labels: [("team".into(), "a".into())].into(),
                annotations: BTreeMap::new(),
            },
            owner_reference: None,
            secret_type: None,
        };
        let (r, changed) = diff(&o, &d, CreationPolicy::Orphan);
        assert_eq!(r.data, vec!["X".to_owned()]);
        assert_eq!(r.labels, vec!["old".to_owned()]);
        assert!(changed);
        o.data.remove("X");
        o.labels.remove("old");
        let (r, changed) = diff(&o, &d, CreationPolicy::Orphan);
        assert!(r.is_empty());
        assert!(!changed);
    }

    #[test]
    fn intact_means_the_annotation_matches_the_data() {
        let data: BTreeMap<String, Vec<u8>> = [("A".into(), b"1".to_vec())].into();
        let v = version_of(&data);
        let o = obs(&[("A", "1")], &[(VERSION_ANNOTATION, &v)]);
        assert!(o.data_intact());
        let edited = obs(&[("A", "2")], &[(VERSION_ANNOTATION, &v)]);
        assert!(!edited.data_intact());
    }

    #[test]
    fn object_names() {
        for ok in ["a", "db-creds", "a.b-c", "0x", &"a".repeat(253)] {
            assert!(valid_object_name(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "my_secret",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a b",
            &"a".repeat(254),
        ] {
            assert!(!valid_object_name(bad), "{bad}");
        }
        assert!(valid_namespace_name("team-a"));
        assert!(!valid_namespace_name("team.a"));
        assert!(!valid_namespace_name(&"a".repeat(64)));
    }

    #[test]
    fn data_keys() {
        for ok in ["A", "a.b", "tls.crt", "x-y_z", "..a"] {
            assert!(valid_data_key(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "ä"] {
            assert!(!valid_data_key(bad), "{bad}");
        }
    }
}
