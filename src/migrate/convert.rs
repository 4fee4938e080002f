//! The field mappings of `kms-operator migrate`: one Go-operator document in,
//! one of ours out, with a finding for every field that was folded, dropped,
//! changed in meaning or could not be carried. Pure functions over
//! `serde_json::Value`; the result is checked by deserialising it into our
//! typed resources before it is printed, so what we print is what our CRDs
//! accept.
//!
//! The Go schemas walked here are those of the Go operators' CRDs (and of
//! their `secrets.lux.network` variant). A field the walk does not know was
//! not in the Go operator's schema either: its API server pruned it, so it had
//! no effect, and it is reported as dropped.

use serde_json::{Map, Value, json};

use kms_operator::api::common::MethodName;
use kms_operator::api::{ClusterGenerator, KmsDynamicSecret, KmsPushSecret, KmsSecret};

/// Our API group and version.
const OUR_API_VERSION: &str = "secrets.hanzo.ai/v1alpha1";
/// The API groups of the Go operators.
const GO_GROUPS: [&str; 4] = [
    "secrets.infisical.com",
    "secrets.hanzo.ai",
    "kms.hanzo.ai",
    "secrets.lux.network",
];
/// What a cross-namespace reference needs, as the report says it.
const CROSS_NAMESPACE_SETTING: &str = "the operator must run with --allow-cross-namespace-refs (chart value security.allowCrossNamespaceReferences: true)";

/// How a finding affects the migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// A deprecated field was folded into its replacement; same behaviour.
    Folded,
    /// A field was left out because it had no effect in the Go operator
    /// (pruned by its API server, ignored by its controller).
    Dropped,
    /// Carried, but behaviour differs in a way worth knowing.
    Note,
    /// A reference into another namespace: carried, but needs
    /// `--allow-cross-namespace-refs`.
    CrossNamespace,
    /// Carried, but needs an operator setting (named in the message).
    NeedsSetting,
    /// Something with an effect that could not be carried over.
    NotCarried,
}

impl Severity {
    /// The word the report uses.
    pub fn label(self) -> &'static str {
        match self {
            Self::Folded => "folded",
            Self::Dropped => "dropped",
            Self::Note => "note",
            Self::CrossNamespace => "cross-namespace",
            Self::NeedsSetting => "needs setting",
            Self::NotCarried => "not carried",
        }
    }
}

/// One line of the report about one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// How it affects the migration.
    pub severity: Severity,
    /// The field of the original document (`spec.resyncInterval`), or empty
    /// for the whole document.
    pub field: String,
    /// What happened and why.
    pub message: String,
}

/// Remove what the API server added to an object's metadata (`uid`,
/// `resourceVersion`, `managedFields`, …), for objects printed rather than
/// converted.
pub fn strip_server_fields(v: &mut Value) {
    if let Some(Value::Object(m)) = v.get_mut("metadata") {
        for key in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "managedFields",
            "selfLink",
        ] {
            m.remove(key);
        }
    }
}

/// What a document is, by its `apiVersion` and `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// `InfisicalSecret` / `KMSSecret`.
    Sync,
    /// `InfisicalPushSecret` / `KMSPushSecret`.
    Push,
    /// `InfisicalDynamicSecret` / `KMSDynamicSecret`.
    Dynamic,
    /// A Go operator's `ClusterGenerator` in a group other than ours.
    Generator,
    /// `Password` / `UUID`: registered by the Go operators, no controller.
    NoController,
    /// A Go-operator kind with no counterpart here (Infisical v1beta1).
    Unsupported,
    /// Already one of ours.
    Ours,
    /// Anything else: passed through.
    Other,
}

/// Classify a document.
pub fn classify(api_version: &str, kind: &str) -> Class {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    if group == "secrets.hanzo.ai"
        && matches!(
            kind,
            "KmsSecret" | "KmsPushSecret" | "KmsDynamicSecret" | "ClusterGenerator"
        )
    {
        return Class::Ours;
    }
    if !GO_GROUPS.contains(&group) {
        return Class::Other;
    }
    match kind {
        "InfisicalSecret" | "KMSSecret" => Class::Sync,
        "InfisicalPushSecret" | "KMSPushSecret" => Class::Push,
        "InfisicalDynamicSecret" | "KMSDynamicSecret" => Class::Dynamic,
        "ClusterGenerator" => Class::Generator,
        "Password" | "UUID" => Class::NoController,
        "InfisicalStaticSecret" | "InfisicalAuth" | "InfisicalConnection" => Class::Unsupported,
        _ => Class::Other,
    }
}

/// The result of converting one document.
#[derive(Debug)]
pub enum Converted {
    /// Converted into one of ours.
    Resource {
        /// The YAML of the result.
        yaml: String,
        /// `Kind namespace/name` of the original.
        from: String,
        /// `Kind namespace/name` of the result.
        to: String,
        /// What happened to its fields.
        findings: Vec<Finding>,
    },
    /// Not a Go-operator document: printed unchanged.
    PassThrough {
        /// The document.
        value: Value,
        /// `Kind namespace/name`.
        what: String,
    },
    /// A Go-operator kind that had no effect; left out.
    Skipped {
        /// `Kind namespace/name` and why.
        what: String,
        /// Findings, if any.
        findings: Vec<Finding>,
    },
    /// Could not be converted; left out.
    NotCarried {
        /// `Kind namespace/name` and why.
        what: String,
        /// Findings gathered before it failed.
        findings: Vec<Finding>,
    },
}

fn describe(kind: &str, meta: Option<&Value>) -> String {
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// Convert one document.
pub fn convert_document(value: Value) -> Converted {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let what = describe(
        if kind.is_empty() { "<no kind>" } else { &kind },
        value.get("metadata"),
    );
    let class = classify(&api_version, &kind);
    let (our_kind, lux) = match class {
        Class::Other | Class::Ours => return Converted::PassThrough { value, what },
        Class::NoController => {
            return Converted::Skipped {
                what: format!(
                    "{what} ({api_version}): the Go operators have no controller for it, so it had no effect; push generators use ClusterGenerator"
                ),
                findings: Vec::new(),
            };
        }
        Class::Unsupported => {
            return Converted::NotCarried {
                what: format!(
                    "{what} ({api_version}): no counterpart in kms-operator (Infisical's v1beta1 API); rewrite it as a KmsSecret (see docs/migration.md)"
                ),
                findings: Vec::new(),
            };
        }
        Class::Sync => ("KmsSecret", api_version.starts_with("secrets.lux.network/")),
        Class::Push => (
            "KmsPushSecret",
            api_version.starts_with("secrets.lux.network/"),
        ),
        Class::Dynamic => (
            "KmsDynamicSecret",
            api_version.starts_with("secrets.lux.network/"),
        ),
        Class::Generator => ("ClusterGenerator", false),
    };
    let Value::Object(mut doc) = value else {
        return Converted::NotCarried {
            what: format!("{what}: not a mapping"),
            findings: Vec::new(),
        };
    };
    let namespace = doc
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let mut cx = Cx {
        findings: Vec::new(),
        namespace,
        engine: kms_template::Engine::new(kms_template::Limits::default()),
        lux_keys: None,
        infisical: api_version.starts_with("secrets.infisical.com/"),
    };
    if lux {
        cx.add(
            Severity::Note,
            "apiVersion",
            "secrets.lux.network resources called the /v1/kms/* server API; kms-operator calls the Infisical-compatible API (/api/v1…v3) of Hanzo KMS: check that hostAPI serves it",
        );
    }
    doc.remove("apiVersion");
    doc.remove("kind");
    let metadata = metadata(&mut cx, doc.remove("metadata"));
    let status = doc.remove("status");
    let spec = doc.remove("spec");
    for key in doc.keys() {
        cx.add(
            Severity::Dropped,
            key,
            "not a top-level field of a Kubernetes object of this kind",
        );
    }
    let spec = match (class, spec) {
        (_, None) => {
            return Converted::NotCarried {
                what: format!("{what}: has no spec"),
                findings: cx.findings,
            };
        }
        (Class::Sync, Some(s)) => Obj::from(&mut cx, "spec", s).map(|o| sync_spec(&mut cx, o)),
        (Class::Push, Some(s)) => Obj::from(&mut cx, "spec", s).map(|o| push_spec(&mut cx, o)),
        (Class::Dynamic, Some(s)) => {
            Obj::from(&mut cx, "spec", s).map(|o| dynamic_spec(&mut cx, o))
        }
        (_, Some(s)) => Some(s),
    };
    status_notes(&mut cx, class, status.as_ref());
    let Some(spec) = spec else {
        return Converted::NotCarried {
            what: format!("{what}: spec is not a mapping"),
            findings: cx.findings,
        };
    };
    if let Some(missing) = missing_essentials(class, &spec) {
        return Converted::NotCarried {
            what: format!("{what} ({api_version}): not converted: {missing} (see below)"),
            findings: cx.findings,
        };
    }
    let out = json!({
        "apiVersion": OUR_API_VERSION,
        "kind": our_kind,
        "metadata": metadata,
        "spec": spec,
    });
    let to = describe(our_kind, out.get("metadata"));
    let typed = match our_kind {
        "KmsSecret" => typed_yaml::<KmsSecret>(out),
        "KmsPushSecret" => typed_yaml::<KmsPushSecret>(out),
        "KmsDynamicSecret" => typed_yaml::<KmsDynamicSecret>(out),
        _ => typed_yaml::<ClusterGenerator>(out),
    };
    match typed {
        Ok(yaml) => Converted::Resource {
            yaml,
            from: format!("{what} ({api_version})"),
            to: format!("{to} ({OUR_API_VERSION})"),
            findings: cx.findings,
        },
        Err(e) => Converted::NotCarried {
            what: format!(
                "{what} ({api_version}): the converted spec does not fit {our_kind}: {e}"
            ),
            findings: cx.findings,
        },
    }
}

/// What our CRD's rules require and the converted spec lacks, if anything:
/// such a document would be refused by the API server, so it is not printed.
fn missing_essentials(class: Class, spec: &Value) -> Option<&'static str> {
    let has = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
    match class {
        Class::Sync if !has("authentication") && !has("tokenSecretReference") => {
            Some("no usable authentication method")
        }
        Class::Sync
            if !has("managedKubeSecretReferences") && !has("managedKubeConfigMapReferences") =>
        {
            Some("no target")
        }
        Class::Push | Class::Dynamic if !has("authentication") => {
            Some("no usable authentication method")
        }
        _ => None,
    }
}

