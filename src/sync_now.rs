//! `kms-operator sync` (also `kubectl kms sync`): ask the operator to sync a
//! resource now and wait for the result. It sets the annotation
//! `secrets.hanzo.ai/force-sync` to a new value (the time), waits until the
//! resource's status records that value (the owning replica ran a full
//! sync for it), and prints the `Ready` condition; exit status 1 when the
//! resource is not Ready or the wait timed out.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use serde::de::DeserializeOwned;

use crate::api::kms_dynamic_secret::KmsDynamicSecret;
use crate::api::kms_push_secret::KmsPushSecret;
use crate::api::kms_secret::KmsSecret;
use crate::cli::SyncArgs;
use crate::cluster;
use crate::controllers::force_sync::{self, Forceable};

/// The Ready condition of a resource (its status, reason and message), or
/// none yet.
fn ready_of<K: Forceable>(o: &K) -> Option<(String, String, String)> {
    let c = o.conditions().iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
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

/// A kind `sync` can ask and watch.
trait Syncable:
    Forceable<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static
{
}

impl<K: Forceable<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static> Syncable
    for K
{
}

async fn sync_one<K: Syncable>(
    api: Api<K>,
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
    let done = await_condition(api.clone(), name, move |o: Option<&K>| {
        o.is_some_and(|o| o.handled() == Some(wanted.as_str()))
    });
    let last = match tokio::time::timeout(timeout, done).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => anyhow::bail!("{what}: watching for the result: {e}"),
        Err(_) => api.get_opt(name).await.ok().flatten(),
    };
    let handled = last.as_ref().and_then(|o| o.handled()) == Some(value.as_str());
    let (line, ok) = outcome(what, &value, handled, last.as_ref().and_then(ready_of));
    println!("{line}");
    Ok(ok)
}

/// Run the command; `Ok(false)` when the resource is not Ready afterwards.
pub async fn run(args: SyncArgs) -> anyhow::Result<bool> {
    let (kind, _, name) = crate::check::parse_resource(&args.resource)?;
    let (client, context_ns) = cluster::connect(&args.cluster).await?;
    let ns = args.cluster.namespace.clone().unwrap_or(context_ns);
    let what = format!("{kind} {ns}/{name}");
    // The same steps for each kind, typed.
    macro_rules! sync_kind {
        ($k:ty) => {
            sync_one(
                Api::<$k>::namespaced(client, &ns),
                &what,
                &name,
                args.timeout,
            )
            .await
        };
    }
    match kind {
        "KmsPushSecret" => sync_kind!(KmsPushSecret),
        "KmsDynamicSecret" => sync_kind!(KmsDynamicSecret),
        _ => sync_kind!(KmsSecret),
    }
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
