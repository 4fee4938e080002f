//! `kms-operator status` (also `kubectl kms status`): the resources of a
//! namespace, or of all (`-A`), each with its Ready condition; and, where
//! the operator's Leases can be read, who owns which shard and how old each
//! renewal is. Takes kubectl's `--kubeconfig`, `--context`, `-n` and `-A`;
//! what the user may not read (the Leases, a kind) is skipped with a note.
//! Writes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::api::kinds::{KINDS, KindInfo};
use crate::cli::{OperatorArgs, OutputFormat, StatusArgs};
use crate::cluster::{self, Scope};

/// One shard Lease as observed.
#[derive(Debug, Serialize, PartialEq)]
pub struct ShardRow {
    /// Shard number.
    pub shard: u32,
    /// Holder (pod name), if any.
    pub holder: Option<String>,
    /// Seconds since the holder last renewed (by the Lease's renewTime).
    pub renewed_seconds_ago: Option<i64>,
    /// Resources shown whose status names this shard.
    pub objects: usize,
}

/// One resource and its Ready condition.
#[derive(Debug, Serialize, PartialEq)]
pub struct ResourceRow {
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Ready condition's status: `True`, `False` or `Unknown` (not
    /// reconciled yet).
    pub ready: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
    /// The shard its status names, if any.
    pub shard: Option<u32>,
    /// A held gradual reload of its objects (the `AutoRedeployReady`
    /// condition's message when its reason is `RolloutHeld`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_reload: Option<String>,
}

/// The whole report.
#[derive(Debug, Serialize, PartialEq)]
pub struct Report {
    /// The namespace shown, or none for all.
    pub namespace: Option<String>,
    /// Shards in order (empty when the Leases could not be read).
    pub shards: Vec<ShardRow>,
    /// Live members (member Leases).
    pub members: Vec<String>,
    /// Resources per kind.
    pub objects: BTreeMap<String, usize>,
    /// Every resource shown, by kind, namespace and name.
    pub resources: Vec<ResourceRow>,
    /// How many of them are not Ready.
    pub not_ready: usize,
    /// What could not be read, and why.
    pub notes: Vec<String>,
}

fn shard_number(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(&format!("{prefix}-shard-"))?.parse().ok()
}

/// The Lease prefix of the operator whose shard Leases are most numerous
/// among `leases` (`<prefix>-shard-NN`).
pub fn detect_prefix(leases: &[Lease]) -> Option<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for l in leases {
        let name = l.name_any();
        if let Some((prefix, n)) = name.rsplit_once("-shard-")
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            *counts.entry(prefix.to_owned()).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(prefix, _)| prefix)
}

/// The Lease prefix: the one given, else the one found among `leases`.
pub fn lease_prefix(operator: &OperatorArgs, leases: &[Lease]) -> Option<String> {
    operator
        .lease_prefix
        .clone()
        .or_else(|| detect_prefix(leases))
}

