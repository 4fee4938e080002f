//! The control runtime: the shard Lease coordinator and the health and
//! metrics servers run on a thread and a Tokio runtime of their own, with a
//! Kubernetes client of their own (its connections are driven there too),
//! so that nothing the workers do — a busy runtime, a slow step, a tenant's
//! expensive template — delays a Lease renewal or a probe's answer.
//!
//! The thread is detached: it lives as long as the process.

use std::future::Future;

use kube::Client;
use tokio::runtime::{Builder, Handle};

/// The control runtime and its client.
pub struct Control {
    handle: Handle,
    /// A Kubernetes client whose connections live on the control runtime.
    pub client: Client,
}

impl Control {
    /// Start the control thread and its client.
    pub async fn start() -> anyhow::Result<Self> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("kms-control".to_owned())
            .spawn(
                move || match Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => {
                        let _ = tx.send(Ok(runtime.handle().clone()));
                        runtime.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                },
            )?;
        let handle = rx
            .await
            .map_err(|_| anyhow::anyhow!("the control thread stopped at start"))??;
        let client = handle.spawn(Client::try_default()).await??;
        Ok(Self { handle, client })
    }

    /// Run `future` on the control runtime and wait for its output.
    pub async fn run<F>(&self, future: F) -> anyhow::Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Ok(self.handle.spawn(future).await?)
    }

    /// Enter the control runtime: what starts tasks with `tokio::spawn`
    /// while the guard lives (the coordinator) starts them there.
    pub fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.handle.enter()
    }
}
