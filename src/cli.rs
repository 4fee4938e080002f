//! The command line: `kms-operator <command>`. Every flag also reads an
//! environment variable `KMS_OPERATOR_<FLAG_NAME>`; durations accept a bare
//! number of seconds or `10s`/`2m`/`1h`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::api::duration::parse_duration;
use crate::telemetry::LogFormat;

/// The version and the commit it was built from (`2.0.0 (commit 1a2b3c4d5e6f)`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KMS_OPERATOR_COMMIT"),
    ")"
);

/// Keeps Kubernetes Secrets in step with Hanzo KMS (Infisical API).
#[derive(Debug, Parser)]
#[command(name = "kms-operator", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "KMS_OPERATOR_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Log level, or an `EnvFilter` directive such as `kms_operator=debug,info`.
    #[arg(
        long,
        global = true,
        default_value = "info",
        env = "KMS_OPERATOR_LOG_LEVEL"
    )]
    pub log_level: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator.
    Run(Box<RunArgs>),
    /// Print the CRDs as YAML (or write one file per CRD with `--out-dir`).
    Crds(CrdsArgs),
    /// Run the embedded development KMS.
    #[cfg(feature = "dev-server")]
    DevServer(DevServerArgs),
    /// Show the resources of a namespace (or all) with their Ready
    /// condition, and the shards and their owners where the Leases can be
    /// read.
    Status(StatusArgs),
    /// Check that the installation is healthy (the chart's `helm test`):
    /// the CRDs are served, the replicas are Ready, every shard is held,
    /// and the resources named are Ready. Exits 1 when a check fails.
    Check(CheckArgs),
    /// Sync a resource now (`NAME` of a KmsSecret, or `KIND/NAME`): set its
    /// `secrets.hanzo.ai/force-sync` annotation and wait for the result.
    /// Exits 1 when it is not Ready afterwards.
    Sync(SyncArgs),
    /// Convert manifests of the Go operators (InfisicalSecret, KMSSecret, …)
    /// into kms-operator's kinds: YAML on stdout, the report on stderr.
    Migrate(MigrateArgs),
    /// Print a shell completion script (`source <(kms-operator completion
    /// bash)`).
    Completion(CompletionArgs),
}

/// How a command that talks to the cluster reaches it, with kubectl's flags.
#[derive(Debug, Args, Clone, Default)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: `$KUBECONFIG`, then
    /// `~/.kube/config`, then the pod's service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