fn typed_yaml<T>(out: Value) -> Result<String, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(out).map_err(|e| e.to_string())?;
    serde_saphyr::to_string(&typed).map_err(|e| e.to_string())
}

/// The state of one conversion: the findings so far and what the checks
/// need to know about the resource.
struct Cx {
    findings: Vec<Finding>,
    /// The resource's own namespace, when the document names one.
    namespace: Option<String>,
    engine: kms_template::Engine,
    /// `secretsScope.keys` of a `secrets.lux.network` KMSSecret.
    lux_keys: Option<Vec<String>>,
    /// Whether the document is Infisical's (`secrets.infisical.com`).
    infisical: bool,
}

impl Cx {
    fn add(&mut self, severity: Severity, field: &str, message: impl Into<String>) {
        self.findings.push(Finding {
            severity,
            field: field.to_owned(),
            message: message.into(),
        });
    }

    /// Flag a reference into another namespace.
    fn refers(&mut self, field: &str, target: Option<&str>, what: &str) {
        let Some(target) = target else { return };
        match self.namespace.clone() {
            Some(own) if own == target => {}
            Some(own) => self.add(
                Severity::CrossNamespace,
                field,
                format!(
                    "{what} in namespace {target:?}, the resource is in {own:?}: {CROSS_NAMESPACE_SETTING}"
                ),
            ),
            None => self.add(
                Severity::CrossNamespace,
                field,
                format!(
                    "{what} in namespace {target:?} and the resource names no namespace: unless it is applied in {target:?}, {CROSS_NAMESPACE_SETTING}"
                ),
            ),
        }
    }
}

/// A mapping being walked: fields are taken out one by one; what is left at
/// the end was not in the Go schema.
struct Obj {
    path: String,
    map: Map<String, Value>,
}

impl Obj {
    fn from(cx: &mut Cx, path: &str, v: Value) -> Option<Obj> {
        match v {
            Value::Object(map) => Some(Obj {
                path: path.to_owned(),
                map,
            }),
            Value::Null => None,
            _ => {
                cx.add(Severity::NotCarried, path, "expected a mapping");
                None
            }
        }
    }

    fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn obj(&mut self, cx: &mut Cx, key: &str) -> Option<Obj> {
        let path = self.at(key);
        self.take(key).and_then(|v| Obj::from(cx, &path, v))
    }

    /// A string field; empty means absent (as in the Go code). Numbers and
    /// booleans are read as their text.
    fn str(&mut self, cx: &mut Cx, key: &str) -> Option<String> {
        match self.take(key)? {
            Value::String(s) if s.is_empty() => None,
            Value::String(s) => Some(s),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => {
                cx.add(Severity::NotCarried, &self.at(key), "expected a string");
                None
            }
        }
    }

    fn bool(&mut self, cx: &mut Cx, key: &str) -> Option<bool> {
        match self.take(key)? {
            Value::Bool(b) => Some(b),
            Value::String(s) if s == "true" => Some(true),
            Value::String(s) if s == "false" => Some(false),
            _ => {
                cx.add(
                    Severity::NotCarried,
                    &self.at(key),
                    "expected true or false",
                );
                None
            }
        }
    }

    fn strings(&mut self, cx: &mut Cx, key: &str) -> Option<Vec<String>> {
        let path = self.at(key);
        match self.take(key)? {
            Value::Array(items) => Some(
                items
                    .into_iter()
                    .filter_map(|v| match v {
                        Value::String(s) => Some(s),
                        _ => {
                            cx.add(Severity::NotCarried, &path, "expected a list of strings");
                            None
                        }
                    })
                    .collect(),
            ),
            _ => {
                cx.add(Severity::NotCarried, &path, "expected a list of strings");
                None
            }
        }
    }

    fn string_map(&mut self, cx: &mut Cx, key: &str) -> Option<Map<String, Value>> {
        let path = self.at(key);
        let mut o = self.obj(cx, key)?;
        let mut out = Map::new();
        for (k, v) in std::mem::take(&mut o.map) {
            match v {
                Value::String(s) => {
                    out.insert(k, Value::String(s));
                }
                Value::Number(n) => {
                    out.insert(k, Value::String(n.to_string()));
                }
                Value::Bool(b) => {
                    out.insert(k, Value::String(b.to_string()));
                }
                _ => cx.add(
                    Severity::NotCarried,
                    &format!("{path}.{k}"),
                    "expected a string",
                ),
            }
        }
        Some(out)
    }

    /// Report what is left: fields the Go schema did not have.
    fn finish(self, cx: &mut Cx) {
        for key in self.map.keys() {
            cx.add(
                Severity::Dropped,
                &self.at(key),
                "not a field of the Go operator's schema here: its API server pruned it, so it had no effect",
            );
        }
    }
}

fn put(map: &mut Map<String, Value>, key: &str, value: Option<impl Into<Value>>) {
    if let Some(v) = value {
        map.insert(key.to_owned(), v.into());
    }
}

// ---------------------------------------------------------------------------
// metadata and status

const DROPPED_METADATA: [&str; 8] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn metadata(cx: &mut Cx, meta: Option<Value>) -> Value {
    let Some(Value::Object(mut meta)) = meta else {
        cx.add(
            Severity::NotCarried,
            "metadata",
            "missing: the resource has no name",
        );
        return json!({});
    };
    for key in DROPPED_METADATA {
        meta.remove(key);
    }
    if let Some(Value::Object(ann)) = meta.get_mut("annotations")
        && ann.remove(LAST_APPLIED).is_some()
    {
        cx.add(
            Severity::Dropped,
            &format!("metadata.annotations.{LAST_APPLIED}"),
            "describes the old object; kubectl writes a new one",
        );
    }
    if meta
        .get("annotations")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        meta.remove("annotations");
    }
    if let Some(Value::Array(f)) = meta.remove("finalizers")
        && !f.is_empty()
    {
        cx.add(
            Severity::Dropped,
            "metadata.finalizers",
            "the Go operator's finalizers; kms-operator adds its own",
        );
    }
    Value::Object(meta)
}

