//! Rendering off the async runtime.
//!
//! A tenant writes the templates of their resources, so a render is
//! untrusted work: the template engine bounds it (fuel per render and one
//! budget per resource, sizes checked before allocating), and this module
//! keeps it away from everything else the replica does:
//!
//! - renders run on a few threads of their own (`--render-threads`), never
//!   on the runtime that answers probes, renews Leases and drives the
//!   watches; a resource's renders (every target and entry) are one job
//!   with one [`kms_template::Budget`];
//! - a job that runs longer than the deadline (`--render-timeout`) is
//!   stopped through its budget's canceller and reported as a template
//!   error ("too expensive"); the reconcile does not wait for it;
//! - a reconcile that is dropped (shard lost, operator stopping) cancels
//!   its job, queued or running, so a stop never waits for a render.
//!
//! The threads are detached: a process that exits does not join them.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kms_template::{Budget, Canceller};
use tokio::sync::oneshot;

use super::error::SyncError;
use super::target::{Renderer, Target, build_data};
use crate::kms::Fetched;

/// A job as the threads run it.
type Job = Box<dyn FnOnce() + Send>;

/// The render threads and their deadline. Cheap to share (`Arc`).
pub struct RenderPool {
    jobs: Mutex<mpsc::Sender<Job>>,
    deadline: Duration,
    resource_fuel: u64,
    threads: usize,
    /// Renders stopped at the deadline, for the metric.
    stopped: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for RenderPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderPool")
            .field("threads", &self.threads)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// The default number of render threads: half the CPUs this process may
/// use, at least one. Renders are short; more threads than that would let
/// tenants' templates take the CPU from the reconciles and the watches.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() / 2)
        .unwrap_or(1)
        .max(1)
}

/// Cancels a job when its reconcile lets go of it (finished or dropped).
struct CancelOnDrop(Canceller);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl RenderPool {
    /// Start `threads` render threads (at least one). Each job gets a
    /// budget of `resource_fuel` and `deadline` from the moment it starts;
    /// `stopped` is called for each job stopped at its deadline.
    pub fn new(
        threads: usize,
        deadline: Duration,
        resource_fuel: u64,
        stopped: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let threads = threads.max(1);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("kms-render-{i}"))
                .spawn(move || {
                    loop {
                        // The lock is held only while waiting for a job.
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(poisoned) => poisoned.into_inner().recv(),
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start a render thread");
            }
        }
        Self {
            jobs: Mutex::new(tx),
            deadline,
            resource_fuel,
            threads,
            stopped,
        }
    }

    /// A pool for unit tests: one thread, a 2 s deadline, the engine's
    /// default budget.
    pub fn for_tests() -> Self {
        Self::new(
            1,
            Duration::from_secs(2),
            kms_template::Limits::default().resource_fuel,
            Arc::new(|| {}),
        )
    }

    /// The deadline of one job.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Run `render` on a render thread with a fresh budget, and wait for
    /// it: its result, or a template error when it ran past the deadline
    /// (it is then cancelled and its result, if any, dropped). Dropping the
    /// returned future cancels the job.
    pub async fn run<T, F>(&self, render: F) -> Result<T, SyncError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Budget) -> Result<T, SyncError> + Send + 'static,
    {
        let mut budget = Budget::new(self.resource_fuel);
        let canceller = budget.canceller();
        let _cancel = CancelOnDrop(canceller.clone());
        let (started_tx, started_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let queued = canceller.clone();
        let job: Job = Box::new(move || {
            if queued.is_cancelled() {
                return;
            }
            let _ = started_tx.send(());
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| render(&mut budget)));
            let _ = done_tx.send(result);
        });
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job);
        if sent.is_err() {
            return Err(SyncError::Template(
                "the render threads are not running; the operator is stopping".to_owned(),
            ));
        }
        // Waiting in the queue does not count against the deadline: the
        // threads are busy with other resources' renders, each bounded.
        if started_rx.await.is_err() {
            return Err(panicked());
        }
        match tokio::time::timeout(self.deadline, done_rx).await {
            Ok(Ok(Ok(result))) => result,
            Ok(_) => Err(panicked()),
            Err(_) => {
                canceller.cancel();
                (self.stopped)();
                Err(SyncError::Template(format!(
                    "the templates of this resource took longer than {:?} to render and were \
                     stopped (too expensive): do less work in them (fewer loops, smaller data, \
                     fewer key derivations)",
                    self.deadline
                )))
            }
        }
    }
}