/// Flags of `kms-operator completion`.
#[derive(Debug, Args, Clone)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Flags of `kms-operator run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Namespaces to watch (comma list); empty watches the whole cluster.
    #[arg(long, value_delimiter = ',', env = "KMS_OPERATOR_NAMESPACES")]
    pub namespaces: Vec<String>,
    /// Number of shards the namespaces are split into. Every replica must use
    /// the same value.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256), env = "KMS_OPERATOR_SHARDS")]
    pub shards: u32,
    /// What each replica caches: `shard` (the default) caches only the
    /// resources and managed objects of the shards it owns (resources by
    /// their namespace, managed objects by the `secrets.hanzo.ai/shard`
    /// label it writes on them); `cluster` caches every watched object on
    /// every replica.
    #[arg(
        long,
        value_enum,
        default_value_t = WatchScope::Shard,
        env = "KMS_OPERATOR_WATCH_SCOPE"
    )]
    pub watch_scope: WatchScope,
    /// This replica's identity in Leases (default: the hostname).
    #[arg(long, env = "KMS_OPERATOR_POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of the operator's Leases.
    #[arg(
        long,
        default_value = "kms-operator-system",
        env = "KMS_OPERATOR_POD_NAMESPACE"
    )]
    pub pod_namespace: String,
    /// Namespace of the global configuration ConfigMap `kms-config` (read
    /// and watched; it may not exist yet).
    #[arg(
        long,
        default_value = crate::controllers::refs::GLOBAL_CONFIG_NAMESPACE,
        env = "KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE"
    )]
    pub global_config_namespace: String,
    /// KMS API URL of resources that name none, when `kms-config` names none
    /// either (default: `https://kms.hanzo.ai/api`).
    #[arg(long, env = "KMS_OPERATOR_DEFAULT_HOST_API")]
    pub default_host_api: Option<String>,
    /// CA bundle (`<namespace>/<secret>/<key>`) of resources that name none,
    /// when `kms-config` names none either.
    #[arg(long, value_parser = crate::controllers::refs::parse_ca_ref, env = "KMS_OPERATOR_DEFAULT_CA_REF")]
    pub default_ca_ref: Option<(String, String, String)>,
    /// Prefix of the Lease names (`<prefix>-shard-NN`, `<prefix>-member-<pod>`).
    #[arg(
        long,
        default_value = "kms-operator",
        env = "KMS_OPERATOR_LEASE_PREFIX"
    )]
    pub lease_prefix: String,
    /// How long a Lease is valid without renewal.
    #[arg(long, default_value = "10", value_parser = parse_duration_arg, env = "KMS_OPERATOR_LEASE_DURATION")]
    pub lease_duration: Duration,
    /// Stop working on a shard whose Lease was not renewed for this long.
    #[arg(long, default_value = "7", value_parser = parse_duration_arg, env = "KMS_OPERATOR_RENEW_DEADLINE")]
    pub renew_deadline: Duration,
    /// Time between Lease renewals.
    #[arg(long, default_value = "2", value_parser = parse_duration_arg, env = "KMS_OPERATOR_RETRY_PERIOD")]
    pub retry_period: Duration,
    /// How many replicas run (the chart sets its replica count). A replica
    /// that starts fresh watches its shards once that many members are live
    /// and it holds exactly its share, instead of once the member set has
    /// been quiet for half a retry period; either way it waits two retry
    /// periods at most. A wrong value costs no more than that wait; 0 is
    /// no count (a release scaled to zero, then up).
    #[arg(long, env = "KMS_OPERATOR_EXPECTED_REPLICAS")]
    pub expected_replicas: Option<u32>,
    /// Directory of the persistent cache; empty disables it.
    #[arg(long, env = "KMS_OPERATOR_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// File with a key that encrypts tokens kept in the persistent cache.
    #[arg(long, env = "KMS_OPERATOR_CACHE_ENCRYPTION_KEY_FILE")]
    pub cache_encryption_key_file: Option<PathBuf>,
    /// Address of the metrics server (`host:port` or `:port`; `0` disables
    /// it). Loopback by default; any other address needs `--metrics-tls`
    /// (or, knowingly, `--metrics-insecure`).
    #[arg(long, alias = "metrics-bind-address", default_value = "127.0.0.1:8443", value_parser = parse_bind_addr, env = "KMS_OPERATOR_METRICS_ADDR")]
    pub metrics_addr: BindAddr,
    /// Serve metrics over HTTPS with bearer-token authentication.
    #[arg(long, env = "KMS_OPERATOR_METRICS_TLS")]
    pub metrics_tls: bool,
    /// Allow plain, unauthenticated HTTP metrics on a non-loopback address.
    #[arg(
        long,
        env = "KMS_OPERATOR_METRICS_INSECURE",
        conflicts_with = "metrics_tls"
    )]
    pub metrics_insecure: bool,
    /// Directory of the metrics server's certificate (with `--metrics-tls`);
    /// without it a self-signed certificate is made at start.
    #[arg(long, env = "KMS_OPERATOR_METRICS_CERT_PATH")]
    pub metrics_cert_path: Option<PathBuf>,
    /// File name of the certificate in `--metrics-cert-path`.
    #[arg(
        long,
        default_value = "tls.crt",
        env = "KMS_OPERATOR_METRICS_CERT_NAME"
    )]
    pub metrics_cert_name: String,
    /// File name of the private key in `--metrics-cert-path`.
    #[arg(long, default_value = "tls.key", env = "KMS_OPERATOR_METRICS_CERT_KEY")]
    pub metrics_cert_key: String,
    /// Address of the health server (`/healthz`, `/readyz`).
    #[arg(long, alias = "health-probe-bind-address", default_value = "0.0.0.0:8081", value_parser = parse_bind_addr, env = "KMS_OPERATOR_HEALTH_ADDR")]
    pub health_addr: BindAddr,
    /// Accepted for compatibility; replicas always coordinate through Leases.
    #[arg(long, env = "KMS_OPERATOR_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Accepted for compatibility with the Go operator's chart; has no effect.
    #[arg(long, hide = true)]
    pub deprecated_scoped_namespace_warning: bool,
    /// Allow resources to reference Secrets and ServiceAccounts in other
    /// namespaces.
    #[arg(long, env = "KMS_OPERATOR_ALLOW_CROSS_NAMESPACE_REFS")]
    pub allow_cross_namespace_refs: bool,
    /// Host patterns the KMS URL may use (comma list, `*.example.com`
    /// allowed); empty allows any host.
    #[arg(long, value_delimiter = ',', env = "KMS_OPERATOR_ALLOWED_KMS_HOSTS")]
    pub allowed_kms_hosts: Vec<String>,
    /// Directory under which `gcpIamAuth` key files may be read.
    #[arg(long, env = "KMS_OPERATOR_KEY_FILE_DIR")]
    pub key_file_dir: Option<PathBuf>,
    /// YAML file of the rules that say which namespaces may log in with
    /// the operator's own cloud identity (`awsIamAuth`, `azureAuth`,
    /// `gcpIdTokenAuth`, `gcpIamAuth`): a list of `{namespaces, methods,
    /// identityIds, keyFiles}`. Without it no namespace may.
    #[arg(long, env = "KMS_OPERATOR_CLOUD_IDENTITIES")]
    pub cloud_identities: Option<PathBuf>,
    /// STS endpoint for AWS IAM auth (signed `GetCallerIdentity`, web
    /// identity exchange); default: the regional endpoint of `AWS_REGION`,
    /// else `https://sts.amazonaws.com`.
    #[arg(long, env = "KMS_OPERATOR_AWS_STS_ENDPOINT")]
    pub aws_sts_endpoint: Option<String>,
    /// AWS instance metadata service (IMDSv2) for AWS IAM auth.
    #[arg(long, default_value = crate::kms::cloud::DEFAULT_AWS_IMDS, env = "KMS_OPERATOR_AWS_IMDS_ENDPOINT")]
    pub aws_imds_endpoint: String,
    /// Azure instance metadata service for Azure managed-identity auth.
    #[arg(long, default_value = crate::kms::cloud::DEFAULT_AZURE_IMDS, env = "KMS_OPERATOR_AZURE_IMDS_ENDPOINT")]
    pub azure_imds_endpoint: String,
    /// GCP metadata server for GCP ID-token auth.
    #[arg(long, default_value = crate::kms::cloud::DEFAULT_GCP_METADATA, env = "KMS_OPERATOR_GCP_METADATA_ENDPOINT")]
    pub gcp_metadata_endpoint: String,
    /// Timeout of one call to a metadata service or STS.
    #[arg(long, default_value = "3", value_parser = parse_duration_arg, env = "KMS_OPERATOR_CLOUD_TIMEOUT")]
    pub cloud_timeout: Duration,
    /// KMS requests per second for the whole operator, shared by live
    /// replicas (burst twice that).
    #[arg(long, default_value_t = 20.0, env = "KMS_OPERATOR_KMS_RATE_LIMIT")]
    pub kms_rate_limit: f64,
    /// Resources each controller of a replica reconciles at once. Most of a
    /// reconcile waits (for the KMS or the API server), so this is not the
    /// CPU count; the KMS budget and the API server bound the pace. While
    /// the replicas have work of different sizes, each runs between half
    /// and twice this, by its part of the work.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024), env = "KMS_OPERATOR_WORKERS")]
    pub workers: u16,
    /// The most secrets one KMS answer may hold (a scope with its imports
    /// and, when recursive, its sub-folders); a larger answer is refused
    /// with a condition that says so.
    #[arg(long, default_value_t = crate::kms::client::DEFAULT_MAX_SECRETS, env = "KMS_OPERATOR_KMS_MAX_SECRETS")]
    pub kms_max_secrets: usize,
    /// Bytes of KMS answers a replica holds at once (read, parsed and in
    /// use; requests wait beyond it). At least twice the largest answer
    /// (32 MiB).
    #[arg(long, default_value_t = crate::kms::client::DEFAULT_ANSWER_BUDGET, value_parser = clap::value_parser!(u64).range(64 * 1024 * 1024..), env = "KMS_OPERATOR_KMS_MEMORY_BUDGET")]
    pub kms_memory_budget: u64,
    /// Also export `kms_operator_resource_condition`, one series per
    /// resource (for small installs: the series count grows with the
    /// resources).
    #[arg(long, env = "KMS_OPERATOR_METRICS_PER_RESOURCE")]
    pub metrics_per_resource: bool,
    /// Threads that render templates (0: half the CPUs, at least one).
    /// Renders never run on the threads that renew Leases and answer
    /// probes.
    #[arg(long, default_value_t = 0, env = "KMS_OPERATOR_RENDER_THREADS")]
    pub render_threads: u16,
    /// How long one resource's templates may render before they are
    /// stopped and reported as too expensive (a TemplateError condition).
    /// Milliseconds are allowed (`500ms`).
    #[arg(long, default_value = "2s", value_parser = parse_timeout_arg, env = "KMS_OPERATOR_RENDER_TIMEOUT")]
    pub render_timeout: Duration,
    /// Workload rollouts started per second by auto-reload, for the whole
    /// operator (shared by live replicas).
    #[arg(
        long,
        default_value_t = 2.0,
        env = "KMS_OPERATOR_MAX_RELOADS_PER_SECOND"
    )]
    pub max_reloads_per_second: f64,
    /// How long auto-reload waits after a change before rolling a workload, so
    /// that objects changing together cause one rollout.
    #[arg(long, default_value = "2", value_parser = parse_duration_arg, env = "KMS_OPERATOR_RELOAD_DEBOUNCE")]
    pub reload_debounce: Duration,
    /// Auto-reload Argo Rollouts (`argoproj.io/v1alpha1` `Rollout`) too,
    /// restarted through `spec.restartAt`. Rollouts are watched while the
    /// CRD `rollouts.argoproj.io` exists (installed later, they are picked
    /// up without a restart). Needs `get`/`list`/`watch` on that one CRD and
    /// `get`/`list`/`watch`/`patch` on `rollouts`.
    #[arg(long, default_value_t = false, env = "KMS_OPERATOR_ARGO_ROLLOUTS")]
    pub argo_rollouts: bool,
    /// How long cleanup on deletion is retried before the operator gives up.
    #[arg(long, default_value = "1h", value_parser = parse_duration_arg, env = "KMS_OPERATOR_CLEANUP_TIMEOUT")]
    pub cleanup_timeout: Duration,
}

