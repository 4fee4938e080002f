//! `KmsDynamicSecret`: lease time-bound credentials from a KMS dynamic secret
//! into a Kubernetes Secret, renew the lease and revoke it.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, DURATION_PATTERN, GENERIC_AUTH_METHODS, GenericAuthentication,
    ManagedKubeSecretConfig, PROJECT_ONE_OF, Time, TlsConfig, auth_count, one_method_message,
};

/// Lease time-bound credentials from a KMS dynamic secret into a Kubernetes
/// Secret; renew the lease before it expires and revoke it on deletion.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "secrets.hanzo.ai",
    version = "v1alpha1",
    kind = "KmsDynamicSecret",
    plural = "kmsdynamicsecrets",
    singular = "kmsdynamicsecret",
    shortname = "kmsds",
    category = "kms",
    namespaced,
    status = "KmsDynamicSecretStatus",
    doc = "Leases time-bound credentials from a KMS dynamic secret into a Kubernetes Secret.",
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
    printcolumn(
        name = "Lease Expires",
        type_ = "date",
        json_path = ".status.lease.expiresAt"
    ),
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
)]
pub struct KmsDynamicSecretSpec {
    /// Base URL of the KMS API (`/api` is appended when missing). Defaults to
    /// the `hostAPI` of the `kms-config` ConfigMap, else
    /// `https://kms.hanzo.ai/api`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "hostAPI")]
    #[schemars(length(max = 2048))]
    pub host_api: Option<String>,
    /// TLS settings for the connection to the KMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// How to log in to the KMS: exactly one method.
    pub authentication: GenericAuthentication,
    /// The dynamic secret to lease from; cannot be changed after creation.
    #[x_kube(validation = Rule::new("self == oldSelf").message("dynamicSecret is immutable"))]
    pub dynamic_secret: DynamicSecretDetails,
    /// Requested lease length (`30s`, `5m`, `1h`, `1d`, compound `1h30m`, or a
    /// bare number of seconds). Defaults to the dynamic secret's default TTL.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "leaseTTL")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 64))]
    pub lease_ttl: Option<String>,
    /// What happens to the lease when this resource is deleted: `Revoke`
    /// revokes it in the KMS first; `None` lets it expire.
    #[serde(default)]
    pub lease_revocation_policy: LeaseRevocationPolicy,
    /// The Secret that receives the leased credentials.
    pub managed_secret_reference: ManagedKubeSecretConfig,
}

/// Which dynamic secret to lease from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(PROJECT_ONE_OF).message("dynamicSecret: exactly one of projectSlug and projectId must be set"))]
pub struct DynamicSecretDetails {
    /// Name of the dynamic secret in the KMS.
    #[schemars(length(min = 1, max = 256))]
    pub secret_name: String,
    /// Folder path of the dynamic secret.
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

/// What happens to the lease when the resource is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum LeaseRevocationPolicy {
    /// Leave the lease to expire at its TTL.
    #[default]
    None,
    /// Revoke the lease in the KMS before the resource goes away.
    Revoke,
}

/// The lease currently held.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseStatus {
    /// Lease ID in the KMS.
    pub id: String,
    /// Lease version, increased by the KMS on renewal.
    pub version: i64,
    /// When the lease was created.
    pub creation_timestamp: Time,
    /// When the lease expires unless renewed.
    pub expires_at: Time,
    /// The lease period granted at creation and by each renewal (`1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// A lease that was replaced and is revoked once its grace period is over
/// (so workloads have the new credentials before the old ones stop working).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetiredLease {
    /// Lease id in the KMS.
    pub id: String,
    /// When it is revoked.
    pub revoke_after: Time,
}

/// Observed state of a KmsDynamicSecret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct KmsDynamicSecretStatus {
    /// Conditions: `Ready`, `secrets.hanzo.ai/Reconcile`,
    /// `secrets.hanzo.ai/LeaseCreated`, `secrets.hanzo.ai/LeaseRenewal`,
    /// `secrets.hanzo.ai/AutoRedeployReady`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The lease currently held, written before its credentials are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseStatus>,
    /// Replaced leases waiting for their revocation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_leases: Vec<RetiredLease>,
    /// ID of the dynamic secret in the KMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_secret_id: Option<String>,
    /// Maximum lifetime of a lease of this dynamic secret, as the KMS reports
    /// it; empty means no maximum.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "maxTTL")]
    pub max_ttl: Option<String>,
    /// The generation of the spec that the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the managed Secret last received credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Number of keys in the managed Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_keys: Option<i64>,
    /// The shard that owns this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<i32>,
    /// The value of the annotation `secrets.hanzo.ai/force-sync` whose
    /// forced sync has run (a new value asks for another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_sync: Option<String>,
}

super::kinds::our_resource!(KmsDynamicSecret);
