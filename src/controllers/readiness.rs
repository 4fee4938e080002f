//! `kms_operator_resource_ready{kind, resource_namespace, status, reason}`: the
//! resources this replica owns, counted by kind, namespace and their Ready
//! condition, so that "my KmsSecrets are not Ready" can be alerted on
//! without a series per resource. Labels are bounded: no name, and reasons
//! from the closed set the operator writes (`Unknown`/`Pending` before the
//! first reconcile). With `--metrics-per-resource` (small installs) each
//! resource also gets `kms_operator_resource_condition{kind,
//! resource_namespace, name, status, reason} 1`. The resource's namespace
//! is `resource_namespace`: a scrape's own `namespace` label (the
//! operator's) would otherwise rename it to `exported_namespace`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::metrics::Metrics;

/// One resource's Ready condition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    /// Its kind.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The condition's reason (`Pending` before the first reconcile).
    pub reason: String,
}

/// The part of a resource the readiness gauge reads: its conditions'
/// type, status and reason, decoded from the cached JSON without the rest
/// of the resource.
#[derive(Debug, Default, serde::Deserialize)]
pub struct ReadyView {
    #[serde(default)]
    status: Option<StatusView>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct StatusView {
    #[serde(default)]
    conditions: Vec<ConditionView>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ConditionView {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: String,
}

impl Row {
    /// The row of a resource from its [`ReadyView`].
    pub fn of_view(kind: &'static str, namespace: &str, name: &str, view: &ReadyView) -> Row {
        let ready = view
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.as_str(), c.reason.as_str()));
        Row::of_ready(kind, namespace, name, ready)
    }

    /// The row of a resource with these conditions.
    pub fn of(kind: &'static str, namespace: &str, name: &str, conditions: &[Condition]) -> Row {
        let ready = conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.as_str(), c.reason.as_str()));
        Row::of_ready(kind, namespace, name, ready)
    }

    /// The row of a resource whose Ready condition has this status and
    /// reason (`None`: no Ready condition yet).
    fn of_ready(
        kind: &'static str,
        namespace: &str,
        name: &str,
        ready: Option<(&str, &str)>,
    ) -> Row {
        Row {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            status: ready.map_or("Unknown", |(status, _)| status).to_owned(),
            reason: ready
                .map(|(_, reason)| reason)
                .filter(|r| !r.is_empty())
                .unwrap_or("Pending")
                .to_owned(),
        }
    }
}

/// The label sets last published, to remove those that are gone.
#[derive(Default)]
pub struct Published {
    counts: BTreeSet<[String; 4]>,
    each: BTreeSet<[String; 5]>,
    /// The count of store changes and the shards owned when the rows were
    /// last gathered.
    gathered: Option<(u64, Vec<u32>)>,
}

impl Published {
    /// Whether the rows must be gathered again: a store changed
    /// (`changes`, see [`crate::controllers::packed::changes`]) or the
    /// shards owned are not those of the last gathering (the first time:
    /// always). Records `changes` and `shards` as gathered.
    pub fn stale(&mut self, changes: u64, shards: Vec<u32>) -> bool {
        let now = Some((changes, shards));
        if self.gathered == now {
            return false;
        }
        self.gathered = now;
        true
    }
}

