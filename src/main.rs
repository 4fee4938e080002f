//! The `kms-operator` binary: parse the command line, set up logging, and hand
//! over to the library, or to [`migrate`] (`kms-operator migrate`, which the
//! operator library does not carry: it converts manifests of the Go
//! operators and imports nothing from the controllers).

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches};
use kms_operator::cli::{Cli, Command};
use kms_operator::{api, telemetry};

mod migrate;

fn main() -> anyhow::Result<()> {
    // One TLS provider for kube, reqwest and everything else on rustls.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS crypto provider was already installed"))?;
    let name = program_name();
    let cli = Cli::from_arg_matches(&Cli::command().bin_name(&name).get_matches())
        .unwrap_or_else(|e| e.exit());
    telemetry::init(cli.log_format, &cli.log_level);
    match cli.command {
        Command::Crds(args) => match args.out_dir {
            None => {
                print!("{}", api::crds_yaml()?);
                Ok(())
            }
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                for crd in api::crds() {
                    let path = dir.join(api::crd_file_name(&crd));
                    std::fs::write(&path, api::crd_yaml(&crd)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                Ok(())
            }
        },
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(kms_operator::operator::run(*args)),
        #[cfg(feature = "dev-server")]
        Command::DevServer(args) => {
            let config = kms_devserver::Config {
                addr: args.addr,
                data_dir: args.data_dir,
                seed: args.seed.map(kms_devserver::SeedSource::File),
                admin_token: args.admin_token.filter(|t| !t.is_empty()),
                min_lease_ttl: args.min_lease_ttl,
                kubeconfig: args.kubeconfig,
                rate_limit_per_minute: args.rate_limit_per_minute,
                tls_cert: args.tls_cert,
                tls_key: args.tls_key,
                missing_folders_not_found: args.missing_folders_not_found,
                ..kms_devserver::Config::default()
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(kms_devserver::run(config))
                .context("dev-server")
        }
        Command::Migrate(args) => {
            let code = migrate::run(args)?;
            std::process::exit(code)
        }
        Command::Completion(args) => {
            clap_complete::generate(
                args.shell,
                &mut Cli::command(),
                "kms-operator",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Status(args) => on_one_thread(kms_operator::status::run(args))?,
        Command::Sync(args) => exit_ok(on_one_thread(kms_operator::sync_now::run(args))??),
        Command::Check(args) => exit_ok(on_one_thread(kms_operator::check::run(args))??),
    }
}

/// Run a command that talks to the cluster on a runtime of one thread.
fn on_one_thread<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

/// Exit with status 0 when `ok`, else 1.
fn exit_ok(ok: bool) -> ! {
    std::process::exit(if ok { 0 } else { 1 })
}

/// How the user called us: `kubectl kms` when run as the kubectl plugin
/// (an executable named `kubectl-kms` on the `PATH`), else `kms-operator`.
fn program_name() -> String {
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let file = std::path::Path::new(&arg0)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if file == "kubectl-kms" {
        "kubectl kms".to_owned()
    } else {
        "kms-operator".to_owned()
    }
}