fn status_notes(cx: &mut Cx, class: Class, status: Option<&Value>) {
    let Some(status) = status else { return };
    match class {
        Class::Push
            if status
                .get("managedSecrets")
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty()) =>
        {
            cx.add(
                Severity::Note,
                "status.managedSecrets",
                "the keys the Go operator pushed are not recorded as this resource's (status is not applied): they are taken over only with updatePolicy: Replace, and deletionPolicy: Delete deletes only keys recorded as ours",
            );
        }
        Class::Dynamic if status.get("lease").is_some_and(|l| !l.is_null()) => {
            cx.add(
                Severity::Note,
                "status.lease",
                "kms-operator creates a lease of its own; the Go operator's lease stays valid until its TTL ends or the Go operator revokes it (it does on deletion with leaseRevocationPolicy: Revoke, and empties the Secret)",
            );
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// building blocks shared by the Go operators' kinds

/// `{secretName, secretNamespace}`; `None` when no name is set.
fn secret_ref(cx: &mut Cx, mut o: Obj, what: &str) -> Option<Value> {
    let name = o.str(cx, "secretName");
    let ns = o.str(cx, "secretNamespace");
    let field = o.at("secretNamespace");
    o.finish(cx);
    let name = name?;
    cx.refers(&field, ns.as_deref(), what);
    let mut m = Map::new();
    put(&mut m, "secretName", Some(name));
    put(&mut m, "secretNamespace", ns);
    Some(Value::Object(m))
}

fn tls(cx: &mut Cx, mut o: Obj) -> Option<Value> {
    let mut ca = o.obj(cx, "caRef");
    o.finish(cx);
    let mut ca = ca.take()?;
    let name = ca.str(cx, "secretName");
    let ns = ca.str(cx, "secretNamespace");
    let key = ca.str(cx, "key");
    let path = ca.path.clone();
    ca.finish(cx);
    let Some(name) = name else {
        cx.add(
            Severity::Dropped,
            &path,
            "no secretName, so the Go operator did not use it",
        );
        return None;
    };
    cx.refers(
        &format!("{path}.secretNamespace"),
        ns.as_deref(),
        "the CA Secret",
    );
    let mut m = Map::new();
    put(&mut m, "secretName", Some(name));
    put(&mut m, "secretNamespace", ns);
    put(&mut m, "key", key);
    Some(json!({ "caRef": m }))
}

fn creation_policy(cx: &mut Cx, field: &str, value: Option<String>) -> Option<&'static str> {
    match value.as_deref() {
        None => None,
        Some("Owner") => Some("Owner"),
        Some("Orphan") => Some("Orphan"),
        Some(other) => {
            cx.add(
                Severity::Note,
                field,
                format!("{other:?} behaved as Orphan in the Go operator; written as Orphan"),
            );
            Some("Orphan")
        }
    }
}

/// Whether `s` can follow a dot in a Go template (`.KEY.Value`).
fn go_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A Go template that writes the secret `key` unchanged.
fn copy_template(key: &str) -> String {
    if go_identifier(key) {
        format!("{{{{ .{key}.Value }}}}")
    } else {
        format!(
            "{{{{ (index . {}).Value }}}}",
            Value::String(key.to_owned())
        )
    }
}

/// `SecretTemplate`: `includeAllSecrets`, `data` (carried verbatim: Go
/// templates render with Go semantics), `metadata`.
fn template(cx: &mut Cx, mut o: Obj) -> Value {
    let mut m = Map::new();
    put(&mut m, "includeAllSecrets", o.bool(cx, "includeAllSecrets"));
    let data_path = o.at("data");
    if let Some(data) = o.string_map(cx, "data") {
        for (key, source) in &data {
            let source = source.as_str().unwrap_or_default();
            if let Err(e) = cx.engine.check(&format!("template.data.{key}"), source) {
                cx.add(
                    Severity::NotCarried,
                    &format!("{data_path}.{key}"),
                    format!("carried verbatim, but kms-operator will not render it: {e}"),
                );
            }
        }
        m.insert("data".to_owned(), Value::Object(data));
    }
    if let Some(mut meta) = o.obj(cx, "metadata") {
        let mut mm = Map::new();
        put(&mut mm, "labels", meta.string_map(cx, "labels"));
        put(&mut mm, "annotations", meta.string_map(cx, "annotations"));
        meta.finish(cx);
        m.insert("metadata".to_owned(), Value::Object(mm));
    }
    o.finish(cx);
    Value::Object(m)
}

/// `ManagedKubeSecretConfig`. A dynamic secret's template was ignored by the
/// Go operator and is left out.
fn managed_secret(cx: &mut Cx, mut o: Obj, dynamic: bool) -> Option<Value> {
    let name = o.str(cx, "secretName");
    let ns = o.str(cx, "secretNamespace");
    let ns_field = o.at("secretNamespace");
    let secret_type = o.str(cx, "secretType");
    let policy_field = o.at("creationPolicy");
    let policy = o.str(cx, "creationPolicy");
    let policy = creation_policy(cx, &policy_field, policy);
    let tpl = if dynamic {
        if o.take("template").is_some() {
            cx.add(
                Severity::Dropped,
                &o.at("template"),
                "the Go operator ignored a dynamic secret's template; left out so the Secret is written as before",
            );
        }
        None
    } else {
        o.obj(cx, "template").map(|t| template(cx, t))
    };
    let path = o.path.clone();
    o.finish(cx);
    let Some(name) = name else {
        cx.add(Severity::NotCarried, &path, "no secretName");
        return None;
    };
    cx.refers(&ns_field, ns.as_deref(), "the target Secret");
    owner_check(cx, &policy_field, policy, ns.as_deref());
    let mut m = Map::new();
    put(&mut m, "secretName", Some(name));
    put(&mut m, "secretNamespace", ns);
    put(&mut m, "secretType", secret_type);
    put(&mut m, "creationPolicy", policy);
    put(&mut m, "template", tpl);
    Some(Value::Object(m))
}

fn owner_check(cx: &mut Cx, field: &str, policy: Option<&str>, target_ns: Option<&str>) {
    if policy == Some("Owner")
        && let (Some(own), Some(target)) = (cx.namespace.clone(), target_ns)
        && own != target
    {
        cx.add(
            Severity::NotCarried,
            field,
            format!(
                "Owner needs the object in the resource's namespace {own:?}, not {target:?} (owner references do not cross namespaces; the Go operator failed here too): kept, but the target will not be written; use Orphan"
            ),
        );
    }
}

/// `ManagedKubeConfigMapConfig`.
fn managed_config_map(cx: &mut Cx, mut o: Obj) -> Option<Value> {
    let name = o.str(cx, "configMapName");
    let ns = o.str(cx, "configMapNamespace");
    let ns_field = o.at("configMapNamespace");
    let policy_field = o.at("creationPolicy");
    let policy = o.str(cx, "creationPolicy");
    let policy = creation_policy(cx, &policy_field, policy);
    let tpl = o.obj(cx, "template").map(|t| template(cx, t));
    let path = o.path.clone();
    o.finish(cx);
    let Some(name) = name else {
        cx.add(Severity::NotCarried, &path, "no configMapName");
        return None;
    };
    cx.refers(&ns_field, ns.as_deref(), "the target ConfigMap");
    owner_check(cx, &policy_field, policy, ns.as_deref());
    let mut m = Map::new();
    put(&mut m, "configMapName", Some(name));
    put(&mut m, "configMapNamespace", ns);
    put(&mut m, "creationPolicy", policy);
    put(&mut m, "template", tpl);
    Some(Value::Object(m))
}

// ---------------------------------------------------------------------------
// authentication

/// The machine-identity `secretsScope`; a `secrets.lux.network` scope's
/// `keys` are kept in `cx.lux_keys` (turned into templates later).
fn machine_scope(cx: &mut Cx, mut o: Obj) -> Value {
    let mut m = Map::new();
    put(&mut m, "secretsPath", o.str(cx, "secretsPath"));
    put(&mut m, "envSlug", o.str(cx, "envSlug"));
    let slug = o.str(cx, "projectSlug");
    let id = o.str(cx, "projectId");
    if slug.is_some() && id.is_some() {
        cx.add(
            Severity::NotCarried,
            &o.path,
            "both projectSlug and projectId are set: the Go operator refused it at run time, and our CRD refuses it when applied; keep one",
        );
    }
    put(&mut m, "projectSlug", slug);
    put(&mut m, "projectId", id);
    put(&mut m, "secretName", o.str(cx, "secretName"));
    put(&mut m, "recursive", o.bool(cx, "recursive"));
    if let Some(keys) = o.strings(cx, "keys") {
        cx.lux_keys = Some(keys);
    }
    o.finish(cx);
    Value::Object(m)
}

fn service_token_scope(cx: &mut Cx, mut o: Obj) -> Value {
    let mut m = Map::new();
    put(&mut m, "secretsPath", o.str(cx, "secretsPath"));
    put(&mut m, "envSlug", o.str(cx, "envSlug"));
    put(&mut m, "recursive", o.bool(cx, "recursive"));
    o.finish(cx);
    Value::Object(m)
}

/// One machine-identity method (`scoped`: a KMSSecret's, with
/// `secretsScope`). `None` when the Go operator would have found it "not
/// applicable", which is reported.
fn auth_method(cx: &mut Cx, name: &str, mut o: Obj, scoped: bool) -> Option<Value> {
    let mut m = Map::new();
    let path = o.path.clone();
    let applicable = match name {
        "universalAuth" | "ldapAuth" => {
            if name == "ldapAuth" {
                put(&mut m, "identityId", o.str(cx, "identityId"));
            } else if o.take("identityId").is_some() {
                cx.add(
                    Severity::Dropped,
                    &o.at("identityId"),
                    "listed by the docs but not a field of the Go type (the API server pruned it); universal auth needs only credentialsRef",
                );
            }
            let what = if name == "ldapAuth" {
                "the LDAP credentials Secret"
            } else {
                "the credentials Secret"
            };
            let cred = o
                .obj(cx, "credentialsRef")
                .and_then(|r| secret_ref(cx, r, what));
            let ok = cred.is_some();
            put(&mut m, "credentialsRef", cred);
            ok
        }
        "kubernetesAuth" => {
            let id = o.str(cx, "identityId");
            let ok = id.is_some();
            put(&mut m, "identityId", id);
            if let Some(mut sa) = o.obj(cx, "serviceAccountRef") {
                let mut s = Map::new();
                put(&mut s, "name", sa.str(cx, "name"));
                let ns_field = sa.at("namespace");
                let ns = sa.str(cx, "namespace");
                cx.refers(&ns_field, ns.as_deref(), "the ServiceAccount");
                put(&mut s, "namespace", ns);
                sa.finish(cx);
                m.insert("serviceAccountRef".to_owned(), Value::Object(s));
            }
            put(
                &mut m,
                "autoCreateServiceAccountToken",
                o.bool(cx, "autoCreateServiceAccountToken"),
            );
            put(
                &mut m,
                "serviceAccountTokenAudiences",
                o.strings(cx, "serviceAccountTokenAudiences"),
            );
            if o.take("serviceAccountTokenPath").is_some() {
                cx.add(
                    Severity::Dropped,
                    &o.at("serviceAccountTokenPath"),
                    "shown in the Go operator's samples but not a field of its type (the API server pruned it); the token comes from the ServiceAccount (set autoCreateServiceAccountToken: true for a short-lived one)",
                );
            }
            ok
        }
        "awsIamAuth" | "gcpIdTokenAuth" => {
            let id = o.str(cx, "identityId");
            let ok = id.is_some();
            put(&mut m, "identityId", id);
            ok
        }
        "azureAuth" => {
            let id = o.str(cx, "identityId");
            let ok = id.is_some();
            put(&mut m, "identityId", id);
            put(&mut m, "resource", o.str(cx, "resource"));
            put(
                &mut m,
                "azureManagedIdentityClientId",
                o.str(cx, "azureManagedIdentityClientId"),
            );
            ok
        }
        "gcpIamAuth" => {
            let id = o.str(cx, "identityId");
            let file = o.str(cx, "serviceAccountKeyFilePath");
            let ok = id.is_some() || file.is_some();
            if file.is_some() {
                cx.add(
                    Severity::NeedsSetting,
                    &o.at("serviceAccountKeyFilePath"),
                    "the key file is read only under the operator's --key-file-dir (chart value security.keyFileDir); mount it there (extraVolumes/extraVolumeMounts)",
                );
            }
            put(&mut m, "identityId", id);
            put(&mut m, "serviceAccountKeyFilePath", file);
            ok
        }
        _ => false,
    };
    if scoped {
        if let Some(scope) = o.obj(cx, "secretsScope") {
            m.insert("secretsScope".to_owned(), machine_scope(cx, scope));
        }
    } else if o.take("secretsScope").is_some() {
        cx.add(
            Severity::Dropped,
            &o.at("secretsScope"),
            "push and dynamic secrets have no scope in the Go operator (the API server pruned it)",
        );
    }
    o.finish(cx);
    if !applicable {
        cx.add(
            Severity::Dropped,
            &path,
            "not configured (no identity or credentials), so the Go operator skipped this method",
        );
        return None;
    }
    if MethodName::of_field(name).is_some_and(MethodName::is_cloud) {
        cx.add(
            Severity::NeedsSetting,
            &format!("{path}.identityId"),
            "the operator's own cloud identity is used only from namespaces an admin rule allows: add a rule \
             for this namespace and identity to --cloud-identities (chart value security.cloudIdentities)",
        );
    }
    Some(Value::Object(m))
}

/// The machine-identity methods, in the order this conversion prefers them
/// when several are set (the Go operator tried them in random order): the
/// operator's own order.
fn method_fields() -> impl Iterator<Item = &'static str> {
    MethodName::GENERIC.into_iter().map(MethodName::field)
}

/// Keep the first applicable method; report the others.
fn pick_one(cx: &mut Cx, path: &str, methods: Vec<(String, Value)>) -> Option<Value> {
    let mut methods = methods.into_iter();
    let (kept, value) = methods.next()?;
    for (other, _) in methods {
        // What would have mattered only for the method left out.
        let prefix = format!("{path}.{other}.");
        cx.findings.retain(|f| {
            !(matches!(
                f.severity,
                Severity::CrossNamespace | Severity::NeedsSetting
            ) && f.field.starts_with(&prefix))
        });
        cx.add(
            Severity::NotCarried,
            &format!("{path}.{other}"),
            format!(
                "several authentication methods are set and kms-operator accepts exactly one (the Go operator used legacy methods first, the others in random order); kept {kept}"
            ),
        );
    }
    Some(json!({ kept: value }))
}

