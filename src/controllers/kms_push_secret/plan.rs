//! The pure part of a push: what a KmsPushSecret wants in its KMS folder
//! (source keys, rendered templates, generated values), and the diff of that
//! against what the folder holds and what the resource owns. No I/O; the
//! randomness of generators comes in as ready-made candidate values, and the
//! clock as `now`. Everything here is unit-tested.
//!
//! Ownership: `status.managedSecrets` maps KMS secret ids to keys. A key is
//! **ours** when its id is recorded there, or when its comment carries this
//! resource's marker (a create whose status write was lost). Ours are
//! updated when their value differs and deleted when no longer pushed.
//! Anything else is **foreign**: taken over only with `updatePolicy:
//! Replace`, otherwise left alone and reported. A recorded id found under
//! another key (renamed in the KMS) is renamed back when its recorded key is
//! still pushed and free, and released otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use secrecy::{ExposeSecret, SecretString};

use super::generate::{Random, generate};
use crate::api::cluster_generator::ClusterGeneratorSpec;
use crate::api::common::SecretTemplate;
use crate::api::duration::parse_optional_duration;
use crate::api::kms_push_secret::{
    GeneratedSecret, GeneratorKind, KmsPushSecret, KmsPushSecretSpec, PushGenerator, UpdatePolicy,
};
use crate::controllers::auth::generic_method;
use crate::controllers::error::SyncError;
use crate::controllers::refs::{namespace_of, written_ref};
use crate::controllers::target::Renderer;
use crate::kms::ProjectRef;
use crate::kms::folders::normalize_path;
use crate::kms::push::{Folder, NewSecret, StoredSecret};

/// The finalizer that holds a KmsPushSecret until its cleanup is done.
pub const FINALIZER: &str = "pushsecret.secrets.hanzo.ai/finalizer";
/// Shortest accepted `resyncInterval`.
pub const MIN_RESYNC: Duration = Duration::from_secs(5);
/// Shortest accepted `rotationInterval`.
pub const MIN_ROTATION: Duration = Duration::from_secs(60);

/// `KmsPushSecret/<ns>/<name>`.
pub fn owner_id(ns: &str, name: &str) -> String {
    format!("KmsPushSecret/{ns}/{name}")
}

/// The comment stored with every key this resource creates. It lets the
/// operator recognise its own keys when the status write that should have
/// recorded them was lost.
pub fn marker(ns: &str, name: &str, uid: &str) -> String {
    format!("Managed by kms-operator: KmsPushSecret {ns}/{name} (uid {uid})")
}

/// The owner id a marker comment names, with the UID it carries:
/// `(KmsPushSecret/<ns>/<name>, uid)`.
pub fn parse_marker(comment: &str) -> Option<(String, String)> {
    let rest = comment.strip_prefix("Managed by kms-operator: KmsPushSecret ")?;
    let (object, uid) = rest.split_once(" (uid ")?;
    let uid = uid.strip_suffix(')')?;
    let (ns, name) = object.split_once('/')?;
    Some((owner_id(ns, name), uid.to_owned()))
}

/// The resync interval: `None` = only on change. At least [`MIN_RESYNC`].
pub fn resync_interval(spec: &KmsPushSecretSpec) -> Result<Option<Duration>, SyncError> {
    let d = parse_optional_duration(spec.resync_interval.as_deref())
        .map_err(|e| SyncError::Spec(format!("resyncInterval: {e}")))?;
    match d {
        Some(d) if d < MIN_RESYNC => Err(SyncError::Spec(format!(
            "resyncInterval must be at least {}s",
            MIN_RESYNC.as_secs()
        ))),
        other => Ok(other),
    }
}

/// The KMS folder of a spec.
pub fn folder(spec: &KmsPushSecretSpec) -> Result<Folder, SyncError> {
    let d = &spec.destination;
    let project = match (
        d.project_slug.as_deref().filter(|v| !v.is_empty()),
        d.project_id.as_deref().filter(|v| !v.is_empty()),
    ) {
        (Some(slug), None) => ProjectRef::Slug(slug.to_owned()),
        (None, Some(id)) => ProjectRef::Id(id.to_owned()),
        _ => {
            return Err(SyncError::Spec(
                "destination: exactly one of projectSlug and projectId must be set".to_owned(),
            ));
        }
    };
    Ok(Folder {
        project,
        environment: d.environment_slug.clone(),
        path: normalize_path(&d.secrets_path),
    })
}

/// The source Secret `(namespace, name)`, under the namespace rule.
pub fn source_ref(
    cr: &KmsPushSecret,
    allow_cross: bool,
) -> Result<Option<(String, String)>, SyncError> {
    let ns = cr.metadata.namespace.as_deref().unwrap_or_default();
    let Some(s) = &cr.spec.push.secret else {
        return Ok(None);
    };
    let sns = namespace_of(
        ns,
        s.secret_namespace.as_deref(),
        "push.secret.secretNamespace",
        allow_cross,
    )?;
    Ok(Some((sns, s.secret_name.clone())))
}

/// Every Secret a resource reads (source, credentials, CA), as
/// `(namespace, name)`, for the reference index. Namespaces are taken as
/// written; whether they are allowed is checked when reconciling.
pub fn referenced_secrets(cr: &KmsPushSecret) -> Vec<(String, String)> {
    let ns = cr.metadata.namespace.clone().unwrap_or_default();
    let pick = |r_ns: Option<&String>, name: &str| written_ref(&ns, r_ns, name);
    let mut out = Vec::new();
    if let Some(s) = &cr.spec.push.secret {
        out.push(pick(s.secret_namespace.as_ref(), &s.secret_name));
    }
    if let Some(read) = cr
        .spec
        .authentication
        .as_ref()
        .and_then(|a| generic_method(a, &ns, true).ok())
        .and_then(|m| m.secret_read().cloned())
    {
        out.push(read);
    }
    if let Some(ca) = cr.spec.tls.as_ref().and_then(|t| t.ca_ref.as_ref()) {
        out.push(pick(ca.secret_namespace.as_ref(), &ca.secret_name));
    }
    out.sort();
    out.dedup();
    out
}

