//! The pure part of the KmsSecret reconcile: the targets a spec names, the
//! scope it reads, its resync interval, whether it is due, and the data each
//! target must hold. No I/O; everything here is unit-tested.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use crate::api::common::{
    CreationPolicy, KubeSecretReference, MachineIdentityScope, ManagedKubeSecretConfig,
};
use crate::api::duration::parse_optional_duration;
use crate::api::kms_secret::{KmsSecret, KmsSecretMethod, KmsSecretSpec};
pub use crate::controllers::auth::AuthMethod;
use crate::controllers::auth::machine_method;
use crate::controllers::error::SyncError;
use crate::controllers::instant::{Nudge, StreamState};
use crate::controllers::key::ObjectKey;
use crate::controllers::queue::JITTER_LOW;
use crate::controllers::refs::namespace_of;
use crate::controllers::registry::OwnerId;
use crate::controllers::target::{
    Claim, Desired, GO_VERSIONS_ANNOTATION, MANAGED_BY_LABEL, MANAGED_BY_VALUE, OWNER_ANNOTATION,
    Observed, Target, TargetKind, desired_meta, go_versions, valid_namespace_name,
    valid_object_name, version_of,
};
use crate::kms::folders::normalize_path;
use crate::kms::{ProjectRef, Scope};

use super::record::SyncRecord;

/// Default time between syncs.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);
/// Default time between syncs with instant updates.
pub const DEFAULT_RESYNC_INSTANT: Duration = Duration::from_secs(3600);
/// Shortest accepted interval.
pub const MIN_RESYNC: Duration = Duration::from_secs(5);

/// The targets of a KmsSecret (the deprecated `managedSecretReference` folded
/// in), with namespaces resolved under the cross-namespace rule.
pub fn targets(cr: &KmsSecret, allow_cross: bool) -> Result<Vec<Target>, SyncError> {
    let ns = cr.metadata.namespace.as_deref().unwrap_or_default();
    let spec = &cr.spec;
    let mut out = Vec::new();
    let secret_target =
        |field: String, r: &ManagedKubeSecretConfig| Target::secret(ns, field, r, allow_cross);
    if let Some(r) = &spec.managed_secret_reference {
        out.push(secret_target("managedSecretReference".to_owned(), r)?);
    }
    for (i, r) in spec
        .managed_kube_secret_references
        .iter()
        .flatten()
        .enumerate()
    {
        out.push(secret_target(
            format!("managedKubeSecretReferences[{i}]"),
            r,
        )?);
    }
    for (i, r) in spec
        .managed_kube_config_map_references
        .iter()
        .flatten()
        .enumerate()
    {
        let field = format!("managedKubeConfigMapReferences[{i}]");
        let namespace = namespace_of(
            ns,
            r.config_map_namespace.as_deref(),
            &format!("{field}.configMapNamespace"),
            allow_cross,
        )?;
        out.push(Target {
            kind: TargetKind::ConfigMap,
            namespace,
            name: r.config_map_name.clone(),
            secret_type: None,
            creation_policy: r.creation_policy,
            template: r.template.clone(),
            field,
        });
    }
    if out.is_empty() {
        return Err(SyncError::Spec(
            "no target: set managedKubeSecretReferences or managedKubeConfigMapReferences"
                .to_owned(),
        ));
    }
    for t in &out {
        let (name_field, namespace_field) = match t.kind {
            TargetKind::Secret => ("secretName", "secretNamespace"),
            TargetKind::ConfigMap => ("configMapName", "configMapNamespace"),
        };
        if !valid_object_name(&t.name) {
            return Err(SyncError::Spec(format!(
                "{}.{name_field}: {:?} is not a valid {} name (lower-case letters, digits, '-' and '.', \
                 starting and ending with a letter or digit, at most 253 characters); nothing was written",
                t.field,
                t.name,
                t.kind.as_str()
            )));
        }
        if !valid_namespace_name(&t.namespace) {
            return Err(SyncError::Spec(format!(
                "{}.{namespace_field}: {:?} is not a valid namespace name; nothing was written",
                t.field, t.namespace
            )));
        }
        if t.creation_policy == CreationPolicy::Owner && t.namespace != ns {
            return Err(SyncError::Spec(format!(
                "{}.creationPolicy: Owner needs the target in the resource's namespace {ns} (it is in {})",
                t.field, t.namespace
            )));
        }
    }
    let mut ids: Vec<String> = out.iter().map(Target::id).collect();
    ids.sort();
    if let Some(dup) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(SyncError::Spec(format!("{} is listed twice", dup[0])));
    }
    Ok(out)
}

/// The authentication a spec selects, with the scope it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct AuthChoice {
    /// How to log in.
    pub method: AuthMethod,
    /// What to read.
    pub scope: Scope,
}

