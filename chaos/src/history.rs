//! What the runner records while it runs: plain values with wall-clock
//! times in milliseconds since the Unix epoch. All processes of a run share
//! one machine and so one clock, which is what lets the checkers compare a
//! replica's log time with the times written into a Lease.

use std::collections::BTreeMap;

use serde::Serialize;

/// Milliseconds since the Unix epoch.
pub type Ms = i64;

/// Now, in [`Ms`].
pub fn now_ms() -> Ms {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One state of a shard Lease, as the Lease watcher saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeaseObs {
    /// When the watcher received it.
    pub observed: Ms,
    /// The shard.
    pub shard: u32,
    /// `spec.holderIdentity` (`None` when empty: released).
    pub holder: Option<String>,
    /// `spec.acquireTime`.
    pub acquire: Option<Ms>,
    /// `spec.renewTime`: stamped by the writer right before its update.
    pub renew: Option<Ms>,
    /// `spec.leaseDurationSeconds`.
    pub duration_s: u32,
    /// The watcher had to list again before this state (a disconnection it
    /// could not resume from): changes in between may be missing.
    pub after_gap: bool,
    /// The Lease was deleted.
    pub deleted: bool,
}

/// A successful Kubernetes write reported in a replica's log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WriteObs {
    /// The log line's timestamp (taken after the API server answered).
    pub at: Ms,
    /// The replica (pod name).
    pub replica: String,
    /// Namespace of the object written.
    pub namespace: String,
    /// The resource (`Kind/ns/name`).
    pub resource: String,
    /// The log message (`target written`, `lease created`).
    pub message: String,
}

/// A replica held with SIGSTOP.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pause {
    /// The replica.
    pub replica: String,
    /// SIGSTOP sent.
    pub from: Ms,
    /// SIGCONT sent.
    pub to: Ms,
}

/// A time window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Window {
    /// Start.
    pub from: Ms,
    /// End.
    pub to: Ms,
}

impl Window {
    /// Length of the overlap with `[a, b]`.
    pub fn overlap(&self, a: Ms, b: Ms) -> Ms {
        (self.to.min(b) - self.from.max(a)).max(0)
    }
}

/// Total overlap of `[a, b]` with a set of windows (overlapping windows are
/// merged first, so no time is counted twice).
pub fn overlap_with(windows: &[Window], a: Ms, b: Ms) -> Ms {
    let mut w: Vec<Window> = windows.to_vec();
    w.sort_by_key(|x| x.from);
    let mut merged: Vec<Window> = Vec::new();
    for x in w {
        match merged.last_mut() {
            Some(last) if x.from <= last.to => last.to = last.to.max(x.to),
            _ => merged.push(x),
        }
    }
    merged.iter().map(|m| m.overlap(a, b)).sum()
}

/// One state of a managed Secret, as the Secret watcher saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SecretObs {
    /// When it was seen.
    pub at: Ms,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `secrets.hanzo.ai/owner`.
    pub owner: Option<String>,
    /// Number of data keys.
    pub keys: usize,
    /// It was deleted (or vanished while the watcher was disconnected).
    pub deleted: bool,
}

/// Something the runner did on purpose that allows a managed Secret to be
/// emptied or deleted afterwards (deleting the resource that owns it).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Excuse {
    /// When.
    pub at: Ms,
    /// The owner id (`Kind/ns/name`).
    pub owner: String,
}

/// A count of the KMS requests served so far, net of the runner's own.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BudgetSample {
    /// When.
    pub at: Ms,
    /// Requests counted by the dev server (all routes and outcomes).
    pub total: u64,
}

/// A dynamic-secret lease alive in the KMS.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KmsLease {
    /// Lease id.
    pub id: String,
    /// Created.
    pub created: Ms,
    /// Expires.
    pub expires: Ms,
    /// `active`, `revoked` or `expired`.
    pub state: String,
}

/// The leases one KmsDynamicSecret records in its status.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RecordedLeases {
    /// `status.lease.id`.
    pub current: Option<String>,
    /// `status.retiredLeases[].id`.
    pub retired: Vec<String>,
}

/// The KmsDynamicSecrets' statuses (read first) and the KMS's active leases
/// (read right after).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeaseSnapshot {
    /// When the statuses were read.
    pub at: Ms,
    /// Resource id → recorded leases.
    pub statuses: BTreeMap<String, RecordedLeases>,
    /// Active leases.
    pub active: Vec<KmsLease>,
}

/// A shard event from a replica's log, kept for the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardLogLine {
    /// When.
    pub at: Ms,
    /// The replica.
    pub replica: String,
    /// The message.
    pub message: String,
    /// The shard.
    pub shard: Option<u32>,
}

/// Everything recorded in one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct History {
    /// Shard Lease states.
    pub leases: Vec<LeaseObs>,
    /// Kubernetes writes from the replicas' logs.
    pub writes: Vec<WriteObs>,
    /// SIGSTOP windows.
    pub pauses: Vec<Pause>,
    /// Managed Secret states.
    pub secrets: Vec<SecretObs>,
    /// Deletions made by the runner.
    pub excuses: Vec<Excuse>,
    /// KMS request counts.
    pub budget: Vec<BudgetSample>,
    /// Start of every replica process.
    pub starts: Vec<Ms>,
    /// Every kill -9 of a replica process.
    pub kills: Vec<Ms>,
    /// Leases a replica logged it tried to revoke after failing to record
    /// them (`could not record a new lease; revoking it`).
    pub revoke_attempts: Vec<String>,
    /// Lease snapshots.
    pub snapshots: Vec<LeaseSnapshot>,
    /// Windows in which kube-apiserver or etcd was restarting.
    pub control_plane: Vec<Window>,
    /// Windows in which the whole machine stood still (the runner's own
    /// 100 ms heartbeat was late by more than a second).
    pub stalls: Vec<Window>,
    /// Shard events of the replicas.
    pub shard_log: Vec<ShardLogLine>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_are_merged() {
        let w = [
            Window { from: 0, to: 10 },
            Window { from: 5, to: 15 },
            Window { from: 20, to: 30 },
        ];
        assert_eq!(overlap_with(&w, 0, 100), 25);
        assert_eq!(overlap_with(&w, 12, 22), 5);
        assert_eq!(overlap_with(&[], 0, 100), 0);
    }
}
