//! `KmsSecret`: sync secrets from the KMS into Secrets and ConfigMaps.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    AwsIamAuth, AzureAuth, DURATION_PATTERN, GENERIC_AUTH_METHODS, GcpIamAuth, GcpIdTokenAuth,
    KMS_SECRET_ONLY_METHODS, KubeSecretReference, KubernetesAuth, LdapAuth, MachineIdentityScope,
    ManagedKubeConfigMapConfig, ManagedKubeSecretConfig, Method, MethodName, ServiceTokenScope,
    Time, TlsConfig, UniversalAuth, auth_count, one_method_message,
};

/// Sync secrets from a KMS folder into Kubernetes Secrets and ConfigMaps.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "secrets.hanzo.ai",
    version = "v1alpha1",
    kind = "KmsSecret",
    plural = "kmssecrets",
    singular = "kmssecret",
    shortname = "kmss",
    category = "kms",
    namespaced,
    status = "KmsSecretStatus",
    doc = "Syncs secrets from a KMS folder into Kubernetes Secrets and ConfigMaps.",
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
    validation = Rule::new(format!(
        "{} + (has(self.tokenSecretReference) ? 1 : 0) == 1",
        auth_count(&kms_secret_methods())
    ))
    .message(
        one_method_message(
            &kms_secret_methods(),
            ", or the legacy spec.tokenSecretReference"
        )
        .as_str()
    ),
    validation = Rule::new(
        "!(has(self.managedSecretReference) && has(self.managedKubeSecretReferences) && size(self.managedKubeSecretReferences) > 0)"
    ).message("managedSecretReference (deprecated) cannot be combined with managedKubeSecretReferences"),
    validation = Rule::new(
        "has(self.managedSecretReference) || (has(self.managedKubeSecretReferences) && size(self.managedKubeSecretReferences) > 0) || (has(self.managedKubeConfigMapReferences) && size(self.managedKubeConfigMapReferences) > 0)"
    ).message("at least one target is required: managedKubeSecretReferences, managedKubeConfigMapReferences or managedSecretReference"),
)]
pub struct KmsSecretSpec {
    /// Base URL of the KMS API, for example `https://kms.example.com/api`
    /// (`/api` is appended when missing). Defaults to the `hostAPI` of the
    /// `kms-config` ConfigMap, else `https://kms.hanzo.ai/api`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "hostAPI")]
    #[schemars(length(max = 2048))]
    pub host_api: Option<String>,
    /// TLS settings for the connection to the KMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Deprecated: use `syncConfig.resyncInterval`. Seconds between syncs;
    /// ignored when `syncConfig` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub resync_interval: Option<i64>,
    /// Deprecated: use `syncConfig.instantUpdates`; ignored when `syncConfig`
    /// is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instant_updates: Option<bool>,
    /// When to sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_config: Option<SyncConfig>,
    /// Deprecated: the Secret holding a service token (key `kmsToken`); use
    /// `authentication.serviceToken`. Counts as the service-token method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_reference: Option<KubeSecretReference>,
    /// How to log in to the KMS: exactly one method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<KmsSecretAuthentication>,
    /// Deprecated: a single Secret target; use `managedKubeSecretReferences`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_secret_reference: Option<ManagedKubeSecretConfig>,
    /// The Secrets to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub managed_kube_secret_references: Option<Vec<ManagedKubeSecretConfig>>,
    /// The ConfigMaps to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub managed_kube_config_map_references: Option<Vec<ManagedKubeConfigMapConfig>>,
}

/// CEL rule: exactly one of the KmsSecret authentication methods, counting the
/// legacy top-level `tokenSecretReference` as the service-token method.
/// A KmsSecret's authentication methods: the generic ones and its own.
fn kms_secret_methods() -> Vec<&'static str> {
    GENERIC_AUTH_METHODS
        .into_iter()
        .chain(KMS_SECRET_ONLY_METHODS)
        .collect()
}

/// When and how to sync.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct SyncConfig {
    /// Time between syncs: `30s`, `5m`, `1h`, `1d`, `1w`, compound `1h30m`, or a
    /// bare number of seconds. At least 5 seconds; empty or `0s` means the
    /// default (1 minute, or 1 hour with `instantUpdates`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 64))]
    pub resync_interval: Option<String>,
    /// Also sync as soon as the KMS reports a change (server-sent events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instant_updates: Option<bool>,
}

// Each method is boxed: one is set, and the eight unset ones inline would be
// most of every cached resource (2.4 KiB of a KmsSecret's 2.4 KiB; 0.9 KiB
// boxed).
/// Authentication of a KmsSecret: exactly one method, each with the scope it
/// reads.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct KmsSecretAuthentication {
    /// Universal auth (client ID and secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub universal_auth: Option<Box<ScopedUniversalAuth>>,
    /// Kubernetes auth (ServiceAccount token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_auth: Option<Box<ScopedKubernetesAuth>>,
    /// AWS IAM auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_iam_auth: Option<Box<ScopedAwsIamAuth>>,
    /// Azure managed-identity auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_auth: Option<Box<ScopedAzureAuth>>,
    /// GCP ID-token auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_id_token_auth: Option<Box<ScopedGcpIdTokenAuth>>,
    /// GCP IAM auth (service-account key file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_iam_auth: Option<Box<ScopedGcpIamAuth>>,
    /// LDAP auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap_auth: Option<Box<ScopedLdapAuth>>,
    /// Legacy service token (`st.…`), read from a Secret's `kmsToken` key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_token: Option<Box<ServiceTokenAuth>>,
    /// Legacy service account (access key and key pair), if the KMS still
    /// offers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<Box<ServiceAccountAuth>>,
}