/// Resolve a machine-identity scope.
fn machine_scope(s: &MachineIdentityScope) -> Result<Scope, SyncError> {
    let project = match (
        s.project_slug.as_deref().filter(|v| !v.is_empty()),
        s.project_id.as_deref().filter(|v| !v.is_empty()),
    ) {
        (Some(slug), None) => ProjectRef::Slug(slug.to_owned()),
        (None, Some(id)) => ProjectRef::Id(id.to_owned()),
        _ => {
            return Err(SyncError::Spec(
                "secretsScope: exactly one of projectSlug and projectId must be set".to_owned(),
            ));
        }
    };
    let secret_name = s.secret_name.clone().filter(|n| !n.is_empty());
    let recursive = s.recursive.unwrap_or(false);
    if secret_name.is_some() && recursive {
        return Err(SyncError::Spec(
            "secretsScope: secretName cannot be combined with recursive: true".to_owned(),
        ));
    }
    Ok(Scope {
        project,
        environment: s.env_slug.clone(),
        path: normalize_path(&s.secrets_path),
        recursive,
        secret_name,
    })
}

/// Pick the single authentication method of a KmsSecret (the schema
/// guarantees there is exactly one) and the scope it reads.
pub fn auth_choice(
    spec: &KmsSecretSpec,
    ns: &str,
    allow_cross: bool,
) -> Result<AuthChoice, SyncError> {
    let service_token =
        |r: &KubeSecretReference, field: &str, path: &str, env: &str, recursive: bool| {
            let sns = namespace_of(ns, r.secret_namespace.as_deref(), field, allow_cross)?;
            Ok::<_, SyncError>(AuthChoice {
                method: AuthMethod::ServiceToken {
                    secret: (sns, r.secret_name.clone()),
                },
                scope: Scope {
                    project: ProjectRef::OfServiceToken,
                    environment: env.to_owned(),
                    path: normalize_path(path),
                    recursive,
                    secret_name: None,
                },
            })
        };
    let Some(auth) = &spec.authentication else {
        return match &spec.token_secret_reference {
            // The legacy top-level reference has no scope of its own: the
            // token's scope applies (the KMS uses it for single-scope tokens).
            Some(r) => service_token(r, "tokenSecretReference", "/", "", false),
            None => Err(SyncError::Spec(
                "no authentication method is set".to_owned(),
            )),
        };
    };
    let no_method = || SyncError::Spec("no authentication method is set".to_owned());
    match auth.method().ok_or_else(no_method)? {
        KmsSecretMethod::ServiceToken(st) => {
            let s = &st.secrets_scope;
            service_token(
                &st.service_token_secret_reference,
                "authentication.serviceToken.serviceTokenSecretReference",
                &s.secrets_path,
                &s.env_slug,
                s.recursive.unwrap_or(false),
            )
        }
        KmsSecretMethod::ServiceAccount(_) => Ok(AuthChoice {
            method: AuthMethod::Unsupported(
                "serviceAccount (legacy service accounts are not offered by the KMS API any more; use universalAuth or kubernetesAuth)",
            ),
            scope: Scope {
                project: ProjectRef::OfServiceToken,
                environment: String::new(),
                path: "/".to_owned(),
                recursive: false,
                secret_name: None,
            },
        }),
        KmsSecretMethod::Machine(method, scope) => Ok(AuthChoice {
            method: machine_method(method, ns, allow_cross)?,
            scope: machine_scope(scope)?,
        }),
    }
}

/// Whether a spec asks for instant updates (`syncConfig` if present, else
/// the deprecated top-level field).
pub fn instant_updates(spec: &KmsSecretSpec) -> bool {
    match &spec.sync_config {
        Some(sc) => sc.instant_updates.unwrap_or(false),
        None => spec.instant_updates.unwrap_or(false),
    }
}

/// The resync interval of a spec: `syncConfig` if present, else the
/// deprecated top-level fields; defaults of 1 minute (1 hour with instant
/// updates); at least 5 seconds.
pub fn resync_interval(spec: &KmsSecretSpec) -> Result<Duration, SyncError> {
    let interval = match &spec.sync_config {
        Some(sc) => parse_optional_duration(sc.resync_interval.as_deref())
            .map_err(|e| SyncError::Spec(format!("syncConfig.resyncInterval: {e}")))?,
        None => spec
            .resync_interval
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s.unsigned_abs())),
    };
    let instant = instant_updates(spec);
    let default = if instant {
        DEFAULT_RESYNC_INSTANT
    } else {
        DEFAULT_RESYNC
    };
    match interval {
        None => Ok(default),
        Some(d) if d < MIN_RESYNC => Err(SyncError::Spec(format!(
            "resyncInterval must be at least {}s",
            MIN_RESYNC.as_secs()
        ))),
        Some(d) => Ok(d),
    }
}

/// What a sync asks of the KMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing: not due, every target intact. The targets' own data is
    /// planned again (labels and annotations of the resource may have
    /// changed), without a KMS call.
    NotDue,
    /// A conditional fetch (`If-None-Match` with the last ETag): due by
    /// time, by an event, or by starting to listen for events.
    Conditional,
    /// A full fetch: nothing is known of the last sync, the spec changed
    /// since, or a target is not intact.
    Full,
}

