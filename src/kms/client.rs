//! The KMS client shared by every controller: requests with the budget,
//! bounded retries and metrics; tokens per identity; conditional GETs;
//! identical fetches in flight shared.

use super::endpoint::truncate;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{ETAG, HeaderMap, IF_NONE_MATCH, RETRY_AFTER};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::auth::{Identity, IdentityKey, Token, TokenAction, TokenCache};
use super::cloud::CloudConfig;
use super::endpoint::{BodyError, describe_reqwest_error, read_capped};
use super::endpoint::{Clients, Endpoint, host_allowed};
use super::error::KmsError;
use super::flight::SingleFlight;
use super::limiter::{Acquired, Limiter};
use super::memory::{AnswerBudget, Held};
use super::model::{
    ErrorBody, GetSecretResponse, ListSecretsResponse, LoginResponse, SecretMap, merge_list,
    with_secret_cap,
};
use crate::metrics::Metrics;

const SERVICE_TOKEN: &str = "GET /api/v2/service-token";
const RENEW: &str = "POST /api/v1/auth/token/renew";
const LIST: &str = "GET /api/v3/secrets/raw";
const GET_ONE: &str = "GET /api/v3/secrets/raw/:secretName";

/// How long an answer is kept for sharing with later requests.
const SHARE_KEPT: Duration = Duration::from_secs(10);

/// How long an answer is kept while the KMS rate-limits this replica (from
/// a `429` until this long after its pause ends), and the oldest answer a
/// request the budget refuses may take instead of waiting (see
/// [`Kms::fetch`]): a window of a hosted KMS's per-minute limit, plus the
/// few seconds its refused requests come back after it.
pub const LIMITED_KEPT: Duration = Duration::from_secs(90);
/// How often answers past their window are let go after a fetch.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The longest 429 pause a request waits out in its worker; a longer one
/// ends the request with [`KmsError::RateLimited`] at once.
const LONGEST_INLINE_WAIT: Duration = Duration::from_secs(1);

/// Largest response body accepted.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// The most secrets one answer may hold, by default.
pub const DEFAULT_MAX_SECRETS: usize = 10_000;

/// Bytes of answers a replica holds at once, by default: two of the
/// largest answers (see [`super::memory`]).
pub const DEFAULT_ANSWER_BUDGET: u64 = 128 * 1024 * 1024;

/// Settings of the client.
#[derive(Clone, Debug)]
pub struct KmsConfig {
    /// Requests per second for the whole operator (shared by replicas).
    pub rate_limit: f64,
    /// Host patterns allowed; empty = any.
    pub allowed_hosts: Vec<String>,
    /// How long one call may keep retrying transport errors, 5xx and short
    /// 429 pauses before it reports the failure.
    pub retry_budget: Duration,
    /// First retry delay (doubled per attempt, with jitter).
    pub retry_base: Duration,
    /// The most secrets one answer may hold (a scope's and its imports').
    pub max_secrets: usize,
    /// Bytes of answers held at once (see [`super::memory`]).
    pub answer_budget: u64,
}

impl Default for KmsConfig {
    fn default() -> Self {
        Self {
            rate_limit: 20.0,
            allowed_hosts: Vec::new(),
            retry_budget: Duration::from_secs(15),
            retry_base: Duration::from_millis(500),
            max_secrets: DEFAULT_MAX_SECRETS,
            answer_budget: DEFAULT_ANSWER_BUDGET,
        }
    }
}

/// A project, by slug or by id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProjectRef {
    /// By slug.
    Slug(String),
    /// By id.
    Id(String),
    /// The project a service token belongs to.
    OfServiceToken,
}

impl ProjectRef {
    /// The project as messages name it: `project SLUG`, `project id ID`.
    pub fn describe(&self) -> String {
        match self {
            ProjectRef::Slug(s) => format!("project {s}"),
            ProjectRef::Id(id) => format!("project id {id}"),
            ProjectRef::OfServiceToken => "the service token's project".to_owned(),
        }
    }
}

/// What to read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The project.
    pub project: ProjectRef,
    /// Environment slug.
    pub environment: String,
    /// Folder path.
    pub path: String,
    /// Include sub-folders.
    pub recursive: bool,
    /// Only this secret (single-secret mode).
    pub secret_name: Option<String>,
}

/// The answer to a (conditional) fetch.
#[derive(Debug)]
pub enum Fetch {
    /// `304 Not Modified`: the data behind the ETag we sent is current.
    NotModified,
    /// The current secrets.
    Secrets {
        /// Secrets by key (shared, with the memory they hold reserved).
        secrets: Arc<Fetched>,
        /// The ETag to send next time.
        etag: Option<String>,
    },
}

type FetchKey = (IdentityKey, Scope, Option<String>);

/// The secrets of an answer, and its reservation of the replica's answer
/// budget: given back when the last holder drops them.
#[derive(Debug, Default)]
pub struct Fetched {
    map: SecretMap,
    held: Option<Held>,
}

impl Fetched {
    /// Secrets that hold no reservation (built here, not read from the KMS).
    pub fn unheld(map: SecretMap) -> Self {
        Self { map, held: None }
    }

    /// KiB of the answer budget these secrets hold.
    pub fn held_kib(&self) -> usize {
        self.held.as_ref().map_or(0, Held::kib)
    }
}

