//! The kind spellings the cluster serves for our three resources.
//!
//! Our types spell the kinds `KmsSecret`, `KmsPushSecret` and
//! `KmsDynamicSecret`. The Hanzo Go operator's CRDs have the same names
//! (`kmssecrets.secrets.hanzo.ai`, …) but spell them `KMSSecret`,
//! `KMSPushSecret` and `KMSDynamicSecret`, and a CRD's `spec.names.kind` is
//! immutable once it is established: a cluster taken over in place from the
//! Go operator (docs/migration.md) keeps serving the Go spelling. The API
//! server then rejects any body whose `kind` differs (`kind: Invalid value:
//! "KmsSecret": must be KMSSecret`), and the garbage collector cannot resolve
//! an owner reference of a kind it does not serve (an owned Secret would
//! never be collected).
//!
//! Reading is unaffected (kube's derived types ignore `kind` when they
//! decode, and every URL uses the plural), so only what the operator
//! *writes* carries the kind: server-side-apply bodies, owner references
//! and the `involvedObject` of Events. At start the operator reads the
//! served kinds once from API discovery (`GET /apis/secrets.hanzo.ai/v1alpha1`,
//! which every authenticated client may read) and every write takes its kind
//! from [`ServedKinds`]. While a resource is not served at all the operator
//! waits for its CRD, and says which in its log and on `/readyz`
//! ([`ServedError`]): guessing a spelling would only move the failure to
//! the first write.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, OwnerReference};
use kube::{Client, Resource};
use serde_json::{Value, json};

use super::kinds::KINDS;
use super::{GROUP, VERSION};

/// The longest wait between two discoveries while the CRDs are missing.
const DISCOVERY_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why the served kinds could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ServedError {
    /// Discovery of the group failed (the API server is unreachable, or
    /// answered with an error).
    #[error(
        "could not read the API group {GROUP}/{VERSION} from the API server ({0}); are the CRDs \
         installed? (crds/ or the chart with installCRDs=true)"
    )]
    Discovery(String),
    /// Some of our resources are not served (all of them when the group is
    /// not served at all).
    #[error(
        "the CRDs of {} are not installed (the API server does not serve them): install them \
         (crds/*.yaml, or the chart with installCRDs=true)",
        .plurals.iter().map(|p| format!("{p}.{GROUP}")).collect::<Vec<_>>().join(", ")
    )]
    Missing {
        /// The plurals of the resources not served.
        plurals: Vec<String>,
    },
}

/// The kinds, as the cluster serves them, of our resources ([`KINDS`], in
/// its order). [`Default`] is our own spelling (for tests and for code that
/// runs without a cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedKinds {
    served: Vec<String>,
}

impl Default for ServedKinds {
    fn default() -> Self {
        Self {
            served: KINDS.iter().map(|k| k.kind.to_owned()).collect(),
        }
    }
}

impl ServedKinds {
    /// Read the served kinds from API discovery, waiting (with a backoff up
    /// to 30 s) while the group or one of the resources is not served;
    /// `waiting` hears why at each attempt, and `None` once they are.
    pub async fn discover(client: &Client, waiting: impl Fn(Option<&ServedError>)) -> Self {
        let mut pause = Duration::from_secs(1);
        loop {
            let result = match client
                .list_api_group_resources(&format!("{GROUP}/{VERSION}"))
                .await
            {
                Ok(list) => Self::from_resources(&list),
                // The group is not served: none of the CRDs is installed.
                Err(kube::Error::Api(s)) if s.code == 404 => Err(ServedError::Missing {
                    plurals: KINDS.iter().map(|k| k.plural.to_owned()).collect(),
                }),
                Err(e) => Err(ServedError::Discovery(e.to_string())),
            };
            match result {
                Ok(kinds) => {
                    waiting(None);
                    return kinds;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for the custom resources to be served");
                    waiting(Some(&e));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(DISCOVERY_BACKOFF_MAX);
                }
            }
        }
    }

    /// The kinds in a discovery document of `secrets.hanzo.ai/v1alpha1`.
    pub fn from_resources(list: &APIResourceList) -> Result<Self, ServedError> {
        let served: Vec<Option<String>> = KINDS
            .iter()
            .map(|k| {
                list.resources
                    .iter()
                    .find(|r| r.name == k.plural)
                    .map(|r| r.kind.clone())
            })
            .collect();
        let missing: Vec<String> = KINDS
            .iter()
            .zip(&served)
            .filter(|(_, s)| s.is_none())
            .map(|(k, _)| k.plural.to_owned())
            .collect();
        if !missing.is_empty() {
            return Err(ServedError::Missing { plurals: missing });
        }
        Ok(Self {
            served: served.into_iter().flatten().collect(),
        })
    }

    /// Whether any kind is spelled other than ours (a cluster taken over
    /// from the Go operator).
    pub fn is_legacy(&self) -> bool {
        *self != Self::default()
    }

