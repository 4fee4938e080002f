//! `kms-operator sync` (also `kubectl kms sync`): ask the operator to sync a
//! resource now and wait for the result. It sets the annotation
//! `secrets.hanzo.ai/force-sync` to a new value (the time), waits until the
//! resource's status records that value (the owning replica ran a full
//! sync for it), and prints the `Ready` condition; exit status 1 when the
//! resource is not Ready or the wait timed out.

use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::await_condition;

use crate::api::{GROUP, VERSION};
use crate::cli::SyncArgs;
use crate::cluster;
use crate::controllers::force_sync;

/// The `forceSync` value a resource's status records.
fn handled(o: &DynamicObject) -> Option<&str> {
    o.data.pointer("/status/forceSync")?.as_str()
}

/// The Ready condition of a resource (its status, reason and message), or
/// none yet.
fn ready_of(o: &DynamicObject) -> Option<(String, String, String)> {
    let conditions = o.data.pointer("/status/conditions")?.as_array()?;
    let c = conditions.iter().find(|c| c["type"] == "Ready")?;
    let field = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    Some((field("status"), field("reason"), field("message")))
}

/// The line printed for the outcome, and whether it is a success (pure).
pub fn outcome(
    what: &str,
    value: &str,
    handled: bool,
    ready: Option<(String, String, String)>,
) -> (String, bool) {
    let (status, reason, message) = ready.unwrap_or_else(|| {
        (
            "Unknown".into(),
            "Pending".into(),
            "not reconciled yet".into(),
        )
    });
    if !handled {
        return (
            format!(
                "{what}: the sync asked for ({} {value}) has not run yet; Ready is {status} ({reason}): {message}",
                force_sync::ANNOTATION
            ),
            false,
        );
    }
    let ok = status == "True";
    (
        format!(
            "{what} {}: Ready is {status} ({reason}): {message}",
            if ok { "synced" } else { "not synced" }
        ),
        ok,
    )
}

async fn sync_one(
    api: Api<DynamicObject>,
    what: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let value = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"metadata": {"annotations": {force_sync::ANNOTATION: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| anyhow::anyhow!("{what}: setting {}: {e}", force_sync::ANNOTATION))?;
    let wanted = value.clone();
    let done = await_condition(api.clone(), name, move |o: Option<&DynamicObject>| {
        o.is_some_and(|o| handled(o) == Some(wanted.as_str()))
    });
    let last = match tokio::time::timeout(timeout, done).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => anyhow::bail!("{what}: watching for the result: {e}"),
        Err(_) => api.get_opt(name).await.ok().flatten(),
    };
    let done = last.as_ref().and_then(handled) == Some(value.as_str());
    let (line, ok) = outcome(what, &value, done, last.as_ref().and_then(ready_of));
    println!("{line}");
    Ok(ok)
}

/// Run the command; `Ok(false)` when the resource is not Ready afterwards.
pub async fn run(args: SyncArgs) -> anyhow::Result<bool> {
    let (kind, plural, name) = crate::check::parse_resource(&args.resource)?;
    let (client, context_ns) = cluster::connect(&args.cluster).await?;
    let ns = args.cluster.namespace.clone().unwrap_or(context_ns);
    let what = format!("{kind} {ns}/{name}");
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural);
    let api = Api::<DynamicObject>::namespaced_with(client, &ns, &resource);
    sync_one(api, &what, &name, args.timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_says_whether_the_sync_ran_and_how_it_ended() {
        let ready = |s: &str| Some((s.to_owned(), "R".to_owned(), "m".to_owned()));
        assert_eq!(
            outcome("KmsSecret a/b", "t", true, ready("True")),
            (
                "KmsSecret a/b synced: Ready is True (R): m".to_owned(),
                true
            )
        );
        assert!(!outcome("KmsSecret a/b", "t", true, ready("False")).1);
        let (line, ok) = outcome("KmsSecret a/b", "t", false, None);
        assert!(!ok);
        assert!(
            line.contains("(secrets.hanzo.ai/force-sync t) has not run yet; Ready is Unknown"),
            "{line}"
        );
    }
}
