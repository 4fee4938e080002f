//! `KmsPushSecret`: push the keys of a Kubernetes Secret (and generated values)
//! into a KMS folder.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, DURATION_PATTERN, GENERIC_AUTH_METHODS, GenericAuthentication, PROJECT_ONE_OF,
    SecretTemplate, Time, TlsConfig, auth_count, one_method_message,
};

/// Push the keys of a Kubernetes Secret, and generated values, into a KMS
/// folder.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "secrets.hanzo.ai",
    version = "v1alpha1",
    kind = "KmsPushSecret",
    plural = "kmspushsecrets",
    singular = "kmspushsecret",
    shortname = "kmsps",
    category = "kms",
    namespaced,
    status = "KmsPushSecretStatus",
    doc = "Pushes the keys of a Kubernetes Secret, and generated values, into a KMS folder.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Last Sync", type_ = "date", json_path = ".status.lastSyncTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(format!("{} == 1", auth_count(&GENERIC_AUTH_METHODS)))
        .message(one_method_message(&GENERIC_AUTH_METHODS, "").as_str()),
    validation = Rule::new("has(self.push.secret) || (has(self.push.generators) && size(self.push.generators) > 0)")
        .message("push: at least one of push.secret and push.generators must be set"),
)]
pub struct KmsPushSecretSpec {
    /// Base URL of the KMS API (`/api` is appended when missing). Defaults to
    /// the `hostAPI` of the `kms-config` ConfigMap, else
    /// `https://kms.hanzo.ai/api`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "hostAPI")]
    #[schemars(length(max = 2048))]
    pub host_api: Option<String>,
    /// TLS settings for the connection to the KMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Time between pushes (`30s`, `5m`, `1h30m`, or a bare number of seconds).
    /// Without it the secret is pushed when the resource or its source Secret
    /// changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 64))]
    pub resync_interval: Option<String>,
    /// What to do with a key that already exists in the KMS but was not
    /// created by this resource: `None` leaves it, `Replace` overwrites it.
    #[serde(default)]
    pub update_policy: UpdatePolicy,
    /// What to do with the pushed keys when this resource is deleted: `None`
    /// leaves them, `Delete` deletes them from the KMS.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Where to push; cannot be changed after creation.
    #[x_kube(validation = Rule::new("self == oldSelf").message("destination is immutable"))]
    pub destination: PushDestination,
    /// How to log in to the KMS: exactly one method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<GenericAuthentication>,
    /// What to push.
    pub push: PushSource,
}

/// What to do with a key that exists in the KMS but was not pushed by this
/// resource.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum UpdatePolicy {
    /// Leave it as it is.
    #[default]
    None,
    /// Overwrite it and manage it from then on.
    Replace,
}

/// What to do with the pushed keys when the resource is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum DeletionPolicy {
    /// Leave them in the KMS.
    #[default]
    None,
    /// Delete them from the KMS before the resource goes away.
    Delete,
}

/// The KMS folder that receives the pushed keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(PROJECT_ONE_OF).message("destination: exactly one of projectSlug and projectId must be set"))]
pub struct PushDestination {
    /// Folder path in the KMS; `/` is the root.
    #[schemars(length(min = 1, max = 1024))]
    pub secrets_path: String,
    /// Environment slug.
    #[schemars(length(min = 1, max = 256))]
    pub environment_slug: String,
    /// ID of the project. Exactly one of `projectId` and `projectSlug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub project_id: Option<String>,
    /// Slug of the project. Exactly one of `projectId` and `projectSlug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub project_slug: Option<String>,
}

/// The sources of the pushed keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushSource {
    /// A Kubernetes Secret whose keys are pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<PushSecretSource>,
    /// Values produced by ClusterGenerators, pushed under the given names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub generators: Option<Vec<PushGenerator>>,
    /// Create the destination folder, and every folder above it, when the
    /// KMS does not have it (the identity needs permission to create
    /// folders there). Without it a missing folder stops the push with a
    /// condition that says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_folders: Option<bool>,
}

/// A Kubernetes Secret whose keys are pushed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushSecretSource {
    /// Name of the source Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Namespace of the source Secret. Defaults to the namespace of the
    /// resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub secret_namespace: Option<String>,
    /// How the pushed keys are built from the Secret's keys; `SecretPath` in a
    /// template is the destination path. `metadata` is not used here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<SecretTemplate>,
}

/// A generated value pushed under a name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushGenerator {
    /// Key under which the generated value is written in the KMS.
    #[schemars(length(min = 1, max = 1024))]
    pub destination_secret_name: String,
    /// The ClusterGenerator that produces the value.
    pub generator_ref: GeneratorRef,
    /// Replace the generated value with a new one when it is older than
    /// this (`30d`, `720h`, or a bare number of seconds; at least 1 minute).
    /// Without it the value is generated once, pushed, and kept: resyncs and
    /// operator restarts never change it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 64))]
    pub rotation_interval: Option<String>,
}

/// A reference to a ClusterGenerator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorRef {
    /// Kind of value; must match the generator's `spec.kind`.
    pub kind: GeneratorKind,
    /// Name of the ClusterGenerator.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The kind of value a generator produces.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GeneratorKind {
    /// A random password.
    Password,
    /// A random version-4 UUID.
    #[serde(rename = "UUID")]
    Uuid,
}

/// Observed state of a KmsPushSecret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct KmsPushSecretStatus {
    /// Conditions: `Ready`, `secrets.hanzo.ai/Authenticated`,
    /// `secrets.hanzo.ai/Reconcile` and the `FailedTo…Secrets` conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The keys this resource manages in the KMS: KMS secret ID to key name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_secrets: Option<BTreeMap<String, String>>,
    /// The generation of the spec that the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the keys were last pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Number of keys pushed at the last sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_keys: Option<i64>,
    /// The shard that owns this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<i32>,
    /// The keys whose values come from a generator, by key: which generator
    /// made the value and when. A key listed here keeps its value until its
    /// generator reference changes, its `rotationInterval` has passed, or
    /// the key disappears from the KMS. Never holds the values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_secrets: Option<BTreeMap<String, GeneratedSecret>>,
    /// The value of the annotation `secrets.hanzo.ai/force-sync` whose
    /// forced sync has run (a new value asks for another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_sync: Option<String>,
}

/// Where a generated value came from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedSecret {
    /// The generator, as `<kind>/<ClusterGenerator name>`.
    pub generator: String,
    /// When the value was generated.
    pub generated_at: Time,
}

super::kinds::our_resource!(KmsPushSecret);
