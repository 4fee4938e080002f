//! `kms-operator check` (the chart's `helm test`, also `kubectl kms check`):
//! is this installation healthy? The CRDs are served, the StatefulSet runs
//! the replicas it should and all of them are Ready, every shard has a
//! holder that renews its Lease, and the resources named on the command line
//! are Ready. Prints one line per check and exits non-zero when one fails.
//! Writes nothing.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};

use crate::cli::CheckArgs;
use crate::cluster;

/// The outcome of one check: what was checked and, when it failed, why.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// What holds (or what was checked).
    pub what: String,
    /// Why it does not hold; `None` when it does.
    pub failure: Option<String>,
}

impl Outcome {
    fn ok(what: impl Into<String>) -> Self {
        Outcome {
            what: what.into(),
            failure: None,
        }
    }

    fn fail(what: impl Into<String>, why: impl Into<String>) -> Self {
        Outcome {
            what: what.into(),
            failure: Some(why.into()),
        }
    }
}

/// The resources of the API group that must be served: the three kinds
/// and ClusterGenerators.
fn resources() -> impl Iterator<Item = &'static str> {
    crate::api::kinds::KINDS
        .iter()
        .map(|k| k.plural)
        .chain(["clustergenerators"])
}

/// The served resources against the kinds (pure).
pub fn crds_served(served: &[String]) -> Outcome {
    let missing: Vec<&str> = resources()
        .filter(|r| !served.iter().any(|s| s == r))
        .collect();
    let group = format!("{}/{}", crate::api::GROUP, crate::api::VERSION);
    if missing.is_empty() {
        Outcome::ok(format!("the CRDs of {group} are served"))
    } else {
        Outcome::fail(
            format!("the CRDs of {group} are served"),
            format!(
                "not served: {}; install the chart's CRDs (`kms-operator crds | kubectl apply --server-side -f -`)",
                missing.join(", ")
            ),
        )
    }
}

/// The StatefulSet's replicas against the count expected (pure).
pub fn replicas_ready(name: &str, sts: Option<&StatefulSet>, expected: Option<u32>) -> Outcome {
    let Some(sts) = sts else {
        return Outcome::fail(
            format!("StatefulSet {name}"),
            "not found (--statefulset names the operator's StatefulSet)",
        );
    };
    let wanted = sts.spec.replicas.unwrap_or(1);
    let status = sts.status.clone().unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    let what = format!("StatefulSet {name}: {ready} of {wanted} replicas Ready");
    if let Some(expected) = expected
        && i64::from(wanted) < i64::from(expected)
    {
        return Outcome::fail(
            what,
            format!(
                "it runs {wanted} replicas where the release asks for {expected} (scaled by hand? `helm upgrade` or `kubectl scale --replicas={expected}` restores them)"
            ),
        );
    }
    if ready < wanted {
        return Outcome::fail(
            what,
            format!(
                "{} replica(s) not Ready: `kubectl describe pod` and the pods' logs say why",
                wanted - ready
            ),
        );
    }
    Outcome::ok(what)
}

/// Every shard `0..shards` has its Lease, with a holder that renewed it
/// within its duration; the failure names each shard that does not (pure;
/// `now` in Unix seconds).
pub fn shards_held(prefix: &str, leases: &[Lease], shards: u32, now: i64) -> Outcome {
    let mut unheld = Vec::new();
    for shard in 0..shards {
        let name = shard::shard_lease_name(prefix, shard);
        let spec = leases
            .iter()
            .find(|l| l.name_any() == name)
            .and_then(|l| l.spec.clone());
        let Some(spec) = spec else {
            unheld.push(format!("shard {shard}: no Lease {name}"));
            continue;
        };
        match (
            spec.holder_identity.filter(|h| !h.is_empty()),
            spec.renew_time,
        ) {
            (Some(holder), Some(renewed)) => {
                let age = now - renewed.0.as_second();
                let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
                if age > duration {
                    unheld.push(format!(
                        "shard {shard}: {holder} last renewed {age} s ago (the Lease lasts {duration} s)"
                    ));
                }
            }
            _ => unheld.push(format!("shard {shard}: no holder")),
        }
    }
    let what = format!("{shards} shards held and renewed (Leases {prefix}-shard-NN)");
    if unheld.is_empty() {
        Outcome::ok(what)
    } else {
        Outcome::fail(what, unheld.join("; "))
    }
}

