//! Condition types and reasons written into the status of the custom
//! resources. `True` always means good.

/// The standard condition every kind carries: the resource is fully in step.
pub const READY: &str = "Ready";

/// Every kind: the KMS host and CA the resource uses and where each came
/// from (`spec`, `kms-config (<namespace>/<name>)`, an operator default or
/// the built-in default). Set when the endpoint is resolved.
pub const ENDPOINT: &str = "secrets.hanzo.ai/Endpoint";

/// KmsSecret: the operator has a KMS token for the resource's identity.
pub const LOADED_KMS_TOKEN: &str = "secrets.hanzo.ai/LoadedKMSToken";
/// KmsSecret: the last sync fetched and wrote the targets.
pub const READY_TO_SYNC_SECRETS: &str = "secrets.hanzo.ai/ReadyToSyncSecrets";
/// KmsSecret with instant updates: the change-event stream is open.
pub const INSTANT_UPDATES: &str = "secrets.hanzo.ai/InstantUpdates";
/// KmsSecret and KmsDynamicSecret: workloads that opted in are rolled on change.
pub const AUTO_REDEPLOY_READY: &str = "secrets.hanzo.ai/AutoRedeployReady";

/// KmsPushSecret: the operator logged in to the KMS.
pub const AUTHENTICATED: &str = "secrets.hanzo.ai/Authenticated";
/// KmsPushSecret and KmsDynamicSecret: the last reconcile succeeded.
pub const RECONCILE: &str = "secrets.hanzo.ai/Reconcile";
/// KmsPushSecret: some keys could not be created in the KMS.
pub const FAILED_TO_CREATE_SECRETS: &str = "secrets.hanzo.ai/FailedToCreateSecrets";
/// KmsPushSecret: some keys could not be updated in the KMS.
pub const FAILED_TO_UPDATE_SECRETS: &str = "secrets.hanzo.ai/FailedToUpdateSecrets";
/// KmsPushSecret: some keys could not be deleted from the KMS.
pub const FAILED_TO_DELETE_SECRETS: &str = "secrets.hanzo.ai/FailedToDeleteSecrets";
/// KmsPushSecret: some keys could not be replaced in the KMS.
pub const FAILED_TO_REPLACE_SECRETS: &str = "secrets.hanzo.ai/FailedToReplaceSecrets";

/// KmsDynamicSecret: a lease is held.
pub const LEASE_CREATED: &str = "secrets.hanzo.ai/LeaseCreated";
/// KmsDynamicSecret: the lease is renewed in time.
pub const LEASE_RENEWAL: &str = "secrets.hanzo.ai/LeaseRenewal";
