//! The KmsSecret watch: a resource is queued when it is created, deleted, or
//! its generation, labels, annotations or deletion mark change (not on the
//! operator's own status writes), and the Secrets it reads or writes are
//! indexed so that a change of one of them queues it.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::ResourceExt;
use kube::runtime::watcher;

use super::{owner_id, plan};
use crate::api::kms_secret::{KmsSecret, KmsSecretStatus};
use crate::controllers::key::ObjectKey;
use crate::controllers::refs::written_ref;
use crate::controllers::registry::{Registered, Watching, Wiring, queue_on_change};
use crate::controllers::stores::Scoped;
use crate::controllers::written::WrittenStatus;

/// What makes a KmsSecret worth reconciling: generation, labels,
/// annotations, deletion.
type Fingerprint = (
    Option<i64>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    bool,
);

fn fingerprint(o: &KmsSecret) -> Fingerprint {
    (
        o.metadata.generation,
        o.labels().clone(),
        o.annotations().clone(),
        o.metadata.deletion_timestamp.is_some(),
    )
}

/// The KmsSecret kind, registered: its queue, watches and controller.
pub fn kind(w: &Wiring<'_>) -> Registered {
    let kms = w.kms.clone();
    w.register(
        |watching| {
            let (gate, queue) = (watching.gate.clone(), watching.queue.clone());
            let written = Arc::new(WrittenStatus::default());
            let (store, drivers) = watch(watching, written.clone());
            let controller = super::Controller::new(kms, gate, store, queue, written);
            (controller, drivers)
        },
        |c| c.store.clone(),
    )
}

/// Secrets a KmsSecret reads (credentials, CA) or writes, as `(namespace,
/// name)`. A target counts too: one the resource may not write yet (it
/// carries no adoption marker) is taken over as soon as someone adds the
/// marker, not at the resource's next retry.
pub fn referenced_secrets(o: &KmsSecret) -> Vec<(String, String)> {
    let ns = o.namespace().unwrap_or_default();
    let pick = |r_ns: Option<&String>, name: &str| written_ref(&ns, r_ns, name);
    // The method as the reconcile reads it (namespaces as written: whether
    // they are allowed is checked when reconciling).
    let mut out: Vec<(String, String)> = plan::auth_choice(&o.spec, &ns, true)
        .ok()
        .and_then(|c| c.method.secret_read().cloned())
        .into_iter()
        .collect();
    if let Some(ca) = o.spec.tls.as_ref().and_then(|t| t.ca_ref.as_ref()) {
        out.push(pick(ca.secret_namespace.as_ref(), &ca.secret_name));
    }
    for t in o
        .spec
        .managed_secret_reference
        .iter()
        .chain(o.spec.managed_kube_secret_references.iter().flatten())
    {
        out.push(pick(t.secret_namespace.as_ref(), &t.secret_name));
    }
    out
}

/// Watch KmsSecrets into a cache, feeding `queue` (and dropping from
/// `written` each status write the watch delivers); the cache and the
/// futures that drive the watch.
pub fn watch(
    w: Watching<'_>,
    written: Arc<WrittenStatus<KmsSecretStatus>>,
) -> (Scoped<KmsSecret>, Vec<BoxFuture<'static, ()>>) {
    let (watches, gate, queue, index) = (w.watches, w.gate, w.queue, w.refs);
    let observe = move |o: &KmsSecret, key: &ObjectKey, deleted: bool| {
        if let (Some(uid), Some(rv)) = (&o.metadata.uid, &o.metadata.resource_version) {
            written.seen(uid, rv);
        }
        let owner = owner_id(&key.namespace, &key.name);
        if deleted {
            index.remove(&owner);
        } else {
            index.set(&owner, referenced_secrets(o));
        }
        false
    };
    watches.watch::<KmsSecret, _>(
        &watcher::Config::default(),
        queue_on_change(gate, queue, fingerprint, observe),
    )
}