/// A KMSSecret's `authentication` and the legacy `tokenSecretReference`:
/// returns (authentication, tokenSecretReference) of the result.
fn sync_auth(
    cx: &mut Cx,
    auth: Option<Obj>,
    token_ref: Option<Obj>,
) -> (Option<Value>, Option<Value>) {
    let legacy = token_ref.map(|mut r| {
        let name = r.str(cx, "secretName");
        let ns = r.str(cx, "secretNamespace");
        r.finish(cx);
        (name, ns)
    });
    let mut methods = Vec::new();
    let mut legacy_used = legacy.is_none();
    if let Some(mut auth) = auth {
        if let Some(mut st) = auth.obj(cx, "serviceToken") {
            let (mut name, mut ns) = (None, None);
            if let Some(mut r) = st.obj(cx, "serviceTokenSecretReference") {
                name = r.str(cx, "secretName");
                ns = r.str(cx, "secretNamespace");
                r.finish(cx);
            }
            if let Some((lname, lns)) = &legacy {
                let folded = (name.is_none() && lname.is_some()) || (ns.is_none() && lns.is_some());
                name = name.or_else(|| lname.clone());
                ns = ns.or_else(|| lns.clone());
                legacy_used = true;
                cx.add(
                    Severity::Folded,
                    "spec.tokenSecretReference",
                    if folded {
                        "folded into authentication.serviceToken.serviceTokenSecretReference (the Go operator read it field by field as its fallback)"
                    } else {
                        "ignored by the Go operator because authentication.serviceToken.serviceTokenSecretReference is complete; left out"
                    },
                );
            }
            let scope = st
                .obj(cx, "secretsScope")
                .map(|s| service_token_scope(cx, s));
            let path = st.path.clone();
            st.finish(cx);
            match name {
                Some(name) => {
                    let field = format!("{path}.serviceTokenSecretReference.secretNamespace");
                    cx.refers(&field, ns.as_deref(), "the service-token Secret");
                    let mut r = Map::new();
                    put(&mut r, "secretName", Some(name));
                    put(&mut r, "secretNamespace", ns);
                    let mut m = Map::new();
                    m.insert("serviceTokenSecretReference".to_owned(), Value::Object(r));
                    put(&mut m, "secretsScope", scope);
                    methods.push(("serviceToken".to_owned(), Value::Object(m)));
                }
                None => cx.add(
                    Severity::Dropped,
                    &path,
                    "no token Secret named, so the Go operator skipped this method",
                ),
            }
        }
        if let Some(mut sa) = auth.obj(cx, "serviceAccount") {
            let path = sa.path.clone();
            let r = sa
                .obj(cx, "serviceAccountSecretReference")
                .and_then(|r| secret_ref(cx, r, "the service-account Secret"));
            let mut m = Map::new();
            put(&mut m, "projectId", sa.str(cx, "projectId"));
            put(&mut m, "environmentName", sa.str(cx, "environmentName"));
            sa.finish(cx);
            match r {
                Some(r) => {
                    m.insert("serviceAccountSecretReference".to_owned(), r);
                    cx.add(
                        Severity::NotCarried,
                        &path,
                        "carried verbatim, but legacy service accounts are not offered by the KMS API any more: the resource will report it unsupported; use universalAuth or kubernetesAuth",
                    );
                    methods.push(("serviceAccount".to_owned(), Value::Object(m)));
                }
                None => cx.add(
                    Severity::Dropped,
                    &path,
                    "no service-account Secret named, so the Go operator skipped this method",
                ),
            }
        }
        for name in method_fields() {
            if let Some(o) = auth.obj(cx, name)
                && let Some(v) = auth_method(cx, name, o, true)
            {
                methods.push((name.to_owned(), v));
            }
        }
        auth.finish(cx);
    }
    let picked = pick_one(cx, "spec.authentication", methods);
    if picked.is_some() {
        if !legacy_used {
            cx.add(
                Severity::NotCarried,
                "spec.tokenSecretReference",
                "the legacy service token and another authentication method are both set; kms-operator accepts exactly one; kept the method under authentication",
            );
        }
        return (picked, None);
    }
    // Only the legacy top-level reference: it has no scope to fold into
    // authentication.serviceToken, and our CRD still serves it.
    match legacy {
        Some((Some(name), ns)) => {
            cx.refers(
                "spec.tokenSecretReference.secretNamespace",
                ns.as_deref(),
                "the service-token Secret",
            );
            cx.add(
                Severity::Note,
                "spec.tokenSecretReference",
                "kept as is: there is no secretsScope to fold it into authentication.serviceToken; the token's own scope applies",
            );
            let mut r = Map::new();
            put(&mut r, "secretName", Some(name));
            put(&mut r, "secretNamespace", ns);
            (None, Some(Value::Object(r)))
        }
        _ => {
            cx.add(
                Severity::NotCarried,
                "spec.authentication",
                "no usable authentication method",
            );
            (None, None)
        }
    }
}

/// The generic `authentication` of push and dynamic secrets.
fn generic_auth(cx: &mut Cx, auth: Option<Obj>) -> Option<Value> {
    let mut methods = Vec::new();
    if let Some(mut auth) = auth {
        for name in method_fields() {
            if let Some(o) = auth.obj(cx, name)
                && let Some(v) = auth_method(cx, name, o, false)
            {
                methods.push((name.to_owned(), v));
            }
        }
        auth.finish(cx);
    }
    let picked = pick_one(cx, "spec.authentication", methods);
    if picked.is_none() {
        cx.add(
            Severity::NotCarried,
            "spec.authentication",
            "no usable authentication method",
        );
    }
    picked
}

// ---------------------------------------------------------------------------
// intervals

/// The Go operator's interval grammar: one `<int><s|m|h|d|w>`, at least 5 s.
fn go_interval_secs(s: &str) -> Option<u64> {
    let unit = s.chars().last()?;
    let n: u64 = s[..s.len() - unit.len_utf8()].parse().ok()?;
    let size = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 604_800,
        _ => return None,
    };
    n.checked_mul(size)
}

