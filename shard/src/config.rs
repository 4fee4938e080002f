//! The coordinator's configuration, its validation, and the Lease names,
//! labels and annotations derived from it (`docs/install.md`, "High availability").

use std::time::Duration;

use crate::ring::MAX_SHARDS;

/// Label on every Lease of one operator installation: its value is the Lease
/// prefix. The coordinator watches Leases by this label.
pub const LABEL_GROUP: &str = "secrets.hanzo.ai/lease-group";
/// Label saying what a Lease is for: [`ROLE_SHARD`] or [`ROLE_MEMBER`].
pub const LABEL_ROLE: &str = "secrets.hanzo.ai/lease-role";
/// Value of [`LABEL_ROLE`] on shard Leases.
pub const ROLE_SHARD: &str = "shard";
/// Value of [`LABEL_ROLE`] on member Leases.
pub const ROLE_MEMBER: &str = "member";
/// Annotation recording the writer's shard count (decimal).
pub const ANNOTATION_SHARDS: &str = "secrets.hanzo.ai/shards";
/// Annotation recording the writer's namespace-hash version (decimal).
pub const ANNOTATION_HASH_VERSION: &str = "secrets.hanzo.ai/hash-version";
/// Annotation on a member Lease: the work its replica has waiting
/// (decimal, see [`crate::Coordinator::set_demand`]).
pub const ANNOTATION_DEMAND: &str = "secrets.hanzo.ai/demand";

/// Longest Lease name the API accepts (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Longest label value (the prefix is one).
const MAX_LABEL_VALUE: usize = 63;

/// The Lease of shard `shard`: `<prefix>-shard-<NN>`, NN zero-padded to two
/// digits.
pub fn shard_lease_name(prefix: &str, shard: u32) -> String {
    format!("{prefix}-shard-{shard:02}")
}

/// The member Lease of replica `identity`: `<prefix>-member-<identity>`.
pub fn member_lease_name(prefix: &str, identity: &str) -> String {
    format!("{prefix}-member-{identity}")
}

/// How one coordinator runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Namespace holding the Leases (`--pod-namespace`).
    pub namespace: String,
    /// Prefix of the Lease names (`--lease-prefix`).
    pub prefix: String,
    /// This replica's identity, the `holderIdentity` it writes (`--pod-name`).
    /// It must be unique among running replicas: like client-go, a replica
    /// takes back at once a Lease that names it (a restart under the same
    /// StatefulSet pod name), without waiting for it to expire.
    pub identity: String,
    /// Number of shards (`--shards`).
    pub shards: u32,
    /// How long a Lease stays valid without a change (`--lease-duration`).
    pub lease_duration: Duration,
    /// How long this replica keeps working on a shard without a successful
    /// renewal (`--renew-deadline`).
    pub renew_deadline: Duration,
    /// How often Leases are renewed and retried (`--retry-period`).
    pub retry_period: Duration,
    /// How long a hand-over waits for the drain hook before giving the shard up
    /// by letting its Lease expire instead of clearing it.
    pub drain_timeout: Duration,
}

impl Config {
    /// A configuration with the documented defaults: 16 shards, Lease duration
    /// 10 s, renew deadline 7 s, retry period 2 s; drain timeout 30 s.
    pub fn new(
        namespace: impl Into<String>,
        prefix: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            prefix: prefix.into(),
            identity: identity.into(),
            shards: 16,
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            retry_period: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(30),
        }
    }

    /// Check the configuration; the error says what is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !is_dns_subdomain(&self.namespace) || self.namespace.contains('.') {
            return Err(ConfigError::Namespace(self.namespace.clone()));
        }
        if self.prefix.len() > MAX_LABEL_VALUE
            || !is_dns_subdomain(&self.prefix)
            || self.prefix.contains('.')
        {
            return Err(ConfigError::Prefix(self.prefix.clone()));
        }
        if !is_dns_subdomain(&self.identity)
            || member_lease_name(&self.prefix, &self.identity).len() > MAX_NAME
        {
            return Err(ConfigError::Identity(self.identity.clone()));
        }
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(ConfigError::Shards(self.shards));
        }
        for (name, value) in [
            ("lease duration", self.lease_duration),
            ("renew deadline", self.renew_deadline),
            ("retry period", self.retry_period),
        ] {
            if value.is_zero() || value.subsec_nanos() != 0 || value.as_secs() > i32::MAX as u64 {
                return Err(ConfigError::WholeSeconds { name, value });
            }
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ConfigError::Order {
                smaller: "renew deadline",
                larger: "lease duration",
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ConfigError::Order {
                smaller: "retry period",
                larger: "renew deadline",
            });
        }
        if self.drain_timeout.is_zero() {
            return Err(ConfigError::DrainTimeout);
        }
        Ok(())
    }

    /// The Lease name of `shard`.
    pub fn shard_lease_name(&self, shard: u32) -> String {
        shard_lease_name(&self.prefix, shard)
    }

    /// The member Lease name of this replica.
    pub fn member_lease_name(&self) -> String {
        member_lease_name(&self.prefix, &self.identity)
    }

    /// The label selector matching this installation's Leases.
    pub fn label_selector(&self) -> String {
        format!("{LABEL_GROUP}={}", self.prefix)
    }

    /// The shard a Lease name belongs to, if it is one of this installation's
    /// shard Leases for a shard below the configured count.
    pub fn shard_of_lease(&self, name: &str) -> Option<u32> {
        let digits = name.strip_prefix(&self.prefix)?.strip_prefix("-shard-")?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let shard: u32 = digits.parse().ok()?;
        (shard < self.shards && shard_lease_name(&self.prefix, shard) == name).then_some(shard)
    }

    /// Whether a Lease name is one of this installation's member Leases.
    pub fn is_member_lease(&self, name: &str) -> bool {
        name.strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix("-member-"))
            .is_some_and(|identity| !identity.is_empty())
    }
}

