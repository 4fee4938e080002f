//! The state shared by every request of a running server.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use ring::hmac;

use crate::events::Streams;
use crate::faults::Faults;
use crate::ids::fill;
use crate::ratelimit::{Limiter, Limits};
use crate::reviewer::Reviewer;
use crate::stats::Stats;
use crate::store::Store;
use crate::token::Signer;

/// What a server is built from.
pub(crate) struct Settings {
    pub store: Store,
    pub signing_key: Vec<u8>,
    pub admin_token: Option<String>,
    pub min_lease_ttl: Duration,
    pub limits: Limits,
    pub reviewer: Option<Reviewer>,
    pub event_ping_interval: Duration,
    pub missing_folders_not_found: bool,
}

/// A handle on the shared state (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct App(Arc<Inner>);

/// The shared state.
#[derive(Debug)]
pub(crate) struct Inner {
    pub store: Store,
    pub signer: Signer,
    pub stats: Stats,
    pub faults: Faults,
    pub limiter: Limiter,
    pub streams: Streams,
    pub reviewer: Option<Reviewer>,
    pub admin_token: Option<String>,
    pub min_lease_ttl: Duration,
    /// A missing folder or environment is a 404, not an empty list.
    pub missing_folders_not_found: bool,
    compare_key: hmac::Key,
}

impl Deref for App {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl App {
    /// Build the shared state.
    pub fn new(s: Settings) -> App {
        let mut compare = [0u8; 32];
        fill(&mut compare);
        App(Arc::new(Inner {
            store: s.store,
            signer: Signer::new(&s.signing_key),
            stats: Stats::default(),
            faults: Faults::default(),
            limiter: Limiter::new(s.limits),
            streams: Streams::new(s.event_ping_interval),
            reviewer: s.reviewer,
            admin_token: s.admin_token.filter(|t| !t.is_empty()),
            min_lease_ttl: s.min_lease_ttl,
            missing_folders_not_found: s.missing_folders_not_found,
            compare_key: hmac::Key::new(hmac::HMAC_SHA256, &compare),
        }))
    }
}

impl Inner {
    /// Compare a secret with what a client sent, in constant time.
    pub fn secret_matches(&self, expected: &str, given: &str) -> bool {
        let tag = hmac::sign(&self.compare_key, expected.as_bytes());
        hmac::verify(&self.compare_key, given.as_bytes(), tag.as_ref()).is_ok()
    }
}