/// Flags of `kms-operator crds`.
#[derive(Debug, Args, Clone)]
pub struct CrdsArgs {
    /// Write `<plural>.yaml` per CRD into this directory instead of printing.
    #[arg(long, env = "KMS_OPERATOR_OUT_DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Flags of `kms-operator dev-server`.
#[derive(Debug, Args, Clone)]
pub struct DevServerArgs {
    /// Address to listen on; the API is served under `/api/…`.
    #[arg(long, default_value = "127.0.0.1:8080", env = "KMS_OPERATOR_ADDR")]
    pub addr: SocketAddr,
    /// Directory of the server's database; empty keeps everything in memory.
    #[arg(long, env = "KMS_OPERATOR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Seed file (YAML) applied at start, create-if-absent.
    #[arg(long, env = "KMS_OPERATOR_SEED")]
    pub seed: Option<PathBuf>,
    /// Bearer token of the admin API (`/admin`); without it the admin API is
    /// open.
    #[arg(long, env = "KMS_OPERATOR_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// Shortest lease TTL accepted for dynamic secrets.
    #[arg(long, default_value = "60s", value_parser = parse_duration_arg, env = "KMS_OPERATOR_MIN_LEASE_TTL")]
    pub min_lease_ttl: Duration,
    /// Kubeconfig of the cluster whose API server reviews the tokens of
    /// Kubernetes-auth logins (`TokenReview`); without it they are refused.
    #[arg(long, env = "KMS_OPERATOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Requests allowed per minute and client on every route (more get
    /// 429); absent or 0 leaves rate limits off.
    #[arg(long, env = "KMS_OPERATOR_RATE_LIMIT_PER_MINUTE")]
    pub rate_limit_per_minute: Option<u32>,
    /// Certificate chain (PEM) to serve HTTPS with, together with
    /// `--tls-key`.
    #[arg(long, requires = "tls_key", env = "KMS_OPERATOR_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of `--tls-cert`.
    #[arg(long, requires = "tls_cert", env = "KMS_OPERATOR_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Answer a list of a folder or environment that does not exist with
    /// 404 `NotFound`, as current servers do, instead of an empty list (as
    /// older servers do).
    #[arg(long, env = "KMS_OPERATOR_MISSING_FOLDERS_NOT_FOUND")]
    pub missing_folders_not_found: bool,
}

/// Flags of `kms-operator migrate`. Exit status: 0 when everything was
/// converted, 2 when something could not be carried (the rest is still
/// printed), 1 on an error.
#[derive(Debug, Args, Clone)]
pub struct MigrateArgs {
    /// Manifest files (multi-document YAML); `-` or none reads stdin.
    #[arg(conflicts_with = "from_cluster")]
    pub files: Vec<PathBuf>,
    /// Read the Go operators' resources from the cluster (of `--kubeconfig`
    /// and `--context`) instead of files: every namespace, or the one of
    /// `-n`.
    #[arg(long, env = "KMS_OPERATOR_FROM_CLUSTER")]
    pub from_cluster: bool,
    /// The cluster and namespace to read with `--from-cluster`.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// What a replica caches (`--watch-scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WatchScope {
    /// The objects of the shards it owns.
    Shard,
    /// Every watched object.
    Cluster,
}

/// Output format of `kms-operator status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A table.
    Table,
    /// A table with the shard and the condition's message.
    Wide,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Flags of `kms-operator status`.
#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// The cluster and the namespace to show.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Where the operator runs.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// Output format.
    #[arg(
        long,
        short,
        value_enum,
        default_value = "table",
        env = "KMS_OPERATOR_OUTPUT"
    )]
    pub output: OutputFormat,
}

