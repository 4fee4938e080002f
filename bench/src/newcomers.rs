//! Newcomers: while the workload converges, a resource someone creates in
//! a fresh namespace must not wait behind the crowd. `k` newcomers come one
//! every `every`, each alone in its namespace `fresh-NN` with its own
//! identity and KMS folder (seeded with the workload's), and each is timed
//! from its create to `Ready` as the benchmark's watch sees it: what the
//! person who created it waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::Client;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::stats::Summary;
use crate::workload::{self, Crd, SyncMode, Tracker};

/// A newcomer is late past this.
const TARGET: Duration = Duration::from_secs(2);

/// Newcomers being created.
pub struct Newcomers {
    task: JoinHandle<Vec<(String, Result<Instant, String>)>>,
    stop: Arc<AtomicBool>,
}

/// What the newcomers waited.
#[derive(Clone, Debug, Serialize)]
pub struct NewcomerTimes {
    /// Newcomers created (fewer than asked when the workload converged
    /// first).
    pub trials: usize,
    /// Seconds from each one's create to `Ready`, in the order they came;
    /// `None`: not ready within the wait, or its create failed.
    pub seconds: Vec<Option<f64>>,
    /// Seconds after the replicas started at which each one was created.
    pub created_at: Vec<f64>,
    /// How many were ready within 2 s.
    pub within_2s: usize,
    /// p50 / p99 / max of those that were ready.
    pub summary: Summary,
    /// Creates that failed, with the error.
    pub errors: Vec<String>,
}

impl Newcomers {
    /// Start creating `k` newcomers, one every `every` (the first after
    /// `every`), until [`Newcomers::finish`].
    pub fn start(
        client: &Client,
        crd: &Crd,
        api: &str,
        sync: &SyncMode,
        k: usize,
        every: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (client, crd, api, sync, halt) = (
            client.clone(),
            crd.clone(),
            api.to_owned(),
            sync.clone(),
            stop.clone(),
        );
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            for ns in workload::newcomer_namespaces(k) {
                tokio::time::sleep(every).await;
                if halt.load(Ordering::Relaxed) {
                    break;
                }
                let created = workload::create_newcomer(&client, &crd, &ns, &api, &sync).await;
                out.push((ns, created.map_err(|e| format!("{e:#}"))));
            }
            out
        });
        Self { task, stop }
    }

    /// Stop creating, wait up to `wait` for those created to be ready, and
    /// time them (`t0`: the replicas' start).
    pub async fn finish(self, tracker: &Tracker, t0: Instant, wait: Duration) -> NewcomerTimes {
        self.stop.store(true, Ordering::Relaxed);
        let created = self.task.await.unwrap_or_default();
        let name = workload::resource_name(0);
        let until = Instant::now() + wait;
        while Instant::now() < until
            && created
                .iter()
                .any(|(ns, c)| c.is_ok() && tracker.newcomer_ready(ns, &name).is_none())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let seconds: Vec<Option<f64>> = created
            .iter()
            .map(|(ns, c)| {
                let at = *c.as_ref().ok()?;
                let ready = tracker.newcomer_ready(ns, &name)?;
                Some(ready.saturating_duration_since(at).as_secs_f64())
            })
            .collect();
        let ready: Vec<f64> = seconds.iter().flatten().copied().collect();
        NewcomerTimes {
            trials: created.len(),
            within_2s: ready.iter().filter(|s| **s <= TARGET.as_secs_f64()).count(),
            summary: Summary::of(&ready),
            created_at: created
                .iter()
                .filter_map(|(_, c)| c.as_ref().ok())
                .map(|at| at.saturating_duration_since(t0).as_secs_f64())
                .collect(),
            errors: created
                .iter()
                .filter_map(|(ns, c)| Some(format!("{ns}: {}", c.as_ref().err()?)))
                .collect(),
            seconds,
        }
    }
}
