//! Waiting on conditions, for every suite that drives the operator from
//! outside: [`until`] polls for something to happen, [`throughout`] checks
//! that something holds over a whole window (a negative assertion, such as
//! "nothing rolls for 10 s", seen to hold at every poll, not only at the
//! end), and [`every`] paces what a test does periodically. The poll
//! period is the caller's.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Poll `check` every `every` until it returns `Some` or `timeout` passes.
pub async fn until<T, F, Fut>(every: Duration, timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Check that `check` holds throughout `window`: at once, every `every`,
/// and once more at the end. Fails at the first poll that breaks it; the
/// error says when ("3.2 s into the 10.0 s window").
pub async fn throughout<F, Fut>(
    every: Duration,
    window: Duration,
    mut check: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    let broken = until(every, window, || {
        let holds = check();
        async move { (!holds.await).then(|| started.elapsed()) }
    })
    .await;
    let at = match broken {
        Some(at) => at,
        None if check().await => return Ok(()),
        None => started.elapsed(),
    };
    Err(format!(
        "{:.1} s into the {:.1} s window",
        at.as_secs_f64(),
        window.as_secs_f64()
    ))
}

/// A period for something a test does again and again (a sampler, a
/// writer's pace, a probe loop): `tick().await` at each round. A round that
/// runs late delays the next instead of bunching the ones missed.
pub fn every(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}