impl std::ops::Deref for Fetched {
    type Target = SecretMap;
    fn deref(&self) -> &SecretMap {
        &self.map
    }
}

/// The last answer for a scope: when its request started (it holds every
/// change made before then), the ETag it proved current, and the secrets if
/// the answer carried them.
struct Recent {
    at: Instant,
    etag: Option<String>,
    secrets: Option<Arc<Fetched>>,
}

/// The client.
pub struct Kms {
    config: KmsConfig,
    clients: Clients,
    limiter: Limiter,
    tokens: TokenCache,
    fetches: SingleFlight<FetchKey, Result<Arc<Fetch>, KmsError>>,
    recent: Mutex<std::collections::HashMap<(IdentityKey, Scope), Recent>>,
    /// Until when answers are kept for [`LIMITED_KEPT`] (the KMS answered
    /// `429` lately), not [`SHARE_KEPT`].
    limited_until: Mutex<Option<Instant>>,
    /// When answers past their window were last let go after a fetch.
    swept: Mutex<Option<Instant>>,
    /// Persistent token cache (only when it encrypts tokens).
    token_store: Option<storage::Store>,
    /// Project ids of service tokens.
    token_projects: Mutex<std::collections::HashMap<IdentityKey, String>>,
    metrics: Metrics,
    warned_plain_http: Mutex<HashSet<String>>,
    /// Where the cloud login methods find their credentials.
    cloud: CloudConfig,
    /// Bytes of answers held at once.
    budget: AnswerBudget,
}

/// A buffered response.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: bytes::Bytes,
    /// Its reservation of the answer budget.
    pub(super) held: Option<Held>,
}

impl Kms {
    /// A client with the given settings, recording into `metrics`.
    pub fn new(config: KmsConfig, metrics: Metrics) -> Self {
        Self {
            limiter: Limiter::new(config.rate_limit),
            budget: AnswerBudget::new(config.answer_budget),
            config,
            clients: Clients::default(),
            tokens: TokenCache::default(),
            fetches: SingleFlight::default(),
            recent: Mutex::new(std::collections::HashMap::new()),
            limited_until: Mutex::new(None),
            swept: Mutex::new(None),
            token_store: None,
            token_projects: Mutex::new(std::collections::HashMap::new()),
            metrics,
            warned_plain_http: Mutex::new(HashSet::new()),
            cloud: CloudConfig::default(),
        }
    }

    /// Look for cloud credentials where `cloud` says.
    pub fn with_cloud(mut self, cloud: CloudConfig) -> Self {
        self.cloud = cloud;
        self
    }

    /// Where the cloud login methods find their credentials.
    pub fn cloud(&self) -> &CloudConfig {
        &self.cloud
    }

    /// Keep tokens in `store` as well (it stores them only when it
    /// encrypts them), so a restart can reuse them instead of logging in.
    pub fn with_token_store(mut self, store: storage::Store) -> Self {
        if store.encrypts_tokens() {
            self.token_store = Some(store);
        }
        self
    }

    /// The HTTP client for an endpoint (for streaming requests).
    pub(super) fn http_client(&self, endpoint: &Endpoint) -> Result<reqwest::Client, KmsError> {
        self.clients.get(endpoint)
    }

    /// Count a request made outside [`Kms::send`].
    pub(super) fn record_request(
        &self,
        route: &'static str,
        status: Option<u16>,
        elapsed: Duration,
    ) {
        self.metrics.kms_request(route, status, elapsed);
    }

    /// Tell the budget the weight each live replica published (`own` is
    /// this replica): it is shared in proportion. `leases` are the members
    /// with a member Lease (see [`Limiter::set_weights`]).
    pub fn set_weights(
        &self,
        own: &str,
        live: &std::collections::BTreeMap<String, f64>,
        leases: &std::collections::BTreeSet<String>,
    ) {
        self.limiter.set_weights(own, live, leases);
    }

    /// This replica's share of the request rate now, requests per second.
    pub fn rate(&self) -> f64 {
        self.limiter.rate()
    }

    /// A Lease renewal failed: members that left keep their weight in the
    /// budget for a full hold from now.
    pub fn hold_members(&self) {
        self.limiter.hold_members();
    }

    /// The `--allowed-kms-hosts` patterns (empty: any host).
    pub fn allowed_hosts(&self) -> &[String] {
        &self.config.allowed_hosts
    }

    /// Check that an endpoint may be used (allow list), warning once per
    /// host about plain HTTP.
    pub fn check_endpoint(&self, endpoint: &Endpoint) -> Result<(), KmsError> {
        if !host_allowed(&endpoint.host, &self.config.allowed_hosts) {
            return Err(KmsError::HostNotAllowed {
                host: endpoint.host.clone(),
            });
        }
        if endpoint.is_plain_http() {
            let mut warned = self
                .warned_plain_http
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if warned.insert(endpoint.base.clone()) {
                tracing::warn!(host = %endpoint.base, "the KMS is reached over plain http: tokens and secrets cross the network unencrypted");
            }
        }
        Ok(())
    }

