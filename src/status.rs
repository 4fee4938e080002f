//! `kms-operator status`: who owns which shard, how old each Lease renewal
//! is, how many resources each shard holds, and which resources are not ready
//! and why. Reads the cluster of the current kubeconfig; writes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::cli::{OutputFormat, StatusArgs};

/// One shard Lease as observed.
#[derive(Debug, Serialize, PartialEq)]
pub struct ShardRow {
    /// Shard number.
    pub shard: u32,
    /// Holder (pod name), if any.
    pub holder: Option<String>,
    /// Seconds since the holder last renewed (by the Lease's renewTime).
    pub renewed_seconds_ago: Option<i64>,
    /// Resources whose status names this shard.
    pub objects: usize,
}

/// A resource that is not ready.
#[derive(Debug, Serialize, PartialEq)]
pub struct NotReady {
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Condition reason.
    pub reason: String,
    /// Condition message.
    pub message: String,
}

/// The whole report.
#[derive(Debug, Serialize, PartialEq)]
pub struct Report {
    /// Shards in order.
    pub shards: Vec<ShardRow>,
    /// Live members (member Leases).
    pub members: Vec<String>,
    /// Resources per kind.
    pub objects: BTreeMap<String, usize>,
    /// Resources that are not ready.
    pub not_ready: Vec<NotReady>,
}

fn shard_number(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(&format!("{prefix}-shard-"))?.parse().ok()
}

/// Build the report from observed Leases and resources (pure).
pub fn build(
    prefix: &str,
    leases: &[Lease],
    resources: &[(String, DynamicObject)],
    now: i64,
) -> Report {
    let mut per_shard: BTreeMap<u32, usize> = BTreeMap::new();
    let mut objects: BTreeMap<String, usize> = BTreeMap::new();
    let mut not_ready = Vec::new();
    for (kind, o) in resources {
        *objects.entry(kind.clone()).or_default() += 1;
        let status = &o.data["status"];
        if let Some(s) = status["shard"].as_u64().and_then(|s| u32::try_from(s).ok()) {
            *per_shard.entry(s).or_default() += 1;
        }
        let ready = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
        let is_ready = ready.is_some_and(|c| c["status"] == "True");
        if !is_ready {
            not_ready.push(NotReady {
                kind: kind.clone(),
                namespace: o.namespace().unwrap_or_default(),
                name: o.name_any(),
                reason: ready
                    .and_then(|c| c["reason"].as_str())
                    .unwrap_or("Pending")
                    .to_owned(),
                message: ready
                    .and_then(|c| c["message"].as_str())
                    .unwrap_or("not reconciled yet")
                    .to_owned(),
            });
        }
    }
    let mut shards: BTreeMap<u32, ShardRow> = BTreeMap::new();
    let mut members = Vec::new();
    for l in leases {
        let name = l.name_any();
        if let Some(member) = name.strip_prefix(&format!("{prefix}-member-")) {
            members.push(member.to_owned());
            continue;
        }
        let Some(shard) = shard_number(&name, prefix) else {
            continue;
        };
        let spec = l.spec.clone().unwrap_or_default();
        shards.insert(
            shard,
            ShardRow {
                shard,
                holder: spec.holder_identity.filter(|h| !h.is_empty()),
                renewed_seconds_ago: spec.renew_time.map(|t| now - t.0.as_second()),
                objects: per_shard.get(&shard).copied().unwrap_or(0),
            },
        );
    }
    for (shard, n) in per_shard {
        shards.entry(shard).or_insert(ShardRow {
            shard,
            holder: None,
            renewed_seconds_ago: None,
            objects: n,
        });
    }
    members.sort();
    not_ready
        .sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    Report {
        shards: shards.into_values().collect(),
        members,
        objects,
        not_ready,
    }
}

/// Render the report as text.
pub fn render_table(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "MEMBERS: {}\n\n",
        if r.members.is_empty() {
            "(none)".to_owned()
        } else {
            r.members.join(", ")
        }
    ));
    out.push_str(&format!(
        "{:<6} {:<32} {:>10} {:>8}\n",
        "SHARD", "OWNER", "RENEWED", "OBJECTS"
    ));
    for s in &r.shards {
        out.push_str(&format!(
            "{:<6} {:<32} {:>10} {:>8}\n",
            s.shard,
            s.holder.as_deref().unwrap_or("<none>"),
            s.renewed_seconds_ago
                .map_or_else(|| "-".to_owned(), |a| format!("{a}s ago")),
            s.objects
        ));
    }
    out.push('\n');
    for (kind, n) in &r.objects {
        out.push_str(&format!("{kind}: {n}\n"));
    }
    if r.not_ready.is_empty() {
        out.push_str("\nall resources are ready\n");
    } else {
        out.push_str(&format!("\nNOT READY ({}):\n", r.not_ready.len()));
        for n in &r.not_ready {
            out.push_str(&format!(
                "  {} {}/{}: {}: {}\n",
                n.kind, n.namespace, n.name, n.reason, n.message
            ));
        }
    }
    out
}

/// Run the command.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let leases = Api::<Lease>::namespaced(client.clone(), &args.pod_namespace)
        .list(&ListParams::default())
        .await?
        .items;
    let mut resources = Vec::new();
    for (kind, plural) in [
        ("KmsSecret", "kmssecrets"),
        ("KmsPushSecret", "kmspushsecrets"),
        ("KmsDynamicSecret", "kmsdynamicsecrets"),
    ] {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", kind),
            plural,
        );
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        for o in api.list(&ListParams::default()).await?.items {
            resources.push((kind.to_owned(), o));
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let report = build(&args.lease_prefix, &leases, &resources, now);
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => print!("{}", render_table(&report)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, holder: Option<&str>, renew: Option<i64>) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": holder,
                "renewTime": renew.map(|s| k8s_openapi::jiff::Timestamp::from_second(s).unwrap().to_string()),
            }
        }))
        .unwrap()
    }

    fn resource(ns: &str, name: &str, shard: u32, ready: bool) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": name, "namespace": ns},
            "status": {"shard": shard, "conditions": [
                {"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": if ready {"Synced"} else {"KMSUnavailable"}, "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn report_counts_and_lists() {
        let leases = vec![
            lease("kms-operator-shard-00", Some("pod-a"), Some(995)),
            lease("kms-operator-shard-01", None, None),
            lease("kms-operator-member-pod-a", Some("pod-a"), Some(999)),
            lease("other", Some("x"), Some(1)),
        ];
        let resources = vec![
            ("KmsSecret".to_owned(), resource("a", "x", 0, true)),
            ("KmsSecret".to_owned(), resource("b", "y", 0, false)),
            ("KmsSecret".to_owned(), resource("c", "z", 1, true)),
        ];
        let r = build("kms-operator", &leases, &resources, 1000);
        assert_eq!(r.members, vec!["pod-a"]);
        assert_eq!(r.shards.len(), 2);
        assert_eq!(r.shards[0].holder.as_deref(), Some("pod-a"));
        assert_eq!(r.shards[0].renewed_seconds_ago, Some(5));
        assert_eq!(r.shards[0].objects, 2);
        assert_eq!(r.shards[1].holder, None);
        assert_eq!(r.objects["KmsSecret"], 3);
        assert_eq!(r.not_ready.len(), 1);
        assert_eq!(r.not_ready[0].reason, "KMSUnavailable");
        let table = render_table(&r);
        assert!(table.contains("pod-a"), "{table}");
        assert!(table.contains("NOT READY (1)"), "{table}");
    }
}
