//! Stand-ins for the Prometheus Operator's CRDs (`ServiceMonitor`,
//! `PrometheusRule`), so that the chart installs with its monitoring
//! objects enabled on a control plane without the Prometheus Operator (the
//! real CRDs are not available offline). Any object of these kinds is
//! accepted and stored as written: their schema is the Prometheus
//! Operator's business, not the tests'.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Create the stand-in CRDs (kept when they exist) and wait until they are
/// Established.
pub async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for (kind, plural) in [
        ("ServiceMonitor", "servicemonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        let name = format!("{plural}.monitoring.coreos.com");
        names.push(name.clone());
        if api.get_opt(&name).await.expect("get CRD").is_some() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }]
            }
        }))
        .unwrap();
        if let Err(e) = api.create(&PostParams::default(), &crd).await {
            assert!(
                matches!(&e, kube::Error::Api(s) if s.code == 409),
                "create {name}: {e}"
            );
        }
    }
    crate::testenv::wait_established(client, &names, Duration::from_secs(30))
        .await
        .expect("the stand-in CRDs are established");
}
