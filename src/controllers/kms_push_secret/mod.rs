//! The KmsPushSecret controller: push the keys of a Kubernetes Secret (and generated values) into a KMS folder.

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::error::SyncError;
use super::queue::Queue;
use super::stores::{self, Scoped};
use super::{Action, Context, ObjectKey, Reconciler, RefIndex};
use crate::api::KmsPushSecret;
use crate::sharding::Ownership;

/// The controller's metric label.
pub const CONTROLLER: &str = "kmspushsecret";

/// The controller's watched state.
pub struct Controller {
    /// Watched resources.
    pub resources: Scoped<KmsPushSecret>,
}

/// Start watching the resources; every event queues its object.
pub fn watch(
    client: &Client,
    namespaces: &[String],
    gate: Arc<dyn Ownership>,
    queue: Arc<Queue<ObjectKey>>,
    _refs: Arc<RefIndex>,
) -> (Controller, Vec<BoxFuture<'static, ()>>) {
    let (resources, drivers) = stores::watch::<KmsPushSecret, _>(
        client,
        namespaces,
        &watcher::Config::default(),
        move |event| {
            let o = match event {
                Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => o,
                Event::Init | Event::InitDone => return,
            };
            let key = ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any());
            let shard = gate.shard_of(&key.namespace);
            queue.add(key, shard);
        },
    );
    (Controller { resources }, drivers)
}

impl Reconciler<ObjectKey> for Controller {
    fn reconcile<'a>(
        &'a self,
        _ctx: &'a Context,
        _key: &'a ObjectKey,
        _shard: u32,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Action, SyncError>> {
        Box::pin(async { Ok(Action::Done) })
    }
}