    /// Reserve the answer budget for a body of `bytes`. While waiting,
    /// answers kept for sharing that are past their window are let go (they
    /// may hold what is waited for).
    async fn hold_answer(&self, bytes: usize) -> Held {
        if let Some(held) = self.budget.try_hold(bytes as u64) {
            return held;
        }
        self.metrics.kms_answer_waits.inc();
        loop {
            // Memory comes first: only the sharing window's answers stay.
            self.forget_answers_older_than(SHARE_KEPT);
            match tokio::time::timeout(Duration::from_secs(1), self.budget.hold(bytes as u64)).await
            {
                Ok(held) => return held,
                Err(_) => tracing::debug!(bytes, "waiting for the KMS answer budget"),
            }
        }
    }

    /// Let go of answers kept for sharing past their window, at most once
    /// a second (a sweep visits every answer kept, and at 100,000 resources
    /// a replica's folders answer dozens of times a second; an answer past
    /// its window is never served, whether it is gone yet or not).
    fn forget_old_answers(&self) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if swept.is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY) {
                return;
            }
            *swept = Some(now);
        }
        let limited = self
            .limited_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|until| until > Instant::now());
        self.forget_answers_older_than(if limited { LIMITED_KEPT } else { SHARE_KEPT });
    }

    fn forget_answers_older_than(&self, kept: Duration) {
        let now = Instant::now();
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, r| now.saturating_duration_since(r.at) <= kept);
    }

    fn jitter(&self, d: Duration) -> Duration {
        d.mul_f64(0.8 + fastrand::f64() * 0.4)
    }

    /// Send a request built by `build`, within the budget, retrying
    /// transport errors, 5xx and short 429 pauses until the retry budget is
    /// spent. 4xx answers (other than 429) and 304 are returned as they are.
    pub(super) async fn send<F>(
        &self,
        endpoint: &Endpoint,
        route: &'static str,
        build: F,
    ) -> Result<Reply, KmsError>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        self.check_endpoint(endpoint)?;
        let client = self.clients.get(endpoint)?;
        let started = Instant::now();
        let deadline = started + self.config.retry_budget;
        let mut delay = self.config.retry_base;
        loop {
            // A pause the KMS asked for is not waited out here (only its last
            // moment): the reconcile gives its worker back and comes round
            // when the pause ends.
            match self
                .limiter
                .acquire_unless_paused(&endpoint.origin, LONGEST_INLINE_WAIT)
                .await
            {
                Ok(Acquired::Immediately) => {}
                Ok(Acquired::AfterWaiting) => self.metrics.kms_throttled.inc(),
                Err(left) => {
                    self.metrics.kms_throttled.inc();
                    return Err(KmsError::rate_limited(route, left));
                }
            }
            let t0 = Instant::now();
            let result = build(&client).send().await;
            let outcome = match result {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    let declared = resp.content_length().map_or(MAX_BODY, |l| {
                        usize::try_from(l).unwrap_or(MAX_BODY).min(MAX_BODY)
                    });
                    let mut held = self.hold_answer(declared).await;
                    match read_capped(resp, MAX_BODY).await {
                        Ok(body) => Ok(Reply {
                            status,
                            headers,
                            held: {
                                held.shrink_to(body.len(), self.budget.total_kib());
                                Some(held)
                            },
                            body,
                        }),
                        // Asking again would read as much again: not retried.
                        Err(e @ BodyError::TooLarge(_)) => {
                            self.metrics
                                .kms_request(route, Some(status.as_u16()), t0.elapsed());
                            return Err(KmsError::Decode {
                                endpoint: route,
                                reason: e.to_string(),
                            });
                        }
                        Err(BodyError::Read(reason)) => Err(KmsError::Transport {
                            host: endpoint.host.clone(),
                            reason,
                        }),
                    }
                }
                Err(e) => Err(transport_error(&endpoint.origin, &e)),
            };
            let status = outcome.as_ref().ok().map(|r| r.status.as_u16());
            self.metrics.kms_request(route, status, t0.elapsed());
            let retry_in = match &outcome {
                // A certificate that is not trusted stays so: report it now.
                Err(KmsError::Certificate { .. }) => None,
                Err(_) => Some(self.jitter(delay)),
                Ok(r) if r.status == StatusCode::TOO_MANY_REQUESTS => {
                    let wait = retry_after(&r.headers, &r.body);
                    self.limiter.pause(&endpoint.origin, wait);
                    let until = Instant::now() + wait + LIMITED_KEPT;
                    let mut limited = self.limited_until.lock().unwrap_or_else(|e| e.into_inner());
                    *limited = Some(limited.map_or(until, |u| u.max(until)));
                    drop(limited);
                    self.metrics.kms_throttled.inc();
                    // One line a 429 (the resources that then wait for the
                    // pause say nothing more: waiting is no failure).
                    tracing::info!(
                        endpoint = %endpoint.origin,
                        route,
                        retry_after_seconds = wait.as_secs_f64(),
                        "the KMS is rate limiting requests (429); requests to it wait"
                    );
                    if wait > LONGEST_INLINE_WAIT || Instant::now() + wait > deadline {
                        return Err(KmsError::rate_limited(route, wait));
                    }
                    // The limiter holds the next attempt back until then.
                    Some(Duration::ZERO)
                }
                Ok(r) if r.status.is_server_error() => Some(self.jitter(delay)),
                Ok(_) => None,
            };
            match retry_in {
                None => return outcome,
                Some(wait) if Instant::now() + wait <= deadline => {
                    if !wait.is_zero() {
                        tracing::debug!(route, ?wait, "retrying KMS request");
                        tokio::time::sleep(wait).await;
                        delay = (delay * 2).min(Duration::from_secs(8));
                    }
                }
                Some(_) => {
                    return match outcome {
                        Err(e) => Err(e),
                        Ok(r) => Err(api_error(route, &r)),
                    };
                }
            }
        }
    }

    /// Log in with an identity's credentials.
    async fn login(&self, identity: &Identity) -> Result<Token, KmsError> {
        let ep = &identity.endpoint;
        let method = identity.credentials.method();
        let Some(body) = identity.credentials.login_body().await? else {
            // No login: the token is the credential.
            let now = Instant::now();
            return Ok(Token {
                access_token: identity.credentials.bearer_without_login(),
                obtained: now,
                renewed: now,
                ttl: Duration::ZERO,
                max_ttl: Duration::ZERO,
            });
        };
        let (route, path) = method.route().ok_or_else(|| {
            KmsError::Credentials(format!("{} has no login", method.strategy_name()))
        })?;
        let url = format!("{}{path}", ep.base);
        let reply = self.send(ep, route, |c| c.post(&url).json(&body)).await?;
        self.metrics
            .kms_logins
            .with_label_values(&[method.label()])
            .inc();
        let body: LoginResponse = parse(route, &reply)?;
        let now = Instant::now();
        Ok(Token {
            access_token: body.access_token,
            obtained: now,
            renewed: now,
            ttl: Duration::from_secs(body.expires_in),
            max_ttl: Duration::from_secs(body.access_token_max_ttl),
        })
    }

    /// The project id of a service token (asked once per identity).
    pub(super) async fn service_token_project(
        &self,
        identity: &Identity,
        token: &SecretString,
    ) -> Result<String, KmsError> {
        let key = identity.key();
        if let Some(id) = self
            .token_projects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(id.clone());
        }
        let url = format!("{}/v2/service-token", identity.endpoint.base);
        let reply = self
            .send(&identity.endpoint, SERVICE_TOKEN, |c| {
                c.get(&url).bearer_auth(token.expose_secret())
            })
            .await?;
        let body: serde_json::Value = parse(SERVICE_TOKEN, &reply)?;
        let id = body["workspace"]
            .as_str()
            .filter(|w| !w.is_empty())
            .ok_or_else(|| KmsError::Decode {
                endpoint: SERVICE_TOKEN,
                reason: "the service token record names no project (workspace)".to_owned(),
            })?
            .to_owned();
        self.token_projects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, id.clone());
        Ok(id)
    }

    async fn renew(&self, endpoint: &Endpoint, token: &Token) -> Result<Token, KmsError> {
        let url = format!("{}/v1/auth/token/renew", endpoint.base);
        let reply = self
            .send(endpoint, RENEW, |c| {
                c.post(&url)
                    .json(&serde_json::json!({"accessToken": token.access_token.expose_secret()}))
            })
            .await?;
        let body: LoginResponse = parse(RENEW, &reply)?;
        Ok(Token {
            access_token: body.access_token,
            obtained: token.obtained,
            renewed: Instant::now(),
            ttl: Duration::from_secs(body.expires_in),
            max_ttl: token.max_ttl,
        })
    }

    /// A valid token for an identity: cached, renewed, or from a new login.
    pub async fn token(&self, identity: &Identity) -> Result<SecretString, KmsError> {
        let key = identity.key();
        let slot = self.tokens.slot(&key);
        let mut guard = slot.lock().await;
        if guard.is_none() {
            *guard = self.load_token(&key);
        }
        let now = Instant::now();
        let action = guard.as_ref().map_or(TokenAction::Login, |t| t.action(now));
        let fresh = match (action, guard.as_ref()) {
            (TokenAction::Use, Some(t)) => return Ok(t.access_token.clone()),
            (TokenAction::Renew, Some(t)) => match self.renew(&identity.endpoint, t).await {
                Ok(t) => t,
                Err(e) if e.is_transient() && !e.is_token_error() => {
                    return Ok(t.access_token.clone());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "token renewal failed; logging in again");
                    self.login(identity).await?
                }
            },
            _ => self.login(identity).await?,
        };
        let token = fresh.access_token.clone();
        self.save_token(&key, &fresh);
        *guard = Some(fresh);
        Ok(token)
    }

    /// A token persisted by an earlier run, if it is still usable.
    fn load_token(&self, key: &IdentityKey) -> Option<Token> {
        let store = self.token_store.as_ref()?;
        let record = match store.get_token(&key.0) {
            storage::Lookup::Hit(r) => r,
            storage::Lookup::Miss => return None,
            storage::Lookup::Error(reason) => {
                tracing::warn!(%reason, "unreadable cached token dropped");
                return None;
            }
        };
        let now_ms = unix_ms(std::time::SystemTime::now());
        let left = |deadline: i64| {
            Duration::from_millis(u64::try_from(deadline.saturating_sub(now_ms)).unwrap_or(0))
        };
        let ttl = left(record.expires_at_unix_ms);
        let max_ttl = left(record.max_expires_at_unix_ms);
        if ttl < Duration::from_secs(30) || max_ttl < Duration::from_secs(30) {
            return None;
        }
        let now = Instant::now();
        tracing::debug!("reusing a persisted token");
        Some(Token {
            access_token: SecretString::from(record.access_token.expose().to_owned()),
            obtained: now,
            renewed: now,
            ttl,
            max_ttl,
        })
    }

    fn save_token(&self, key: &IdentityKey, token: &Token) {
        let Some(store) = &self.token_store else {
            return;
        };
        let wall = std::time::SystemTime::now();
        let now = Instant::now();
        let deadline = |from: Instant, d: Duration| {
            if d.is_zero() {
                i64::MAX
            } else {
                unix_ms(wall)
                    + i64::try_from((from + d).saturating_duration_since(now).as_millis())
                        .unwrap_or(i64::MAX)
            }
        };
        let record = storage::TokenRecord {
            access_token: storage::AccessToken::new(token.access_token.expose_secret().to_owned()),
            expires_at_unix_ms: deadline(token.renewed, token.ttl),
            max_expires_at_unix_ms: deadline(token.obtained, token.max_ttl),
        };
        if let Err(e) = store.put_token(&key.0, &record) {
            tracing::warn!(error = %e, "could not persist a token");
        }
    }

    /// Run a request that needs a token; on a token error, log in again once
    /// and retry.
    pub(super) async fn with_token<T, F, Fut>(
        &self,
        identity: &Identity,
        call: F,
    ) -> Result<T, KmsError>
    where
        F: Fn(SecretString) -> Fut,
        Fut: std::future::Future<Output = Result<T, KmsError>>,
    {
        let token = self.token(identity).await?;
        match call(token.clone()).await {
            Err(e) if e.is_token_error() => {
                self.tokens.invalidate(&identity.key(), &token).await;
                if let Some(store) = &self.token_store {
                    let _ = store.remove_token(&identity.key().0);
                }
                let token = self.token(identity).await?;
                call(token).await
            }
            other => other,
        }
    }

    /// Fetch a scope: the whole folder (with imports and references
    /// expanded), or one secret in single-secret mode. With an `etag` the GET
    /// is conditional.
    ///
    /// Callers that ask for the same scope at about the same time share one
    /// request: an answer to a request that started at or after
    /// `not_before` is reused, and an identical request in flight that
    /// started then or later is joined (a caller whose ETag an answer proved
    /// current gets `NotModified`). A caller that must see every change made
    /// before an instant (an event heard then) passes that instant.
    ///
    /// When the KMS's budget refuses the request (a `429`, or its pause),
    /// the latest answer kept for the scope serves instead if it started at
    /// or after `refused_from` and differs from what the caller holds (its
    /// `etag`): the folder's other resources already show it, and waiting
    /// for the KMS's next window would only spend a request of that window
    /// on an answer this replica already has. A caller the kept answer
    /// brings nothing new gets the refusal, and waits.
    ///
    /// With the answer comes when the request that gave it started: the
    /// answer says how things stood at that instant.
    pub async fn fetch(
        &self,
        identity: &Identity,
        scope: &Scope,
        etag: Option<&str>,
        not_before: Instant,
        refused_from: Instant,
    ) -> Result<(Arc<Fetch>, Instant), KmsError> {
        let scope_key = (identity.key(), scope.clone());
        {
            let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = recent.get(&scope_key).filter(|r| r.at >= not_before) {
                if etag.is_some() && r.etag.as_deref() == etag {
                    return Ok((Arc::new(Fetch::NotModified), r.at));
                }
                if let Some(secrets) = &r.secrets {
                    let answer = Fetch::Secrets {
                        secrets: secrets.clone(),
                        etag: r.etag.clone(),
                    };
                    return Ok((Arc::new(answer), r.at));
                }
            }
        }
        let key = (scope_key.0.clone(), scope.clone(), etag.map(str::to_owned));
        let outcome = self
            .fetches
            .run(key, not_before, || async {
                self.with_token(identity, |token| {
                    self.fetch_once(identity, scope, etag, token)
                })
                .await
                .map(Arc::new)
            })
            .await;
        if let Ok(answer) = &outcome.value {
            self.forget_old_answers();
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            // An answer is as recent as its request's start; a slower,
            // older request does not replace a newer answer.
            if recent
                .get(&scope_key)
                .is_none_or(|r| r.at <= outcome.started)
            {
                let entry = match &**answer {
                    Fetch::Secrets { secrets, etag } => Recent {
                        at: outcome.started,
                        etag: etag.clone(),
                        secrets: Some(secrets.clone()),
                    },
                    Fetch::NotModified => Recent {
                        at: outcome.started,
                        etag: etag.map(str::to_owned),
                        secrets: recent
                            .get(&scope_key)
                            .filter(|r| r.etag.as_deref() == etag)
                            .and_then(|r| r.secrets.clone()),
                    },
                };
                recent.insert(scope_key.clone(), entry);
            }
        }
        if let Err(KmsError::RateLimited { .. }) = &outcome.value {
            let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            let kept = recent.get(&scope_key);
            tracing::debug!(
                path = %scope.path,
                kept_age = ?kept.map(|r| r.at.elapsed()),
                "read refused by the KMS's budget"
            );
            if let Some(Recent {
                secrets: Some(secrets),
                etag: kept_etag,
                at,
            }) = kept
                && *at >= refused_from
                && (etag.is_none() || kept_etag.as_deref() != etag)
            {
                self.metrics.kms_refused_served.inc();
                let answer = Fetch::Secrets {
                    secrets: secrets.clone(),
                    etag: kept_etag.clone(),
                };
                return Ok((Arc::new(answer), *at));
            }
        }
        outcome.value.map(|answer| (answer, outcome.started))
    }

    async fn fetch_once(
        &self,
        identity: &Identity,
        scope: &Scope,
        etag: Option<&str>,
        token: SecretString,
    ) -> Result<Fetch, KmsError> {
        let ep = &identity.endpoint;
        let mut query: Vec<(&str, String)> = vec![
            match &scope.project {
                ProjectRef::Slug(s) => ("workspaceSlug", s.clone()),
                ProjectRef::Id(id) => ("workspaceId", id.clone()),
                ProjectRef::OfServiceToken => (
                    "workspaceId",
                    self.service_token_project(identity, &token).await?,
                ),
            },
            ("environment", scope.environment.clone()),
            ("secretPath", scope.path.clone()),
            ("include_imports", "true".to_owned()),
            ("expandSecretReferences", "true".to_owned()),
        ];
        let (route, url) = match &scope.secret_name {
            Some(name) => (
                GET_ONE,
                format!("{}/v3/secrets/raw/{}", ep.base, urlencode(name)),
            ),
            None => {
                query.push(("recursive", scope.recursive.to_string()));
                (LIST, format!("{}/v3/secrets/raw", ep.base))
            }
        };
        let reply = self
            .send(ep, route, |c| {
                let mut req = c.get(&url).query(&query).bearer_auth(token.expose_secret());
                if let Some(tag) = etag {
                    req = req.header(IF_NONE_MATCH, tag);
                }
                req
            })
            .await?;
        if reply.status == StatusCode::NOT_MODIFIED {
            return Ok(Fetch::NotModified);
        }
        let new_etag = reply
            .headers
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let secrets = match &scope.secret_name {
            None => {
                let cap = self.config.max_secrets;
                let (list, exceeded) =
                    with_secret_cap(cap, || parse::<ListSecretsResponse>(route, &reply));
                if exceeded {
                    return Err(KmsError::Decode {
                        endpoint: route,
                        reason: format!(
                            "the answer holds more than {cap} secrets, the most one scope may hold \
                             (--kms-max-secrets): narrow secretsPath or turn recursive off, or raise \
                             the limit"
                        ),
                    });
                }
                merge_list(list?, &scope.path)
            }
            Some(_) => {
                let one: GetSecretResponse = parse(route, &reply)?;
                let mut raw = one.secret;
                raw.secret_path.get_or_insert_with(|| scope.path.clone());
                merge_list(
                    ListSecretsResponse {
                        secrets: vec![raw],
                        imports: Vec::new(),
                    },
                    &scope.path,
                )
            }
        };
        Ok(Fetch::Secrets {
            secrets: Arc::new(Fetched {
                map: secrets,
                held: reply.held,
            }),
            etag: new_etag,
        })
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl From<BodyError> for String {
    fn from(e: BodyError) -> String {
        e.to_string()
    }
}

/// The error of a request that got no answer: a certificate the TLS
/// library refused, or a transport failure.
pub(crate) fn transport_error(host: &str, e: &reqwest::Error) -> KmsError {
    match certificate_problem(e) {
        Some(reason) => KmsError::Certificate {
            host: host.to_owned(),
            reason,
        },
        None => KmsError::Transport {
            host: host.to_owned(),
            reason: describe_reqwest_error(e),
        },
    }
}

/// What rustls said of the server's certificate, if that is why the
/// request failed. The rustls error sits inside an `io::Error` of the TLS
/// stream, which `source()` skips, so each `io::Error` is opened too.
fn certificate_problem(e: &reqwest::Error) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = next {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(
            tls @ (rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::InvalidCertRevocationList(_)),
        ) = tls
        {
            return Some(tls.to_string());
        }
        // The TLS error may reach us wrapped in a type of the connector's:
        // rustls's own words are recognisable.
        let text = err.to_string();
        if let Some(at) = text.find("invalid peer certificate") {
            return Some(text[at..].to_owned());
        }
        next = err.source();
    }
    None
}

