//! The dev server: an embedded KMS that speaks the Infisical HTTP API, so
//! that kms-operator can be run and tested with no external service
//! (`kms-operator dev-server`).
//!
//! It answers the routes the operator uses with the real server's shapes,
//! status codes and error bodies: universal-auth logins and access tokens,
//! projects and environments, secrets (v3 raw, single and batch, with
//! imports, references, `ETag` and `304`), and dynamic secrets whose built-in
//! provider mints a username and password per lease. State lives in sled,
//! and every acknowledged write is flushed before the response is sent. A
//! seed file creates projects, secrets and identities at start. An admin API
//! under `/admin` counts requests and injects faults.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kms_devserver::Error> {
//! use kms_devserver::{Config, SeedSource};
//! let config = Config {
//!     addr: "127.0.0.1:0".parse().expect("address"),
//!     seed: Some(SeedSource::Yaml("projects: [{slug: demo, environments: [dev]}]".into())),
//!     ..Config::default()
//! };
//! let running = kms_devserver::start(config).await?;
//! println!("serving on {}", running.addr());
//! running.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod admin;
mod api;
mod app;
mod clock;
mod durations;
mod errors;
mod expand;
mod faults;
mod ids;
mod middleware;
mod model;
mod seed;
mod server;
mod stats;
mod store;
mod token;
mod validate;
mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use seed::{
    Seed, SeedDuration, SeedDynamicSecret, SeedEnvironment, SeedIdentity, SeedImport, SeedProject,
    SeedSecretValue, SeedUniversalAuth,
};
pub use store::SeededObject;

/// How long `start` keeps retrying to open a data directory whose lock is
/// still held (for instance by a server that is still shutting down).
const OPEN_RETRY: Duration = Duration::from_secs(5);

/// Where the seed comes from.
#[derive(Debug, Clone)]
pub enum SeedSource {
    /// A YAML file.
    File(PathBuf),
    /// YAML text.
    Yaml(String),
    /// An already parsed seed.
    Parsed(Seed),
}

impl From<PathBuf> for SeedSource {
    fn from(path: PathBuf) -> Self {
        SeedSource::File(path)
    }
}

impl SeedSource {
    /// Read and parse the seed.
    pub fn load(&self) -> Result<Seed, Error> {
        match self {
            SeedSource::File(path) => Seed::from_file(path),
            SeedSource::Yaml(text) => Seed::from_yaml(text),
            SeedSource::Parsed(seed) => {
                seed.validate()?;
                Ok(seed.clone())
            }
        }
    }
}

/// Settings of a dev server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on (port 0 picks a free port; see [`Running::addr`]).
    pub addr: SocketAddr,
    /// Directory of the sled database; `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    /// Seed applied at start, create-if-absent.
    pub seed: Option<SeedSource>,
    /// Bearer token of the admin API; `None` leaves the admin API open.
    pub admin_token: Option<String>,
    /// Shortest lease TTL accepted for dynamic secrets.
    pub min_lease_ttl: Duration,
    /// Kubeconfig of the cluster that validates Kubernetes-auth logins
    /// (accepted now, used once Kubernetes auth is served).
    pub kubeconfig: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: None,
            seed: None,
            admin_token: None,
            min_lease_ttl: Duration::from_secs(60),
            kubeconfig: None,
        }
    }
}

/// Why the dev server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The seed could not be read, parsed or applied.
    #[error("seed: {0}")]
    Seed(String),
    /// The database could not be opened, read or written.
    #[error("storage: {0}")]
    Storage(String),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Another I/O failure (signals, files).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A dev server that is serving. Dropping it stops the server too, without
/// waiting; [`Running::shutdown`] waits until everything is closed.
pub struct Running {
    addr: SocketAddr,
    seeded: Vec<SeededObject>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    app: app::App,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("addr", &self.addr).finish()
    }
}

impl Running {
    /// The address the server listens on (with the real port when the
    /// configured port was 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every project, environment, identity and dynamic secret in the
    /// database after the seed was applied, with its id.
    pub fn seeded(&self) -> &[SeededObject] {
        &self.seeded
    }

    /// Stop accepting connections, let requests in flight finish (up to a
    /// few seconds), flush and close the database.
    pub async fn shutdown(self) {
        let Running {
            stop, task, app, ..
        } = self;
        let _ = stop.send(true);
        if let Err(e) = task.await {
            tracing::warn!(error = %e, "dev-server task ended abnormally");
        }
        app.store.close().await;
    }
}

/// Open the database, apply the seed and start serving. Returns once the
/// listener is bound.
pub async fn start(config: Config) -> Result<Running, Error> {
    if let Some(path) = &config.kubeconfig {
        tracing::info!(
            kubeconfig = %path.display(),
            "a kubeconfig was given; Kubernetes-auth logins are not served yet"
        );
    }
    let seed = match &config.seed {
        Some(source) => Some(source.load()?),
        None => None,
    };
    let store = store::Store::open(config.data_dir.as_deref(), OPEN_RETRY).await?;
    let seeded = match &seed {
        Some(seed) => store.apply_seed(seed).await?,
        None => store.inventory().await,
    };
    let signing_key = store.signing_key().await?;
    let app = app::App::new(app::Settings {
        store,
        signing_key,
        admin_token: config.admin_token.clone(),
        min_lease_ttl: config.min_lease_ttl,
    });
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = watch::channel(false);
    let router = Arc::new(api::router(app.clone()));
    let task = tokio::spawn(server::serve(listener, router, stopped));
    tracing::info!(%addr, "dev-server started");
    Ok(Running {
        addr,
        seeded,
        stop,
        task,
        app,
    })
}

/// Start the server, print `dev-server listening on http://ADDR` and the ids
/// of the seeded objects to stdout, and serve until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), Error> {
    // Catch the signals before announcing the address, so that a signal sent
    // as soon as the address is read stops the server gracefully.
    let signals = Signals::new()?;
    let running = start(config).await?;
    println!("dev-server listening on {}", running.url());
    for object in running.seeded() {
        println!("{object}");
    }
    signals.wait().await;
    tracing::info!("dev-server stopping");
    running.shutdown().await;
    Ok(())
}

/// SIGTERM and SIGINT (Ctrl-C elsewhere than on Unix).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    #[cfg(unix)]
    fn new() -> Result<Signals, Error> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    #[cfg(not(unix))]
    fn new() -> Result<Signals, Error> {
        Ok(Signals {})
    }

    #[cfg(unix)]
    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    #[cfg(not(unix))]
    async fn wait(self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}