fn panicked() -> SyncError {
    SyncError::Template("rendering failed unexpectedly (the renderer panicked)".to_owned())
}

/// The data of every target from the fetched `secrets`: on the render
/// threads with one budget when a target has templates, else here (copying
/// needs no render).
pub async fn render_targets(
    (renders, renderer): (&RenderPool, &Arc<Renderer>),
    targets: &[Target],
    secrets: Arc<Fetched>,
) -> Result<Vec<BTreeMap<String, Vec<u8>>>, SyncError> {
    let templated = targets.iter().any(|t| {
        t.template
            .as_ref()
            .and_then(|tpl| tpl.data.as_ref())
            .is_some_and(|d| !d.is_empty())
    });
    let renderer = renderer.clone();
    if !templated {
        let mut budget = kms_template::Budget::new(0);
        return targets
            .iter()
            .map(|t| build_data(t, &secrets, renderer.as_ref(), &mut budget))
            .collect();
    }
    let targets = targets.to_vec();
    renders
        .run(move |budget| {
            targets
                .iter()
                .map(|t| build_data(t, &secrets, renderer.as_ref(), budget))
                .collect()
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A render that runs until its budget is cancelled, then says so.
    fn until_cancelled(
        seen: Arc<AtomicBool>,
    ) -> impl FnOnce(&mut Budget) -> Result<(), SyncError> + Send + 'static {
        move |budget| {
            let c = budget.canceller();
            while !c.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            seen.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_render_returns_its_result() {
        let pool = RenderPool::for_tests();
        let got = pool.run(|_| Ok(41 + 1)).await.unwrap();
        assert_eq!(got, 42);
        let err = pool
            .run(|_| -> Result<(), SyncError> { Err(SyncError::Template("bad".into())) })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "bad");
    }

    #[tokio::test]
    async fn a_render_past_the_deadline_is_cancelled_and_reported() {
        let stopped = Arc::new(AtomicUsize::new(0));
        let counted = stopped.clone();
        let pool = RenderPool::new(
            1,
            Duration::from_millis(100),
            1_000,
            Arc::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let saw_cancel = Arc::new(AtomicBool::new(false));
        let t0 = std::time::Instant::now();
        let err = pool
            .run(until_cancelled(saw_cancel.clone()))
            .await
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(err.to_string().contains("too expensive"), "{err}");
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
        // The thread is free again once the job saw the cancel.
        assert_eq!(pool.run(|_| Ok(1)).await.unwrap(), 1);
        assert!(saw_cancel.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_dropped_reconcile_cancels_its_render() {
        let pool = Arc::new(RenderPool::for_tests());
        let saw_cancel = Arc::new(AtomicBool::new(false));
        let running = pool.clone();
        let job = until_cancelled(saw_cancel.clone());
        let task = tokio::spawn(async move { running.run(job).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        task.abort();
        // The next job runs once the first one stopped.
        let t0 = std::time::Instant::now();
        assert_eq!(pool.run(|_| Ok(7)).await.unwrap(), 7);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert!(saw_cancel.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panicking_render_is_an_error_and_the_thread_survives() {
        let pool = RenderPool::for_tests();
        let err = pool
            .run(|_| -> Result<(), SyncError> { panic!("boom") })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        assert_eq!(pool.run(|_| Ok(3)).await.unwrap(), 3);
    }
}
