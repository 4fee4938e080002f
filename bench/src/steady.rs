//! `steady`: a converged session left alone for a window (30 minutes by
//! default) with nothing changing, in the KMS or in the cluster. What it
//! costs is what an installation pays all day: KMS requests (the folders
//! due, mostly answered `304`), API server writes (Secrets, statuses,
//! Leases), CPU per replica. The measures and the model they are held
//! against are computed here; the session runs them in
//! `Session::steady`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::replicas::Usage;
use crate::scenarios::Load;
use crate::stats::KmsCounts;
use crate::workload::SyncMode;

/// The operator's default resync interval (a resource without
/// `syncConfig.resyncInterval`).
const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

/// The operator's default `--retry-period`: how often each shard Lease and
/// each member Lease is renewed.
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The verbs that write, as `apiserver_request_total` names them (`POST`
/// creates, `PUT` updates).
const WRITE_VERBS: [&str; 5] = ["POST", "PUT", "PATCH", "APPLY", "DELETE"];

/// Result of `steady`.
#[derive(Clone, Debug, Serialize)]
pub struct Steady {
    /// Resources.
    pub n: usize,
    /// KMS folders (one per namespace).
    pub folders: usize,
    /// Replicas.
    pub replicas: usize,
    /// The resources' sync settings.
    pub sync: SyncMode,
    /// Load at the start of the window.
    pub load: Load,
    /// Seconds waited after convergence before the window opened.
    pub settle_seconds: f64,
    /// Length of the window, seconds.
    pub window_seconds: f64,
    /// KMS requests in the window.
    pub kms: KmsCounts,
    /// KMS secret reads per minute in the window.
    pub fetches_per_minute: f64,
    /// The model's: every folder once per resync interval.
    pub folders_due_per_minute: f64,
    /// API server requests in the window (every client: the benchmark's own
    /// watches were open before).
    pub apiserver_requests: f64,
    /// The same by verb and resource (`APPLY kmssecrets/status`).
    pub apiserver_by_request: BTreeMap<String, f64>,
    /// Writes in the window by resource (`secrets`, `kmssecrets/status`,
    /// `leases`, …): creates, updates, patches, applies and deletes.
    pub writes: BTreeMap<String, f64>,
    /// Lease writes per second in the window.
    pub lease_writes_per_second: f64,
    /// The model's: every shard Lease and every member Lease renewed once a
    /// retry period.
    pub lease_writes_per_second_model: f64,
    /// Bytes a second the API server's watches sent in the window, by
    /// kind (every watcher: the replicas' and the benchmark's own).
    pub watch_bytes_per_second: BTreeMap<String, f64>,
    /// Events a second the API server's watches sent, by kind.
    pub watch_events_per_second: BTreeMap<String, f64>,
    /// CPU of each replica in the window, percent of one core.
    pub cpu_percent: BTreeMap<String, f64>,
    /// Memory and CPU of each replica at the end of the window.
    pub usage: Vec<Usage>,
}

/// Writes by resource, from requests by `VERB resource`.
pub fn writes(by_request: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (k, v) in by_request {
        let Some((verb, resource)) = k.split_once(' ') else {
            continue;
        };
        if WRITE_VERBS.contains(&verb) {
            *out.entry(resource.to_owned()).or_default() += v;
        }
    }
    out
}

/// The resync interval of `sync`, as the operator reads it (`30s`, `10m`,
/// `1h`; the default when unset or unreadable).
pub fn resync_interval(sync: &SyncMode) -> Duration {
    let Some(s) = sync.resync.as_deref() else {
        return DEFAULT_RESYNC;
    };
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let Ok(n) = number.parse::<u64>() else {
        return DEFAULT_RESYNC;
    };
    match unit {
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => DEFAULT_RESYNC,
    }
}

/// Each count divided by `seconds`, to three decimals.
pub fn per_second(counts: &BTreeMap<String, f64>, seconds: f64) -> BTreeMap<String, f64> {
    let seconds = seconds.max(f64::EPSILON);
    counts
        .iter()
        .map(|(k, v)| (k.clone(), (v / seconds * 1000.0).round() / 1000.0))
        .collect()
}

/// Lease writes per second by the model: `shards` shard Leases and one
/// member Lease per replica, each renewed once a retry period.
pub fn lease_writes_model(shards: u32, replicas: usize) -> f64 {
    (f64::from(shards) + replicas as f64) / RETRY_PERIOD.as_secs_f64()
}

/// CPU of each replica between two measurements, percent of one core.
pub fn cpu_percent(before: &[Usage], after: &[Usage], window: Duration) -> BTreeMap<String, f64> {
    let secs = window.as_secs_f64().max(f64::EPSILON);
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.replica == a.replica)?;
            let used = a.cpu_seconds? - b.cpu_seconds?;
            Some((a.replica.clone(), (used / secs * 1000.0).round() / 10.0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(replica: &str, cpu: f64) -> Usage {
        Usage {
            replica: replica.into(),
            peak_rss_mib: None,
            rss_anon_mib: None,
            rss_file_mib: None,
            cpu_seconds: Some(cpu),
        }
    }

    #[test]
    fn writes_are_counted_by_resource_and_reads_are_not() {
        let by_request: BTreeMap<String, f64> = [
            ("APPLY kmssecrets/status", 3.0),
            ("PATCH secrets", 1.0),
            ("POST secrets", 2.0),
            ("PUT leases", 480.0),
            ("GET leases", 10.0),
            ("WATCH kmssecrets", 1.0),
            ("LIST secrets", 4.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let w = writes(&by_request);
        assert_eq!(w.get("kmssecrets/status"), Some(&3.0));
        assert_eq!(w.get("secrets"), Some(&3.0));
        assert_eq!(w.get("leases"), Some(&480.0));
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn the_interval_is_read_as_the_operator_reads_it() {
        let sync = |r: Option<&str>| SyncMode {
            resync: r.map(str::to_owned),
            instant: false,
        };
        assert_eq!(resync_interval(&sync(None)), Duration::from_secs(60));
        assert_eq!(
            resync_interval(&sync(Some("10m"))),
            Duration::from_secs(600)
        );
        assert_eq!(resync_interval(&sync(Some("45s"))), Duration::from_secs(45));
        assert_eq!(
            resync_interval(&sync(Some("1h"))),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn the_lease_model_and_the_cpu_share() {
        assert_eq!(lease_writes_model(16, 3), 9.5);
        let cpu = cpu_percent(
            &[usage("a", 10.0), usage("b", 20.0)],
            &[usage("a", 19.0), usage("b", 20.9), usage("c", 1.0)],
            Duration::from_secs(900),
        );
        assert_eq!(cpu.get("a"), Some(&1.0));
        assert_eq!(cpu.get("b"), Some(&0.1));
        assert_eq!(cpu.len(), 2);
    }
}
