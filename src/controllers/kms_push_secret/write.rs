//! Carrying out a push plan against the KMS: updates (renames back
//! included), take-overs, creates, then deletes; several writes of one kind
//! go in one batch request, and a batch the KMS refuses (a 4xx) is retried
//! key by key so that the failures name their keys. After a transient
//! failure (the KMS unreachable, 5xx, 429) the remaining writes are not
//! attempted: they are reported with the same cause and retried with the
//! next reconcile.
//!
//! The ownership records follow the results: a created or taken-over key
//! joins `managedSecrets` only when its write succeeded, a deleted key
//! leaves it only when its delete succeeded (or the key was already gone),
//! and a generated value is recorded only once it was written.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::api::kms_push_secret::GeneratedSecret;
use crate::kms::push::{Folder, NewSecret, SecretChange, Written};
use crate::kms::{Identity, Kms, KmsError};

use super::plan::{Change, Op, Plan};

/// Why a key's write did not happen.
#[derive(Clone, Debug)]
pub enum Cause {
    /// The KMS refused or could not be reached.
    Kms(KmsError),
    /// The folder needs approval: the KMS opened a change request.
    Approval,
    /// A generator could not make a value.
    Generator(String),
}

impl Cause {
    /// A bounded reason for conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            Cause::Kms(e) => e.reason(),
            Cause::Approval => "ApprovalRequired",
            Cause::Generator(_) => "GeneratorFailed",
        }
    }

    /// Whether retrying soon may help.
    pub fn is_transient(&self) -> bool {
        matches!(self, Cause::Kms(e) if e.is_transient())
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Kms(e) => write!(f, "{e}"),
            Cause::Approval => write!(
                f,
                "the folder is protected by an approval policy: the KMS opened a change request instead of writing"
            ),
            Cause::Generator(why) => write!(f, "{why}"),
        }
    }
}

/// What applying a plan did.
#[derive(Debug, Default)]
pub struct Applied {
    /// Ownership after the writes: id → key.
    pub managed: BTreeMap<String, String>,
    /// Generator records after the writes.
    pub generated: BTreeMap<String, GeneratedSecret>,
    /// Keys whose write failed, by write kind (key, cause).
    pub failures: BTreeMap<OpKey, Vec<(String, Cause)>>,
    /// Keys written, by write kind.
    pub written: BTreeMap<OpKey, usize>,
    /// Foreign keys left alone.
    pub skipped: Vec<String>,
    /// Keys another resource pushes: (key, owner).
    pub conflicts: Vec<(String, String)>,
    /// Wanted keys that needed no write.
    pub in_step: usize,
    /// When a kept generated value is next due for rotation.
    pub next_rotation: Option<SystemTime>,
}

/// [`Op`] as a map key (ordered as the conditions are listed).
pub type OpKey = u8;

/// The map key of an [`Op`].
pub fn op_key(op: Op) -> OpKey {
    match op {
        Op::Create => 0,
        Op::Update => 1,
        Op::Delete => 2,
        Op::Replace => 3,
    }
}

impl Applied {
    /// The failures of one kind of write.
    pub fn failed(&self, op: Op) -> &[(String, Cause)] {
        self.failures
            .get(&op_key(op))
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Every failure.
    pub fn all_failures(&self) -> impl Iterator<Item = &(String, Cause)> {
        self.failures.values().flatten()
    }

    /// Keys written of one kind.
    pub fn count(&self, op: Op) -> usize {
        self.written.get(&op_key(op)).copied().unwrap_or(0)
    }

    fn fail(&mut self, op: Op, key: &str, cause: Cause) {
        self.failures
            .entry(op_key(op))
            .or_default()
            .push((key.to_owned(), cause));
    }

    fn done(&mut self, op: Op) {
        *self.written.entry(op_key(op)).or_default() += 1;
    }
}

/// Whether a refused batch is worth retrying key by key: a 4xx that is
/// neither a token error nor a rate limit (those would fail every key alike).
fn split_batch(e: &KmsError) -> bool {
    matches!(e, KmsError::Api { status, .. } if (400..500).contains(status) && *status != 429)
        && !e.is_token_error()
}

fn single(r: Result<Written, KmsError>) -> Result<Option<String>, Cause> {
    match r {
        Ok(Written::Done(t)) => Ok(t.into_iter().next().map(|t| t.id)),
        Ok(Written::ApprovalRequired) => Err(Cause::Approval),
        Err(e) => Err(Cause::Kms(e)),
    }
}

/// Write `n` items: one batch when there are several, else (or when the
/// batch is refused with a 4xx) one request per item. Results in item
/// order: the id written (when the KMS named it) or the cause.
async fn each<B, BF, S, SF>(
    keys: &[String],
    batch: B,
    one: S,
    stop: &mut Option<Cause>,
) -> Vec<Result<Option<String>, Cause>>
where
    B: FnOnce() -> BF,
    BF: Future<Output = Result<Written, KmsError>>,
    S: Fn(usize) -> SF,
    SF: Future<Output = Result<Written, KmsError>>,
{
    if let Some(cause) = stop {
        return keys.iter().map(|_| Err(cause.clone())).collect();
    }
    if keys.len() >= 2 {
        match batch().await {
            Ok(Written::Done(touched)) => {
                return keys
                    .iter()
                    .map(|k| Ok(touched.iter().find(|t| t.key == *k).map(|t| t.id.clone())))
                    .collect();
            }
            Ok(Written::ApprovalRequired) => {
                return keys.iter().map(|_| Err(Cause::Approval)).collect();
            }
            Err(e) if split_batch(&e) => {
                tracing::debug!(error = %e, "batch refused; writing key by key");
            }
            Err(e) => {
                let cause = Cause::Kms(e);
                if cause.is_transient() {
                    *stop = Some(cause.clone());
                }
                return keys.iter().map(|_| Err(cause.clone())).collect();
            }
        }
    }
    let mut out = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        if let Some(cause) = stop {
            out.push(Err(cause.clone()));
            continue;
        }
        let r = single(one(i).await);
        if let Err(c) = &r
            && c.is_transient()
        {
            *stop = Some(c.clone());
        }
        out.push(r);
    }
    out
}