/// Names of the ClusterGenerators a resource uses.
pub fn generator_names(cr: &KmsPushSecret) -> Vec<String> {
    let mut names: Vec<String> = cr
        .spec
        .push
        .generators
        .iter()
        .flatten()
        .map(|g| g.generator_ref.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The values the source Secret contributes: every key (no template, or
/// `includeAllSecrets`), overridden by the rendered `template.data` entries.
/// Each template sees every source key as `{Value, SecretPath}` with
/// `SecretPath` the destination folder; values may be binary. A value pushed
/// as it is must be UTF-8 text (the KMS stores text).
pub fn source_values(
    source: &str,
    data: &BTreeMap<String, Vec<u8>>,
    template: Option<&SecretTemplate>,
    path: &str,
    renderer: &Renderer,
    budget: &mut kms_template::Budget,
) -> Result<BTreeMap<String, SecretString>, SyncError> {
    let mut out = BTreeMap::new();
    if let Some(entries) = template.and_then(|t| t.data.as_ref()) {
        let model: kms_template::SecretData = data
            .iter()
            .map(|(k, v)| (k.clone(), kms_template::SecretEntry::new(v.clone(), path)))
            .collect();
        for (key, tpl) in entries {
            let field = format!("push.secret.template.data.{key}");
            let text = renderer(&field, tpl, &model, false, budget)
                .map_err(SyncError::Template)
                .and_then(|b| {
                    String::from_utf8(b)
                        .map_err(|_| SyncError::Template(format!("{field}: not text")))
                })?;
            out.insert(key.clone(), SecretString::from(text));
        }
    }
    if template.is_none_or(|t| t.include_all_secrets) {
        for (key, bytes) in data {
            if out.contains_key(key) {
                continue;
            }
            let text = String::from_utf8(bytes.clone()).map_err(|_| {
                SyncError::Spec(format!(
                    "source Secret {source}: key {key} holds binary data (not UTF-8 text), and the KMS stores text; \
                     push it through push.secret.template.data, e.g. {{{{ {key}.Value | b64enc }}}}"
                ))
            })?;
            out.insert(key.clone(), SecretString::from(text));
        }
    }
    Ok(out)
}

/// A value as the KMS stores it: surrounding whitespace trimmed, one final
/// newline kept if there was one. Desired values are compared in this form,
/// so a value the KMS normalised is not written again on every resync.
pub fn normalized(v: &str) -> String {
    if v.ends_with('\n') {
        format!("{}\n", v.trim())
    } else {
        v.trim().to_owned()
    }
}

/// A generated value wanted under a key.
#[derive(Clone)]
pub struct GeneratorEntry {
    /// `<kind>/<ClusterGenerator name>`.
    pub generator: String,
    /// Rotate when the value is older than this.
    pub rotation: Option<Duration>,
    /// A fresh value, used only when the key needs one; or why the
    /// generator cannot make one.
    pub fresh: Result<SecretString, String>,
}

impl std::fmt::Debug for GeneratorEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratorEntry")
            .field("generator", &self.generator)
            .field("rotation", &self.rotation)
            .field("fresh", &self.fresh.as_ref().map(|_| "[REDACTED]"))
            .finish()
    }
}

/// What a key should hold.
#[derive(Clone, Debug)]
pub enum Wanted {
    /// This value (from the source Secret or a template).
    Value(SecretString),
    /// A generated value, kept once pushed.
    Generated(GeneratorEntry),
}

/// The generator entries of a spec, with a fresh candidate each. The
/// ClusterGenerator must exist and its `spec.kind` must match the
/// reference's kind.
pub fn generator_entries<F>(
    generators: &[PushGenerator],
    lookup: F,
    rng: &mut dyn Random,
) -> Result<Vec<(String, GeneratorEntry)>, SyncError>
where
    F: Fn(&str) -> Option<ClusterGeneratorSpec>,
{
    let mut out: Vec<(String, GeneratorEntry)> = Vec::new();
    for (i, g) in generators.iter().enumerate() {
        let field = format!("push.generators[{i}]");
        let r = &g.generator_ref;
        let key = g.destination_secret_name.clone();
        if out.iter().any(|(k, _)| *k == key) {
            return Err(SyncError::Spec(format!(
                "{field}.destinationSecretName: {key} is generated twice"
            )));
        }
        let spec = lookup(&r.name).ok_or_else(|| SyncError::Reference {
            reason: "GeneratorNotFound",
            message: format!("{field}: ClusterGenerator {} not found", r.name),
        })?;
        if spec.kind != r.kind {
            return Err(SyncError::Reference {
                reason: "GeneratorKindMismatch",
                message: format!(
                    "{field}.generatorRef.kind is {} but ClusterGenerator {} has spec.kind {}",
                    kind_name(r.kind),
                    r.name,
                    kind_name(spec.kind)
                ),
            });
        }
        let rotation = parse_optional_duration(g.rotation_interval.as_deref())
            .map_err(|e| SyncError::Spec(format!("{field}.rotationInterval: {e}")))?;
        if rotation.is_some_and(|d| d < MIN_ROTATION) {
            return Err(SyncError::Spec(format!(
                "{field}.rotationInterval must be at least {}s",
                MIN_ROTATION.as_secs()
            )));
        }
        let fresh = generate(&spec, rng)
            .map(SecretString::from)
            .map_err(|why| format!("ClusterGenerator {}: {why}", r.name));
        out.push((
            key,
            GeneratorEntry {
                generator: format!("{}/{}", kind_name(r.kind), r.name),
                rotation,
                fresh,
            },
        ));
    }
    Ok(out)
}

/// A generator kind as written in manifests.
pub fn kind_name(k: GeneratorKind) -> &'static str {
    match k {
        GeneratorKind::Password => "Password",
        GeneratorKind::Uuid => "UUID",
    }
}

