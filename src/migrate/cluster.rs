//! `kms-operator migrate --from-cluster`: lists the Go operators' resources
//! in the cluster of `--kubeconfig`/`--context` (all namespaces, or one), in
//! every group they were published under, and hands them to the conversion
//! as plain JSON. Reads only; writes nothing.
//!
//! A resource type whose CRD is not installed is skipped. In
//! `secrets.hanzo.ai` the Go operator and kms-operator share the CRD names:
//! that group is read only while the Go operator's CRDs serve it (kind
//! `KMSSecret` without our schema); objects whose kind is already ours
//! (`KmsSecret`…) are left out in any case.

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use kms_operator::cli::ClusterArgs;

use super::convert::{Class, classify, strip_server_fields};

/// The resource types read: (group, kind, plural).
const TYPES: [(&str, &str, &str); 17] = [
    (
        "secrets.infisical.com",
        "InfisicalSecret",
        "infisicalsecrets",
    ),
    (
        "secrets.infisical.com",
        "InfisicalPushSecret",
        "infisicalpushsecrets",
    ),
    (
        "secrets.infisical.com",
        "InfisicalDynamicSecret",
        "infisicaldynamicsecrets",
    ),
    (
        "secrets.infisical.com",
        "ClusterGenerator",
        "clustergenerators",
    ),
    ("secrets.hanzo.ai", "KMSSecret", "kmssecrets"),
    ("secrets.hanzo.ai", "KMSPushSecret", "kmspushsecrets"),
    ("secrets.hanzo.ai", "KMSDynamicSecret", "kmsdynamicsecrets"),
    // Same CRD and kind as ours: printed unchanged (only while the Hanzo
    // operator's CRDs serve the group), so that replacing its CRDs by ours
    // does not lose them.
    ("secrets.hanzo.ai", "ClusterGenerator", "clustergenerators"),
    ("kms.hanzo.ai", "KMSSecret", "kmssecrets"),
    ("kms.hanzo.ai", "KMSPushSecret", "kmspushsecrets"),
    ("kms.hanzo.ai", "KMSDynamicSecret", "kmsdynamicsecrets"),
    ("kms.hanzo.ai", "ClusterGenerator", "clustergenerators"),
    ("secrets.lux.network", "KMSSecret", "kmssecrets"),
    ("secrets.lux.network", "KMSPushSecret", "kmspushsecrets"),
    (
        "secrets.lux.network",
        "KMSDynamicSecret",
        "kmsdynamicsecrets",
    ),
    (
        "secrets.lux.network",
        "ClusterGenerator",
        "clustergenerators",
    ),
    // Infisical's v1beta1 kind, listed so the report names what it cannot
    // carry.
    (
        "secrets.infisical.com",
        "InfisicalStaticSecret",
        "infisicalstaticsecrets",
    ),
];

fn version_of(kind: &str) -> &'static str {
    if kind == "InfisicalStaticSecret" {
        "v1beta1"
    } else {
        "v1alpha1"
    }
}

/// Every Go-operator object in the cluster (in `namespace` only, when
/// given; cluster-scoped ClusterGenerators are read either way), sorted by
/// type, namespace and name.
pub async fn read(args: &ClusterArgs, namespace: Option<&str>) -> anyhow::Result<Vec<Value>> {
    let (client, _) = kms_operator::cluster::connect(args).await?;
    let hanzo_go = hanzo_go_crds(&client).await;
    let mut out = Vec::new();
    for (group, kind, plural) in TYPES {
        // secrets.hanzo.ai is the Go operator's only while its CRDs serve
        // it; once ours do (installed fresh, or taken over in place with
        // the Go spelling kept), its objects are already kms-operator's.
        if group == "secrets.hanzo.ai" && !hanzo_go {
            continue;
        }
        let version = version_of(kind);
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = match (kind, namespace) {
            ("ClusterGenerator", _) | (_, None) => Api::all_with(client.clone(), &ar),
            (_, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        };
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            // The CRD is not installed (or not at this version).
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e).with_context(|| format!("listing {plural}.{group}")),
        };
        let mut items: Vec<Value> = Vec::new();
        for obj in list.items {
            let mut v = serde_json::to_value(&obj)?;
            let actual_kind = obj
                .types
                .as_ref()
                .map(|t| t.kind.clone())
                .unwrap_or_else(|| kind.to_owned());
            let api_version = format!("{group}/{version}");
            match classify(&api_version, &actual_kind) {
                // ClusterGenerators of secrets.hanzo.ai are the same in both
                // operators: kept, without what the server added.
                Class::Ours if actual_kind == "ClusterGenerator" => {
                    if let Some(o) = v.as_object_mut() {
                        o.remove("status");
                    }
                    strip_server_fields(&mut v);
                }
                // Already ours (our CRDs hold these plural names in
                // secrets.hanzo.ai).
                Class::Ours | Class::Other => continue,
                _ => {}
            }
            if let Some(o) = v.as_object_mut() {
                o.insert("apiVersion".to_owned(), Value::String(api_version));
                o.insert("kind".to_owned(), Value::String(actual_kind));
            }
            items.push(v);
        }
        items.sort_by_key(|v| {
            let m = &v["metadata"];
            (
                m["namespace"].as_str().unwrap_or_default().to_owned(),
                m["name"].as_str().unwrap_or_default().to_owned(),
            )
        });
        out.extend(items);
    }
    Ok(out)
}

/// Whether `secrets.hanzo.ai` is served by the Hanzo Go operator's CRDs
/// rather than ours: kind `KMSSecret` and not our schema (ours has the
/// short name `kmss`, also when a hand-over in place kept the Go kind
/// spelling). Unknown (no access) counts as no.
async fn hanzo_go_crds(client: &Client) -> bool {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt("kmssecrets.secrets.hanzo.ai")
        .await
        .ok()
        .flatten()
        .is_some_and(|c| is_go_crd(&c.spec.names.kind, c.spec.names.short_names.as_deref()))
}

/// Whether a `kmssecrets.secrets.hanzo.ai` CRD is the Go operator's: its kind
/// spelling, and not kms-operator's schema (short name `kmss`).
fn is_go_crd(kind: &str, short_names: Option<&[String]>) -> bool {
    kind == "KMSSecret" && !short_names.is_some_and(|s| s.iter().any(|n| n == "kmss"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_go_operators_crd_counts_as_go() {
        let ours = ["kmss".to_owned()];
        assert!(is_go_crd("KMSSecret", None));
        assert!(is_go_crd("KMSSecret", Some(&[])));
        // Taken over in place: the Go spelling, our schema.
        assert!(!is_go_crd("KMSSecret", Some(&ours)));
        assert!(!is_go_crd("KmsSecret", Some(&ours)));
        assert!(!is_go_crd("KmsSecret", None));
    }

    #[test]
    fn every_type_has_a_plural_of_its_kind() {
        for (group, kind, plural) in TYPES {
            assert_eq!(plural, format!("{}s", kind.to_lowercase()), "{group}");
        }
    }
}
