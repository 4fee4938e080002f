//! Errors of a reconcile, each with a bounded reason (used as the condition
//! reason and the Event reason) and a retry policy. Messages name objects and
//! fields, never secret values.

use std::time::Duration;

use crate::kms::KmsError;

/// Why a reconcile did not finish.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SyncError {
    /// The spec cannot work as written (beyond what the schema checks).
    #[error("{0}")]
    Spec(String),
    /// A referenced object is missing or not allowed.
    #[error("{message}")]
    Reference {
        /// Bounded reason.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Logging in failed.
    #[error("{0}")]
    Auth(KmsError),
    /// Talking to the KMS failed.
    #[error("{0}")]
    Kms(KmsError),
    /// Reading the resource's scope failed; the message names it.
    #[error("{error} ({scope})")]
    KmsScope {
        /// What the KMS answered.
        error: KmsError,
        /// The scope read: project, environment and folder.
        scope: String,
    },
    /// The scope's environment or folder does not exist, or whether it does
    /// could not be found out; the targets keep their data.
    #[error("{message}")]
    Folder {
        /// Bounded reason: `FolderNotFound`, `EnvironmentNotFound` or
        /// `FolderCheckFailed`.
        reason: &'static str,
        /// What is wrong, naming the environment and folder.
        message: String,
        /// Whether retrying soon may help (the check itself failed on a
        /// passing error).
        transient: bool,
    },
    /// A template failed.
    #[error("{0}")]
    Template(String),
    /// A target cannot be written (not ours, owned by another resource).
    #[error("{message}")]
    Target {
        /// Bounded reason.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The Kubernetes API failed.
    #[error("{context}: {message}")]
    Kube {
        /// What was being done.
        context: String,
        /// The API's answer.
        message: String,
        /// HTTP status if the API answered.
        code: Option<u16>,
    },
    /// A target created without reading it first exists already (outside
    /// the caches): it is read and checked, then written or refused.
    #[error("{0} exists already")]
    Exists(String),
    /// The shard was lost while working; nothing more was written.
    #[error("shard ownership lost")]
    NotOwner,
}

impl SyncError {
    /// Wrap a Kubernetes client error with context.
    pub fn kube(context: impl Into<String>, e: kube::Error) -> Self {
        let (message, code) = match &e {
            kube::Error::Api(s) => (s.message.clone(), Some(s.code)),
            other => (other.to_string(), None),
        };
        SyncError::Kube {
            context: context.into(),
            message,
            code,
        }
    }

    /// The condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            SyncError::Spec(_) => "InvalidSpec",
            SyncError::Reference { reason, .. } | SyncError::Target { reason, .. } => reason,
            SyncError::Auth(e) => match e {
                KmsError::Transport { .. } | KmsError::RateLimited { .. } => e.reason(),
                KmsError::Api { status, .. } if *status >= 500 => e.reason(),
                KmsError::InvalidHost { .. }
                | KmsError::HostNotAllowed { .. }
                | KmsError::HostNotTrusted { .. }
                | KmsError::Certificate { .. }
                | KmsError::InvalidCa(_) => e.reason(),
                _ => "AuthenticationFailed",
            },
            SyncError::Kms(e) => e.reason(),
            SyncError::KmsScope { error, .. } => match error.status() {
                Some(404) => "FolderNotFound",
                _ => error.reason(),
            },
            SyncError::Folder { reason, .. } => reason,
            SyncError::Template(_) => "TemplateError",
            SyncError::Kube {
                code: Some(409), ..
            }
            | SyncError::Exists(_) => "Conflict",
            SyncError::Kube { .. } => "KubernetesAPIError",
            SyncError::NotOwner => "NotOwner",
        }
    }

    /// Whether retrying soon may help (as opposed to waiting for a change).
    pub fn is_transient(&self) -> bool {
        match self {
            SyncError::Auth(e) | SyncError::Kms(e) | SyncError::KmsScope { error: e, .. } => {
                e.is_transient()
            }
            SyncError::Folder { transient, .. } => *transient,
            SyncError::Kube { code, .. } => code.is_none_or(|c| c >= 500 || c == 409 || c == 429),
            SyncError::NotOwner | SyncError::Exists(_) => true,
            _ => false,
        }
    }

    /// Whether logging in failed: the KMS refused the credentials, or they
    /// could not be read (a `Credentials…` reference error).
    pub fn is_login_failure(&self) -> bool {
        matches!(self, SyncError::Auth(_))
            || matches!(self, SyncError::Reference { reason, .. } if reason.starts_with("Credentials"))
    }

    /// Whether the KMS refused the request for its rate limit (`429`, or an
    /// endpoint still paused by an earlier `Retry-After`): nothing is wrong
    /// with the resource or its credentials, the KMS asked to come back later.
    pub fn is_throttled(&self) -> bool {
        match self {
            SyncError::Auth(e) | SyncError::Kms(e) | SyncError::KmsScope { error: e, .. } => {
                matches!(e, KmsError::RateLimited { .. })
            }
            _ => false,
        }
    }

    /// The least delay before the next attempt, when the KMS asked for one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            SyncError::Auth(e) | SyncError::Kms(e) | SyncError::KmsScope { error: e, .. } => {
                e.retry_after()
            }
            _ => None,
        }
    }
}
