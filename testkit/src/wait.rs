//! Waiting on conditions, for every suite that drives the operator from
//! outside: [`until`] polls for something to happen, [`throughout`] checks
//! that something holds over a whole window (a negative assertion, such as
//! "nothing rolls for 10 s", seen to hold at every poll, not only at the
//! end). The poll period is the caller's.

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