/// Where the CLI's commands find a running operator: its namespace (its
/// Leases and StatefulSet) and the prefix of its Lease names.
#[derive(Debug, Args, Clone)]
pub struct OperatorArgs {
    /// Namespace of the operator's Leases (and StatefulSet).
    #[arg(
        long,
        default_value = "kms-operator-system",
        env = "KMS_OPERATOR_POD_NAMESPACE"
    )]
    pub pod_namespace: String,
    /// Prefix of the Lease names (default: found from the shard Leases in
    /// `--pod-namespace`).
    #[arg(long, env = "KMS_OPERATOR_LEASE_PREFIX")]
    pub lease_prefix: Option<String>,
}

/// Flags of `kms-operator sync`.
#[derive(Debug, Args, Clone)]
pub struct SyncArgs {
    /// The cluster, and the namespace of the resource.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// How long to wait for the sync to run.
    #[arg(long, default_value = "60s", value_parser = parse_duration_arg, env = "KMS_OPERATOR_TIMEOUT")]
    pub timeout: Duration,
    /// The resource: `NAME` (a KmsSecret) or `KIND/NAME`.
    pub resource: String,
}

/// Flags of `kms-operator check`.
#[derive(Debug, Args, Clone)]
pub struct CheckArgs {
    /// The cluster, and the namespace of the resources named.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Where the operator runs.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// How many shards must be held (default: as many as there are shard
    /// Leases).
    #[arg(long, env = "KMS_OPERATOR_SHARDS")]
    pub shards: Option<u32>,
    /// The operator's StatefulSet, whose replicas must all be Ready.
    #[arg(long, env = "KMS_OPERATOR_STATEFULSET")]
    pub statefulset: Option<String>,
    /// How many replicas the StatefulSet must run (with `--statefulset`).
    #[arg(long, requires = "statefulset", env = "KMS_OPERATOR_REPLICAS")]
    pub replicas: Option<u32>,
    /// Resources that must be Ready: `NAME` (a KmsSecret) or `KIND/NAME`,
    /// in the namespace `-n` names.
    pub resources: Vec<String>,
}

