//! Re-arm: a scheduled resync of a resource that nothing touched since its
//! last sync, done without a reconcile.
//!
//! A resync of a resource in step costs one conditional request for its
//! folder, shared by every resource of that folder due at the same moment
//! ([`super::plan::on_grid`]), and then a whole reconcile per resource:
//! decode it, observe its targets, plan, prune, compute its status, only
//! to find that nothing changed. At 100,000 resources that was hundreds of
//! reconciles a second per replica for nothing.
//!
//! So a sync that left a resource in step leaves it a [`Ticket`]: the
//! versions of the resource and of each target as that sync saw them, the
//! global configuration's change count, and the identity, folder and ETag
//! it fetched with. When the resource next comes due on its schedule, and
//! the resource, every target and the configuration are still at those
//! versions (read from the caches without decoding anything), the resync
//! is only the folder's conditional request: a `304` moves its next check
//! on (in memory and in the persistent cache) and that is all. Anything
//! else (an answer with data, an error, a version moved, no ticket) falls
//! through to the whole reconcile, which takes the same answer (shared for
//! two seconds) rather than asking again.
//!
//! A ticket is taken only on a scheduled resync: every other way a resource
//! comes due (its spec, a target or a credential changed, a `force-sync`, a
//! change heard from the KMS) is a whole reconcile, which issues the next
//! ticket or revokes it. Resources with instant updates get none (their
//! stream decides when they fetch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::controllers::key::ObjectKey;
use crate::controllers::target::TargetKind;
use crate::kms::{Identity, Scope};

/// One target as the sync that issued a ticket saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TargetSeen {
    pub(super) kind: TargetKind,
    pub(super) namespace: Box<str>,
    pub(super) name: Box<str>,
    /// Its `resourceVersion` as a number.
    pub(super) version: u64,
}

/// Who fetches which folder (one per folder, shared by its tickets), and
/// the last ETag the KMS confirmed for it by ticket.
pub(super) struct Folder {
    pub(super) identity: Identity,
    pub(super) scope: Scope,
    /// The ETag a `304` confirmed, and when the request that said so
    /// started.
    confirmed: Mutex<Option<(Instant, Box<str>)>>,
    /// Held by the resource asking the KMS client for the folder: the
    /// others due with it wait for its answer rather than each reaching
    /// the client.
    pub(super) asking: tokio::sync::Mutex<()>,
}

impl Folder {
    pub(super) fn new(identity: Identity, scope: Scope) -> Self {
        Self {
            identity,
            scope,
            confirmed: Mutex::new(None),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// The KMS said `etag` was current in answer to a request that started
    /// at `started`.
    pub(super) fn confirm(&self, etag: &str, started: Instant) {
        let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        if confirmed.as_ref().is_none_or(|(at, _)| *at <= started) {
            *confirmed = Some((started, etag.into()));
        }
    }

    /// Whether `etag` was confirmed by a request that started at or after
    /// `not_before` (as an answer the KMS client shares would be).
    pub(super) fn confirmed(&self, etag: &str, not_before: Instant) -> bool {
        self.confirmed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|(at, e)| *at >= not_before && &**e == etag)
    }
}

/// What a resync needs to move a resource's next check on without a
/// reconcile, and the versions under which that is sound.
pub(super) struct Ticket {
    pub(super) uid: Box<str>,
    pub(super) shard: u32,
    /// The resource's `resourceVersion` as a number.
    pub(super) version: u64,
    /// The global configuration's change count.
    pub(super) epoch: u64,
    pub(super) folder: Arc<Folder>,
    /// The ETag the folder's data had.
    pub(super) etag: Box<str>,
    pub(super) interval: Duration,
    /// The folder's offset on the grid of resyncs
    /// ([`super::plan::phase_of`]).
    pub(super) phase: f64,
    pub(super) targets: Box<[TargetSeen]>,
    /// After this the whole reconcile runs again, whatever the versions say
    /// ([`SERVES`] resyncs after it was issued).
    pub(super) expires: SystemTime,
}

/// How many resync intervals a ticket serves before a whole reconcile
/// checks everything again: what no event told of (an object deleted while
/// a watch was down and re-listed, a credential's Secret gone) is found
/// within that many intervals, and nine in ten resyncs of a resource left
/// alone need no reconcile.
pub(super) const SERVES: u32 = 10;

/// The tickets of one controller, by resource.
#[derive(Default)]
pub(super) struct Tickets {
    by_key: Mutex<HashMap<ObjectKey, Arc<Ticket>>>,
    /// Folders by identity key and scope, so that the tickets of one
    /// folder share one copy of its identity.
    folders: Mutex<HashMap<(crate::kms::IdentityKey, Scope), Arc<Folder>>>,
}

impl Tickets {
    /// The folder of `identity` and `scope`, shared with the tickets that
    /// name it already.
    pub(super) fn folder(&self, identity: &Identity, scope: &Scope) -> Arc<Folder> {
        let mut folders = self.folders.lock().unwrap_or_else(|e| e.into_inner());
        folders
            .entry((identity.key(), scope.clone()))
            .or_insert_with(|| Arc::new(Folder::new(identity.clone(), scope.clone())))
            .clone()
    }

    /// Leave `key` a ticket (replacing the one it had).
    pub(super) fn issue(&self, key: &ObjectKey, ticket: Ticket) {
        self.lock().insert(key.clone(), Arc::new(ticket));
    }

    /// Take `key`'s ticket away.
    pub(super) fn revoke(&self, key: &ObjectKey) {
        self.lock().remove(key);
    }