/// `syncConfig.resyncInterval`: carried when the Go operator used it; where
/// it fell back to the default, left out (same behaviour) and reported.
fn sync_interval(cx: &mut Cx, field: &str, value: Option<String>) -> Option<String> {
    let v = value?;
    match go_interval_secs(&v) {
        Some(0) => {
            cx.add(
                Severity::Dropped,
                field,
                "0 means the default in both operators",
            );
            None
        }
        Some(s) if s >= 5 => Some(v),
        Some(_) => {
            cx.add(
                Severity::Dropped,
                field,
                format!("{v:?} is below 5 s, so the Go operator used the default (1 minute); left out to keep that"),
            );
            None
        }
        None => {
            cx.add(
                Severity::Dropped,
                field,
                format!("the Go operator could not parse {v:?} (one number and one unit only) and used the default (1 minute); left out to keep that, though kms-operator would read it"),
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------
// the three kinds

fn carry_common(cx: &mut Cx, o: &mut Obj, spec: &mut Map<String, Value>) {
    put(spec, "hostAPI", o.str(cx, "hostAPI"));
    if let Some(t) = o.obj(cx, "tls") {
        put(spec, "tls", tls(cx, t));
    }
}

/// KMSSecret → KmsSecret.
fn sync_spec(cx: &mut Cx, mut o: Obj) -> Value {
    let mut spec = Map::new();
    carry_common(cx, &mut o, &mut spec);

    // syncConfig, folding the deprecated top-level fields.
    let top_interval = o.str(cx, "resyncInterval");
    let top_instant = o.bool(cx, "instantUpdates");
    let mut sync = Map::new();
    if let Some(mut sc) = o.obj(cx, "syncConfig") {
        let field = sc.at("resyncInterval");
        let interval = sc.str(cx, "resyncInterval");
        put(
            &mut sync,
            "resyncInterval",
            sync_interval(cx, &field, interval),
        );
        put(&mut sync, "instantUpdates", sc.bool(cx, "instantUpdates"));
        sc.finish(cx);
        for (field, set) in [
            ("spec.resyncInterval", top_interval.is_some()),
            ("spec.instantUpdates", top_instant.is_some()),
        ] {
            if set {
                cx.add(
                    Severity::Dropped,
                    field,
                    "deprecated, and ignored by the Go operator because syncConfig is set",
                );
            }
        }
    } else {
        if let Some(secs) = top_interval {
            let as_go = format!("{secs}s");
            if let Some(v) = sync_interval(cx, "spec.resyncInterval", Some(as_go)) {
                cx.add(
                    Severity::Folded,
                    "spec.resyncInterval",
                    format!("deprecated seconds folded into syncConfig.resyncInterval: {v:?}"),
                );
                sync.insert("resyncInterval".to_owned(), Value::String(v));
            }
        }
        if let Some(b) = top_instant {
            cx.add(
                Severity::Folded,
                "spec.instantUpdates",
                "deprecated; folded into syncConfig.instantUpdates",
            );
            sync.insert("instantUpdates".to_owned(), Value::Bool(b));
        }
    }
    if !sync.contains_key("resyncInterval") && cx.infisical {
        // Upstream Infisical ≥ v0.11 defaults to 5 minutes.
        cx.add(
            Severity::Note,
            "spec.syncConfig.resyncInterval",
            "not set: kms-operator syncs every minute (1 hour with instantUpdates), as Infisical's operator did up to v0.10; from v0.11 it used 5 minutes",
        );
    }
    if !sync.is_empty() {
        spec.insert("syncConfig".to_owned(), Value::Object(sync));
    }

    let auth = o.obj(cx, "authentication");
    let token_ref = o.obj(cx, "tokenSecretReference");
    let (auth, token_ref) = sync_auth(cx, auth, token_ref);
    put(&mut spec, "authentication", auth);
    put(&mut spec, "tokenSecretReference", token_ref);

    // Targets, folding the deprecated single managedSecretReference.
    let mut secrets: Vec<Value> = Vec::new();
    let legacy = o.obj(cx, "managedSecretReference");
    let list_path = o.at("managedKubeSecretReferences");
    if let Some(Value::Array(items)) = o.take("managedKubeSecretReferences") {
        for (i, item) in items.into_iter().enumerate() {
            if let Some(t) = Obj::from(cx, &format!("{list_path}[{i}]"), item)
                && let Some(v) = managed_secret(cx, t, false)
            {
                secrets.push(v);
            }
        }
    }
    if let Some(l) = legacy {
        let had_list = !secrets.is_empty();
        if let Some(v) = managed_secret(cx, l, false) {
            if had_list {
                cx.add(
                    Severity::NotCarried,
                    "spec.managedSecretReference",
                    "set together with managedKubeSecretReferences, which the Go operator refused; left out (add it to the list if it is wanted)",
                );
            } else {
                cx.add(
                    Severity::Folded,
                    "spec.managedSecretReference",
                    "deprecated; folded into managedKubeSecretReferences",
                );
                secrets.push(v);
            }
        }
    }
    let mut config_maps: Vec<Value> = Vec::new();
    let cm_path = o.at("managedKubeConfigMapReferences");
    if let Some(Value::Array(items)) = o.take("managedKubeConfigMapReferences") {
        for (i, item) in items.into_iter().enumerate() {
            if let Some(t) = Obj::from(cx, &format!("{cm_path}[{i}]"), item)
                && let Some(v) = managed_config_map(cx, t)
            {
                config_maps.push(v);
            }
        }
    }
    if let Some(keys) = cx.lux_keys.take() {
        for t in secrets.iter_mut().chain(config_maps.iter_mut()) {
            restrict_to_keys(t, &keys);
        }
        cx.add(
            Severity::Folded,
            "spec.authentication.universalAuth.secretsScope.keys",
            "kms-operator reads the whole folder (the identity needs list access to it); the listed keys became template entries with includeAllSecrets: false, so the targets hold exactly those keys",
        );
    }
    if !secrets.is_empty() {
        spec.insert(
            "managedKubeSecretReferences".to_owned(),
            Value::Array(secrets),
        );
    }
    if !config_maps.is_empty() {
        spec.insert(
            "managedKubeConfigMapReferences".to_owned(),
            Value::Array(config_maps),
        );
    }
    if !spec.contains_key("managedKubeSecretReferences")
        && !spec.contains_key("managedKubeConfigMapReferences")
    {
        cx.add(
            Severity::NotCarried,
            "spec",
            "no target: neither managedKubeSecretReferences nor managedKubeConfigMapReferences (nor managedSecretReference) holds anything",
        );
    }
    o.finish(cx);
    Value::Object(spec)
}

/// A lux `secretsScope.keys` list as a template: exactly those keys, each
/// copied unchanged unless the template already renders it.
fn restrict_to_keys(target: &mut Value, keys: &[String]) {
    let Some(t) = target.as_object_mut() else {
        return;
    };
    let tpl = t
        .entry("template")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("template is a mapping");
    let had_data = tpl.contains_key("data");
    let include_all = tpl
        .get("includeAllSecrets")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if had_data && !include_all {
        // The template already decides which keys are written.
        return;
    }
    tpl.insert("includeAllSecrets".to_owned(), Value::Bool(false));
    let data = tpl
        .entry("data")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("data is a mapping");
    for key in keys {
        data.entry(key.clone())
            .or_insert_with(|| Value::String(copy_template(key)));
    }
}

fn update_policy(
    cx: &mut Cx,
    field: &str,
    v: Option<String>,
    wanted: &'static str,
) -> &'static str {
    match v.as_deref() {
        Some(s) if s == wanted => wanted,
        None | Some("None") => "None",
        Some(other) => {
            cx.add(
                Severity::Note,
                field,
                format!("{other:?} behaved as None in the Go operator (only {wanted:?} counts); written as None"),
            );
            "None"
        }
    }
}

fn project(cx: &mut Cx, o: &mut Obj, m: &mut Map<String, Value>) {
    let id = o.str(cx, "projectId");
    let slug = o.str(cx, "projectSlug");
    if id.is_some() && slug.is_some() {
        cx.add(
            Severity::NotCarried,
            &o.path,
            "both projectId and projectSlug are set: the Go operator refused it at run time, and our CRD refuses it when applied; keep one",
        );
    }
    put(m, "projectId", id);
    put(m, "projectSlug", slug);
}

/// KMSPushSecret → KmsPushSecret.
fn push_spec(cx: &mut Cx, mut o: Obj) -> Value {
    let mut spec = Map::new();
    carry_common(cx, &mut o, &mut spec);
    let field = o.at("resyncInterval");
    if let Some(v) = o.str(cx, "resyncInterval") {
        match kms_operator::api::duration::parse_duration(&v) {
            Ok(_) if v.trim() == v => {
                if go_interval_secs(&v).is_none_or(|s| s < 5) {
                    cx.add(
                        Severity::Note,
                        &field,
                        format!("the Go operator failed every reconcile on {v:?} (one number and one unit, at least 5 s); kms-operator reads it"),
                    );
                }
                spec.insert("resyncInterval".to_owned(), Value::String(v));
            }
            _ => cx.add(
                Severity::NotCarried,
                &field,
                format!("{v:?} is not an interval (the Go operator failed on it too)"),
            ),
        }
    }
    let f = o.at("updatePolicy");
    let up = o.str(cx, "updatePolicy");
    let up = update_policy(cx, &f, up, "Replace");
    spec.insert("updatePolicy".to_owned(), Value::from(up));
    if up != "Replace" {
        cx.add(
            Severity::Note,
            &f,
            "keys that already exist in the KMS (such as those the Go operator pushed) are left as they are and reported, not overwritten; set updatePolicy: Replace for the first sync to take them over",
        );
    }
    let f = o.at("deletionPolicy");
    let dp = o.str(cx, "deletionPolicy");
    spec.insert(
        "deletionPolicy".to_owned(),
        Value::from(update_policy(cx, &f, dp, "Delete")),
    );
    if let Some(mut d) = o.obj(cx, "destination") {
        let mut m = Map::new();
        put(&mut m, "secretsPath", d.str(cx, "secretsPath"));
        put(&mut m, "environmentSlug", d.str(cx, "environmentSlug"));
        project(cx, &mut d, &mut m);
        d.finish(cx);
        spec.insert("destination".to_owned(), Value::Object(m));
    }
    let auth = o.obj(cx, "authentication");
    put(&mut spec, "authentication", generic_auth(cx, auth));
    if let Some(mut p) = o.obj(cx, "push") {
        let mut m = Map::new();
        if let Some(mut s) = p.obj(cx, "secret") {
            let mut sm = Map::new();
            put(&mut sm, "secretName", s.str(cx, "secretName"));
            let ns_field = s.at("secretNamespace");
            let ns = s.str(cx, "secretNamespace");
            cx.refers(&ns_field, ns.as_deref(), "the source Secret");
            put(&mut sm, "secretNamespace", ns);
            put(
                &mut sm,
                "template",
                s.obj(cx, "template").map(|t| template(cx, t)),
            );
            s.finish(cx);
            m.insert("secret".to_owned(), Value::Object(sm));
        }
        let gpath = p.at("generators");
        if let Some(Value::Array(items)) = p.take("generators") {
            let mut gens = Vec::new();
            for (i, item) in items.into_iter().enumerate() {
                let Some(mut g) = Obj::from(cx, &format!("{gpath}[{i}]"), item) else {
                    continue;
                };
                let mut gm = Map::new();
                put(
                    &mut gm,
                    "destinationSecretName",
                    g.str(cx, "destinationSecretName"),
                );
                if let Some(mut r) = g.obj(cx, "generatorRef") {
                    let kind_field = r.at("kind");
                    let kind = r.str(cx, "kind");
                    if !matches!(kind.as_deref(), Some("Password" | "UUID")) {
                        cx.add(
                            Severity::NotCarried,
                            &kind_field,
                            "must be Password or UUID",
                        );
                    }
                    let mut rm = Map::new();
                    put(&mut rm, "kind", kind);
                    put(&mut rm, "name", r.str(cx, "name"));
                    r.finish(cx);
                    gm.insert("generatorRef".to_owned(), Value::Object(rm));
                }
                g.finish(cx);
                gens.push(Value::Object(gm));
            }
            if !gens.is_empty() {
                cx.add(
                    Severity::Note,
                    &gpath,
                    "kms-operator generates each value once and keeps it (the Go operator made a new one on every reconcile); set rotationInterval on a generators entry to rotate it; migrate the ClusterGenerators too",
                );
                m.insert("generators".to_owned(), Value::Array(gens));
            }
        }
        p.finish(cx);
        spec.insert("push".to_owned(), Value::Object(m));
    }
    o.finish(cx);
    Value::Object(spec)
}

/// KMSDynamicSecret → KmsDynamicSecret.
fn dynamic_spec(cx: &mut Cx, mut o: Obj) -> Value {
    let mut spec = Map::new();
    carry_common(cx, &mut o, &mut spec);
    let auth = o.obj(cx, "authentication");
    put(&mut spec, "authentication", generic_auth(cx, auth));
    if let Some(mut d) = o.obj(cx, "dynamicSecret") {
        let mut m = Map::new();
        put(&mut m, "secretName", d.str(cx, "secretName"));
        put(&mut m, "secretsPath", d.str(cx, "secretsPath"));
        put(&mut m, "environmentSlug", d.str(cx, "environmentSlug"));
        project(cx, &mut d, &mut m);
        d.finish(cx);
        spec.insert("dynamicSecret".to_owned(), Value::Object(m));
    }
    let field = o.at("leaseTTL");
    if let Some(ttl) = o.str(cx, "leaseTTL") {
        if kms_operator::api::duration::parse_duration(&ttl).is_ok() && ttl.trim() == ttl {
            spec.insert("leaseTTL".to_owned(), Value::String(ttl));
        } else {
            cx.add(
                Severity::NotCarried,
                &field,
                format!("{ttl:?} is not an interval kms-operator reads (30s, 5m, 1h, 1d, 1h30m); the dynamic secret's default TTL applies"),
            );
        }
    }
    let f = o.at("leaseRevocationPolicy");
    let rp = o.str(cx, "leaseRevocationPolicy");
    spec.insert(
        "leaseRevocationPolicy".to_owned(),
        Value::from(update_policy(cx, &f, rp, "Revoke")),
    );
    if let Some(t) = o.obj(cx, "managedSecretReference") {
        put(
            &mut spec,
            "managedSecretReference",
            managed_secret(cx, t, true),
        );
    }
    o.finish(cx);
    Value::Object(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Value {
        serde_saphyr::from_str(yaml).unwrap()
    }

    /// Convert and return (our document as JSON, findings).
    fn convert(yaml: &str) -> (Value, Vec<Finding>) {
        match convert_document(parse(yaml)) {
            Converted::Resource { yaml, findings, .. } => (parse(&yaml), findings),
            other => panic!("not converted: {other:?}"),
        }
    }

    fn finding<'a>(findings: &'a [Finding], field: &str) -> &'a Finding {
        findings
            .iter()
            .find(|f| f.field == field)
            .unwrap_or_else(|| panic!("no finding for {field}: {findings:#?}"))
    }

    fn severities(findings: &[Finding], s: Severity) -> Vec<&str> {
        findings
            .iter()
            .filter(|f| f.severity == s)
            .map(|f| f.field.as_str())
            .collect()
    }

    #[test]
    fn classifies_every_group_and_kind() {
        for group in GO_GROUPS {
            let av = format!("{group}/v1alpha1");
            assert_eq!(classify(&av, "KMSSecret"), Class::Sync);
            assert_eq!(classify(&av, "InfisicalSecret"), Class::Sync);
            assert_eq!(classify(&av, "KMSPushSecret"), Class::Push);
            assert_eq!(classify(&av, "InfisicalPushSecret"), Class::Push);
            assert_eq!(classify(&av, "KMSDynamicSecret"), Class::Dynamic);
            assert_eq!(classify(&av, "InfisicalDynamicSecret"), Class::Dynamic);
            assert_eq!(classify(&av, "Password"), Class::NoController);
            assert_eq!(classify(&av, "UUID"), Class::NoController);
        }
        assert_eq!(
            classify("secrets.infisical.com/v1alpha1", "ClusterGenerator"),
            Class::Generator
        );
        assert_eq!(
            classify("secrets.hanzo.ai/v1alpha1", "ClusterGenerator"),
            Class::Ours
        );
        assert_eq!(
            classify("secrets.hanzo.ai/v1alpha1", "KmsSecret"),
            Class::Ours
        );
        assert_eq!(
            classify("secrets.infisical.com/v1beta1", "InfisicalStaticSecret"),
            Class::Unsupported
        );
        assert_eq!(classify("v1", "Secret"), Class::Other);
        assert_eq!(classify("apps/v1", "Deployment"), Class::Other);
    }

    const UNIVERSAL: &str = r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata:
  name: web
  namespace: app
  labels: {team: a}
  annotations:
    note: kept
    kubectl.kubernetes.io/last-applied-configuration: "{}"
  uid: 1234
  resourceVersion: "99"
  finalizers: [secrets.finalizers.infisical.com]
spec:
  hostAPI: https://kms.example.com/api
  resyncInterval: 60
  instantUpdates: false
  tls:
    caRef: {secretName: ca, secretNamespace: app, key: ca.crt}
  authentication:
    universalAuth:
      credentialsRef: {secretName: creds, secretNamespace: app}
      secretsScope: {projectSlug: demo, envSlug: dev, secretsPath: /app, recursive: true}
  managedSecretReference:
    secretName: web-secrets
    secretNamespace: app
    creationPolicy: Owner
    secretType: kubernetes.io/dockerconfigjson
status:
  conditions: []
"#;

    #[test]
    fn universal_auth_and_the_deprecated_fields_fold_into_their_replacements() {
        let (doc, findings) = convert(UNIVERSAL);
        assert_eq!(doc["apiVersion"], "secrets.hanzo.ai/v1alpha1");
        assert_eq!(doc["kind"], "KmsSecret");
        assert_eq!(
            doc["metadata"],
            json!({"name": "web", "namespace": "app", "labels": {"team": "a"}, "annotations": {"note": "kept"}})
        );
        assert!(doc.get("status").is_none_or(Value::is_null));
        let spec = &doc["spec"];
        assert_eq!(spec["hostAPI"], "https://kms.example.com/api");
        assert_eq!(
            spec["tls"],
            json!({"caRef": {"secretName": "ca", "secretNamespace": "app", "key": "ca.crt"}})
        );
        assert_eq!(
            spec["syncConfig"],
            json!({"resyncInterval": "60s", "instantUpdates": false})
        );
        assert!(spec.get("resyncInterval").is_none());
        assert!(spec.get("instantUpdates").is_none());
        assert_eq!(
            spec["authentication"],
            json!({"universalAuth": {
                "credentialsRef": {"secretName": "creds", "secretNamespace": "app"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/app", "recursive": true}
            }})
        );
        assert!(spec.get("managedSecretReference").is_none());
        assert_eq!(
            spec["managedKubeSecretReferences"],
            json!([{"secretName": "web-secrets", "secretNamespace": "app",
                    "secretType": "kubernetes.io/dockerconfigjson", "creationPolicy": "Owner"}])
        );
        assert_eq!(
            severities(&findings, Severity::Folded),
            vec![
                "spec.resyncInterval",
                "spec.instantUpdates",
                "spec.managedSecretReference"
            ]
        );
        assert!(severities(&findings, Severity::NotCarried).is_empty());
        assert!(severities(&findings, Severity::CrossNamespace).is_empty());
        finding(&findings, "metadata.finalizers");
    }

    #[test]
    fn go_templates_and_template_metadata_are_carried_verbatim() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.hanzo.ai/v1alpha1
kind: KMSSecret
metadata: {name: t, namespace: app}
spec:
  syncConfig: {resyncInterval: 10s, instantUpdates: true}
  authentication:
    universalAuth:
      credentialsRef: {secretName: creds, secretNamespace: app}
      secretsScope: {projectId: p-1, envSlug: prod, secretsPath: /, secretName: ONE}
  managedKubeSecretReferences:
    - secretName: out
      secretNamespace: app
      template:
        includeAllSecrets: true
        data:
          DSN: 'postgres://{{ .DB_USER.Value }}:{{ .DB_PASSWORD.Value | urlquery }}@db/{{ .DB_NAME.Value | lower }}'
          HASH: '{{ .DB_PASSWORD.Value | sha256sum }}'
        metadata:
          labels: {app: web}
          annotations: {a: b}
  managedKubeConfigMapReferences:
    - configMapName: cm
      configMapNamespace: app
      creationPolicy: Orphan
      template:
        data: {HOST: '{{ .HOST.Value | trim | quote }}'}
"#,
        );
        let spec = &doc["spec"];
        assert_eq!(
            spec["syncConfig"],
            json!({"resyncInterval": "10s", "instantUpdates": true})
        );
        let t = &spec["managedKubeSecretReferences"][0]["template"];
        assert_eq!(t["includeAllSecrets"], true);
        assert_eq!(
            t["data"]["DSN"],
            "postgres://{{ .DB_USER.Value }}:{{ .DB_PASSWORD.Value | urlquery }}@db/{{ .DB_NAME.Value | lower }}"
        );
        assert_eq!(t["data"]["HASH"], "{{ .DB_PASSWORD.Value | sha256sum }}");
        assert_eq!(
            t["metadata"],
            json!({"labels": {"app": "web"}, "annotations": {"a": "b"}})
        );
        assert_eq!(
            spec["managedKubeConfigMapReferences"],
            json!([{"configMapName": "cm", "configMapNamespace": "app", "creationPolicy": "Orphan",
                    "template": {"includeAllSecrets": false, "data": {"HOST": "{{ .HOST.Value | trim | quote }}"}}}])
        );
        assert_eq!(
            spec["authentication"]["universalAuth"]["secretsScope"],
            json!({"projectId": "p-1", "envSlug": "prod", "secretsPath": "/", "secretName": "ONE"})
        );
        assert!(
            severities(&findings, Severity::NotCarried).is_empty(),
            "{findings:#?}"
        );
    }

    #[test]
    fn a_template_we_refuse_is_kept_and_reported() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata: {name: t, namespace: app}
spec:
  authentication:
    universalAuth:
      credentialsRef: {secretName: creds, secretNamespace: app}
      secretsScope: {projectSlug: demo, envSlug: dev, secretsPath: /}
  managedKubeSecretReferences:
    - secretName: out
      template:
        data: {TOKEN: '{{ .A.Value }}-{{ randAlphaNum 16 }}'}
"#,
        );
        assert_eq!(
            doc["spec"]["managedKubeSecretReferences"][0]["template"]["data"]["TOKEN"],
            "{{ .A.Value }}-{{ randAlphaNum 16 }}"
        );
        let f = finding(
            &findings,
            "spec.managedKubeSecretReferences[0].template.data.TOKEN",
        );
        assert_eq!(f.severity, Severity::NotCarried);
        assert!(f.message.contains("randAlphaNum"), "{}", f.message);
    }

    #[test]
    fn intervals_the_go_operator_ignored_keep_the_default() {
        for (value, folded) in [("3", false), ("0", false), ("10", true)] {
            let (doc, findings) = convert(&format!(
                "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {{name: a, namespace: app}}\nspec:\n  resyncInterval: {value}\n  authentication:\n    universalAuth:\n      credentialsRef: {{secretName: c}}\n      secretsScope: {{projectSlug: p, envSlug: dev, secretsPath: /}}\n  managedKubeSecretReferences: [{{secretName: o}}]\n"
            ));
            if folded {
                assert_eq!(doc["spec"]["syncConfig"]["resyncInterval"], "10s");
            } else {
                assert!(doc["spec"].get("syncConfig").is_none(), "{value}: {doc}");
                assert_eq!(
                    finding(&findings, "spec.resyncInterval").severity,
                    Severity::Dropped
                );
            }
        }
        for (value, kept) in [("5m", true), ("1h30m", false), ("2s", false), ("0s", false)] {
            let (doc, _) = convert(&format!(
                "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {{name: a, namespace: app}}\nspec:\n  resyncInterval: 90\n  syncConfig: {{resyncInterval: {value}}}\n  authentication:\n    universalAuth:\n      credentialsRef: {{secretName: c}}\n      secretsScope: {{projectSlug: p, envSlug: dev, secretsPath: /}}\n  managedKubeSecretReferences: [{{secretName: o}}]\n"
            ));
            let got = doc["spec"]
                .get("syncConfig")
                .map(|s| s["resyncInterval"].clone());
            assert_eq!(got.is_some_and(|v| v == value), kept, "{value}: {doc}");
        }
    }

    #[test]
    fn every_machine_identity_method_is_carried() {
        let methods = r#"
kubernetesAuth:
  identityId: id-k
  serviceAccountRef: {name: sa, namespace: app}
  autoCreateServiceAccountToken: true
  serviceAccountTokenAudiences: [kms]
  serviceAccountTokenPath: /var/run/secrets/token
  secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
---
awsIamAuth: {identityId: id-a, secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}}
---
azureAuth: {identityId: id-z, resource: "https://r/", azureManagedIdentityClientId: mi, secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}}
---
gcpIdTokenAuth: {identityId: id-g, secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}}
---
gcpIamAuth: {identityId: id-i, serviceAccountKeyFilePath: /keys/k.json, secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}}
---
ldapAuth: {identityId: id-l, credentialsRef: {secretName: ldap, secretNamespace: app}, secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}}
---
serviceToken: {serviceTokenSecretReference: {secretName: st, secretNamespace: app}, secretsScope: {envSlug: dev, secretsPath: /, recursive: true}}
"#;
        for method in super::super::split_documents(methods) {
            let auth = parse(&method.text);
            let mut expected = auth.clone();
            let name = auth.as_object().unwrap().keys().next().unwrap().clone();
            if let Some(k) = expected
                .get_mut("kubernetesAuth")
                .and_then(Value::as_object_mut)
            {
                k.remove("serviceAccountTokenPath");
            }
            let doc = json!({
                "apiVersion": "secrets.infisical.com/v1alpha1", "kind": "InfisicalSecret",
                "metadata": {"name": "a", "namespace": "app"},
                "spec": {"authentication": auth, "managedKubeSecretReferences": [{"secretName": "o"}]}
            });
            let Converted::Resource { yaml, findings, .. } = convert_document(doc) else {
                panic!("{name} not converted");
            };
            let out = parse(&yaml);
            assert_eq!(out["spec"]["authentication"], expected, "{name}");
            assert!(
                severities(&findings, Severity::NotCarried).is_empty(),
                "{name}: {findings:#?}"
            );
            match name.as_str() {
                "kubernetesAuth" => assert_eq!(
                    finding(
                        &findings,
                        "spec.authentication.kubernetesAuth.serviceAccountTokenPath"
                    )
                    .severity,
                    Severity::Dropped
                ),
                "gcpIamAuth" => {
                    assert!(findings.iter().any(|f| f.severity == Severity::NeedsSetting
                        && f.message.contains("--key-file-dir")))
                }
                _ => {}
            }
            let cloud = ["awsIamAuth", "azureAuth", "gcpIdTokenAuth", "gcpIamAuth"];
            assert_eq!(
                findings.iter().any(|f| f.severity == Severity::NeedsSetting
                    && f.message.contains("--cloud-identities")),
                cloud.contains(&name.as_str()),
                "{name}: {findings:#?}"
            );
        }
    }

    #[test]
    fn legacy_token_reference_folds_field_by_field_or_stays() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata: {name: a, namespace: app}