/// Decide what a sync asks of the KMS (pure). `record` is what is known of
/// the last sync, `all_intact` whether every target is ours with its data
/// as written, `nudged` whether an event arrived or the resource just
/// started listening (it may have missed events).
pub fn decide(
    record: Option<&SyncRecord>,
    generation: i64,
    all_intact: bool,
    nudged: bool,
    now: SystemTime,
) -> Decision {
    match record {
        Some(r) if all_intact && r.generation == generation => {
            if nudged || now >= r.next_due {
                Decision::Conditional
            } else {
                Decision::NotDue
            }
        }
        _ => Decision::Full,
    }
}

/// Where in its schedule a resource's folder falls (pure): a number in
/// `[0, 1)` from a stable hash of the namespace, the KMS host and the
/// authentication block (the identity and the folder it reads). The
/// resources of one namespace reading one folder with one identity have the
/// same phase, so [`on_grid`] makes them due at the same moment, and they
/// share one request; different folders are spread evenly.
pub fn phase_of(cr: &KmsSecret) -> f64 {
    let auth = serde_json::to_vec(&cr.spec.authentication).unwrap_or_default();
    let key = [
        cr.namespace().unwrap_or_default().as_bytes(),
        b"\0",
        cr.spec.host_api.as_deref().unwrap_or_default().as_bytes(),
        b"\0",
        &auth,
    ]
    .concat();
    (shard::hash64(&key) >> 11) as f64 / (1u64 << 53) as f64
}

/// The next check after one at `from` (pure): the first point at least 0.9
/// × `interval` later on a grid of points a fifth of the interval apart,
/// offset by `phase` (see [`phase_of`]). So it comes 0.9–1.1 intervals
/// after `from`, the ±10 % of [`jittered`](crate::controllers::queue::jittered); resources of one folder
/// checked within a tenth of an interval of each other come due together
/// (and share one request); and a resource checked on the grid stays on
/// it, one interval apart.
pub fn on_grid(from: SystemTime, interval: Duration, phase: f64) -> SystemTime {
    let step = interval.as_nanos() / 5;
    if step == 0 {
        return from + interval;
    }
    let earliest = from + interval.mul_f64(JITTER_LOW);
    let e = earliest
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let offset = ((phase.clamp(0.0, 1.0) * step as f64) as u128).min(step - 1);
    let mut t = e - e % step + offset;
    if t < e {
        t += step;
    }
    SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(t).unwrap_or(u64::MAX))
}

/// When the KMS was last checked and when the next check is due, after a
/// sync that decided `decision` at `now` (pure). `polling`: instant
/// updates are asked for but their stream is not open, so the resource
/// polls at least as often as without them. `phase` is the folder's place
/// in the schedule ([`phase_of`], [`on_grid`]).
pub fn next_times(
    decision: Decision,
    record: Option<&SyncRecord>,
    interval: Duration,
    polling: bool,
    now: SystemTime,
    phase: f64,
) -> (Option<SystemTime>, SystemTime) {
    let (last_sync, mut next_due) = match (decision, record) {
        (Decision::NotDue, Some(rec)) => (Some(rec.last_sync), rec.next_due),
        (Decision::NotDue, None) => (None, now + interval),
        _ => (Some(now), on_grid(now, interval, phase)),
    };
    if polling {
        next_due = next_due.min(last_sync.unwrap_or(now) + interval.min(DEFAULT_RESYNC));
    }
    (last_sync, next_due)
}

/// Whether a check made for a reason other than the schedule (the
/// resource started listening, its stream opened, its endpoint changed)
/// was due by the schedule anyway, so that it counts as the scheduled
/// resync (pure). With the stream `open`, the schedule is the interval's: a
/// due time set while the stream was still opening (polling) does not
/// count.
pub fn check_was_due(record: &SyncRecord, interval: Duration, open: bool, now: SystemTime) -> bool {
    let due = if open {
        record.next_due.max(earliest_resync(record, interval))
    } else {
        record.next_due
    };
    now >= due
}

/// The soonest the interval's schedule can make a resync due after the
/// last sync of `record` (the low end of the jitter).
fn earliest_resync(record: &SyncRecord, interval: Duration) -> SystemTime {
    record.last_sync + interval.mul_f64(JITTER_LOW)
}

/// The last sync and next due time after a check that found every target
/// in step and was not due (pure): the last sync stands; so does the due
/// time, except that one set while the stream was opening (sooner than the
/// interval allows) gives way to the interval once the stream is `open`,
/// and while `polling` the next poll comes no sooner than a poll interval
/// from now (the check was one).
pub fn times_after_check(
    record: &SyncRecord,
    interval: Duration,
    open: bool,
    polling: bool,
    now: SystemTime,
    phase: f64,
) -> (SystemTime, SystemTime) {
    let mut due = record.next_due;
    if open && due < earliest_resync(record, interval) {
        due = on_grid(record.last_sync, interval, phase);
    }
    if polling {
        let poll = interval.min(DEFAULT_RESYNC);
        due = due
            .min(record.last_sync + poll)
            .max(on_grid(now, poll, phase));
    }
    (record.last_sync, due)
}