fn changes(list: &[Change]) -> Vec<SecretChange> {
    list.iter()
        .map(|c| SecretChange {
            key: c.key.clone(),
            value: c.value.clone(),
            new_key: (c.key != c.to).then(|| c.to.clone()),
        })
        .collect()
}

/// Apply a plan. `check` runs before each group of writes and stops the
/// work when it fails (the shard was lost).
pub async fn apply<C, E>(
    kms: &Kms,
    identity: &Identity,
    folder: &Folder,
    plan: Plan,
    check: C,
) -> Result<Applied, E>
where
    C: Fn() -> Result<(), E>,
{
    let mut a = Applied {
        managed: plan.managed,
        generated: plan.generated,
        skipped: plan.skipped,
        conflicts: plan.conflicts,
        in_step: plan.in_step,
        next_rotation: plan.next_rotation,
        ..Applied::default()
    };
    let pending = plan.pending;
    let mut stop: Option<Cause> = None;
    for (op, key, why) in plan.unavailable {
        a.fail(op, &key, Cause::Generator(why));
    }

    // Updates of our keys (renames back included), then take-overs.
    for (op, list) in [(Op::Update, &plan.updates), (Op::Replace, &plan.replaces)] {
        if list.is_empty() {
            continue;
        }
        check()?;
        let items = changes(list);
        let keys: Vec<String> = list.iter().map(|c| c.key.clone()).collect();
        let results = each(
            &keys,
            || kms.update_secrets(identity, folder, &items),
            |i| kms.update_secret(identity, folder, &items[i]),
            &mut stop,
        )
        .await;
        for (c, r) in list.iter().zip(results) {
            match r {
                Ok(_) => {
                    a.done(op);
                    a.managed.insert(c.id.clone(), c.to.clone());
                    if let Some(g) = pending.get(&c.to) {
                        a.generated.insert(c.to.clone(), g.clone());
                    }
                }
                Err(cause) => a.fail(op, &c.to, cause),
            }
        }
    }

    // Creates.
    if !plan.creates.is_empty() {
        check()?;
        let items: &[NewSecret] = &plan.creates;
        let keys: Vec<String> = items.iter().map(|s| s.key.clone()).collect();
        let results = each(
            &keys,
            || kms.create_secrets(identity, folder, items),
            |i| kms.create_secret(identity, folder, &items[i]),
            &mut stop,
        )
        .await;
        for (s, r) in items.iter().zip(results) {
            match r {
                Ok(id) => {
                    a.done(Op::Create);
                    // Without an id (an unusual answer) the key is found
                    // again by its marker at the next reconcile.
                    if let Some(id) = id.filter(|i| !i.is_empty()) {
                        a.managed.insert(id, s.key.clone());
                    }
                    if let Some(g) = pending.get(&s.key) {
                        a.generated.insert(s.key.clone(), g.clone());
                    }
                }
                Err(cause) => a.fail(Op::Create, &s.key, cause),
            }
        }
    }

    // Deletes of our keys no longer pushed.
    if !plan.deletes.is_empty() {
        check()?;
        let results = delete_keys(kms, identity, folder, &plan.deletes, &mut stop).await;
        for ((id, key), r) in plan.deletes.iter().zip(results) {
            match r {
                Ok(()) => {
                    a.done(Op::Delete);
                    a.managed.remove(id);
                    a.generated.remove(key);
                }
                Err(cause) => a.fail(Op::Delete, key, cause),
            }
        }
    }

    // Records of keys no longer generated go.
    let generated_keys: Vec<String> = a.generated.keys().cloned().collect();
    for k in generated_keys {
        if !a.managed.values().any(|v| *v == k) {
            a.generated.remove(&k);
        }
    }
    Ok(a)
}

/// Delete `(id, key)` pairs; a key already gone counts as deleted.
pub async fn delete_keys(
    kms: &Kms,
    identity: &Identity,
    folder: &Folder,
    items: &[(String, String)],
    stop: &mut Option<Cause>,
) -> Vec<Result<(), Cause>> {
    let keys: Vec<String> = items.iter().map(|(_, k)| k.clone()).collect();
    each(
        &keys,
        || kms.delete_secrets(identity, folder, &keys),
        |i| kms.delete_secret(identity, folder, &keys[i]),
        stop,
    )
    .await
    .into_iter()
    .map(|r| r.map(|_| ()))
    .collect()
}