spec:
  tokenSecretReference: {secretName: legacy, secretNamespace: app}
  authentication:
    serviceToken:
      serviceTokenSecretReference: {secretName: ""}
      secretsScope: {envSlug: dev, secretsPath: /}
  managedSecretReference: {secretName: o, secretNamespace: app}
"#,
        );
        assert_eq!(
            doc["spec"]["authentication"]["serviceToken"]["serviceTokenSecretReference"],
            json!({"secretName": "legacy", "secretNamespace": "app"})
        );
        assert!(doc["spec"].get("tokenSecretReference").is_none());
        assert_eq!(
            finding(&findings, "spec.tokenSecretReference").severity,
            Severity::Folded
        );

        let (doc, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {name: a, namespace: app}\nspec:\n  tokenSecretReference: {secretName: legacy, secretNamespace: app}\n  managedSecretReference: {secretName: o, secretNamespace: app}\n",
        );
        assert_eq!(
            doc["spec"]["tokenSecretReference"],
            json!({"secretName": "legacy", "secretNamespace": "app"})
        );
        assert!(doc["spec"].get("authentication").is_none());
        assert_eq!(
            finding(&findings, "spec.tokenSecretReference").severity,
            Severity::Note
        );
    }

    #[test]
    fn empty_sample_methods_are_skipped_and_several_real_ones_are_reported() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata: {name: a, namespace: app}