/// What a sync decided to ask of the KMS, and from what.
pub(super) struct Asked {
    pub(super) decision: Decision,
    /// A sync asked for by hand (`force-sync`): full, with a fresh answer.
    pub(super) forced: bool,
    /// What was synced last (the cache, else the status).
    pub(super) record: Option<SyncRecord>,
    /// An instant-update event (or its stream's opening) made it due.
    pub(super) nudged: Option<Nudge>,
    pub(super) key: ObjectKey,
    /// Instant updates are on.
    pub(super) instant: bool,
    /// The global configuration's change count when decided.
    pub(super) epoch: u64,
    pub(super) generation: i64,
    pub(super) now: SystemTime,
}

impl Asked {
    /// When the targets were last brought in step, and when the next check
    /// is due. A check made only because the resource started listening
    /// (after a restart or a hand-over), its stream opened, or its endpoint
    /// changed, that found every target in step (nothing `wrote`), is not a
    /// sync: the status keeps when the targets were last brought in step
    /// (no status write for it), and the scheduled check stays due when it
    /// was.
    pub(super) fn times(
        &self,
        interval: Duration,
        stream: Option<&StreamState>,
        wrote: bool,
        phase: f64,
    ) -> (Option<SystemTime>, SystemTime) {
        let polling = stream.is_some_and(|s| *s != StreamState::Open);
        let open = stream == Some(&StreamState::Open);
        match &self.record {
            Some(r)
                if self.decision == Decision::Conditional
                    && self.nudged != Some(Nudge::Event)
                    && !wrote
                    && !check_was_due(r, interval, open, self.now) =>
            {
                let (last, due) = times_after_check(r, interval, open, polling, self.now, phase);
                (Some(last), due)
            }
            _ => next_times(
                self.decision,
                self.record.as_ref(),
                interval,
                polling,
                self.now,
                phase,
            ),
        }
    }
}

/// Whether `owner` (an owner id) is a live KmsSecret that still lists the
/// target; `found` is that KmsSecret as [`named_owner`] found it.
pub fn owner_lists(allow_cross: bool, owner: &str, found: Option<&KmsSecret>, t: &Target) -> bool {
    let Some(owner) = OwnerId::parse(owner).filter(|o| o.kind == "KmsSecret") else {
        // Another kind (a dynamic secret) or a foreign marker: treat as live.
        return true;
    };
    let Some(other) = found.filter(|o| {
        o.namespace().as_deref() == Some(owner.namespace) && o.name_any() == owner.name
    }) else {
        return false;
    };
    if other.metadata.deletion_timestamp.is_some() {
        return false;
    }
    targets(other, allow_cross)
        .map(|ts| {
            ts.iter()
                .any(|o| o.kind == t.kind && o.namespace == t.namespace && o.name == t.name)
        })
        .unwrap_or(false)
}

/// What every target should be: the data rendered from the fetched
/// secrets, or (not fetched) its own current data; with the resource's
/// labels and annotations, the owner marker and the data's version.
pub fn desired_targets(
    owner_ref: Option<&OwnerReference>,
    cr: &KmsSecret,
    me: &str,
    targets: &[Target],
    observed: &[(Option<Observed>, Claim)],
    rendered: Option<&[BTreeMap<String, Vec<u8>>]>,
) -> Vec<Desired> {
    let mut desired_all = Vec::with_capacity(targets.len());
    for (i, (t, (o, c))) in targets.iter().zip(observed).enumerate() {
        let data: BTreeMap<String, Vec<u8>> = match rendered.and_then(|r| r.get(i)) {
            Some(data) => data.clone(),
            None => o.as_ref().map(|o| o.data.clone()).unwrap_or_default(),
        };
        let version = version_of(&data);
        let created_by_us = *c == Claim::Missing
            || o.as_ref().is_some_and(|o| {
                o.labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE)
                    && o.annotations.get(OWNER_ANNOTATION).map(String::as_str) == Some(me)
            });
        let template_meta = t.template.as_ref().and_then(|tpl| tpl.metadata.as_ref());
        let mut meta = desired_meta(
            cr.labels(),
            cr.annotations(),
            template_meta,
            me,
            &version,
            created_by_us,
        );
        // Taken over from a Go operator without a data change: its version
        // stays known, so that workloads it stamped do not roll.
        meta.annotations.remove(GO_VERSIONS_ANNOTATION);
        if let Some(go) = go_versions(o.as_ref(), &data, &version) {
            meta.annotations
                .insert(GO_VERSIONS_ANNOTATION.to_owned(), go);
        }
        desired_all.push(Desired {
            kind: t.kind,
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            data,
            meta,
            owner_reference: (t.creation_policy == CreationPolicy::Owner)
                .then(|| owner_ref.cloned())
                .flatten(),
            secret_type: t.secret_type.clone(),
        });
    }
    desired_all
}

