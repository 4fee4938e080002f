//! Single flight: callers that ask for the same thing at the same time share
//! one request, provided it started late enough for them (a caller that
//! must see what happened after an instant never joins a request that
//! started before it). If the caller doing the work is cancelled, a waiting
//! caller takes over with its own request.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tokio::time::Instant;

/// A call in flight: when it started, and its result once there.
struct Call<V> {
    started: Instant,
    cell: Arc<OnceCell<V>>,
}

/// Shares in-flight results by key.
pub struct SingleFlight<K, V> {
    in_flight: Mutex<HashMap<K, Call<V>>>,
}

/// A result and where it came from.
#[derive(Debug)]
pub struct Outcome<V> {
    /// The value.
    pub value: V,
    /// Whether another caller produced it.
    pub shared: bool,
    /// When the call that produced it started (no later than the work).
    pub started: Instant,
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        Self {
            in_flight: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> SingleFlight<K, V> {
    /// Run `work` unless a call with the same key that started at or after
    /// `not_before` is in flight, in which case wait for that call's result.
    /// A call in flight that started earlier is left to its own callers.
    pub async fn run<F, Fut>(&self, key: K, not_before: Instant, work: F) -> Outcome<V>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let (cell, started) = {
            let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&key) {
                Some(call) if call.started >= not_before => (call.cell.clone(), call.started),
                _ => {
                    let call = Call {
                        started: Instant::now(),
                        cell: Arc::new(OnceCell::new()),
                    };
                    let out = (call.cell.clone(), call.started);
                    map.insert(key.clone(), call);
                    out
                }
            }
        };
        let mut ran = false;
        let value = cell
            .get_or_init(|| {
                ran = true;
                work()
            })
            .await
            .clone();
        let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&key).is_some_and(|c| Arc::ptr_eq(&c.cell, &cell)) {
            map.remove(&key);
        }
        Outcome {
            value,
            shared: !ran,
            started,
        }
    }

    /// Keys currently in flight (for tests).
    pub fn in_flight(&self) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_callers_share_one_call() {
        let flight: Arc<SingleFlight<&str, u32>> = Arc::default();
        let calls = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (flight, calls) = (flight.clone(), calls.clone());
            tasks.push(tokio::spawn(async move {
                let o = flight
                    .run(
                        "k",
                        Instant::now() - Duration::from_secs(1),
                        || async move {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            calls.fetch_add(1, Ordering::SeqCst) + 1
                        },
                    )
                    .await;
                (o.value, o.shared)
            }));
        }
        let mut shared = 0;
        for t in tasks {
            let (v, s) = t.await.unwrap();
            assert_eq!(v, 1);
            shared += u32::from(s);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(shared, 9);
        assert_eq!(flight.in_flight(), 0);
        // Later calls run again.
        let o = flight.run("k", Instant::now(), || async { 7 }).await;
        assert_eq!((o.value, o.shared), (7, false));
    }

    #[tokio::test]
    async fn a_cancelled_leader_hands_over() {
        let flight: Arc<SingleFlight<&str, u32>> = Arc::default();
        let f2 = flight.clone();
        let leader = tokio::spawn(async move {
            f2.run("k", Instant::now(), || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                1
            })
            .await
            .value
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let f3 = flight.clone();
        let follower = tokio::spawn(async move {
            f3.run("k", Instant::now() - Duration::from_secs(1), || async { 2 })
                .await
                .value
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.abort();
        assert_eq!(follower.await.unwrap(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_started_too_early_is_not_joined() {
        let flight: Arc<SingleFlight<&str, u32>> = Arc::default();
        let t0 = Instant::now();
        let f = flight.clone();
        let early = tokio::spawn(async move {
            f.run("k", t0, || async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                1
            })
            .await
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A caller content with anything since before the call started
        // joins it.
        let f = flight.clone();
        let relaxed = tokio::spawn(async move {
            f.run("k", t0 - Duration::from_secs(1), || async { 3 })
                .await
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Something happened just now: the call of a second ago cannot
        // have seen it, so this caller makes its own.
        let now = Instant::now();
        let late = flight.run("k", now, || async { 2 }).await;
        assert_eq!((late.value, late.shared), (2, false));
        assert!(late.started >= now);
        let (early, relaxed) = (early.await.unwrap(), relaxed.await.unwrap());
        assert_eq!((early.value, early.shared, early.started), (1, false, t0));
        assert_eq!(
            (relaxed.value, relaxed.shared, relaxed.started),
            (1, true, t0)
        );
        assert_eq!(flight.in_flight(), 0);
    }
}