spec:
  authentication:
    universalAuth:
      credentialsRef: {secretName: creds, secretNamespace: app}
      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
    kubernetesAuth:
      identityId: ""
      serviceAccountRef: {name: "", namespace: ""}
      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
    awsIamAuth:
      identityId: id-a
      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
  managedKubeSecretReferences: [{secretName: o}]
"#,
        );
        let auth = doc["spec"]["authentication"].as_object().unwrap();
        assert_eq!(auth.keys().collect::<Vec<_>>(), vec!["universalAuth"]);
        assert_eq!(
            finding(&findings, "spec.authentication.kubernetesAuth").severity,
            Severity::Dropped
        );
        assert_eq!(
            finding(&findings, "spec.authentication.awsIamAuth").severity,
            Severity::NotCarried
        );
    }

    #[test]
    fn references_of_a_method_left_out_are_not_flagged() {
        let (_, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata: {name: a, namespace: app}
spec:
  authentication:
    universalAuth:
      credentialsRef: {secretName: creds, secretNamespace: app}
      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
    kubernetesAuth:
      identityId: id
      serviceAccountRef: {name: sa, namespace: elsewhere}
      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
  managedKubeSecretReferences: [{secretName: o}]
"#,
        );
        assert!(
            severities(&findings, Severity::CrossNamespace).is_empty(),
            "{findings:#?}"
        );
        assert_eq!(
            finding(&findings, "spec.authentication.kubernetesAuth").severity,
            Severity::NotCarried
        );
    }

    #[test]
    fn legacy_service_account_is_carried_but_reported() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata: {name: a, namespace: app}
spec:
  authentication:
    serviceAccount:
      serviceAccountSecretReference: {secretName: sa, secretNamespace: app}
      projectId: p
      environmentName: dev
  managedKubeSecretReferences: [{secretName: o}]
"#,
        );
        assert_eq!(
            doc["spec"]["authentication"]["serviceAccount"],
            json!({"serviceAccountSecretReference": {"secretName": "sa", "secretNamespace": "app"}, "projectId": "p", "environmentName": "dev"})
        );
        assert_eq!(
            finding(&findings, "spec.authentication.serviceAccount").severity,
            Severity::NotCarried
        );
    }

    #[test]
    fn cross_namespace_references_are_flagged_with_the_setting() {
        let (_, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalSecret
metadata: {name: a, namespace: app}
spec:
  tls: {caRef: {secretName: ca, secretNamespace: certs, key: ca.crt}}
  authentication:
    kubernetesAuth:
      identityId: id
      serviceAccountRef: {name: sa, namespace: infra}
      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
  managedKubeSecretReferences:
    - {secretName: o, secretNamespace: other, creationPolicy: Owner}
  managedKubeConfigMapReferences:
    - {configMapName: c, configMapNamespace: app}
"#,
        );
        let cross = severities(&findings, Severity::CrossNamespace);
        assert_eq!(
            cross,
            vec![
                "spec.tls.caRef.secretNamespace",
                "spec.authentication.kubernetesAuth.serviceAccountRef.namespace",
                "spec.managedKubeSecretReferences[0].secretNamespace",
            ]
        );
        for f in findings
            .iter()
            .filter(|f| f.severity == Severity::CrossNamespace)
        {
            assert!(
                f.message.contains("--allow-cross-namespace-refs")
                    && f.message.contains("security.allowCrossNamespaceReferences"),
                "{}",
                f.message
            );
        }
        assert_eq!(
            finding(
                &findings,
                "spec.managedKubeSecretReferences[0].creationPolicy"
            )
            .severity,
            Severity::NotCarried
        );
    }

    #[test]
    fn a_resource_without_namespace_flags_every_explicit_namespace() {
        let (_, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {name: a}\nspec:\n  authentication:\n    universalAuth:\n      credentialsRef: {secretName: c, secretNamespace: default}\n      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}\n  managedKubeSecretReferences: [{secretName: o}]\n",
        );
        let f = finding(
            &findings,
            "spec.authentication.universalAuth.credentialsRef.secretNamespace",
        );
        assert_eq!(f.severity, Severity::CrossNamespace);
        assert!(f.message.contains("names no namespace"));
    }

    #[test]
    fn unknown_fields_are_dropped_and_named() {
        let (doc, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {name: a, namespace: app}\nspec:\n  frobnicate: 1\n  authentication:\n    universalAuth:\n      credentialsRef: {secretName: c}\n      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /, extra: x}\n  managedKubeSecretReferences: [{secretName: o}]\n",
        );
        assert!(doc["spec"].get("frobnicate").is_none());
        assert_eq!(
            finding(&findings, "spec.frobnicate").severity,
            Severity::Dropped
        );
        assert_eq!(
            finding(
                &findings,
                "spec.authentication.universalAuth.secretsScope.extra"
            )
            .severity,
            Severity::Dropped
        );
    }

    #[test]
    fn odd_creation_policies_behave_as_orphan() {
        let (doc, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {name: a, namespace: app}\nspec:\n  authentication:\n    universalAuth:\n      credentialsRef: {secretName: c}\n      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}\n  managedKubeSecretReferences: [{secretName: o, creationPolicy: Keep}]\n",
        );
        assert_eq!(
            doc["spec"]["managedKubeSecretReferences"][0]["creationPolicy"],
            "Orphan"
        );
        assert_eq!(
            finding(
                &findings,
                "spec.managedKubeSecretReferences[0].creationPolicy"
            )
            .severity,
            Severity::Note
        );
    }

    #[test]
    fn both_legacy_and_list_targets_keep_the_list() {
        let (doc, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {name: a, namespace: app}\nspec:\n  authentication:\n    universalAuth:\n      credentialsRef: {secretName: c}\n      secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}\n  managedSecretReference: {secretName: legacy}\n  managedKubeSecretReferences: [{secretName: o}]\n",
        );
        assert_eq!(
            doc["spec"]["managedKubeSecretReferences"],
            json!([{"secretName": "o", "secretType": "Opaque", "creationPolicy": "Orphan"}])
        );
        assert_eq!(
            finding(&findings, "spec.managedSecretReference").severity,
            Severity::NotCarried
        );
    }

    #[test]
    fn lux_keys_become_a_template() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.lux.network/v1alpha1