/// Parse a successful JSON body, or turn an error status into [`KmsError`].
pub(super) fn parse<T: DeserializeOwned>(
    route: &'static str,
    reply: &Reply,
) -> Result<T, KmsError> {
    if !reply.status.is_success() {
        return Err(api_error(route, reply));
    }
    serde_json::from_slice(&reply.body).map_err(|e| KmsError::Decode {
        endpoint: route,
        // serde_json errors name the position and the expected type, never
        // the content.
        reason: format!(
            "{} (at line {} column {})",
            classify_json_error(&e),
            e.line(),
            e.column()
        ),
    })
}

fn classify_json_error(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "not valid JSON",
        serde_json::error::Category::Data => "JSON of an unexpected shape",
        serde_json::error::Category::Eof => "truncated JSON",
    }
}

/// The error of a non-success answer given by parts.
pub(super) fn api_error_of(
    route: &'static str,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> KmsError {
    api_error(
        route,
        &Reply {
            status,
            headers: headers.clone(),
            body: bytes::Bytes::copy_from_slice(body),
            held: None,
        },
    )
}

/// The error of a non-success reply, from the KMS's envelope when it has one.
pub(super) fn api_error(route: &'static str, reply: &Reply) -> KmsError {
    let status = reply.status.as_u16();
    if status == 429 {
        return KmsError::rate_limited(route, retry_after(&reply.headers, &reply.body));
    }
    if reply.status.is_redirection() && status != 304 {
        let to = reply
            .headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(|l| crate::kms::endpoint::redact_userinfo(&truncate(l, 200)))
            .unwrap_or_else(|| "nowhere".to_owned());
        return KmsError::Api {
            endpoint: route,
            status,
            error: "Redirect".to_owned(),
            message: format!(
                "the KMS answered with a redirect to {to}, which the operator does not follow; \
                 set hostAPI to the address that answers"
            ),
        };
    }
    let (error, message) = match serde_json::from_slice::<ErrorBody>(&reply.body) {
        Ok(body) => (body.error.clone().unwrap_or_default(), body.message_text()),
        Err(_) => (
            String::new(),
            reply
                .status
                .canonical_reason()
                .unwrap_or("error")
                .to_owned(),
        ),
    };
    KmsError::Api {
        endpoint: route,
        status,
        error,
        message: truncate(&message, 300),
    }
}