/// A resource's Ready condition (pure), read as `kms-operator status`
/// reads it.
pub fn resource_ready(kind: &str, ns: &str, name: &str, o: Option<&DynamicObject>) -> Outcome {
    let what = format!("{kind} {ns}/{name} is Ready");
    let Some(o) = o else {
        return Outcome::fail(what, "not found");
    };
    let row = crate::status::resource_row(kind, o);
    if row.ready == "True" {
        Outcome::ok(what)
    } else {
        Outcome::fail(
            what,
            format!("Ready is {} ({}): {}", row.ready, row.reason, row.message),
        )
    }
}

/// The lines printed for the outcomes.
pub fn render(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for o in outcomes {
        match &o.failure {
            None => out.push_str(&format!("ok    {}\n", o.what)),
            Some(why) => out.push_str(&format!("FAIL  {}: {why}\n", o.what)),
        }
    }
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    out.push_str(&if failed == 0 {
        format!("{} checks passed\n", outcomes.len())
    } else {
        format!("{failed} of {} checks failed\n", outcomes.len())
    });
    out
}

/// `KIND/NAME` or `NAME` (a KmsSecret) → (kind, plural, name).
pub(crate) fn parse_resource(arg: &str) -> anyhow::Result<(&'static str, &'static str, String)> {
    let (kind, name) = arg.split_once('/').unwrap_or(("KmsSecret", arg));
    let found = crate::api::kinds::KINDS.iter().find(|k| {
        let r = k.plural;
        k.kind.eq_ignore_ascii_case(kind) || r == kind || r.strip_suffix('s') == Some(kind)
    });
    let Some(&crate::api::kinds::KindInfo { kind, plural, .. }) = found else {
        let known: Vec<&str> = crate::api::kinds::KINDS.iter().map(|k| k.kind).collect();
        anyhow::bail!("{arg}: unknown kind {kind:?} ({})", known.join(", "));
    };
    if name.is_empty() {
        anyhow::bail!("{arg}: no name");
    }
    Ok((kind, plural, name.to_owned()))
}