/// What is wrong with a [`Config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The Lease namespace is not a valid namespace name.
    #[error("invalid Lease namespace {0:?}")]
    Namespace(String),
    /// The prefix is not a DNS label of at most 63 characters.
    #[error("invalid Lease prefix {0:?}: lowercase letters, digits and '-', at most 63 characters")]
    Prefix(String),
    /// The identity is not a DNS subdomain, or makes a member Lease name too long.
    #[error("invalid identity {0:?}: must be a DNS subdomain (the pod name)")]
    Identity(String),
    /// The shard count is out of range.
    #[error("invalid shard count {0}: must be 1 to {MAX_SHARDS}")]
    Shards(u32),
    /// A duration is not a positive whole number of seconds.
    #[error(
        "the {name} must be a positive whole number of seconds (got {value:?}); Leases store seconds"
    )]
    WholeSeconds {
        /// Which duration.
        name: &'static str,
        /// Its value.
        value: Duration,
    },
    /// Two durations are in the wrong order.
    #[error("the {smaller} must be shorter than the {larger}")]
    Order {
        /// The one that must be shorter.
        smaller: &'static str,
        /// The one that must be longer.
        larger: &'static str,
    },
    /// The drain timeout is zero.
    #[error("the drain timeout must be positive")]
    DrainTimeout,
}

/// A lowercase RFC 1123 subdomain: labels of `[a-z0-9-]`, starting and ending
/// alphanumeric, joined by dots, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new("kms-operator-system", "kms-operator", "kms-operator-0")
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
    }

    #[test]
    fn names() {
        let c = config();
        assert_eq!(c.shard_lease_name(3), "kms-operator-shard-03");
        assert_eq!(c.shard_lease_name(12), "kms-operator-shard-12");
        assert_eq!(c.shard_lease_name(120), "kms-operator-shard-120");
        assert_eq!(c.member_lease_name(), "kms-operator-member-kms-operator-0");
        assert_eq!(
            c.label_selector(),
            "secrets.hanzo.ai/lease-group=kms-operator"
        );
        assert_eq!(c.shard_of_lease("kms-operator-shard-03"), Some(3));
        assert_eq!(c.shard_of_lease("kms-operator-shard-3"), None);
        assert_eq!(c.shard_of_lease("kms-operator-shard-16"), None);
        assert_eq!(c.shard_of_lease("kms-operator-shard-+1"), None);
        assert_eq!(c.shard_of_lease("other-shard-03"), None);
        assert!(c.is_member_lease("kms-operator-member-kms-operator-1"));
        assert!(!c.is_member_lease("kms-operator-member-"));
        assert!(!c.is_member_lease("kms-operator-shard-01"));
    }

    #[test]
    fn rejects_bad_values() {
        let check = |f: &dyn Fn(&mut Config)| {
            let mut c = config();
            f(&mut c);
            c.validate()
        };
        assert!(matches!(
            check(&|c| c.shards = 0),
            Err(ConfigError::Shards(0))
        ));
        assert!(matches!(
            check(&|c| c.shards = MAX_SHARDS + 1),
            Err(ConfigError::Shards(_))
        ));
        assert!(matches!(
            check(&|c| c.lease_duration = Duration::from_millis(10_500)),
            Err(ConfigError::WholeSeconds { .. })
        ));
        assert!(matches!(
            check(&|c| c.retry_period = Duration::ZERO),
            Err(ConfigError::WholeSeconds { .. })
        ));
        assert!(matches!(
            check(&|c| c.renew_deadline = Duration::from_secs(10)),
            Err(ConfigError::Order { .. })
        ));
        assert!(matches!(
            check(&|c| c.retry_period = Duration::from_secs(7)),
            Err(ConfigError::Order { .. })
        ));
        assert!(matches!(
            check(&|c| c.identity = "Pod_1".into()),
            Err(ConfigError::Identity(_))
        ));
        assert!(matches!(
            check(&|c| c.identity = String::new()),
            Err(ConfigError::Identity(_))
        ));
        assert!(matches!(
            check(&|c| c.prefix = "a.b".into()),
            Err(ConfigError::Prefix(_))
        ));
        assert!(matches!(
            check(&|c| c.prefix = "x".repeat(64)),
            Err(ConfigError::Prefix(_))
        ));
        assert!(matches!(
            check(&|c| c.namespace = "-ns".into()),
            Err(ConfigError::Namespace(_))
        ));
        assert!(matches!(
            check(&|c| c.drain_timeout = Duration::ZERO),
            Err(ConfigError::DrainTimeout)
        ));
        // A dotted pod name is a valid identity.
        assert_eq!(check(&|c| c.identity = "web.example-0".into()), Ok(()));
    }
}