/// How long a 429 asks us to wait: `Retry-After` seconds, else the number in
/// "try again in N seconds", else 60 s. Capped at 10 minutes.
pub(super) fn retry_after(headers: &HeaderMap, body: &[u8]) -> Duration {
    let from_header = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let from_body = || {
        let text = serde_json::from_slice::<ErrorBody>(body)
            .ok()?
            .message_text();
        let after = text.rsplit(" in ").next()?;
        after.split_whitespace().next()?.parse::<u64>().ok()
    };
    Duration::from_secs(from_header.or_else(from_body).unwrap_or(60).clamp(1, 600))
}

pub(super) fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kms::auth::Credentials;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_sources() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("59"));
        assert_eq!(retry_after(&h, b""), Duration::from_secs(59));
        let body = br#"{"statusCode":429,"message":"Rate limit exceeded. Please try again in 12 seconds","error":"RateLimitExceeded"}"#;
        assert_eq!(
            retry_after(&HeaderMap::new(), body),
            Duration::from_secs(12)
        );
        assert_eq!(
            retry_after(&HeaderMap::new(), b"garbage"),
            Duration::from_secs(60)
        );
    }

    fn fixture_reply(fixture: &serde_json::Value) -> Reply {
        let resp = &fixture["response"];
        let mut headers = HeaderMap::new();
        for (k, v) in resp["headers"].as_object().unwrap() {
            headers.insert(
                reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v.as_str().unwrap()).unwrap(),
            );
        }
        let body = match &resp["body"] {
            serde_json::Value::Null => bytes::Bytes::new(),
            b => bytes::Bytes::from(serde_json::to_vec(b).unwrap()),
        };
        Reply {
            status: StatusCode::from_u16(u16::try_from(resp["status"].as_u64().unwrap()).unwrap())
                .unwrap(),
            headers,
            body,
            held: None,
        }
    }

    /// Every response recorded from a real server is understood: success
    /// bodies parse into their types, errors become precise `KmsError`s.
    #[test]
    fn every_recorded_response_is_understood() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("devserver/tests/fixtures/kms-api");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let fixture: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let method = fixture["request"]["method"].as_str().unwrap();
            let route = fixture["request"]["path"]
                .as_str()
                .unwrap()
                .split('?')
                .next()
                .unwrap()
                .to_owned();
            let reply = fixture_reply(&fixture);
            let status = reply.status.as_u16();
            seen += 1;
            if status == 304 {
                assert!(reply.body.is_empty(), "{name}");
                continue;
            }
            if !reply.status.is_success() {
                match api_error(LIST, &reply) {
                    KmsError::RateLimited { retry_after, .. } => {
                        assert_eq!(status, 429, "{name}");
                        assert_eq!(retry_after, Duration::from_secs(59), "{name}");
                    }
                    KmsError::Api {
                        status: s,
                        error,
                        message,
                        ..
                    } => {
                        assert_eq!(s, status, "{name}");
                        assert!(!error.is_empty(), "{name}: no error class");
                        assert!(!message.is_empty(), "{name}: no message");
                        if status == 401 || error == "TokenError" {
                            assert!(api_error(LIST, &reply).is_token_error(), "{name}");
                        }
                    }
                    other => panic!("{name}: {other:?}"),
                }
                continue;
            }
            match (method, route.as_str()) {
                ("POST", "/api/v1/auth/universal-auth/login" | "/api/v1/auth/token/renew") => {
                    let b: LoginResponse =
                        parse("POST /api/v1/auth/universal-auth/login", &reply).unwrap();
                    assert_eq!(b.access_token.expose_secret(), "<ACCESS_TOKEN>");
                    assert_eq!(
                        (b.expires_in, b.access_token_max_ttl),
                        (3600, 86400),
                        "{name}"
                    );
                }
                ("GET", "/api/v3/secrets/raw") => {
                    let b: ListSecretsResponse = parse(LIST, &reply).unwrap();
                    let merged = merge_list(b, "/");
                    let n = fixture["response"]["body"]["secrets"]
                        .as_array()
                        .unwrap()
                        .len();
                    assert!(merged.len() >= n.min(1) || n == 0, "{name}");
                    assert!(reply.headers.get(ETAG).is_some(), "{name}: no ETag");
                }
                ("GET", r) if r.starts_with("/api/v3/secrets/raw/") => {
                    let b: GetSecretResponse = parse(GET_ONE, &reply).unwrap();
                    assert!(!b.secret.secret_key.is_empty());
                }
                ("POST" | "PATCH" | "DELETE", r) if r.starts_with("/api/v3/secrets/raw/") => {
                    let b: GetSecretResponse = parse(GET_ONE, &reply).unwrap();
                    assert!(b.secret.version.is_some(), "{name}");
                }
                (_, "/api/v3/secrets/batch/raw") => {
                    let b: ListSecretsResponse = parse(LIST, &reply).unwrap();
                    assert!(!b.secrets.is_empty(), "{name}");
                }
                ("GET", r) if r.starts_with("/api/v2/workspace/") => {
                    let p: super::super::model::Project =
                        parse("GET /api/v2/workspace/:slug", &reply).unwrap();
                    assert!(!p.id.is_empty() && !p.slug.is_empty(), "{name}");
                }
                ("GET", "/api/v1/dynamic-secrets") => {
                    let v: serde_json::Value =
                        parse("GET /api/v1/dynamic-secrets", &reply).unwrap();
                    assert!(v["dynamicSecrets"].is_array(), "{name}");
                }
                ("POST", "/api/v1/auth/token/revoke") => {
                    let v: serde_json::Value = parse(RENEW, &reply).unwrap();
                    assert!(v["message"].is_string(), "{name}");
                }
                other => panic!("{name}: no expectation for {other:?}"),
            }
        }
        assert_eq!(seen, 36, "every recorded fixture must be checked");
    }

    /// Serve one HTTP/1.1 response made of `chunks` chunks of `size` bytes,
    /// chunked (no Content-Length), and count the bytes written.
    async fn chunked_server(
        chunks: usize,
        size: usize,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = written.clone();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b' '; size];
            for _ in 0..chunks {
                let frame = [format!("{size:x}\r\n").as_bytes(), &chunk, b"\r\n"].concat();
                if s.write_all(&frame).await.is_err() {
                    return;
                }
                counter.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
        });
        (url, written)
    }

    #[tokio::test]
    async fn the_body_cap_holds_while_a_chunked_body_streams() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        // 64 MiB announced by nobody, cap 1 MiB: cut off after about 1 MiB.
        let (url, written) = chunked_server(1024, 64 * 1024).await;
        let resp = http.get(&url).send().await.unwrap();
        assert!(resp.content_length().is_none());
        let err = read_capped(resp, 1 << 20).await.unwrap_err();
        assert_eq!(err, BodyError::TooLarge(1 << 20));
        assert_eq!(err.to_string(), "response larger than 1048576 bytes");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = written.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < 16 << 20, "the server could write {sent} bytes");
        // Within the cap it is read whole.
        let (url, _) = chunked_server(16, 1024).await;
        let body = read_capped(http.get(&url).send().await.unwrap(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(body.len(), 16 * 1024);
    }

    /// Answer every request with `status` and `head` (extra header lines),
    /// counting the requests and the bytes of their bodies.
    async fn fixed_server(
        status: &'static str,
        head: String,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (counter, head) = (counter.clone(), head.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    if matches!(s.read(&mut buf).await, Ok(n) if n > 0) {
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let reply = format!(
                            "HTTP/1.1 {status}\r\n{head}content-length: 0\r\nconnection: close\r\n\r\n"
                        );
                        let _ = s.write_all(reply.as_bytes()).await;
                    }
                });
            }
        });
        (url, seen)
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed_and_the_login_is_not_resent() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Where a hostile KMS would send the login: a host of its choosing.
        let (elsewhere, reached) = fixed_server("200 OK", String::new()).await;
        let location = format!("location: {elsewhere}/api/v1/auth/universal-auth/login\r\n");
        let (kms_url, asked) = fixed_server("307 Temporary Redirect", location).await;
        let kms = Kms::new(KmsConfig::default(), Metrics::new(1));
        let identity = Identity {
            endpoint: Endpoint::new(&kms_url, None).unwrap(),
            credentials: Credentials::UniversalAuth {
                client_id: "id".into(),
                client_secret: secrecy::SecretString::from("the-client-secret".to_owned()),
            },
        };
        let err = kms.token(&identity).await.unwrap_err().to_string();
        assert!(
            err.contains("redirect") && err.contains(&elsewhere),
            "{err}"
        );
        assert!(!err.contains("the-client-secret"), "{err}");
        assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "asked once, not retried"
        );
    }

    #[test]
    fn names_are_path_encoded() {
        assert_eq!(urlencode("MY KEY/x"), "MY%20KEY%2Fx");
    }
}