/// Source values and generated entries together; a generated key overrides
/// a source key of the same name.
pub fn wanted(
    source: BTreeMap<String, SecretString>,
    generators: Vec<(String, GeneratorEntry)>,
) -> BTreeMap<String, Wanted> {
    let mut out: BTreeMap<String, Wanted> = source
        .into_iter()
        .map(|(k, v)| (k, Wanted::Value(v)))
        .collect();
    for (k, g) in generators {
        out.insert(k, Wanted::Generated(g));
    }
    out
}

/// Everything the diff looks at.
pub struct Input<'a> {
    /// What the resource wants, by key.
    pub wanted: &'a BTreeMap<String, Wanted>,
    /// The folder as listed.
    pub stored: &'a [StoredSecret],
    /// `status.managedSecrets`: id → key.
    pub managed: &'a BTreeMap<String, String>,
    /// `status.generatedSecrets`.
    pub generated: &'a BTreeMap<String, GeneratedSecret>,
    /// `updatePolicy`.
    pub policy: UpdatePolicy,
    /// This resource's marker comment.
    pub marker: &'a str,
    /// Given a stored comment: the owner id of another live resource whose
    /// marker it is (such keys are never taken over).
    pub pushed_by_other: &'a dyn Fn(&str) -> Option<String>,
    /// The time.
    pub now: SystemTime,
}

/// A write to an existing secret.
#[derive(Clone)]
pub struct Change {
    /// Its id.
    pub id: String,
    /// Its key now.
    pub key: String,
    /// Its key after the write (differs for a rename back).
    pub to: String,
    /// The value to write.
    pub value: SecretString,
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Change")
            .field("id", &self.id)
            .field("key", &self.key)
            .field("to", &self.to)
            .finish_non_exhaustive()
    }
}

/// Which write a key needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create a missing key.
    Create,
    /// Update a key of ours.
    Update,
    /// Delete a key of ours no longer pushed.
    Delete,
    /// Take over an existing key (`updatePolicy: Replace`).
    Replace,
}

/// The writes that bring the folder in step, and the ownership records
/// that follow.
#[derive(Default)]
pub struct Plan {
    /// Keys to create (with the marker comment).
    pub creates: Vec<NewSecret>,
    /// Keys of ours to update, renames back included (`key != to`).
    pub updates: Vec<Change>,
    /// Foreign keys to take over with a new value.
    pub replaces: Vec<Change>,
    /// Keys of ours to delete: (id, key).
    pub deletes: Vec<(String, String)>,
    /// Ownership that holds whatever the writes do: kept, recovered and
    /// adopted ids (deleted ones leave when their delete succeeds; created
    /// and replaced ones join when their write succeeds).
    pub managed: BTreeMap<String, String>,
    /// Generator records that hold (values kept).
    pub generated: BTreeMap<String, GeneratedSecret>,
    /// Generator records that hold once the key's write succeeds.
    pub pending: BTreeMap<String, GeneratedSecret>,
    /// Foreign keys left alone (`updatePolicy: None`).
    pub skipped: Vec<String>,
    /// Keys another live resource pushes (never taken over): (key, owner).
    pub conflicts: Vec<(String, String)>,
    /// Keys that needed a generated value the generator cannot make:
    /// (write, key, why).
    pub unavailable: Vec<(Op, String, String)>,
    /// Wanted keys already in step.
    pub in_step: usize,
    /// The earliest time a kept generated value is due for rotation.
    pub next_rotation: Option<SystemTime>,
}

impl Plan {
    /// Whether the plan writes nothing.
    pub fn is_noop(&self) -> bool {
        self.creates.is_empty()
            && self.updates.is_empty()
            && self.replaces.is_empty()
            && self.deletes.is_empty()
    }
}

#[derive(Clone)]
struct Slot {
    id: String,
    value: SecretString,
    ours: bool,
    /// Ours by the marker only (not recorded in the status).
    recovered: bool,
    /// For a rename back: the key it has in the KMS now.
    renamed_from: Option<String>,
    /// Another live resource that created it.
    other: Option<String>,
}