/// Publish `rows` (the resources this replica owns now): counts always,
/// one series per resource when `per_resource`; label sets that no
/// longer occur are removed.
pub fn publish(metrics: &Metrics, rows: &[Row], per_resource: bool, last: &mut Published) {
    let mut counts: BTreeMap<[String; 4], i64> = BTreeMap::new();
    for r in rows {
        let key = [
            r.kind.to_owned(),
            r.namespace.clone(),
            r.status.clone(),
            r.reason.clone(),
        ];
        *counts.entry(key).or_default() += 1;
    }
    for (key, n) in &counts {
        let labels: Vec<&str> = key.iter().map(String::as_str).collect();
        metrics.resource_ready.with_label_values(&labels).set(*n);
    }
    for gone in last.counts.iter().filter(|k| !counts.contains_key(*k)) {
        let labels: Vec<&str> = gone.iter().map(String::as_str).collect();
        let _ = metrics.resource_ready.remove_label_values(&labels);
    }
    last.counts = counts.into_keys().collect();
    let each: BTreeSet<[String; 5]> = if per_resource {
        rows.iter()
            .map(|r| {
                [
                    r.kind.to_owned(),
                    r.namespace.clone(),
                    r.name.clone(),
                    r.status.clone(),
                    r.reason.clone(),
                ]
            })
            .collect()
    } else {
        BTreeSet::new()
    };
    for key in &each {
        let labels: Vec<&str> = key.iter().map(String::as_str).collect();
        metrics.resource_condition.with_label_values(&labels).set(1);
    }
    for gone in last.each.iter().filter(|k| !each.contains(*k)) {
        let labels: Vec<&str> = gone.iter().map(String::as_str).collect();
        let _ = metrics.resource_condition.remove_label_values(&labels);
    }
    last.each = each;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_gathered_again_only_when_a_store_or_the_shards_owned_changed() {
        let mut last = Published::default();
        assert!(last.stale(7, vec![1, 2]), "the first time");
        assert!(!last.stale(7, vec![1, 2]), "nothing changed");
        assert!(last.stale(8, vec![1, 2]), "a store changed");
        assert!(!last.stale(8, vec![1, 2]));
        assert!(last.stale(8, vec![1]), "a shard lost");
        assert!(last.stale(8, vec![1, 3]), "a shard gained");
        assert!(!last.stale(8, vec![1, 3]));
    }

    fn condition(status: &str, reason: &str) -> Condition {
        serde_json::from_value(
            serde_json::json!({"type": "Ready", "status": status, "reason": reason,
            "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        )
        .unwrap()
    }

    /// The gauge reads a resource's cached JSON through the view: the same
    /// row as from the decoded conditions, and `Unknown`/`Pending` without
    /// a status.
    #[test]
    fn the_view_reads_the_ready_condition_from_the_json() {
        let json = serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": "x", "namespace": "a", "labels": {"l": "v"}},
            "spec": {"resyncInterval": "1m"},
            "status": {"observedGeneration": 2, "conditions": [
                {"type": "secrets.hanzo.ai/ReadyToSyncSecrets", "status": "False", "reason": "KMSRateLimited",
                 "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "False", "reason": "FolderNotFound",
                 "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        });
        let view: ReadyView = serde_json::from_value(json).unwrap();
        let row = Row::of_view("KmsSecret", "a", "x", &view);
        assert_eq!(
            (row.status.as_str(), row.reason.as_str()),
            ("False", "FolderNotFound")
        );
        assert_eq!(
            row,
            Row::of(
                "KmsSecret",
                "a",
                "x",
                &[{
                    let mut c = condition("False", "FolderNotFound");
                    c.message.clear();
                    c
                }]
            )
        );
        let bare: ReadyView =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "y"}})).unwrap();
        let row = Row::of_view("KmsSecret", "a", "y", &bare);
        assert_eq!(
            (row.status.as_str(), row.reason.as_str()),
            ("Unknown", "Pending")
        );
    }

    #[test]
    fn counts_by_kind_namespace_and_condition_and_forgets_what_is_gone() {
        let metrics = Metrics::new(1);
        let mut last = Published::default();
        let rows = vec![
            Row::of("KmsSecret", "a", "x", &[condition("True", "Synced")]),
            Row::of("KmsSecret", "a", "y", &[condition("True", "Synced")]),
            Row::of(
                "KmsSecret",
                "a",
                "z",
                &[condition("False", "FolderNotFound")],
            ),
            Row::of("KmsPushSecret", "b", "p", &[]),
        ];
        publish(&metrics, &rows, false, &mut last);
        let text = metrics.encode();
        assert!(text.contains(r#"kms_operator_resource_ready{kind="KmsSecret",reason="Synced",resource_namespace="a",status="True"} 2"#), "{text}");
        assert!(text.contains(r#"kms_operator_resource_ready{kind="KmsSecret",reason="FolderNotFound",resource_namespace="a",status="False"} 1"#), "{text}");
        assert!(text.contains(r#"kms_operator_resource_ready{kind="KmsPushSecret",reason="Pending",resource_namespace="b",status="Unknown"} 1"#), "{text}");
        assert!(
            !text.contains("kms_operator_resource_condition{"),
            "per resource is opt-in"
        );
        // z recovers, p moves to another replica: their series go.
        let rows = vec![
            Row::of("KmsSecret", "a", "x", &[condition("True", "Synced")]),
            Row::of("KmsSecret", "a", "z", &[condition("True", "Synced")]),
        ];
        publish(&metrics, &rows, true, &mut last);
        let text = metrics.encode();
        let ready: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("kms_operator_resource_ready{"))
            .collect();
        assert_eq!(ready.len(), 1, "{ready:#?}");
        assert!(
            ready[0].ends_with(r#"reason="Synced",resource_namespace="a",status="True"} 2"#),
            "{ready:#?}"
        );
        assert!(text.contains(r#"kms_operator_resource_condition{kind="KmsSecret",name="z",reason="Synced",resource_namespace="a",status="True"} 1"#), "{text}");
        publish(&metrics, &rows, false, &mut last);
        assert!(
            !metrics
                .encode()
                .contains("kms_operator_resource_condition{")
        );
    }
}
