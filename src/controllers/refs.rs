//! References from a resource to other objects (credentials, CA bundles,
//! targets), the namespace rule that keeps a resource inside its own
//! namespace unless `--allow-cross-namespace-refs`, and the global
//! `kms-config` ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::Api;

use super::error::SyncError;
use crate::api::common::TlsConfig;
use crate::kms::{DEFAULT_HOST_API, Endpoint};

/// Name of the global configuration ConfigMap.
pub const GLOBAL_CONFIG_NAME: &str = "kms-config";

/// The namespace a reference points to: its own, or the resource's. Another
/// namespace than the resource's is refused unless allowed.
pub fn namespace_of(
    resource_ns: &str,
    requested: Option<&str>,
    field: &str,
    allow_cross: bool,
) -> Result<String, SyncError> {
    match requested.filter(|n| !n.is_empty()) {
        None => Ok(resource_ns.to_owned()),
        Some(ns) if ns == resource_ns || allow_cross => Ok(ns.to_owned()),
        Some(ns) => Err(SyncError::Reference {
            reason: "CrossNamespaceRefDenied",
            message: format!(
                "{field} points to namespace {ns}; references outside the resource's namespace {resource_ns} \
                 need the operator flag --allow-cross-namespace-refs"
            ),
        }),
    }
}

/// Read a Secret; `None` when it does not exist.
pub async fn get_secret(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<Secret>, SyncError> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| SyncError::kube(format!("reading Secret {ns}/{name}"), e))
}

/// Read the string value of `key` in a Secret's data.
pub fn secret_string(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The parsed `kms-config` ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GlobalConfig {
    /// `hostAPI`.
    pub host_api: Option<String>,
    /// `tls.caRef.*`: namespace, name, key.
    pub ca_ref: Option<(String, String, String)>,
    /// Why the ConfigMap could not be used, if it could not.
    pub error: Option<String>,
}

impl GlobalConfig {
    /// Parse the ConfigMap's data.
    pub fn from_config_map(cm: &ConfigMap) -> Self {
        let empty = BTreeMap::new();
        let data = cm.data.as_ref().unwrap_or(&empty);
        let get = |k: &str| {
            data.get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let host_api = get("hostAPI");
        let parts = (
            get("tls.caRef.secretNamespace"),
            get("tls.caRef.secretName"),
            get("tls.caRef.key"),
        );
        let (ca_ref, error) = match parts {
            (None, None, None) => (None, None),
            (Some(ns), Some(name), Some(key)) => (Some((ns, name, key)), None),
            _ => (
                None,
                Some(format!(
                    "ConfigMap {GLOBAL_CONFIG_NAME}: tls.caRef.secretName, tls.caRef.secretNamespace and tls.caRef.key must be set together"
                )),
            ),
        };
        Self {
            host_api,
            ca_ref,
            error,
        }
    }
}

/// Work out the KMS endpoint of a resource: its own `hostAPI` and `tls.caRef`
/// first, then the global config, then the default host.
pub async fn resolve_endpoint(
    client: &Client,
    resource_ns: &str,
    host_api: Option<&str>,
    tls: Option<&TlsConfig>,
    global: &GlobalConfig,
    allow_cross: bool,
) -> Result<Endpoint, SyncError> {
    let own_host = host_api.map(str::trim).filter(|h| !h.is_empty());
    if own_host.is_none()
        && let Some(e) = &global.error
    {
        return Err(SyncError::Spec(e.clone()));
    }
    let host = own_host
        .or(global.host_api.as_deref())
        .unwrap_or(DEFAULT_HOST_API);
    let ca = match tls.and_then(|t| t.ca_ref.as_ref()) {
        Some(r) => {
            let ns = namespace_of(
                resource_ns,
                r.secret_namespace.as_deref(),
                "tls.caRef",
                allow_cross,
            )?;
            Some((ns, r.secret_name.clone(), r.key.clone()))
        }
        None if own_host.is_none() => global.ca_ref.clone(),
        None => None,
    };
    let ca_pem = match ca {
        None => None,
        Some((ns, name, key)) => {
            let secret =
                get_secret(client, &ns, &name)
                    .await?
                    .ok_or_else(|| SyncError::Reference {
                        reason: "CANotFound",
                        message: format!("CA Secret {ns}/{name} not found"),
                    })?;
            let pem = secret
                .data
                .as_ref()
                .and_then(|d| d.get(&key))
                .map(|b| b.0.clone())
                .ok_or_else(|| SyncError::Reference {
                    reason: "CANotFound",
                    message: format!("CA Secret {ns}/{name} has no key {key}"),
                })?;
            Some(pem)
        }
    };
    Endpoint::new(host, ca_pem).map_err(SyncError::Kms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_namespace_references_need_the_flag() {
        assert_eq!(namespace_of("a", None, "f", false).unwrap(), "a");
        assert_eq!(namespace_of("a", Some(""), "f", false).unwrap(), "a");
        assert_eq!(namespace_of("a", Some("a"), "f", false).unwrap(), "a");
        let err = namespace_of("a", Some("b"), "credentialsRef", false).unwrap_err();
        assert!(
            err.to_string()
                .contains("credentialsRef points to namespace b"),
            "{err}"
        );
        assert_eq!(namespace_of("a", Some("b"), "f", true).unwrap(), "b");
    }

    #[test]
    fn global_config_parsing() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kms-config"},
            "data": {"hostAPI": "https://kms.example.com/api", "tls.caRef.secretName": "ca"}
        }))
        .unwrap();
        let g = GlobalConfig::from_config_map(&cm);
        assert_eq!(g.host_api.as_deref(), Some("https://kms.example.com/api"));
        assert!(g.error.unwrap().contains("must be set together"));
    }
}