    /// `key`'s ticket.
    pub(super) fn get(&self, key: &ObjectKey) -> Option<Arc<Ticket>> {
        self.lock().get(key).cloned()
    }

    /// Keep the tickets `keep` accepts, and the folders some ticket names.
    pub(super) fn retain(&self, mut keep: impl FnMut(&ObjectKey, &Ticket) -> bool) {
        self.lock().retain(|k, t| keep(k, t));
        self.folders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, f| Arc::strong_count(f) > 1);
    }

    /// How many resources hold a ticket.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Arc<Ticket>>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether everything a ticket was issued under still holds at `now`: it
/// has not expired, and the resource, each target (`version_of` reads a
/// target's cached version) and the global configuration are at the
/// versions it names (pure).
pub(super) fn holds(
    ticket: &Ticket,
    now: SystemTime,
    version: Option<u64>,
    epoch: u64,
    version_of: impl Fn(&TargetSeen) -> Option<u64>,
) -> bool {
    now < ticket.expires
        && version == Some(ticket.version)
        && ticket.version != 0
        && epoch == ticket.epoch
        && ticket
            .targets
            .iter()
            .all(|t| t.version != 0 && version_of(t) == Some(t.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(targets: &[(&str, u64)]) -> Ticket {
        let identity = Identity {
            endpoint: crate::kms::Endpoint::new("https://kms.example/api", None).unwrap(),
            credentials: crate::kms::Credentials::ServiceToken {
                token: "st.x.y".to_owned().into(),
            },
        };
        let scope = Scope {
            project: crate::kms::ProjectRef::Slug("p".into()),
            environment: "dev".into(),
            path: "/".into(),
            recursive: false,
            secret_name: None,
        };
        Ticket {
            uid: "u".into(),
            shard: 3,
            version: 10,
            epoch: 1,
            folder: Arc::new(Folder::new(identity, scope)),
            etag: "e".into(),
            interval: Duration::from_secs(60),
            phase: 0.5,
            expires: SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
            targets: targets
                .iter()
                .map(|(name, version)| TargetSeen {
                    kind: TargetKind::Secret,
                    namespace: "ns".into(),
                    name: (*name).into(),
                    version: *version,
                })
                .collect(),
        }
    }

    #[test]
    fn a_ticket_holds_only_while_nothing_it_names_moved() {
        let t = ticket(&[("a", 20), ("b", 21)]);
        let targets = |a: Option<u64>, b: Option<u64>| {
            move |t: &TargetSeen| if &*t.name == "a" { a } else { b }
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(999);
        let holds = |t: &Ticket, v, e, f| holds(t, now, v, e, f);
        assert!(holds(&t, Some(10), 1, targets(Some(20), Some(21))));
        // It expired.
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        assert!(!super::holds(
            &t,
            later,
            Some(10),
            1,
            targets(Some(20), Some(21))
        ));
        // The resource changed (its spec, annotations, a status written
        // elsewhere), or is gone.
        assert!(!holds(&t, Some(11), 1, targets(Some(20), Some(21))));
        assert!(!holds(&t, None, 1, targets(Some(20), Some(21))));
        // The global configuration changed.
        assert!(!holds(&t, Some(10), 2, targets(Some(20), Some(21))));
        // A target was edited, or deleted.
        assert!(!holds(&t, Some(10), 1, targets(Some(20), Some(22))));
        assert!(!holds(&t, Some(10), 1, targets(None, Some(21))));
        // Versions that are not numbers say nothing.
        let unversioned = Ticket {
            version: 0,
            ..ticket(&[])
        };
        assert!(!super::holds(&unversioned, now, Some(0), 1, |_| None));
        let unversioned_target = ticket(&[("a", 0)]);
        assert!(!super::holds(&unversioned_target, now, Some(10), 1, |_| {
            Some(0)
        }));
    }

    #[test]
    fn a_folders_confirmation_serves_within_its_window_and_for_its_etag() {
        let folder = &ticket(&[]).folder;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!folder.confirmed("e", t0), "nothing confirmed yet");
        folder.confirm("e", at(10));
        assert!(folder.confirmed("e", at(9)));
        assert!(folder.confirmed("e", at(10)));
        assert!(!folder.confirmed("e", at(11)), "older than the window");
        assert!(!folder.confirmed("f", at(9)), "another ETag");
        // An older answer arriving late does not replace a newer one.
        folder.confirm("old", at(5));
        assert!(folder.confirmed("e", at(10)));
        folder.confirm("f", at(12));
        assert!(folder.confirmed("f", at(12)) && !folder.confirmed("e", at(9)));
    }

    #[test]
    fn the_tickets_of_one_folder_share_it_and_it_goes_with_the_last() {
        let tickets = Tickets::default();
        let t = ticket(&[]);
        let (identity, scope) = (&t.folder.identity, &t.folder.scope);
        let a = tickets.folder(identity, scope);
        let b = tickets.folder(identity, scope);
        assert!(Arc::ptr_eq(&a, &b));
        let key = |n: &str| ObjectKey::new("ns", n);
        for n in ["x", "y"] {
            tickets.issue(
                &key(n),
                Ticket {
                    folder: tickets.folder(identity, scope),
                    ..ticket(&[])
                },
            );
        }
        drop((a, b));
        assert_eq!(tickets.len(), 2);
        tickets.revoke(&key("x"));
        tickets.retain(|_, _| true);
        assert_eq!(tickets.len(), 1);
        assert_eq!(tickets.folders.lock().unwrap().len(), 1);
        tickets.retain(|_, t| t.shard != 3);
        assert_eq!(tickets.len(), 0);
        assert!(tickets.folders.lock().unwrap().is_empty());
    }
}