/// How a scope is named in messages: project, environment, folder.
pub fn describe_scope(scope: &crate::kms::Scope) -> String {
    let project = project_of(scope);
    let folder = if scope.recursive {
        format!("folder {} and its sub-folders", scope.path)
    } else {
        format!("folder {}", scope.path)
    };
    match &scope.secret_name {
        Some(name) => format!(
            "secret {name} in {project}, environment {}, {folder}",
            scope.environment
        ),
        None => format!("{project}, environment {}, {folder}", scope.environment),
    }
}

/// What a missing scope leaves alone.
pub const KEPT: &str = "the targets keep their data and none was created";

/// The project as messages name it.
pub fn project_of(scope: &crate::kms::Scope) -> String {
    scope.project.describe()
}

/// The error for a scope whose environment does not exist (names the field
/// to fix).
pub fn missing_environment(scope: &crate::kms::Scope) -> SyncError {
    SyncError::Folder {
        reason: "EnvironmentNotFound",
        message: format!(
            "environment {} does not exist ({}); check secretsScope.envSlug against the project's \
             environments; {KEPT}",
            scope.environment,
            describe_scope(scope)
        ),
        transient: false,
    }
}

/// The error for a scope whose folder does not exist (names the field to
/// fix).
pub fn missing_folder(scope: &crate::kms::Scope) -> SyncError {
    SyncError::Folder {
        reason: "FolderNotFound",
        message: format!(
            "folder {} does not exist in environment {} ({}); check secretsScope.secretsPath; {KEPT}",
            scope.path,
            scope.environment,
            describe_scope(scope)
        ),
        transient: false,
    }
}

/// What the observe stage saw of one resource: what it decides from.
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    pub(super) cr: &'a KmsSecret,
    pub(super) interval: Duration,
    pub(super) shard: u32,
    pub(super) targets: &'a [Target],
    /// Each target as it is now, and who may write it.
    pub(super) observed: &'a [(Option<Observed>, Claim)],
}

