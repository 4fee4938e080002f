//! Cloud credentials for the cloud login methods: what the operator pod
//! proves about itself to the KMS.
//!
//! - [`aws`]: a SigV4-signed STS `GetCallerIdentity` request, signed with the
//!   pod's ambient AWS credentials (environment, IRSA web-identity token via
//!   STS `AssumeRoleWithWebIdentity`, or the instance metadata service);
//! - [`azure`]: a managed-identity token from the Azure instance metadata
//!   service;
//! - [`gcp`]: a GCP identity token from the metadata server, or a JWT signed
//!   (RS256) with a service-account key file read from under
//!   `--key-file-dir`.
//!
//! Every source sits behind [`CloudSource`], and every endpoint it talks to
//! comes from [`CloudConfig`], so each one is tested against a local stand-in.
//! Calls are short (a few seconds) and failures say which sources were tried
//! and what the cloud answered, never a credential, token or signature.

pub mod aws;
pub mod azure;
mod common;
pub mod gcp;

pub use self::common::*;

use std::sync::Arc;

/// The source of a method.
pub fn source(
    config: &CloudConfig,
    method: CloudMethod,
    azure_resource: Option<&str>,
    azure_client_id: Option<&str>,
    gcp_key_file: Option<&str>,
) -> Arc<dyn CloudSource> {
    match method {
        CloudMethod::AwsIam => Arc::new(aws::AwsSource::new(config.clone())),
        CloudMethod::Azure => Arc::new(azure::AzureSource::new(
            config.clone(),
            azure_resource,
            azure_client_id,
        )),
        CloudMethod::GcpIdToken => Arc::new(gcp::GcpIdTokenSource::new(config.clone())),
        CloudMethod::GcpIam => Arc::new(gcp::GcpIamSource::new(
            config.clone(),
            gcp_key_file.unwrap_or_default(),
        )),
    }
}

#[cfg(test)]
pub(crate) mod stand_in {
    //! A loopback HTTP server answering with canned responses, for the
    //! sources' unit tests.

    use std::sync::{Arc, Mutex};

    use axum::extract::Request;
    use axum::response::{IntoResponse, Response};

    /// A recorded request: method, path and query, headers, body.
    #[derive(Clone, Debug)]
    pub struct Seen {
        pub method: String,
        pub uri: String,
        pub headers: Vec<(String, String)>,
        pub body: String,
    }

    type Handler = Arc<dyn Fn(&Seen) -> (u16, String) + Send + Sync>;

    /// A running stand-in.
    pub struct StandIn {
        pub url: String,
        pub seen: Arc<Mutex<Vec<Seen>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for StandIn {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl StandIn {
        /// Serve `handler` on a free loopback port.
        pub async fn start(
            handler: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static,
        ) -> Self {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let handler: Handler = Arc::new(handler);
            let seen = Arc::new(Mutex::new(Vec::new()));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let log = seen.clone();
            let app = axum::Router::new().fallback(move |req: Request| {
                let (handler, log) = (handler.clone(), log.clone());
                async move {
                    let (parts, body) = req.into_parts();
                    let body = axum::body::to_bytes(body, 1 << 20)
                        .await
                        .unwrap_or_default();
                    let seen = Seen {
                        method: parts.method.to_string(),
                        uri: parts.uri.to_string(),
                        headers: parts
                            .headers
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                            .collect(),
                        body: String::from_utf8_lossy(&body).into_owned(),
                    };
                    let (status, text) = handler(&seen);
                    log.lock().unwrap().push(seen);
                    let mut resp: Response = text.into_response();
                    *resp.status_mut() = axum::http::StatusCode::from_u16(status).unwrap();
                    resp
                }
            });
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            Self { url, seen, task }
        }

        /// The header `name` of a recorded request.
        pub fn header(seen: &Seen, name: &str) -> Option<String> {
            seen.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        }
    }

    /// An address where nothing listens.
    pub async fn closed_port() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        format!("http://{addr}")
    }
}