/// Run the command; the process exits 1 when a check fails.
pub async fn run(args: CheckArgs) -> anyhow::Result<bool> {
    let wanted = args
        .resources
        .iter()
        .map(|r| parse_resource(r))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (client, context_ns) = cluster::connect(&args.cluster).await?;
    let ns = args.cluster.namespace.clone().unwrap_or(context_ns);
    let mut outcomes = Vec::new();
    let group = format!("{}/{}", crate::api::GROUP, crate::api::VERSION);
    // A group not served at all is a 404; any other failure is reported as
    // itself, not as missing CRDs.
    outcomes.push(match client.list_api_group_resources(&group).await {
        Ok(list) => crds_served(
            &list
                .resources
                .into_iter()
                .map(|r| r.name)
                .collect::<Vec<_>>(),
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => crds_served(&[]),
        Err(e) => Outcome::fail(
            format!("the CRDs of {group} are served"),
            format!("API discovery failed: {e}"),
        ),
    });
    if let Some(name) = &args.statefulset {
        let sts = Api::<StatefulSet>::namespaced(client.clone(), &args.operator.pod_namespace)
            .get_opt(name)
            .await?;
        outcomes.push(replicas_ready(name, sts.as_ref(), args.replicas));
    }
    let leases = Api::<Lease>::namespaced(client.clone(), &args.operator.pod_namespace)
        .list(&ListParams::default())
        .await?
        .items;
    let prefix = crate::status::lease_prefix(&args.operator, &leases);
    match prefix {
        Some(prefix) => {
            let shards = args.shards.unwrap_or_else(|| {
                let n = leases
                    .iter()
                    .filter(|l| l.name_any().starts_with(&format!("{prefix}-shard-")))
                    .count();
                u32::try_from(n).unwrap_or(u32::MAX)
            });
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            outcomes.push(shards_held(&prefix, &leases, shards, now));
        }
        None => outcomes.push(Outcome::fail(
            format!("shards held (namespace {})", args.operator.pod_namespace),
            "no shard Leases: is the operator running there? (--pod-namespace)",
        )),
    }
    for (kind, plural, name) in wanted {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(crate::api::GROUP, crate::api::VERSION, kind),
            plural,
        );
        let o = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar)
            .get_opt(&name)
            .await?;
        outcomes.push(resource_ready(kind, &ns, &name, o.as_ref()));
    }
    print!("{}", render(&outcomes));
    Ok(outcomes.iter().all(|o| o.failure.is_none()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts(wanted: i32, ready: i32) -> StatefulSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "op"},
            "spec": {"replicas": wanted, "selector": {}, "template": {}, "serviceName": "x"},
            "status": {"replicas": wanted, "readyReplicas": ready}
        }))
        .unwrap()
    }

    fn lease(name: &str, holder: Option<&str>, renewed: i64) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "renewTime": k8s_openapi::jiff::Timestamp::from_second(renewed).unwrap().to_string(),
            }
        }))
        .unwrap()
    }

    #[test]
    fn crds_name_what_is_missing() {
        let all: Vec<String> = resources().map(str::to_owned).collect();
        assert_eq!(crds_served(&all).failure, None);
        let why = crds_served(&all[..2]).failure.unwrap();
        assert!(
            why.contains("kmsdynamicsecrets, clustergenerators"),
            "{why}"
        );
    }

    #[test]
    fn a_statefulset_scaled_below_the_release_fails() {
        assert_eq!(
            replicas_ready("op", Some(&sts(3, 3)), Some(3)).failure,
            None
        );
        let why = replicas_ready("op", Some(&sts(2, 2)), Some(3))
            .failure
            .unwrap();
        assert!(
            why.contains("runs 2 replicas where the release asks for 3"),
            "{why}"
        );
        let why = replicas_ready("op", Some(&sts(3, 2)), Some(3))
            .failure
            .unwrap();
        assert!(why.starts_with("1 replica(s) not Ready"), "{why}");
        assert!(replicas_ready("op", None, Some(3)).failure.is_some());
    }

    #[test]
    fn every_shard_needs_a_fresh_holder() {
        let leases = vec![
            lease("p-shard-00", Some("a"), 100),
            lease("p-shard-01", None, 100),
            lease("p-shard-02", Some("b"), 50),
        ];
        let out = shards_held("p", &leases, 4, 110);
        let why = out.failure.clone().unwrap();
        assert!(!why.contains("shard 0"), "{why}");
        assert!(why.contains("shard 1: no holder"), "{why}");
        assert!(
            why.contains("shard 2: b last renewed 60 s ago (the Lease lasts 15 s)"),
            "{why}"
        );
        assert!(why.contains("shard 3: no Lease p-shard-03"), "{why}");
        assert_eq!(shards_held("p", &leases[..1], 1, 110).failure, None);
    }

    #[test]
    fn a_resource_is_ready_or_says_why_not() {
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": "app", "namespace": "a"},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "CredentialsNotFound", "message": "Secret a/creds not found"}]}
        }))
        .unwrap();
        let why = resource_ready("KmsSecret", "a", "app", Some(&o))
            .failure
            .unwrap();
        assert_eq!(
            why,
            "Ready is False (CredentialsNotFound): Secret a/creds not found"
        );
        assert_eq!(
            resource_ready("KmsSecret", "a", "x", None)
                .failure
                .as_deref(),
            Some("not found")
        );
        let text = render(&[
            Outcome::ok("one"),
            resource_ready("KmsSecret", "a", "app", Some(&o)),
        ]);
        assert!(
            text.starts_with("ok    one\nFAIL  KmsSecret a/app is Ready: Ready is False"),
            "{text}"
        );
        assert!(text.ends_with("1 of 2 checks failed\n"), "{text}");
    }

    #[test]
    fn resources_are_named_as_kubectl_names_them() {
        assert_eq!(parse_resource("app").unwrap().0, "KmsSecret");
        assert_eq!(
            parse_resource("kmspushsecret/p").unwrap().0,
            "KmsPushSecret"
        );
        assert_eq!(
            parse_resource("KmsDynamicSecret/d").unwrap().1,
            "kmsdynamicsecrets"
        );
        assert!(parse_resource("Secret/x").is_err());
        assert!(parse_resource("KmsSecret/").is_err());
    }
}