/// A listen address, or disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindAddr {
    /// Listen here.
    Addr(SocketAddr),
    /// Do not listen (`0`).
    Disabled,
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// A duration as [`parse_duration_arg`] reads it, or milliseconds
/// (`250ms`); never zero.
fn parse_timeout_arg(s: &str) -> Result<Duration, String> {
    let d = match s.trim().strip_suffix("ms") {
        Some(ms) => ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("invalid duration {s:?}: use e.g. 500ms, 2s or 1m"))?,
        None => parse_duration_arg(s)?,
    };
    if d.is_zero() {
        return Err("the timeout must be more than 0".to_owned());
    }
    Ok(d)
}

/// Parse `host:port`, `:port` (all interfaces) or `0` (disabled).
fn parse_bind_addr(s: &str) -> Result<BindAddr, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(BindAddr::Disabled);
    }
    let full = if let Some(port) = s.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else {
        s.to_owned()
    };
    full.parse::<SocketAddr>()
        .map(BindAddr::Addr)
        .map_err(|e| format!("invalid address {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(args: &[&str]) -> RunArgs {
        let mut argv = vec!["kms-operator", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(a) => *a,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let a = run_args(&[]);
        assert_eq!(a.shards, 16);
        assert_eq!(a.pod_namespace, "kms-operator-system");
        // kms-config is read where the Go operators' documentation puts it.
        assert_eq!(a.global_config_namespace, "kms-operator-system");
        assert_eq!((a.default_host_api, a.default_ca_ref), (None, None));
        assert_eq!(a.lease_prefix, "kms-operator");
        assert_eq!(a.lease_duration, Duration::from_secs(10));
        assert_eq!(a.renew_deadline, Duration::from_secs(7));
        assert_eq!(a.retry_period, Duration::from_secs(2));
        assert_eq!(a.cleanup_timeout, Duration::from_secs(3600));
        assert_eq!(
            a.metrics_addr,
            BindAddr::Addr("127.0.0.1:8443".parse().unwrap())
        );
        assert!(!a.metrics_tls && !a.metrics_insecure);
        assert_eq!(
            a.health_addr,
            BindAddr::Addr("0.0.0.0:8081".parse().unwrap())
        );
        assert!((a.kms_rate_limit - 20.0).abs() < f64::EPSILON);
        assert_eq!(a.workers, 32);
        assert!(a.namespaces.is_empty());
        assert_eq!(a.aws_imds_endpoint, "http://169.254.169.254");
        assert_eq!(a.azure_imds_endpoint, "http://169.254.169.254");
        assert_eq!(a.gcp_metadata_endpoint, "http://metadata.google.internal");
        assert_eq!(a.aws_sts_endpoint, None);
        assert_eq!(a.cloud_timeout, Duration::from_secs(3));
        assert_eq!(a.render_timeout, Duration::from_secs(2));
        assert_eq!(a.render_threads, 0);
        assert_eq!(a.kms_max_secrets, 10_000);
        assert_eq!(a.kms_memory_budget, 128 << 20);
        assert_eq!(a.cloud_identities, None);
    }

    #[test]
    fn the_render_timeout_takes_milliseconds_and_never_zero() {
        assert_eq!(
            run_args(&["--render-timeout=250ms"]).render_timeout,
            Duration::from_millis(250)
        );
        assert_eq!(
            run_args(&["--render-timeout=1m"]).render_timeout,
            Duration::from_secs(60)
        );
        for bad in ["0", "0ms", "fast", "1.5s"] {
            assert!(parse_timeout_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reference_chart_arguments_are_accepted() {
        let a = run_args(&[
            "--metrics-bind-address=:8443",
            "--leader-elect",
            "--health-probe-bind-address=:8081",
            "--namespaces=a,b",
        ]);
        assert_eq!(
            a.metrics_addr,
            BindAddr::Addr("0.0.0.0:8443".parse().unwrap())
        );
        assert_eq!(
            a.health_addr,
            BindAddr::Addr("0.0.0.0:8081".parse().unwrap())
        );
        assert!(a.leader_elect);
        assert_eq!(a.namespaces, vec!["a", "b"]);
        assert_eq!(
            run_args(&["--metrics-addr=0"]).metrics_addr,
            BindAddr::Disabled
        );
    }

    #[test]
    fn durations_accept_seconds_and_units() {
        let a = run_args(&[
            "--lease-duration=15s",
            "--retry-period=3",
            "--cleanup-timeout=2m",
        ]);
        assert_eq!(a.lease_duration, Duration::from_secs(15));
        assert_eq!(a.retry_period, Duration::from_secs(3));
        assert_eq!(a.cleanup_timeout, Duration::from_secs(120));
        let err = Cli::try_parse_from(["kms-operator", "run", "--lease-duration=ten"]).unwrap_err();
        assert!(err.to_string().contains("invalid duration"), "{err}");
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_reads_its_environment_variable() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let mut checked = 0;
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if arg.is_hide_set() || long == "help" || long == "version" {
                    continue;
                }
                // kubectl's flags, spelled and read as kubectl reads them
                // (the kubeconfig from `KUBECONFIG`, the rest from none).
                let kubectl = ["kubeconfig", "context", "namespace", "all-namespaces"];
                if ["status", "check", "sync", "migrate"].contains(&sub.get_name())
                    && kubectl.contains(&long)
                {
                    assert!(arg.get_env().is_none(), "--{long} of {}", sub.get_name());
                    continue;
                }
                let want = format!("KMS_OPERATOR_{}", long.to_uppercase().replace('-', "_"));
                let got = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                assert_eq!(
                    got.as_deref(),
                    Some(want.as_str()),
                    "flag --{long} of {}",
                    sub.get_name()
                );
                checked += 1;
            }
        }
        assert!(checked > 20, "only {checked} flags checked");
    }
}
