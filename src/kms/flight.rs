//! Single flight: callers that ask for the same thing at the same time share
//! one request. If the caller doing the work is cancelled, a waiting caller
//! takes over with its own request.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

/// Shares in-flight results by key.
pub struct SingleFlight<K, V> {
    in_flight: Mutex<HashMap<K, Arc<OnceCell<V>>>>,
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        Self {
            in_flight: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> SingleFlight<K, V> {
    /// Run `work` unless a call with the same key is in flight, in which
    /// case wait for that call's result. Returns the value and whether it
    /// was shared with (produced by) another caller.
    pub async fn run<F, Fut>(&self, key: K, work: F) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let cell = {
            let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key.clone())
                .or_insert_with(|| Arc::new(OnceCell::new()))
                .clone()
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
        if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            map.remove(&key);
        }
        (value, !ran)
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
                flight
                    .run("k", || async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        calls.fetch_add(1, Ordering::SeqCst) + 1
                    })
                    .await
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
        let (v, s) = flight.run("k", || async { 7 }).await;
        assert_eq!((v, s), (7, false));
    }

    #[tokio::test]
    async fn a_cancelled_leader_hands_over() {
        let flight: Arc<SingleFlight<&str, u32>> = Arc::default();
        let f2 = flight.clone();
        let leader = tokio::spawn(async move {
            f2.run("k", || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                1
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let f3 = flight.clone();
        let follower = tokio::spawn(async move { f3.run("k", || async { 2 }).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.abort();
        let (v, _) = follower.await.unwrap();
        assert_eq!(v, 2);
    }
}