/// A KmsSecret's authentication method, borrowed from its spec.
#[derive(Clone, Copy, Debug)]
pub enum KmsSecretMethod<'a> {
    /// A machine-identity method and the scope it reads.
    Machine(Method<'a>, &'a MachineIdentityScope),
    /// The legacy service token.
    ServiceToken(&'a ServiceTokenAuth),
    /// The legacy service account.
    ServiceAccount(&'a ServiceAccountAuth),
}

impl KmsSecretMethod<'_> {
    /// The method's name.
    pub fn name(&self) -> MethodName {
        match self {
            Self::Machine(m, _) => m.name(),
            Self::ServiceToken(_) => MethodName::ServiceToken,
            Self::ServiceAccount(_) => MethodName::ServiceAccount,
        }
    }
}

impl KmsSecretAuthentication {
    /// The method set (the schema allows exactly one; the first in
    /// [`MethodName::GENERIC`]'s order, then the legacy ones, if several
    /// are).
    pub fn method(&self) -> Option<KmsSecretMethod<'_>> {
        use KmsSecretMethod::Machine;
        let all = MethodName::GENERIC
            .into_iter()
            .chain(MethodName::KMS_SECRET_ONLY);
        all.into_iter().find_map(|name| {
            Some(match name {
                MethodName::Universal => {
                    let a = self.universal_auth.as_deref()?;
                    Machine(Method::Universal(&a.auth), &a.secrets_scope)
                }
                MethodName::Kubernetes => {
                    let a = self.kubernetes_auth.as_deref()?;
                    Machine(Method::Kubernetes(&a.auth), &a.secrets_scope)
                }
                MethodName::AwsIam => {
                    let a = self.aws_iam_auth.as_deref()?;
                    Machine(Method::AwsIam(&a.auth), &a.secrets_scope)
                }
                MethodName::Azure => {
                    let a = self.azure_auth.as_deref()?;
                    Machine(Method::Azure(&a.auth), &a.secrets_scope)
                }
                MethodName::GcpIdToken => {
                    let a = self.gcp_id_token_auth.as_deref()?;
                    Machine(Method::GcpIdToken(&a.auth), &a.secrets_scope)
                }
                MethodName::GcpIam => {
                    let a = self.gcp_iam_auth.as_deref()?;
                    Machine(Method::GcpIam(&a.auth), &a.secrets_scope)
                }
                MethodName::Ldap => {
                    let a = self.ldap_auth.as_deref()?;
                    Machine(Method::Ldap(&a.auth), &a.secrets_scope)
                }
                MethodName::ServiceToken => {
                    KmsSecretMethod::ServiceToken(self.service_token.as_deref()?)
                }
                MethodName::ServiceAccount => {
                    KmsSecretMethod::ServiceAccount(self.service_account.as_deref()?)
                }
            })
        })
    }
}

/// Universal auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedUniversalAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: UniversalAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// Kubernetes auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedKubernetesAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: KubernetesAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// AWS IAM auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedAwsIamAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: AwsIamAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// Azure auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedAzureAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: AzureAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// GCP ID-token auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedGcpIdTokenAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: GcpIdTokenAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// GCP IAM auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedGcpIamAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: GcpIamAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// LDAP auth with the scope to read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScopedLdapAuth {
    /// The method's settings.
    #[serde(flatten)]
    pub auth: LdapAuth,
    /// What to read.
    pub secrets_scope: MachineIdentityScope,
}

/// Legacy service-token auth.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceTokenAuth {
    /// Secret with the key `kmsToken` holding the `st.…` token.
    pub service_token_secret_reference: KubeSecretReference,
    /// What to read (the project comes from the token).
    pub secrets_scope: ServiceTokenScope,
}

/// Legacy service-account auth.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountAuth {
    /// Secret with the keys `serviceAccountAccessKey`,
    /// `serviceAccountPublicKey` and `serviceAccountPrivateKey`.
    pub service_account_secret_reference: KubeSecretReference,
    /// ID of the project to read (always its root folder).
    #[schemars(length(min = 1, max = 256))]
    pub project_id: String,
    /// Environment to read.
    #[schemars(length(min = 1, max = 256))]
    pub environment_name: String,
}

/// Observed state of a KmsSecret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct KmsSecretStatus {
    /// Conditions: `Ready`, `secrets.hanzo.ai/LoadedKMSToken`,
    /// `secrets.hanzo.ai/ReadyToSyncSecrets`, `secrets.hanzo.ai/AutoRedeployReady`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation of the spec that the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the targets were last brought in step with the KMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Number of secrets fetched at the last sync.
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

super::kinds::our_resource!(KmsSecret);