    /// The served kind of `K` (one of our resources; any other type's own
    /// kind).
    pub fn kind_of<K: Resource<DynamicType = ()>>(&self) -> Cow<'_, str> {
        let ours = K::kind(&());
        match KINDS.iter().position(|k| k.kind == ours) {
            Some(i) => Cow::Borrowed(&self.served[i]),
            None => ours,
        }
    }

    /// A server-side-apply body of `K`'s status subresource.
    pub fn status_apply<K: Resource<DynamicType = ()>>(
        &self,
        status: &impl serde::Serialize,
    ) -> Value {
        json!({
            "apiVersion": K::api_version(&()),
            "kind": self.kind_of::<K>(),
            "status": status,
        })
    }

    /// A controller owner reference to `object` (blocking its owner's
    /// deletion), with the served kind.
    pub fn owner_ref<K: Resource<DynamicType = ()>>(&self, object: &K) -> Option<OwnerReference> {
        let mut r = object.controller_owner_ref(&())?;
        r.kind = self.kind_of::<K>().into_owned();
        r.block_owner_deletion = Some(true);
        Some(r)
    }

    /// A reference to `object` for Events, with the served kind (so that
    /// `kubectl describe` finds them).
    pub fn object_ref<K: Resource<DynamicType = ()>>(&self, object: &K) -> ObjectReference {
        let mut r = object.object_ref(&());
        r.kind = Some(self.kind_of::<K>().into_owned());
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KmsDynamicSecret, KmsPushSecret, KmsSecret};

    fn list(kinds: &[(&str, &str)]) -> APIResourceList {
        serde_json::from_value(json!({
            "groupVersion": "secrets.hanzo.ai/v1alpha1",
            "resources": kinds.iter().map(|(name, kind)| json!({
                "name": name, "kind": kind, "namespaced": true, "singularName": "",
                "verbs": ["get", "list"]
            })).collect::<Vec<_>>()
        }))
        .unwrap()
    }

    fn go_operator() -> APIResourceList {
        list(&[
            ("kmssecrets", "KMSSecret"),
            ("kmssecrets/status", "KMSSecret"),
            ("kmspushsecrets", "KMSPushSecret"),
            ("kmsdynamicsecrets", "KMSDynamicSecret"),
            ("clustergenerators", "ClusterGenerator"),
        ])
    }

    fn secret() -> KmsSecret {
        serde_json::from_value(json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KMSSecret",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u-1"},
            "spec": {}
        }))
        .unwrap()
    }

    #[test]
    fn our_crds_serve_our_spelling() {
        let ours = list(&[
            ("kmssecrets", "KmsSecret"),
            ("kmspushsecrets", "KmsPushSecret"),
            ("kmsdynamicsecrets", "KmsDynamicSecret"),
        ]);
        let kinds = ServedKinds::from_resources(&ours).unwrap();
        assert_eq!(kinds, ServedKinds::default());
        assert!(!kinds.is_legacy());
    }

    #[test]
    fn the_go_operators_crds_give_every_write_its_spelling() {
        let kinds = ServedKinds::from_resources(&go_operator()).unwrap();
        assert!(kinds.is_legacy());
        assert_eq!(kinds.kind_of::<KmsSecret>(), "KMSSecret");
        assert_eq!(kinds.kind_of::<KmsPushSecret>(), "KMSPushSecret");
        assert_eq!(kinds.kind_of::<KmsDynamicSecret>(), "KMSDynamicSecret");
        // Other types keep their own.
        assert_eq!(
            kinds.kind_of::<k8s_openapi::api::core::v1::Secret>(),
            "Secret"
        );

        let body = kinds.status_apply::<KmsSecret>(&json!({"conditions": []}));
        assert_eq!(body["kind"], "KMSSecret");
        assert_eq!(body["apiVersion"], "secrets.hanzo.ai/v1alpha1");

        let owner = kinds.owner_ref(&secret()).unwrap();
        assert_eq!(owner.kind, "KMSSecret");
        assert_eq!(owner.uid, "u-1");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));

        let reference = kinds.object_ref(&secret());
        assert_eq!(reference.kind.as_deref(), Some("KMSSecret"));
        assert_eq!(reference.name.as_deref(), Some("app"));
    }

    #[test]
    fn a_resource_not_served_is_named() {
        let partial = list(&[
            ("kmssecrets", "KMSSecret"),
            ("kmspushsecrets", "KMSPushSecret"),
        ]);
        let e = ServedKinds::from_resources(&partial).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the CRDs of kmsdynamicsecrets.secrets.hanzo.ai are not installed"),
            "{e}"
        );
        let e = ServedKinds::from_resources(&list(&[])).unwrap_err();
        assert!(
            e.to_string().contains(
                "kmssecrets.secrets.hanzo.ai, kmspushsecrets.secrets.hanzo.ai, \
                 kmsdynamicsecrets.secrets.hanzo.ai are not installed"
            ),
            "{e}"
        );
    }
}
