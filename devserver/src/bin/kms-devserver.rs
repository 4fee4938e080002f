//! A standalone runner of the dev server, with the flags of
//! `kms-operator dev-server`: `--addr`, `--data-dir`, `--seed`,
//! `--admin-token`, `--min-lease-ttl` (seconds, or `30s`, `2m`, `1h`),
//! `--kubeconfig`, `--rate-limit-per-minute`, `--tls-cert` and `--tls-key`
//! (no environment variables). The crate's tests run it as a separate
//! process to check that acknowledged writes survive `kill -9`;
//! `kms-operator dev-server` is the supported entry point.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kms_devserver::{Config, SeedDuration, SeedSource};

fn parse(args: impl Iterator<Item = String>) -> Result<Config, String> {
    let mut config = Config::default();
    let mut args = args.peekable();
    while let Some(flag) = args.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (flag.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--addr" => {
                let v = value()?;
                config.addr = v.parse().map_err(|e| format!("--addr {v:?}: {e}"))?;
            }
            "--data-dir" => config.data_dir = Some(PathBuf::from(value()?)),
            "--seed" => config.seed = Some(SeedSource::File(PathBuf::from(value()?))),
            "--admin-token" => config.admin_token = Some(value()?).filter(|t| !t.is_empty()),
            "--kubeconfig" => config.kubeconfig = Some(PathBuf::from(value()?)),
            "--rate-limit-per-minute" => {
                let v = value()?;
                config.rate_limit_per_minute = Some(
                    v.parse()
                        .map_err(|e| format!("--rate-limit-per-minute {v:?}: {e}"))?,
                );
            }
            "--tls-cert" => config.tls_cert = Some(PathBuf::from(value()?)),
            "--tls-key" => config.tls_key = Some(PathBuf::from(value()?)),
            "--min-lease-ttl" => {
                let v = value()?;
                config.min_lease_ttl = SeedDuration::parse(&v)
                    .map(|d| d.duration)
                    .ok_or_else(|| format!("--min-lease-ttl {v:?}: not a duration"))?;
            }
            "-h" | "--help" => {
                return Err(
                    "usage: kms-devserver [--addr A] [--data-dir D] [--seed S] [--admin-token T] \
                     [--min-lease-ttl 60s] [--kubeconfig K] [--rate-limit-per-minute N] \
                     [--tls-cert C --tls-key K]"
                        .to_owned(),
                );
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    if config.min_lease_ttl == Duration::ZERO {
        return Err("--min-lease-ttl must be positive".to_owned());
    }
    Ok(config)
}

#[tokio::main]
async fn main() -> ExitCode {
    // One TLS provider for the Kubernetes client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match parse(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match kms_devserver::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dev-server: {e}");
            ExitCode::FAILURE
        }
    }
}
