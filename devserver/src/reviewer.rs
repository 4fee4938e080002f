//! The cluster that reviews Kubernetes-auth logins: a client of the API
//! server of `--kubeconfig`, with whose credentials the dev server creates
//! `TokenReview`s (the real server uses a reviewer token or the caller's own
//! token; the dev server needs no extra set-up).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::Error;

/// How long a review may take (as on the real server).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The outcome of a `TokenReview`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Review {
    pub authenticated: bool,
    pub error: Option<String>,
    pub username: String,
    pub audiences: Vec<String>,
}

/// Creates `TokenReview`s.
#[derive(Clone)]
pub(crate) struct Reviewer {
    client: Client,
}

impl std::fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reviewer")
    }
}

impl Reviewer {
    /// A reviewer for the cluster of a kubeconfig file (its current
    /// context).
    pub async fn connect(path: &Path) -> Result<Reviewer, Error> {
        // kube's TLS needs a process-wide rustls provider; install ring's
        // when the program has not chosen one.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let bad = |e: String| Error::Kube(format!("{}: {e}", path.display()));
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| bad(e.to_string()))?;
        let client = Client::try_from(config).map_err(|e| bad(e.to_string()))?;
        Ok(Reviewer { client })
    }

    /// Review `token`, for `audience` when given.
    pub async fn review(&self, token: &str, audience: Option<&str>) -> Result<Review, String> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: audience.map(|a| vec![a.to_owned()]),
            },
            ..TokenReview::default()
        };
        let created =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &request))
                .await
                .map_err(|_| "the Kubernetes API server did not answer in time".to_owned())?
                .map_err(|e| e.to_string())?;
        let status = created.status.unwrap_or_default();
        Ok(Review {
            authenticated: status.authenticated.unwrap_or(false),
            error: status.error,
            username: status.user.and_then(|u| u.username).unwrap_or_default(),
            audiences: status.audiences.unwrap_or_default(),
        })
    }
}