pub(crate) fn resource_row(kind: &str, o: &DynamicObject) -> ResourceRow {
    let status = &o.data["status"];
    let ready = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
    let text = |field: &str, default: &str| {
        ready
            .and_then(|c| c[field].as_str())
            .unwrap_or(default)
            .to_owned()
    };
    ResourceRow {
        kind: kind.to_owned(),
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        ready: text("status", "Unknown"),
        reason: text("reason", "Pending"),
        message: text("message", "not reconciled yet"),
        shard: status["shard"].as_u64().and_then(|s| u32::try_from(s).ok()),
        held_reload: status["conditions"]
            .as_array()
            .and_then(|cs| {
                cs.iter().find(|c| {
                    c["type"] == crate::api::conditions::AUTO_REDEPLOY_READY
                        && c["reason"] == "RolloutHeld"
                })
            })
            .and_then(|c| c["message"].as_str())
            .map(str::to_owned),
    }
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
    let mut rows = Vec::new();
    for (kind, o) in resources {
        *objects.entry(kind.clone()).or_default() += 1;
        let row = resource_row(kind, o);
        if let Some(s) = row.shard {
            *per_shard.entry(s).or_default() += 1;
        }
        rows.push(row);
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
    if !shards.is_empty() {
        for (shard, n) in per_shard {
            shards.entry(shard).or_insert(ShardRow {
                shard,
                holder: None,
                renewed_seconds_ago: None,
                objects: n,
            });
        }
    }
    members.sort();
    rows.sort_by(|a, b| (&a.namespace, &a.kind, &a.name).cmp(&(&b.namespace, &b.kind, &b.name)));
    Report {
        namespace: None,
        shards: shards.into_values().collect(),
        members,
        objects,
        not_ready: rows.iter().filter(|r| r.ready != "True").count(),
        resources: rows,
        notes: Vec::new(),
    }
}

/// Columns padded to their widest cell, as kubectl prints them.
fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// Render the report as a table (`wide`: with the shard and the message).
pub fn render_table(r: &Report, wide: bool) -> String {
    let mut out = String::new();
    if r.resources.is_empty() {
        match &r.namespace {
            Some(ns) => out.push_str(&format!("No resources found in {ns} namespace.\n")),
            None => out.push_str("No resources found.\n"),
        }
    } else {
        let all = r.namespace.is_none();
        let mut header = vec![];
        if all {
            header.push("NAMESPACE");
        }
        header.extend(["KIND", "NAME", "READY", "REASON"]);
        if wide {
            header.extend(["SHARD", "MESSAGE"]);
        }
        let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
        for res in &r.resources {
            let mut row = vec![];
            if all {
                row.push(res.namespace.clone());
            }
            row.extend([
                res.kind.clone(),
                res.name.clone(),
                res.ready.clone(),
                res.reason.clone(),
            ]);
            if wide {
                row.push(res.shard.map_or_else(|| "-".to_owned(), |s| s.to_string()));
                row.push(res.message.clone());
            }
            rows.push(row);
        }
        out.push_str(&columns(&rows));
        out.push_str(&format!(
            "\n{} resources, {} not ready\n",
            r.resources.len(),
            r.not_ready
        ));
        for res in &r.resources {
            if let Some(held) = &res.held_reload {
                out.push_str(&format!(
                    "held reload: {} {}/{}: {held}\n",
                    res.kind, res.namespace, res.name
                ));
            }
        }
    }
    if !r.shards.is_empty() {
        let mut rows = vec![vec![
            "SHARD".to_owned(),
            "OWNER".to_owned(),
            "RENEWED".to_owned(),
            "OBJECTS".to_owned(),
        ]];
        for s in &r.shards {
            rows.push(vec![
                s.shard.to_string(),
                s.holder.clone().unwrap_or_else(|| "<none>".to_owned()),
                s.renewed_seconds_ago
                    .map_or_else(|| "-".to_owned(), |a| format!("{a}s ago")),
                s.objects.to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&columns(&rows));
        out.push_str(&format!(
            "members: {}\n",
            if r.members.is_empty() {
                "(none)".to_owned()
            } else {
                r.members.join(", ")
            }
        ));
    }
    for note in &r.notes {
        out.push_str(&format!("\nnote: {note}\n"));
    }
    out
}

/// Why a list failed, in words a user can act on.
fn list_error(what: &str, where_: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            format!("{what} in {where_} cannot be read: forbidden (needs list on {what})")
        }
        kube::Error::Api(s) if s.code == 404 => {
            format!("{what} are not served: are the CRDs installed?")
        }
        e => format!("{what} in {where_} could not be listed: {e}"),
    }
}

/// List the resources of `scope`: each kind the user may list, the others
/// noted.
async fn list_resources(
    client: &Client,
    scope: &Scope,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<(String, DynamicObject)>> {
    let where_ = match scope {
        Scope::All => "all namespaces".to_owned(),
        Scope::Namespace(ns) => format!("namespace {ns}"),
    };
    let mut resources = Vec::new();
    let mut failures = Vec::new();
    for KindInfo { kind, plural, .. } in KINDS {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(crate::api::GROUP, crate::api::VERSION, kind),
            plural,
        );
        let api: Api<DynamicObject> = match scope {
            Scope::All => Api::all_with(client.clone(), &ar),
            Scope::Namespace(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        };
        match api.list(&ListParams::default()).await {
            Ok(list) => resources.extend(list.items.into_iter().map(|o| (kind.to_owned(), o))),
            Err(e) => failures.push(list_error(
                &format!("{plural}.{}", crate::api::GROUP),
                &where_,
                &e,
            )),
        }
    }
    if failures.len() == KINDS.len() {
        anyhow::bail!("{}", failures.join("; "));
    }
    notes.extend(failures);
    Ok(resources)
}

/// Run the command.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let (client, context_ns) = cluster::connect(&args.cluster).await?;
    let scope = cluster::scope(&args.cluster, &context_ns);
    let mut notes = Vec::new();
    let resources = list_resources(&client, &scope, &mut notes).await?;
    let leases = match Api::<Lease>::namespaced(client.clone(), &args.operator.pod_namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            notes.push(format!(
                "{}; shard owners are not shown (--pod-namespace names the operator's namespace)",
                list_error(
                    "leases.coordination.k8s.io",
                    &format!("namespace {}", args.operator.pod_namespace),
                    &e
                )
            ));
            Vec::new()
        }
    };
    let prefix = lease_prefix(&args.operator, &leases).unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let mut report = build(&prefix, &leases, &resources, now);
    report.namespace = scope.namespace().map(str::to_owned);
    report.notes = notes;
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Yaml => print!("{}", serde_saphyr::to_string(&report)?),
        OutputFormat::Table => print!("{}", render_table(&report, false)),
        OutputFormat::Wide => print!("{}", render_table(&report, true)),
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
        assert_eq!(r.not_ready, 1);
        assert_eq!(r.resources.len(), 3);
        assert_eq!(r.resources[1].reason, "KMSUnavailable");
        assert_eq!(r.resources[1].ready, "False");
        assert_eq!(r.resources[0].ready, "True");
        let table = render_table(&r, false);
        assert!(table.contains("pod-a"), "{table}");
        assert!(table.contains("3 resources, 1 not ready"), "{table}");
        assert!(table.starts_with("NAMESPACE"), "{table}");
        assert!(!table.contains("MESSAGE"), "{table}");
        let wide = render_table(&r, true);
        assert!(
            wide.lines().next().unwrap().ends_with("SHARD   MESSAGE"),
            "{wide}"
        );
    }

    #[test]
    fn the_lease_prefix_is_found_from_the_shard_leases() {
        let leases = vec![
            lease("rel-secrets-operator-shard-00", Some("p"), Some(1)),
            lease("rel-secrets-operator-shard-01", Some("p"), Some(1)),
            lease("rel-secrets-operator-member-p", Some("p"), Some(1)),
            lease("other-shard-x", None, None),
        ];
        assert_eq!(
            detect_prefix(&leases).as_deref(),
            Some("rel-secrets-operator")
        );
        assert_eq!(detect_prefix(&[]), None);
    }

    #[test]
    fn one_namespace_prints_no_namespace_column_and_says_when_empty() {
        let resources = vec![("KmsSecret".to_owned(), resource("a", "x", 0, true))];
        let mut r = build("p", &[], &resources, 0);
        r.namespace = Some("a".to_owned());
        let table = render_table(&r, false);
        assert!(table.starts_with("KIND"), "{table}");
        assert!(
            !table.contains("SHARD"),
            "no Leases, no shard table: {table}"
        );
        let mut empty = build("p", &[], &[], 0);
        empty.namespace = Some("a".to_owned());
        empty.notes.push("leases cannot be read".to_owned());
        let table = render_table(&empty, false);
        assert!(
            table.starts_with("No resources found in a namespace."),
            "{table}"
        );
        assert!(table.contains("note: leases cannot be read"), "{table}");
    }
}