/// What a sync plans its targets from.
pub(super) struct Planned<'a> {
    pub(super) cr: &'a KmsSecret,
    pub(super) me: &'a str,
    pub(super) targets: &'a [Target],
    /// Each target's data rendered from the fetched secrets (not fetched:
    /// none, the targets keep their data).
    pub(super) rendered: Option<&'a [BTreeMap<String, Vec<u8>>]>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::controllers::target::{Renderer, build_data};
    use crate::kms::SecretMap;
    use kms_template::{Budget, SecretData};

    fn record(generation: i64, next_due: SystemTime) -> SyncRecord {
        SyncRecord {
            generation,
            etag: Some("e".into()),
            last_sync: next_due - Duration::from_secs(60),
            next_due,
            synced_keys: 1,
            target_hashes: BTreeMap::new(),
        }
    }

    #[test]
    fn a_sync_fetches_only_what_it_must() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let later = now + Duration::from_secs(30);
        let known = record(3, later);
        // Nothing known, or the spec changed, or a target was touched: all.
        assert_eq!(decide(None, 3, true, false, now), Decision::Full);
        assert_eq!(decide(Some(&known), 4, true, false, now), Decision::Full);
        assert_eq!(decide(Some(&known), 3, false, false, now), Decision::Full);
        // Known and intact: nothing until due, an event, or a new listener.
        assert_eq!(decide(Some(&known), 3, true, false, now), Decision::NotDue);
        assert_eq!(
            decide(Some(&known), 3, true, true, now),
            Decision::Conditional
        );
        assert_eq!(
            decide(Some(&known), 3, true, false, later),
            Decision::Conditional
        );
    }

    #[test]
    fn the_next_check_follows_the_decision() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        let known = record(3, now + Duration::from_secs(600));
        // Not due: the record's times stand.
        assert_eq!(
            next_times(Decision::NotDue, Some(&known), hour, false, now, 0.5),
            (Some(known.last_sync), known.next_due)
        );
        // Checked now: the interval from now, on the folder's grid.
        assert_eq!(
            next_times(Decision::Conditional, Some(&known), hour, false, now, 0.5),
            (Some(now), on_grid(now, hour, 0.5))
        );
        assert_eq!(
            next_times(Decision::Full, None, hour, false, now, 0.0),
            (Some(now), on_grid(now, hour, 0.0))
        );
        // Instant updates without an open stream: polled at the default.
        assert_eq!(
            next_times(Decision::Full, None, hour, true, now, 0.5),
            (Some(now), now + DEFAULT_RESYNC)
        );
        assert_eq!(
            next_times(Decision::NotDue, Some(&known), hour, true, now, 0.5),
            (Some(known.last_sync), known.last_sync + DEFAULT_RESYNC)
        );
    }

    #[test]
    fn a_check_off_schedule_counts_as_a_resync_only_when_one_was_due() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        let minute = Duration::from_secs(60);
        // Synced 5 minutes ago while the stream was opening: polled at the
        // default (due 4 minutes ago).
        let mut polled = record(3, now - 4 * minute);
        polled.last_sync = now - 5 * minute;
        // Stream open: the interval's schedule, not the polling one.
        assert!(!check_was_due(&polled, hour, true, now));
        assert!(check_was_due(&polled, hour, false, now));
        assert!(check_was_due(&polled, hour, true, now + hour));
        // Its times: the last sync stands, the due time moves to the interval.
        let (last, due) = times_after_check(&polled, hour, true, false, now, 0.5);
        assert_eq!(last, polled.last_sync);
        assert_eq!(due, on_grid(polled.last_sync, hour, 0.5));
        // A due time already on the interval's schedule stays.
        let mut scheduled = record(3, now + 30 * minute);
        scheduled.last_sync = now - 30 * minute;
        assert_eq!(
            times_after_check(&scheduled, hour, true, false, now, 0.9),
            (scheduled.last_sync, scheduled.next_due)
        );
        // Still polling (the stream not open): the next poll a poll
        // interval from now at the soonest, not in the past.
        let (_, due) = times_after_check(&polled, hour, false, true, now, 0.5);
        assert_eq!(due, on_grid(now, DEFAULT_RESYNC, 0.5));
        let mut recent = record(3, now + 50 * minute);
        recent.last_sync = now - Duration::from_secs(10);
        let (_, due) = times_after_check(&recent, hour, false, true, now, 0.5);
        assert_eq!(due, on_grid(now, DEFAULT_RESYNC, 0.5));
    }

    #[test]
    fn a_folders_resources_come_due_together_and_folders_spread() {
        let minute = Duration::from_secs(60);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        for phase in [0.0, 0.3, 0.999] {
            for offset in 0..120 {
                let from = t0 + Duration::from_millis(offset * 517);
                let due = on_grid(from, minute, phase);
                // The ±10 % of the interval, as before.
                let after = due.duration_since(from).unwrap();
                assert!(after >= minute.mul_f64(0.9), "{after:?}");
                assert!(after < minute.mul_f64(1.1), "{after:?}");
                // On the grid, it stays there: one interval apart.
                assert_eq!(on_grid(due, minute, phase), due + minute);
            }
        }
        // Resources of one folder synced a few seconds apart (their
        // shared answer reached them one after the other): one due time.
        let due = on_grid(t0, minute, 0.4);
        for late in [1, 3, 5] {
            assert_eq!(
                on_grid(due + Duration::from_secs(late), minute, 0.4),
                due + minute
            );
        }
        // Different folders fall at different moments.
        let cr = |ns: &str, path: &str| -> KmsSecret {
            let mut cr: KmsSecret = serde_json::from_value(serde_json::json!({
                "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
                "metadata": {"name": "a", "namespace": ns},
                "spec": {
                    "authentication": {"universalAuth": {
                        "credentialsRef": {"secretName": "creds"},
                        "secretsScope": {"projectSlug": "p", "envSlug": "dev", "secretsPath": path}
                    }},
                    "managedKubeSecretReferences": [{"secretName": "out"}]
                }
            }))
            .unwrap();
            cr.metadata.name = Some(format!("{ns}{path}"));
            cr
        };
        assert_eq!(phase_of(&cr("a", "/x")), phase_of(&cr("a", "/x")));
        let phases: Vec<f64> = (0..200)
            .map(|i| phase_of(&cr(&format!("ns{i}"), "/x")))
            .collect();
        assert!(phases.iter().all(|p| (0.0..1.0).contains(p)));
        let low = phases.iter().filter(|p| **p < 0.5).count();
        assert!((70..=130).contains(&low), "{low} of 200 below one half");
        assert_ne!(phase_of(&cr("a", "/x")), phase_of(&cr("a", "/y")));
    }

    use crate::kms::SecretItem;
    use secrecy::SecretString;

    /// A renderer that reads a template as the name of a secret and writes
    /// its value in capitals.
    fn upper() -> Box<Renderer> {
        Box::new(
            |_: &str, source: &str, data: &SecretData, _: bool, _: &mut Budget| {
                data.get(source)
                    .map(|e| {
                        String::from_utf8_lossy(&e.value)
                            .to_uppercase()
                            .into_bytes()
                    })
                    .ok_or_else(|| format!("undefined {source}"))
            },
        )
    }

    fn text(m: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, String> {
        m.into_iter()
            .map(|(k, v)| (k, String::from_utf8(v).unwrap()))
            .collect()
    }

    fn cr(spec: serde_json::Value) -> KmsSecret {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": "x", "namespace": "ns", "uid": "u1"},
            "spec": spec
        }))
        .unwrap()
    }

    fn budget() -> kms_template::Budget {
        kms_template::Budget::new(1_000_000)
    }

    fn secrets() -> SecretMap {
        [("A", "a1"), ("B", "b1")]
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_owned(),
                    SecretItem {
                        key: k.to_owned(),
                        value: SecretString::from(v.to_owned()),
                        secret_path: "/".into(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn targets_fold_the_legacy_reference_and_check_namespaces() {
        let c = cr(serde_json::json!({
            "managedSecretReference": {"secretName": "legacy"},
            "managedKubeConfigMapReferences": [{"configMapName": "cm", "creationPolicy": "Owner"}]
        }));
        let t = targets(&c, false).unwrap();
        assert_eq!(
            t.iter().map(Target::id).collect::<Vec<_>>(),
            vec!["Secret/ns/legacy", "ConfigMap/ns/cm"]
        );
        assert_eq!(t[0].secret_type.as_deref(), Some("Opaque"));

        let cross = cr(
            serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s", "secretNamespace": "other"}]}),
        );
        let err = targets(&cross, false).unwrap_err().to_string();
        assert!(
            err.contains(
                "managedKubeSecretReferences[0].secretNamespace points to namespace other"
            ),
            "{err}"
        );
        assert_eq!(targets(&cross, true).unwrap()[0].namespace, "other");

        let owner_cross = cr(
            serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s", "secretNamespace": "other", "creationPolicy": "Owner"}]}),
        );
        assert!(
            targets(&owner_cross, true)
                .unwrap_err()
                .to_string()
                .contains("creationPolicy: Owner")
        );

        let dup = cr(
            serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s"}, {"secretName": "s", "secretNamespace": "ns"}]}),
        );
        assert!(
            targets(&dup, false)
                .unwrap_err()
                .to_string()
                .contains("listed twice")
        );
    }

    #[test]
    fn intervals() {
        let s = |v: serde_json::Value| cr(v).spec;
        assert_eq!(
            resync_interval(&s(serde_json::json!({}))).unwrap(),
            DEFAULT_RESYNC
        );
        assert_eq!(
            resync_interval(&s(
                serde_json::json!({"syncConfig": {"resyncInterval": "1h30m"}})
            ))
            .unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            resync_interval(&s(
                serde_json::json!({"syncConfig": {"instantUpdates": true}})
            ))
            .unwrap(),
            DEFAULT_RESYNC_INSTANT
        );
        // Deprecated top-level fields apply only without syncConfig.
        assert_eq!(
            resync_interval(&s(serde_json::json!({"resyncInterval": 10}))).unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(
            resync_interval(&s(
                serde_json::json!({"resyncInterval": 10, "syncConfig": {}})
            ))
            .unwrap(),
            DEFAULT_RESYNC
        );
        assert!(
            resync_interval(&s(
                serde_json::json!({"syncConfig": {"resyncInterval": "3s"}})
            ))
            .is_err()
        );
        for _ in 0..100 {
            let j = crate::controllers::queue::jittered(Duration::from_secs(100), fastrand::f64());
            assert!(j >= Duration::from_secs(90) && j <= Duration::from_secs(110));
        }
    }

    #[test]
    fn auth_and_scope() {
        let c = cr(serde_json::json!({"authentication": {"universalAuth": {
            "credentialsRef": {"secretName": "creds"},
            "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "backend/", "recursive": true}
        }}}));
        let choice = auth_choice(&c.spec, "ns", false).unwrap();
        assert_eq!(
            choice.method,
            AuthMethod::Universal {
                credentials: ("ns".to_owned(), "creds".to_owned())
            }
        );
        assert_eq!(choice.scope.path, "/backend");
        assert!(choice.scope.recursive);
        assert_eq!(choice.scope.project, ProjectRef::Slug("demo".into()));
        let k = cr(serde_json::json!({"authentication": {"ldapAuth": {
            "identityId": "i", "credentialsRef": {"secretName": "c"},
            "secretsScope": {"projectId": "p", "envSlug": "dev", "secretsPath": "/"}
        }}}));
        let ldap = auth_choice(&k.spec, "ns", false).unwrap();
        assert_eq!(
            ldap.method,
            AuthMethod::Ldap {
                identity_id: "i".into(),
                credentials: ("ns".into(), "c".into())
            }
        );
        assert_eq!(ldap.scope.project, ProjectRef::Id("p".into()));
        // Kubernetes auth: the ServiceAccount follows the namespace rule.
        let kube = cr(serde_json::json!({"authentication": {"kubernetesAuth": {
            "identityId": "i", "serviceAccountRef": {"name": "sa", "namespace": "other"},
            "autoCreateServiceAccountToken": true, "serviceAccountTokenAudiences": ["kms"],
            "secretsScope": {"projectSlug": "p", "envSlug": "dev", "secretsPath": "/"}
        }}}));
        let err = auth_choice(&kube.spec, "ns", false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("serviceAccountRef points to namespace other"),
            "{err}"
        );
        assert_eq!(
            auth_choice(&kube.spec, "ns", true).unwrap().method,
            AuthMethod::Kubernetes {
                identity_id: "i".into(),
                service_account: ("other".into(), "sa".into()),
                auto_token: true,
                audiences: vec!["kms".into()]
            }
        );
        // Service tokens, new and legacy: the project comes from the token.
        let st = cr(serde_json::json!({"authentication": {"serviceToken": {
            "serviceTokenSecretReference": {"secretName": "tok"},
            "secretsScope": {"envSlug": "dev", "secretsPath": "/app"}
        }}}));
        let c = auth_choice(&st.spec, "ns", false).unwrap();
        assert_eq!(c.scope.project, ProjectRef::OfServiceToken);
        assert_eq!(c.scope.path, "/app");
        let legacy = cr(serde_json::json!({"tokenSecretReference": {"secretName": "tok"}}));
        assert_eq!(
            auth_choice(&legacy.spec, "ns", false).unwrap().method,
            AuthMethod::ServiceToken {
                secret: ("ns".into(), "tok".into())
            }
        );
    }

    #[test]
    fn data_without_template_is_everything() {
        let c = cr(serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s"}]}));
        let t = &targets(&c, false).unwrap()[0];
        let d = text(build_data(t, &secrets(), &*upper(), &mut budget()).unwrap());
        assert_eq!(
            d,
            [
                ("A".to_owned(), "a1".to_owned()),
                ("B".to_owned(), "b1".to_owned())
            ]
            .into()
        );
    }

    #[test]
    fn template_entries_override_or_replace() {
        let c = cr(serde_json::json!({"managedKubeSecretReferences": [
            {"secretName": "only", "template": {"data": {"X": "A"}}},
            {"secretName": "all", "template": {"includeAllSecrets": true, "data": {"A": "B"}}}
        ]}));
        let t = targets(&c, false).unwrap();
        assert_eq!(
            text(build_data(&t[0], &secrets(), &*upper(), &mut budget()).unwrap()),
            [("X".to_owned(), "A1".to_owned())].into()
        );
        let all = text(build_data(&t[1], &secrets(), &*upper(), &mut budget()).unwrap());
        assert_eq!(all["A"], "B1");
        assert_eq!(all["B"], "b1");
    }

    #[test]
    fn template_errors_name_the_field() {
        let c = cr(
            serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s", "template": {"data": {"X": "MISSING"}}}]}),
        );
        let t = &targets(&c, false).unwrap()[0];
        let named = |field: &str, _: &str, _: &SecretData, _: bool, _: &mut Budget| {
            Err(format!("{field}: undefined"))
        };
        let err = build_data(t, &secrets(), &named, &mut budget())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "managedKubeSecretReferences[0].template.data.X: undefined"
        );
    }

    #[test]
    fn invalid_keys_are_reported_by_name() {
        let c = cr(serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s"}]}));
        let t = &targets(&c, false).unwrap()[0];
        let mut s = secrets();
        s.insert(
            "BAD KEY".into(),
            SecretItem {
                key: "BAD KEY".into(),
                value: SecretString::from("v".to_owned()),
                secret_path: "/".into(),
            },
        );
        let err = build_data(t, &s, &*upper(), &mut budget()).unwrap_err();
        assert_eq!(err.reason(), "InvalidSecretKey");
        let err = err.to_string();
        assert!(
            err.contains("the KMS secret \"BAD KEY\" (folder /) cannot be a key of Secret/"),
            "{err}"
        );
        assert!(!err.contains("v\""));

        // A key of template.data (the spec's own) names its field.
        let c = cr(
            serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s",
            "template": {"includeAllSecrets": false, "data": {"bad key": "A"}}}]}),
        );
        let t = &targets(&c, false).unwrap()[0];
        let err = build_data(t, &secrets(), &*upper(), &mut budget()).unwrap_err();
        assert_eq!(err.reason(), "InvalidSpec");
        assert!(
            err.to_string()
                .starts_with("managedKubeSecretReferences[0].template.data: the key \"bad key\""),
            "{err}"
        );
    }

    #[test]
    fn invalid_target_names_are_caught_before_any_write() {
        let c = cr(
            serde_json::json!({"managedKubeSecretReferences": [{"secretName": "s"}, {"secretName": "My_Secret"}]}),
        );
        let err = targets(&c, false).unwrap_err().to_string();
        assert!(
            err.starts_with("managedKubeSecretReferences[1].secretName: \"My_Secret\" is not a valid Secret name"),
            "{err}"
        );
        let c = cr(
            serde_json::json!({"managedKubeConfigMapReferences": [{"configMapName": "cfg.", "configMapNamespace": "x"}]}),
        );
        let err = targets(&c, true).unwrap_err().to_string();
        assert!(err.contains("configMapName: \"cfg.\""), "{err}");
    }
}