enum Decision {
    Keep,
    Write(SecretString),
    Unavailable(String),
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The diff (pure).
pub fn plan(input: &Input<'_>) -> Plan {
    let mut p = Plan::default();
    let slots = slots(input, &mut p);
    // A secret renamed back leaves no slot under the key it has now, so a
    // wanted key of that name is created (after the rename).

    // 3. Every wanted key.
    for (key, want) in input.wanted {
        let slot = slots.get(key);
        if let Some(owner) = slot.and_then(|s| s.other.clone()) {
            p.conflicts.push((key.clone(), owner));
            continue;
        }
        if slot.is_some_and(|s| !s.ours) && input.policy != UpdatePolicy::Replace {
            p.skipped.push(key.clone());
            continue;
        }
        let decision = decide(input, &mut p, key, want, slot);
        place(input, &mut p, key, want, slot, decision);
    }

    // 4. Keys of ours no longer wanted.
    for (key, s) in &slots {
        if s.ours && s.renamed_from.is_none() && !input.wanted.contains_key(key) {
            p.deletes.push((s.id.clone(), key.clone()));
        }
    }
    p
}

/// The record of a value generated now by `generator`.
fn generated_now(generator: &str, now: SystemTime) -> GeneratedSecret {
    GeneratedSecret {
        generator: generator.to_owned(),
        generated_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(timestamp(now)),
    }
}

/// Steps 1 and 2: the listed secrets by key, and who owns them (recorded
/// ids, recovered by marker, another resource's, foreign); ids recorded
/// under another key are renamed back when that key is wanted and free.
fn slots(input: &Input<'_>, p: &mut Plan) -> BTreeMap<String, Slot> {
    // 1. Who owns what is listed.
    let mut slots: BTreeMap<String, Slot> = BTreeMap::new();
    let mut renamed: Vec<(&StoredSecret, String)> = Vec::new();
    for s in input.stored {
        match input.managed.get(&s.id) {
            Some(k) if *k == s.key => {
                slots.insert(
                    s.key.clone(),
                    Slot {
                        id: s.id.clone(),
                        value: s.value.clone(),
                        ours: true,
                        recovered: false,
                        renamed_from: None,
                        other: None,
                    },
                );
                p.managed.insert(s.id.clone(), s.key.clone());
            }
            Some(k) => renamed.push((s, k.clone())),
            None => {
                let recovered = !input.marker.is_empty() && s.comment.contains(input.marker);
                if recovered {
                    p.managed.insert(s.id.clone(), s.key.clone());
                }
                let other = if recovered {
                    None
                } else {
                    (input.pushed_by_other)(&s.comment)
                };
                slots.insert(
                    s.key.clone(),
                    Slot {
                        id: s.id.clone(),
                        value: s.value.clone(),
                        ours: recovered,
                        recovered,
                        renamed_from: None,
                        other,
                    },
                );
            }
        }
    }
    // 2. Recorded ids found under another key: rename back when the recorded
    // key is still wanted and free; otherwise release them (whoever renamed
    // them keeps them).
    for (s, recorded) in renamed {
        if input.wanted.contains_key(&recorded) && !slots.contains_key(&recorded) {
            slots.insert(
                recorded.clone(),
                Slot {
                    id: s.id.clone(),
                    value: s.value.clone(),
                    ours: true,
                    recovered: false,
                    renamed_from: Some(s.key.clone()),
                    other: None,
                },
            );
            p.managed.insert(s.id.clone(), recorded);
        } else {
            slots.insert(
                s.key.clone(),
                Slot {
                    id: s.id.clone(),
                    value: s.value.clone(),
                    ours: false,
                    recovered: false,
                    renamed_from: None,
                    other: None,
                },
            );
        }
    }
    slots
}

/// What a wanted key needs: keep what is there, write a value, or report
/// that a generated value is unavailable. Generated values are kept until
/// their rotation is due (the soonest due rotation is the plan's next).
fn decide(
    input: &Input<'_>,
    p: &mut Plan,
    key: &str,
    want: &Wanted,
    slot: Option<&Slot>,
) -> Decision {
    let now = input.now;
    let record = |generator: &str| generated_now(generator, now);
    let current = slot.filter(|s| s.ours).map(|s| &s.value);
    match want {
        Wanted::Value(v) => match current {
            Some(cur) if normalized(v.expose_secret()) == cur.expose_secret() => Decision::Keep,
            _ => Decision::Write(v.clone()),
        },
        Wanted::Generated(g) => {
            let kept = input
                .generated
                .get(key)
                .filter(|r| r.generator == g.generator);
            let keep = match (current, kept) {
                (None, _) => None,
                (Some(_), Some(r)) => {
                    let at = SystemTime::from(r.generated_at.0);
                    let due = g.rotation.and_then(|d| at.checked_add(d));
                    if due.is_some_and(|due| due <= now) {
                        None
                    } else {
                        if let Some(due) = due {
                            p.next_rotation = Some(p.next_rotation.map_or(due, |n| n.min(due)));
                        }
                        Some(r.clone())
                    }
                }
                // Created by us, but the status write that should have
                // recorded it was lost: keep the value, record it now.
                (Some(_), None) if slot.is_some_and(|s| s.recovered) => Some(record(&g.generator)),
                (Some(_), None) => None,
            };
            match keep {
                Some(r) => {
                    p.generated.insert(key.to_owned(), r);
                    Decision::Keep
                }
                None => match &g.fresh {
                    Ok(v) => {
                        p.pending.insert(key.to_owned(), record(&g.generator));
                        if let Some(due) = g.rotation.and_then(|d| now.checked_add(d)) {
                            p.next_rotation = Some(p.next_rotation.map_or(due, |n| n.min(due)));
                        }
                        Decision::Write(v.clone())
                    }
                    Err(why) => Decision::Unavailable(why.clone()),
                },
            }
        }
    }
}

/// Put a wanted key's decision in the plan: an update (or rename) of ours,
/// a replacement or takeover of a foreign one, or a creation.
fn place(
    input: &Input<'_>,
    p: &mut Plan,
    key: &str,
    want: &Wanted,
    slot: Option<&Slot>,
    decision: Decision,
) {
    match slot {
        Some(s) if s.ours => {
            let (value, write) = match decision {
                Decision::Keep => (s.value.clone(), false),
                Decision::Write(v) => (v, true),
                Decision::Unavailable(why) => {
                    p.unavailable.push((Op::Update, key.to_owned(), why));
                    return;
                }
            };
            match &s.renamed_from {
                Some(from) => p.updates.push(Change {
                    id: s.id.clone(),
                    key: from.clone(),
                    to: key.to_owned(),
                    value,
                }),
                None if write => p.updates.push(Change {
                    id: s.id.clone(),
                    key: key.to_owned(),
                    to: key.to_owned(),
                    value,
                }),
                None => p.in_step += 1,
            }
        }
        // Foreign, and updatePolicy: Replace.
        Some(s) => match decision {
            Decision::Write(v)
                if matches!(want, Wanted::Value(_))
                    && normalized(v.expose_secret()) == s.value.expose_secret() =>
            {
                // Same value: take it over without writing.
                p.managed.insert(s.id.clone(), key.to_owned());
                p.in_step += 1;
            }
            Decision::Write(v) => p.replaces.push(Change {
                id: s.id.clone(),
                key: key.to_owned(),
                to: key.to_owned(),
                value: v,
            }),
            Decision::Keep => {
                p.managed.insert(s.id.clone(), key.to_owned());
                p.in_step += 1;
            }
            Decision::Unavailable(why) => p.unavailable.push((Op::Replace, key.to_owned(), why)),
        },
        None => match decision {
            Decision::Write(v) => p.creates.push(NewSecret {
                key: key.to_owned(),
                value: v,
                comment: input.marker.to_owned(),
            }),
            Decision::Keep => p.in_step += 1,
            Decision::Unavailable(why) => p.unavailable.push((Op::Create, key.to_owned(), why)),
        },
    }
}

/// Keys a resource still owns, for messages: sorted, deduplicated.
pub fn owned_keys(managed: &BTreeMap<String, String>) -> Vec<String> {
    let set: BTreeSet<&String> = managed.values().collect();
    set.into_iter().cloned().collect()
}

/// A list of keys for a message, cut after a few dozen.
pub fn key_list(keys: &[String]) -> String {
    const MAX: usize = 30;
    let mut s = keys
        .iter()
        .take(MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > MAX {
        s.push_str(&format!(" and {} more", keys.len() - MAX));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::kms_push_secret::generate::SystemRandomSource;
    use crate::controllers::target::engine_renderer;
    use kms_template::{Budget, SecretData};

    type Rendered = Result<Vec<u8>, String>;

    const MARKER: &str = "Managed by kms-operator: KmsPushSecret ns/p (uid u1)";

    static NO_IDS: BTreeMap<String, String> = BTreeMap::new();
    static NO_RECORDS: BTreeMap<String, GeneratedSecret> = BTreeMap::new();

    fn nobody(_: &str) -> Option<String> {
        None
    }

    /// A plan's input with nothing managed or generated yet, `updatePolicy:
    /// None` and no other resource's markers.
    fn input<'a>(
        wanted: &'a BTreeMap<String, Wanted>,
        stored: &'a [StoredSecret],
        now: SystemTime,
    ) -> Input<'a> {
        Input {
            wanted,
            stored,
            managed: &NO_IDS,
            generated: &NO_RECORDS,
            policy: UpdatePolicy::None,
            marker: MARKER,
            pushed_by_other: &nobody,
            now,
        }
    }

    fn stored(id: &str, key: &str, value: &str, comment: &str) -> StoredSecret {
        StoredSecret {
            id: id.into(),
            key: key.into(),
            value: SecretString::from(value.to_owned()),
            comment: comment.into(),
        }
    }

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, Wanted> {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Wanted::Value(SecretString::from((*v).to_owned())),
                )
            })
            .collect()
    }

    fn managed(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(i, k)| ((*i).to_owned(), (*k).to_owned()))
            .collect()
    }

    fn run(
        wanted: &BTreeMap<String, Wanted>,
        listed: &[StoredSecret],
        owned: &BTreeMap<String, String>,
        policy: UpdatePolicy,
    ) -> Plan {
        plan(&Input {
            managed: owned,
            policy,
            ..input(wanted, listed, SystemTime::now())
        })
    }

    fn keys_of(p: &Plan) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
        (
            p.creates.iter().map(|c| c.key.clone()).collect(),
            p.updates.iter().map(|c| c.to.clone()).collect(),
            p.replaces.iter().map(|c| c.to.clone()).collect(),
            p.deletes.iter().map(|(_, k)| k.clone()).collect(),
        )
    }

    #[test]
    fn first_push_creates_with_the_marker_and_leaves_foreign_keys() {
        let w = values(&[("A", "1"), ("B", "2"), ("C", "3")]);
        let listed = [stored("x", "B", "other", ""), stored("y", "Z", "z", "")];
        let p = run(&w, &listed, &BTreeMap::new(), UpdatePolicy::None);
        let (c, u, r, d) = keys_of(&p);
        assert_eq!(c, vec!["A", "C"]);
        assert!(u.is_empty() && r.is_empty() && d.is_empty());
        assert_eq!(p.skipped, vec!["B"]);
        assert!(p.creates.iter().all(|c| c.comment == MARKER));
        assert!(
            p.managed.is_empty(),
            "nothing owned until the creates succeed"
        );
    }

    #[test]
    fn replace_takes_over_and_equal_values_are_adopted_without_a_write() {
        let w = values(&[("B", "2"), ("C", "3")]);
        let listed = [stored("x", "B", "other", ""), stored("y", "C", "3", "")];
        let p = run(&w, &listed, &BTreeMap::new(), UpdatePolicy::Replace);
        let (c, u, r, d) = keys_of(&p);
        assert!(c.is_empty() && u.is_empty() && d.is_empty());
        assert_eq!(r, vec!["B"]);
        assert_eq!(p.replaces[0].id, "x");
        assert_eq!(p.managed, managed(&[("y", "C")]));
        assert_eq!(p.in_step, 1);
        assert!(p.skipped.is_empty());
    }

    #[test]
    fn ours_are_updated_only_when_they_differ_and_deleted_when_dropped() {
        let w = values(&[("A", "new"), ("B", "same")]);
        let listed = [
            stored("1", "A", "old", ""),
            stored("2", "B", "same", ""),
            stored("3", "GONE_FROM_SOURCE", "x", ""),
            stored("4", "NOT_OURS", "x", ""),
        ];
        let owned = managed(&[
            ("1", "A"),
            ("2", "B"),
            ("3", "GONE_FROM_SOURCE"),
            ("9", "VANISHED"),
        ]);
        let p = run(&w, &listed, &owned, UpdatePolicy::None);
        let (c, u, r, d) = keys_of(&p);
        assert!(c.is_empty() && r.is_empty());
        assert_eq!(u, vec!["A"]);
        assert_eq!(d, vec!["GONE_FROM_SOURCE"]);
        assert_eq!(p.in_step, 1);
        // An id no longer in the KMS is forgotten; a foreign key that is not
        // wanted is never touched.
        assert_eq!(
            p.managed,
            managed(&[("1", "A"), ("2", "B"), ("3", "GONE_FROM_SOURCE")])
        );
    }

    #[test]
    fn nothing_to_do_when_in_step_even_after_kms_normalisation() {
        let w = values(&[("A", "  padded  "), ("B", "line\n\n")]);
        let listed = [
            stored("1", "A", "padded", ""),
            stored("2", "B", "line\n", ""),
        ];
        let p = run(
            &w,
            &listed,
            &managed(&[("1", "A"), ("2", "B")]),
            UpdatePolicy::None,
        );
        assert!(p.is_noop(), "{:?}", keys_of(&p));
        assert_eq!(p.in_step, 2);
        assert_eq!(normalized(" a \n"), "a\n");
        assert_eq!(normalized("a"), "a");
    }

    #[test]
    fn a_deleted_key_of_ours_is_created_again() {
        let w = values(&[("A", "1")]);
        let p = run(&w, &[], &managed(&[("1", "A")]), UpdatePolicy::None);
        assert_eq!(keys_of(&p).0, vec!["A"]);
        assert!(p.managed.is_empty());
    }

    #[test]
    fn lost_status_writes_are_recovered_by_the_marker() {
        let w = values(&[("A", "1")]);
        let listed = [
            stored("1", "A", "1", MARKER),
            stored("2", "OLD", "x", MARKER),
            // Another resource's marker (different uid) is foreign.
            stored(
                "3",
                "B",
                "x",
                "Managed by kms-operator: KmsPushSecret ns/p (uid u0)",
            ),
        ];
        let p = run(&w, &listed, &BTreeMap::new(), UpdatePolicy::None);
        assert_eq!(p.managed, managed(&[("1", "A"), ("2", "OLD")]));
        assert_eq!(keys_of(&p).3, vec!["OLD"]);
        assert!(p.creates.is_empty() && p.updates.is_empty());
        assert!(p.skipped.is_empty(), "B is not wanted, so not reported");
    }

    #[test]
    fn keys_of_another_live_resource_are_never_taken_over() {
        let other = "Managed by kms-operator: KmsPushSecret ns/q (uid u9)";
        assert_eq!(
            parse_marker(other),
            Some(("KmsPushSecret/ns/q".to_owned(), "u9".to_owned()))
        );
        assert_eq!(parse_marker("a note"), None);
        let w = values(&[("A", "mine"), ("B", "mine")]);
        let listed = [stored("1", "A", "theirs", other), stored("2", "B", "x", "")];
        let live = |c: &str| parse_marker(c).map(|(owner, _)| owner);
        let p = plan(&Input {
            policy: UpdatePolicy::Replace,
            pushed_by_other: &live,
            ..input(&w, &listed, SystemTime::now())
        });
        assert_eq!(
            p.conflicts,
            vec![("A".to_owned(), "KmsPushSecret/ns/q".to_owned())]
        );
        assert_eq!(keys_of(&p).2, vec!["B"], "a plain foreign key is replaced");
    }

    #[test]
    fn keys_renamed_in_the_kms_are_renamed_back_or_released() {
        // Id 1 was A and is now A2 (renamed by hand); A is still wanted and
        // free: rename back with the wanted value.
        let w = values(&[("A", "v"), ("A2", "w")]);
        let listed = [stored("1", "A2", "old", "")];
        let p = run(&w, &listed, &managed(&[("1", "A")]), UpdatePolicy::None);
        assert_eq!(p.updates.len(), 1);
        let c = &p.updates[0];
        assert_eq!(
            (c.id.as_str(), c.key.as_str(), c.to.as_str()),
            ("1", "A2", "A")
        );
        assert_eq!(c.value.expose_secret(), "v");
        // A2 is wanted too: created after the rename frees it.
        assert_eq!(keys_of(&p).0, vec!["A2"]);
        assert_eq!(p.managed, managed(&[("1", "A")]));

        // A is no longer wanted: release the renamed secret, delete nothing.
        let w = values(&[("B", "v")]);
        let p = run(&w, &listed, &managed(&[("1", "A")]), UpdatePolicy::None);
        assert!(p.deletes.is_empty() && p.updates.is_empty());
        assert!(p.managed.is_empty());
    }

    fn gen_entry(generator: &str, fresh: &str, rotation: Option<Duration>) -> Wanted {
        Wanted::Generated(GeneratorEntry {
            generator: generator.into(),
            rotation,
            fresh: Ok(SecretString::from(fresh.to_owned())),
        })
    }

    fn record(generator: &str, at: SystemTime) -> GeneratedSecret {
        GeneratedSecret {
            generator: generator.into(),
            generated_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(timestamp(at)),
        }
    }

    #[test]
    fn generated_values_are_made_once_and_kept() {
        let now = SystemTime::now();
        let mut w = BTreeMap::new();
        w.insert("PW".to_owned(), gen_entry("Password/pw", "fresh", None));
        // First push: created with the fresh value, recorded on success.
        let p = plan(&input(&w, &[], now));
        assert_eq!(p.creates[0].value.expose_secret(), "fresh");
        assert_eq!(p.pending["PW"].generator, "Password/pw");
        assert!(p.generated.is_empty());
        // Later: recorded and ours → kept, whatever the fresh candidate is.
        let listed = [stored("1", "PW", "kept", MARKER)];
        let owned = managed(&[("1", "PW")]);
        let records: BTreeMap<String, GeneratedSecret> =
            [("PW".to_owned(), record("Password/pw", now))].into();
        let p = plan(&Input {
            managed: &owned,
            generated: &records,
            ..input(&w, &listed, now + Duration::from_secs(86_400 * 365))
        });
        assert!(p.is_noop());
        assert_eq!(p.generated, records);
        assert_eq!(p.in_step, 1);
        assert!(p.next_rotation.is_none());
        // The reference changed to another generator → a new value.
        let mut other = BTreeMap::new();
        other.insert("PW".to_owned(), gen_entry("Password/other", "fresh2", None));
        let p = plan(&Input {
            managed: &owned,
            generated: &records,
            ..input(&other, &listed, now)
        });
        assert_eq!(p.updates[0].value.expose_secret(), "fresh2");
        // Recovered by the marker without a record: kept and recorded now.
        let p = plan(&input(&w, &listed, now));
        assert!(p.is_noop());
        assert_eq!(p.generated["PW"].generator, "Password/pw");
        // A key of ours that was pushed from the source before: generated now.
        let p = plan(&Input {
            managed: &owned,
            ..input(&w, &[stored("1", "PW", "from-source", "")], now)
        });
        assert_eq!(p.updates[0].value.expose_secret(), "fresh");
    }

    #[test]
    fn rotation_only_when_asked_and_due() {
        let day = Duration::from_secs(86_400);
        let now = SystemTime::now();
        let mut w = BTreeMap::new();
        w.insert(
            "PW".to_owned(),
            gen_entry("Password/pw", "rotated", Some(day)),
        );
        let listed = [stored("1", "PW", "kept", "")];
        let owned = managed(&[("1", "PW")]);
        let young: BTreeMap<String, GeneratedSecret> =
            [("PW".to_owned(), record("Password/pw", now - day / 2))].into();
        let p = plan(&Input {
            managed: &owned,
            generated: &young,
            ..input(&w, &listed, now)
        });
        assert!(p.is_noop());
        let due = p.next_rotation.expect("a rotation time");
        assert!(due > now && due <= now + day);
        let old: BTreeMap<String, GeneratedSecret> =
            [("PW".to_owned(), record("Password/pw", now - day * 2))].into();
        let p = plan(&Input {
            managed: &owned,
            generated: &old,
            ..input(&w, &listed, now)
        });
        assert_eq!(p.updates[0].value.expose_secret(), "rotated");
        assert!(p.pending.contains_key("PW"));
    }

    #[test]
    fn a_generator_that_cannot_make_a_value_fails_only_when_one_is_needed() {
        let mut w = BTreeMap::new();
        w.insert(
            "PW".to_owned(),
            Wanted::Generated(GeneratorEntry {
                generator: "Password/pw".into(),
                rotation: None,
                fresh: Err(
                    "ClusterGenerator pw: digits (5) plus symbols (5) exceed the length (8)".into(),
                ),
            }),
        );
        let p = run(&w, &[], &BTreeMap::new(), UpdatePolicy::None);
        assert_eq!(p.unavailable.len(), 1);
        assert_eq!(p.unavailable[0].0, Op::Create);
        assert!(p.creates.is_empty());
    }

    #[test]
    fn generator_references_are_checked() {
        let gens: Vec<PushGenerator> = serde_json::from_value(serde_json::json!([
            {"destinationSecretName": "PW", "generatorRef": {"kind": "Password", "name": "pw"}},
            {"destinationSecretName": "ID", "generatorRef": {"kind": "UUID", "name": "ids"}, "rotationInterval": "30d"}
        ]))
        .unwrap();
        let lookup = |n: &str| -> Option<ClusterGeneratorSpec> {
            match n {
                "pw" => {
                    Some(serde_json::from_value(serde_json::json!({"kind": "Password"})).unwrap())
                }
                "ids" => Some(serde_json::from_value(serde_json::json!({"kind": "UUID"})).unwrap()),
                "wrong" => {
                    Some(serde_json::from_value(serde_json::json!({"kind": "UUID"})).unwrap())
                }
                _ => None,
            }
        };
        let mut rng = SystemRandomSource::default();
        let entries = generator_entries(&gens, lookup, &mut rng).unwrap();
        assert_eq!(entries[0].1.generator, "Password/pw");
        assert_eq!(
            entries[0].1.fresh.as_ref().unwrap().expose_secret().len(),
            24
        );
        assert_eq!(
            entries[1].1.rotation,
            Some(Duration::from_secs(30 * 86_400))
        );

        let missing: Vec<PushGenerator> = serde_json::from_value(serde_json::json!([
            {"destinationSecretName": "PW", "generatorRef": {"kind": "Password", "name": "nope"}}
        ]))
        .unwrap();
        let e = generator_entries(&missing, lookup, &mut rng).unwrap_err();
        assert_eq!(e.reason(), "GeneratorNotFound");
        assert!(
            e.to_string().contains("ClusterGenerator nope not found"),
            "{e}"
        );

        let mismatch: Vec<PushGenerator> = serde_json::from_value(serde_json::json!([
            {"destinationSecretName": "PW", "generatorRef": {"kind": "Password", "name": "wrong"}}
        ]))
        .unwrap();
        let e = generator_entries(&mismatch, lookup, &mut rng).unwrap_err();
        assert_eq!(e.reason(), "GeneratorKindMismatch");
        let m = e.to_string();
        assert!(
            m.contains("kind is Password") && m.contains("spec.kind UUID"),
            "{m}"
        );

        let fast: Vec<PushGenerator> = serde_json::from_value(serde_json::json!([
            {"destinationSecretName": "PW", "generatorRef": {"kind": "Password", "name": "pw"}, "rotationInterval": "10s"}
        ]))
        .unwrap();
        assert!(generator_entries(&fast, lookup, &mut rng).is_err());
    }

    /// A renderer that writes a key's value length and folder.
    fn echo(field: &str, source: &str, data: &SecretData, _: bool, _: &mut Budget) -> Rendered {
        data.get(source)
            .map(|e| format!("{}@{}", e.value.len(), e.secret_path).into_bytes())
            .ok_or_else(|| format!("{field}: undefined"))
    }

    fn bytes(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
            .collect()
    }

    fn texts(m: BTreeMap<String, SecretString>) -> BTreeMap<String, String> {
        m.into_iter()
            .map(|(k, v)| (k, v.expose_secret().to_owned()))
            .collect()
    }

    #[test]
    fn source_values_with_and_without_templates() {
        let data = bytes(&[("A", b"a"), ("BIN", &[0xff, 0x00, 0xfe])]);
        let values = |t: Option<&SecretTemplate>, path: &str| {
            let mut budget = kms_template::Budget::new(1_000_000);
            source_values("ns/src", &data, t, path, &echo, &mut budget)
        };
        // Without a template every key is pushed, and must be text.
        let err = values(None, "/").unwrap_err();
        let m = err.to_string();
        assert!(
            m.contains("key BIN holds binary data") && m.contains("ns/src"),
            "{m}"
        );
        // A template may read binary values; only its keys are pushed.
        let t: SecretTemplate =
            serde_json::from_value(serde_json::json!({"data": {"OUT": "BIN"}})).unwrap();
        let v = texts(values(Some(&t), "/app").unwrap());
        assert_eq!(v, [("OUT".to_owned(), "3@/app".to_owned())].into());
        // includeAllSecrets: source keys too, template entries override.
        let t: SecretTemplate = serde_json::from_value(
            serde_json::json!({"includeAllSecrets": true, "data": {"BIN": "BIN"}}),
        )
        .unwrap();
        let v = texts(values(Some(&t), "/").unwrap());
        assert_eq!(v["A"], "a");
        assert_eq!(v["BIN"], "3@/");
        // Template errors name the field.
        let t: SecretTemplate =
            serde_json::from_value(serde_json::json!({"data": {"OUT": "MISSING"}})).unwrap();
        let err = values(Some(&t), "/").unwrap_err();
        assert_eq!(err.to_string(), "push.secret.template.data.OUT: undefined");
    }

    #[test]
    fn the_real_engine_sees_value_and_secret_path() {
        let engine = engine_renderer(kms_template::Engine::default());
        let data = bytes(&[("USER", b"app"), ("PASS", b"pw")]);
        let t: SecretTemplate = serde_json::from_value(serde_json::json!({"data": {
            "DSN": "postgres://{{ USER.Value }}:{{ PASS.Value }}@db{{ PASS.SecretPath }}"
        }}))
        .unwrap();
        let v = texts(
            source_values(
                "ns/src",
                &data,
                Some(&t),
                "/prod",
                &*engine,
                &mut kms_template::Budget::new(1_000_000),
            )
            .unwrap(),
        );
        assert_eq!(v["DSN"], "postgres://app:pw@db/prod");
    }

    #[test]
    fn references_for_the_index() {
        let cr: KmsPushSecret = serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsPushSecret",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "destination": {"secretsPath": "/", "environmentSlug": "dev", "projectSlug": "demo"},
                "authentication": {"universalAuth": {"credentialsRef": {"secretName": "creds"}}},
                "tls": {"caRef": {"secretName": "ca", "secretNamespace": "other", "key": "ca.crt"}},
                "push": {
                    "secret": {"secretName": "src"},
                    "generators": [{"destinationSecretName": "PW", "generatorRef": {"kind": "Password", "name": "pw"}}]
                }
            }
        }))
        .unwrap();
        assert_eq!(
            referenced_secrets(&cr),
            vec![
                ("ns".to_owned(), "creds".to_owned()),
                ("ns".to_owned(), "src".to_owned()),
                ("other".to_owned(), "ca".to_owned()),
            ]
        );
        assert_eq!(generator_names(&cr), vec!["pw"]);
        assert_eq!(
            source_ref(&cr, false).unwrap(),
            Some(("ns".into(), "src".into()))
        );
        assert_eq!(resync_interval(&cr.spec).unwrap(), None);
        let f = folder(&cr.spec).unwrap();
        assert_eq!(f.project, ProjectRef::Slug("demo".into()));

        let mut cross = cr.clone();
        cross.spec.push.secret.as_mut().unwrap().secret_namespace = Some("elsewhere".into());
        assert!(source_ref(&cross, false).is_err());
        assert!(source_ref(&cross, true).is_ok());
        let mut fast = cr;
        fast.spec.resync_interval = Some("3s".into());
        assert!(resync_interval(&fast.spec).is_err());
        fast.spec.resync_interval = Some("5s".into());
        assert_eq!(resync_interval(&fast.spec).unwrap(), Some(MIN_RESYNC));
    }
}
