//! How the CLI's commands reach a cluster: kubectl's `--kubeconfig`,
//! `--context`, `-n` and `-A`, read the way kubectl reads them.

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::ClusterArgs;

/// Which namespaces a command looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (`-A`).
    All,
    /// One namespace.
    Namespace(String),
}

impl Scope {
    /// The namespace, if one.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Scope::All => None,
            Scope::Namespace(ns) => Some(ns),
        }
    }
}

/// The scope `args` ask for: `-A`, else `-n`, else the context's namespace
/// (`fallback`), as kubectl does.
pub fn scope(args: &ClusterArgs, fallback: &str) -> Scope {
    if args.all_namespaces {
        Scope::All
    } else {
        Scope::Namespace(
            args.namespace
                .clone()
                .unwrap_or_else(|| fallback.to_owned()),
        )
    }
}

/// A client for the cluster `args` name, and the namespace of its context
/// (`default` when it names none).
pub async fn connect(args: &ClusterArgs) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .with_context(|| format!("loading the kubeconfig {}", path.display()))?
        }
        (None, Some(context)) => Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("loading the context {context} of the kubeconfig"))?,
        (None, None) => Config::infer().await.context(
            "no cluster found: set --kubeconfig or KUBECONFIG, or run in a pod with a service account",
        )?,
    };
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).context("creating the cluster client")?;
    Ok((client, namespace))
}
