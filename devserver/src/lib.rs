//! The dev server: an embedded KMS that speaks the Infisical HTTP API, so
//! that kms-operator can be run and tested with no external service
//! (`kms-operator dev-server`).
//!
//! It answers the routes the operator uses with the real server's shapes,
//! status codes and error bodies: universal, Kubernetes (reviewed by a real
//! cluster) and LDAP logins, access tokens and legacy service tokens,
//! identities scoped to some folders, projects and environments, secrets (v3
//! raw, single and batch, and the v4 list, with imports, references, `ETag`
//! and `304`), dynamic secrets whose built-in provider mints a username and
//! password per lease, the project-events stream, and per-client rate
//! limits. It serves HTTP or, with a certificate, HTTPS. State lives in
//! sled, and every acknowledged write is flushed before the response is
//! sent. A seed file creates projects, secrets, identities and service
//! tokens at start. An admin API under `/admin` counts requests, injects
//! faults and sets rate limits.
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
mod cloud;
mod durations;
mod errors;
mod events;
mod expand;
mod faults;
mod ids;
mod middleware;
mod model;
mod ratelimit;
mod reviewer;
mod scope;
mod seed;
mod server;
mod stats;
mod store;
mod tls;
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
    Seed, SeedAwsAuth, SeedAwsKey, SeedAzureAuth, SeedDuration, SeedDynamicSecret, SeedEnvironment,
    SeedGcpAuth, SeedIdentity, SeedImport, SeedJwk, SeedKubernetesAuth, SeedLdapAuth, SeedList,
    SeedMembership, SeedProject, SeedSecretValue, SeedServiceToken, SeedUniversalAuth,
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
    /// Kubeconfig of the cluster whose API server reviews the tokens of
    /// Kubernetes-auth logins; without it such logins are refused.
    pub kubeconfig: Option<PathBuf>,
    /// Requests allowed per minute and client on every route; `None` or 0
    /// leaves rate limits off (the admin API can still set them).
    pub rate_limit_per_minute: Option<u32>,
    /// PEM certificate chain to serve HTTPS with (together with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// How often event streams send a ping (15 s, as the real server).
    pub event_ping_interval: Duration,
    /// Answer a list of a folder or environment that does not exist with
    /// 404 `NotFound` (as current servers do) instead of an empty list (as
    /// the recorded October 2024 server does, the default).
    pub missing_folders_not_found: bool,
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
            rate_limit_per_minute: None,
            tls_cert: None,
            tls_key: None,
            event_ping_interval: Duration::from_secs(15),
            missing_folders_not_found: false,
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
    /// The certificate or key could not be read or used.
    #[error("tls: {0}")]
    Tls(String),
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {0}")]
    Kube(String),
    /// Another I/O failure (signals, files).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A dev server that is serving. Dropping it stops the server too, without
/// waiting; [`Running::shutdown`] waits until everything is closed.
pub struct Running {
    addr: SocketAddr,
    https: bool,
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

    /// The base URL, `http://ADDR`, or `https://ADDR` when serving HTTPS.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
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
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        (None, None) => None,
        _ => {
            return Err(Error::Tls(
                "a certificate and its key are given together (--tls-cert and --tls-key)".into(),
            ));
        }
    };
    let reviewer = match &config.kubeconfig {
        Some(path) => Some(reviewer::Reviewer::connect(path).await?),
        None => None,
    };
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
        limits: config
            .rate_limit_per_minute
            .filter(|n| *n > 0)
            .map(ratelimit::Limits::all)
            .unwrap_or_default(),
        reviewer,
        event_ping_interval: config.event_ping_interval,
        missing_folders_not_found: config.missing_folders_not_found,
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
    let https = tls.is_some();
    let streams = app.clone();
    let task = tokio::spawn(server::serve(
        listener,
        router,
        tls,
        stopped,
        Box::new(move || streams.streams.close_all()),
    ));
    tracing::info!(%addr, https, "dev-server started");
    Ok(Running {
        addr,
        https,
        seeded,
        stop,
        task,
        app,
    })
}

/// Start the server, print `dev-server listening on http://ADDR` (`https://`
/// when serving HTTPS) and the ids of the seeded objects to stdout, and serve
/// until SIGTERM or SIGINT.
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