kind: KMSSecret
metadata: {name: a, namespace: app}
spec:
  resyncInterval: 60
  authentication:
    universalAuth:
      credentialsRef: {secretName: c, secretNamespace: app}
      secretsScope: {projectSlug: org, envSlug: prod, secretsPath: /svc, keys: [DB_URL, my-key]}
  managedKubeSecretReferences: [{secretName: o, secretNamespace: app}]
"#,
        );
        assert_eq!(
            doc["spec"]["managedKubeSecretReferences"][0]["template"],
            json!({"includeAllSecrets": false, "data": {
                "DB_URL": "{{ .DB_URL.Value }}",
                "my-key": "{{ (index . \"my-key\").Value }}"
            }})
        );
        assert!(
            doc["spec"]["authentication"]["universalAuth"]["secretsScope"]
                .get("keys")
                .is_none()
        );
        assert_eq!(
            finding(
                &findings,
                "spec.authentication.universalAuth.secretsScope.keys"
            )
            .severity,
            Severity::Folded
        );
        assert_eq!(finding(&findings, "apiVersion").severity, Severity::Note);
    }

    #[test]
    fn push_secret_fields_map() {
        let (doc, findings) = convert(
            r#"
apiVersion: secrets.infisical.com/v1alpha1
kind: InfisicalPushSecret
metadata: {name: p, namespace: app}
spec:
  hostAPI: http://kms/api
  resyncInterval: 1m
  updatePolicy: Replace
  deletionPolicy: Delete
  destination: {projectSlug: demo, environmentSlug: dev, secretsPath: /pushed}
  authentication:
    universalAuth:
      identityId: not-a-field
      credentialsRef: {secretName: creds, secretNamespace: app}
  push:
    secret:
      secretName: source
      secretNamespace: app
      template:
        includeAllSecrets: true
        data: {PW_UPPER: '{{ .password.Value | upper }}'}
    generators:
      - destinationSecretName: UUID_KEY
        generatorRef: {kind: UUID, name: uuid-gen}
status:
  managedSecrets: {id1: KEY}
"#,
        );
        assert_eq!(doc["kind"], "KmsPushSecret");
        let spec = &doc["spec"];
        assert_eq!(spec["hostAPI"], "http://kms/api");
        assert_eq!(spec["resyncInterval"], "1m");
        assert_eq!(spec["updatePolicy"], "Replace");
        assert_eq!(spec["deletionPolicy"], "Delete");
        assert_eq!(
            spec["destination"],
            json!({"projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/pushed"})
        );
        assert_eq!(
            spec["authentication"],
            json!({"universalAuth": {"credentialsRef": {"secretName": "creds", "secretNamespace": "app"}}})
        );
        assert_eq!(
            spec["push"]["secret"],
            json!({"secretName": "source", "secretNamespace": "app",
                   "template": {"includeAllSecrets": true, "data": {"PW_UPPER": "{{ .password.Value | upper }}"}}})
        );
        assert_eq!(
            spec["push"]["generators"],
            json!([{"destinationSecretName": "UUID_KEY", "generatorRef": {"kind": "UUID", "name": "uuid-gen"}}])
        );
        assert_eq!(
            finding(&findings, "spec.authentication.universalAuth.identityId").severity,
            Severity::Dropped
        );
        assert_eq!(
            finding(&findings, "status.managedSecrets").severity,
            Severity::Note
        );
        assert!(severities(&findings, Severity::NotCarried).is_empty());
    }

    #[test]
    fn push_policies_other_than_the_magic_words_are_none() {
        let (doc, findings) = convert(
            "apiVersion: secrets.hanzo.ai/v1alpha1\nkind: KMSPushSecret\nmetadata: {name: p, namespace: app}\nspec:\n  updatePolicy: Overwrite\n  destination: {projectId: id, environmentSlug: dev, secretsPath: /}\n  authentication: {universalAuth: {credentialsRef: {secretName: c}}}\n  push: {secret: {secretName: s, secretNamespace: other}}\n",
        );
        assert_eq!(doc["spec"]["updatePolicy"], "None");
        assert_eq!(doc["spec"]["deletionPolicy"], "None");
        assert!(
            findings
                .iter()
                .any(|f| f.field == "spec.updatePolicy" && f.message.contains("behaved as None"))
        );
        assert_eq!(
            finding(&findings, "spec.push.secret.secretNamespace").severity,
            Severity::CrossNamespace
        );
    }

    #[test]
    fn dynamic_secret_fields_map_and_the_ignored_template_is_dropped() {
        let (doc, findings) = convert(
            r#"
apiVersion: kms.hanzo.ai/v1alpha1
kind: KMSDynamicSecret
metadata: {name: d, namespace: app}
spec:
  authentication:
    kubernetesAuth:
      identityId: id
      serviceAccountRef: {name: sa, namespace: app}
  dynamicSecret: {secretName: db-creds, secretsPath: /, environmentSlug: dev, projectSlug: demo}
  leaseTTL: 1h
  leaseRevocationPolicy: Revoke
  managedSecretReference:
    secretName: db
    secretNamespace: app
    creationPolicy: Owner
    template: {data: {X: "{{ .Y.Value }}"}}
status:
  lease: {id: l-1, version: 1, creationTimestamp: "2026-01-01T00:00:00Z", expiresAt: "2026-01-01T01:00:00Z"}
"#,
        );
        assert_eq!(doc["kind"], "KmsDynamicSecret");
        let spec = &doc["spec"];
        assert_eq!(
            spec["dynamicSecret"],
            json!({"secretName": "db-creds", "secretsPath": "/", "environmentSlug": "dev", "projectSlug": "demo"})
        );
        assert_eq!(spec["leaseTTL"], "1h");
        assert_eq!(spec["leaseRevocationPolicy"], "Revoke");
        assert_eq!(
            spec["managedSecretReference"],
            json!({"secretName": "db", "secretNamespace": "app", "secretType": "Opaque", "creationPolicy": "Owner"})
        );
        assert_eq!(
            spec["authentication"],
            json!({"kubernetesAuth": {"identityId": "id", "serviceAccountRef": {"name": "sa", "namespace": "app"}}})
        );
        assert_eq!(
            finding(&findings, "spec.managedSecretReference.template").severity,
            Severity::Dropped
        );
        assert_eq!(finding(&findings, "status.lease").severity, Severity::Note);
    }

    #[test]
    fn dynamic_empty_ttl_and_unknown_policy_take_the_defaults() {
        let (doc, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalDynamicSecret\nmetadata: {name: d, namespace: app}\nspec:\n  authentication: {universalAuth: {credentialsRef: {secretName: c}}}\n  dynamicSecret: {secretName: x, secretsPath: /, environmentSlug: dev, projectId: p}\n  leaseTTL: \"\"\n  leaseRevocationPolicy: \"\"\n  managedSecretReference: {secretName: db}\n",
        );
        assert!(doc["spec"].get("leaseTTL").is_none());
        assert_eq!(doc["spec"]["leaseRevocationPolicy"], "None");
        assert!(severities(&findings, Severity::NotCarried).is_empty());

        let (_, findings) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalDynamicSecret\nmetadata: {name: d, namespace: app}\nspec:\n  authentication: {universalAuth: {credentialsRef: {secretName: c}}}\n  dynamicSecret: {secretName: x, secretsPath: /, environmentSlug: dev, projectId: p}\n  leaseTTL: 1.5h\n  leaseRevocationPolicy: Revoke\n  managedSecretReference: {secretName: db}\n",
        );
        assert_eq!(
            finding(&findings, "spec.leaseTTL").severity,
            Severity::NotCarried
        );
    }

    #[test]
    fn generators_are_converted_and_ours_pass_through() {
        let (doc, _) = convert(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: ClusterGenerator\nmetadata: {name: pw}\nspec:\n  kind: Password\n  generator:\n    passwordSpec: {length: 32, digits: 4, symbols: 0, noUpper: true, allowRepeat: true}\n",
        );
        assert_eq!(doc["apiVersion"], "secrets.hanzo.ai/v1alpha1");
        assert_eq!(doc["spec"]["generator"]["passwordSpec"]["length"], 32);
        let ours = parse(
            "apiVersion: secrets.hanzo.ai/v1alpha1\nkind: ClusterGenerator\nmetadata: {name: pw}\nspec: {kind: UUID}\n",
        );
        assert!(matches!(
            convert_document(ours),
            Converted::PassThrough { .. }
        ));
    }

    #[test]
    fn kinds_without_counterpart_are_reported() {
        let v1beta1 = parse(
            "apiVersion: secrets.infisical.com/v1beta1\nkind: InfisicalStaticSecret\nmetadata: {name: s, namespace: app}\nspec: {}\n",
        );
        assert!(matches!(
            convert_document(v1beta1),
            Converted::NotCarried { .. }
        ));
        let password = parse(
            "apiVersion: secrets.hanzo.ai/v1alpha1\nkind: Password\nmetadata: {name: s, namespace: app}\nspec: {}\n",
        );
        assert!(matches!(
            convert_document(password),
            Converted::Skipped { .. }
        ));
    }

    #[test]
    fn a_resource_without_target_or_auth_is_reported() {
        match convert_document(parse(
            "apiVersion: secrets.infisical.com/v1alpha1\nkind: InfisicalSecret\nmetadata: {name: a, namespace: app}\nspec: {}\n",
        )) {
            Converted::NotCarried { what, findings } => {
                assert!(what.contains("no usable authentication method"), "{what}");
                assert_eq!(
                    finding(&findings, "spec.authentication").severity,
                    Severity::NotCarried
                );
                assert_eq!(finding(&findings, "spec").severity, Severity::NotCarried);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn copy_templates_use_index_for_keys_that_are_not_identifiers() {
        assert_eq!(copy_template("DB_URL"), "{{ .DB_URL.Value }}");
        assert_eq!(copy_template("my-key"), "{{ (index . \"my-key\").Value }}");
        assert_eq!(copy_template("1x"), "{{ (index . \"1x\").Value }}");
    }

    #[test]
    fn go_interval_grammar_is_one_number_and_one_unit() {
        assert_eq!(go_interval_secs("30s"), Some(30));
        assert_eq!(go_interval_secs("5m"), Some(300));
        assert_eq!(go_interval_secs("1w"), Some(604_800));
        assert_eq!(go_interval_secs("1h30m"), None);
        assert_eq!(go_interval_secs("60"), None);
        assert_eq!(go_interval_secs(""), None);
    }
}
