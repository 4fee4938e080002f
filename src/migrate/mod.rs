//! `kms-operator migrate`: converts manifests written for the Go operators
//! (Infisical's `InfisicalSecret` family in `secrets.infisical.com`, and the
//! Hanzo rename's `KMSSecret` family in `secrets.hanzo.ai`, `kms.hanzo.ai`
//! and `secrets.lux.network`) into this operator's `KmsSecret`,
//! `KmsPushSecret`, `KmsDynamicSecret` and `ClusterGenerator` in
//! `secrets.hanzo.ai/v1alpha1`.
//!
//! The input is a YAML stream (files, stdin) or the live cluster
//! (`--from-cluster`); the output is a YAML stream on stdout and a report on
//! stderr. Documents of any other kind pass through byte for byte, so a whole
//! manifest bundle can be piped through. Every field of the Go operators'
//! schemas is mapped; deprecated fields are folded into their replacements;
//! what cannot be carried is listed with the reason; references into other
//! namespaces are flagged with the operator setting that allows them.
//!
//! Modules: `convert` (the field mappings and their findings, pure
//! functions), `cluster` (reading the live cluster). This file splits
//! streams into documents, drives the conversion and writes the report.
//! Nothing here reads or prints secret values: the report names kinds,
//! objects and fields only.
//!
//! Exit status (documented in `docs/migration.md`): [`EXIT_OK`] when every
//! document was converted or passed through and nothing with an effect was
//! lost; [`EXIT_NOT_CARRIED`] when something could not be carried (what could
//! is still printed); 1 for a fatal error (unreadable input, cluster
//! unreachable).

mod cluster;
mod convert;

use std::fmt::Write as _;
use std::io::Read as _;

use anyhow::Context as _;
use serde_json::Value;

use kms_operator::cli::MigrateArgs;

pub use convert::{Converted, Finding, Severity, convert_document, strip_server_fields};

/// Exit status: everything was converted (or passed through unchanged).
pub const EXIT_OK: i32 = 0;
/// Exit status: at least one field or document could not be carried; the
/// report says which, and everything else was printed.
pub const EXIT_NOT_CARRIED: i32 = 2;

/// What happened to one input document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Converted into one of our kinds.
    Converted {
        /// `Kind namespace/name` of the original.
        from: String,
        /// `Kind namespace/name` of the result.
        to: String,
    },
    /// Passed through unchanged (not a Go-operator kind).
    PassedThrough(String),
    /// Left out: a Go-operator kind with no effect (no controller).
    Skipped(String),
    /// Left out: could not be converted.
    NotCarried(String),
}

/// The report of one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocReport {
    /// What happened to it.
    pub disposition: Disposition,
    /// The findings, in field order.
    pub findings: Vec<Finding>,
}

/// The result of a migration: the output documents and the report.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Output YAML documents, each ending with a newline, in input order.
    pub documents: Vec<String>,
    /// One entry per input document (per item of a `List`).
    pub reports: Vec<DocReport>,
}

impl Outcome {
    /// The YAML stream for stdout: the documents, `---` separated.
    pub fn yaml(&self) -> String {
        let mut out = String::new();
        for doc in &self.documents {
            out.push_str("---\n");
            out.push_str(doc);
            if !doc.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }

    /// Whether something could not be carried.
    pub fn has_uncarried(&self) -> bool {
        self.reports.iter().any(|r| {
            matches!(r.disposition, Disposition::NotCarried(_))
                || r.findings
                    .iter()
                    .any(|f| f.severity == Severity::NotCarried)
        })
    }

    /// The exit status: [`EXIT_OK`] or [`EXIT_NOT_CARRIED`].
    pub fn exit_code(&self) -> i32 {
        if self.has_uncarried() {
            EXIT_NOT_CARRIED
        } else {
            EXIT_OK
        }
    }

    /// The report for stderr.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let (mut converted, mut passed, mut skipped, mut failed) = (0, 0, 0, 0);
        let (mut uncarried, mut cross, mut settings) = (0, 0, 0);
        for r in &self.reports {
            match &r.disposition {
                Disposition::Converted { from, to } => {
                    converted += 1;
                    let _ = writeln!(out, "converted    {from} -> {to}");
                }
                Disposition::PassedThrough(what) => {
                    passed += 1;
                    let _ = writeln!(out, "passed       {what} (unchanged)");
                }
                Disposition::Skipped(what) => {
                    skipped += 1;
                    let _ = writeln!(out, "skipped      {what}");
                }
                Disposition::NotCarried(what) => {
                    failed += 1;
                    let _ = writeln!(out, "NOT CARRIED  {what}");
                }
            }
            for f in &r.findings {
                match f.severity {
                    Severity::NotCarried => uncarried += 1,
                    Severity::CrossNamespace => cross += 1,
                    Severity::NeedsSetting => settings += 1,
                    _ => {}
                }
                let field = if f.field.is_empty() {
                    String::new()
                } else {
                    format!("{}: ", f.field)
                };
                let _ = writeln!(
                    out,
                    "  {:<18}{field}{}",
                    format!("{}:", f.severity.label()),
                    f.message
                );
            }
        }
        let _ = writeln!(
            out,
            "summary: {converted} converted, {passed} passed through, {skipped} skipped, {failed} documents not carried, {uncarried} fields not carried, {cross} cross-namespace references, {settings} needing an operator setting; exit status {}",
            self.exit_code()
        );
        out
    }
}

/// One document of a YAML stream, with its original text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawDocument {
    /// The text between the separators (without the `---` line).
    pub text: String,
}

/// Split a YAML stream into documents at `---` lines (a `---` at the start of
/// a line followed by nothing, a space or a comment) and `...` end markers.
/// Documents holding only comments and blank lines are dropped. Text after
/// `--- ` on the marker line belongs to the document.
pub fn split_documents(stream: &str) -> Vec<RawDocument> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let flush = |current: &mut String, docs: &mut Vec<RawDocument>| {
        let has_content = current.lines().any(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#')
        });
        if has_content {
            docs.push(RawDocument {
                text: std::mem::take(current),
            });
        } else {
            current.clear();
        }
    };
    for line in stream.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = |m: &str| {
            bare == m
                || bare
                    .strip_prefix(m)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('\t'))
        };
        if is_marker("---") {
            flush(&mut current, &mut docs);
            let rest = bare[3..].trim();
            if !rest.is_empty() && !rest.starts_with('#') {
                current.push_str(rest);
                current.push('\n');
            }
        } else if is_marker("...") {
            flush(&mut current, &mut docs);
        } else {
            current.push_str(line);
        }
    }
    flush(&mut current, &mut docs);
    docs
}

/// Migrate a YAML stream: convert the Go-operator documents, pass the others
/// through unchanged. `origin` names the input in the report (a file name).
pub fn migrate_stream(stream: &str, origin: &str, outcome: &mut Outcome) {
    for (i, raw) in split_documents(stream).into_iter().enumerate() {
        let value: Value = match serde_saphyr::from_str(&raw.text) {
            Ok(v) => v,
            Err(e) => {
                outcome.reports.push(DocReport {
                    disposition: Disposition::NotCarried(format!(
                        "document {} of {origin}: not valid YAML ({})",
                        i + 1,
                        first_line(&e.to_string())
                    )),
                    findings: Vec::new(),
                });
                continue;
            }
        };
        if is_list(&value) {
            migrate_list(value, outcome);
            continue;
        }
        migrate_value(value, Some(&raw.text), outcome);
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn is_list(v: &Value) -> bool {
    v.get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k == "List" || k.ends_with("List"))
        && v.get("items").is_some_and(Value::is_array)
}

/// The items of a `List` (what `kubectl get -o yaml` prints), each as a
/// document of its own.
fn migrate_list(mut list: Value, outcome: &mut Outcome) {
    let items = match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let item_kind = list
        .get("kind")
        .and_then(Value::as_str)
        .and_then(|k| k.strip_suffix("List"))
        .filter(|k| !k.is_empty())
        .map(str::to_owned);
    let api_version = list.get("apiVersion").cloned();
    for mut item in items {
        // Typed lists leave kind/apiVersion off their items.
        if let (Some(obj), Some(kind)) = (item.as_object_mut(), &item_kind) {
            obj.entry("kind")
                .or_insert_with(|| Value::from(kind.clone()));
            if let Some(av) = &api_version {
                obj.entry("apiVersion").or_insert_with(|| av.clone());
            }
        }
        migrate_value(item, None, outcome);
    }
}

/// Migrate one parsed document; `text` is its original text, printed as is
/// when it passes through.
pub fn migrate_value(value: Value, text: Option<&str>, outcome: &mut Outcome) {
    match convert_document(value) {
        Converted::Resource {
            yaml,
            from,
            to,
            findings,
        } => {
            outcome.documents.push(yaml);
            outcome.reports.push(DocReport {
                disposition: Disposition::Converted { from, to },
                findings,
            });
        }
        Converted::PassThrough { mut value, what } => {
            let doc = match text {
                Some(t) => t.to_owned(),
                // An item of a List (a dump of the cluster): without what the
                // API server added, so that it applies again.
                None => match serde_saphyr::to_string({
                    strip_server_fields(&mut value);
                    &value
                }) {
                    Ok(y) => y,
                    Err(e) => {
                        outcome.reports.push(DocReport {
                            disposition: Disposition::NotCarried(format!(
                                "{what}: cannot be written as YAML ({e})"
                            )),
                            findings: Vec::new(),
                        });
                        return;
                    }
                },
            };
            outcome.documents.push(doc);
            outcome.reports.push(DocReport {
                disposition: Disposition::PassedThrough(what),
                findings: Vec::new(),
            });
        }
        Converted::Skipped { what, findings } => outcome.reports.push(DocReport {
            disposition: Disposition::Skipped(what),
            findings,
        }),
        Converted::NotCarried { what, findings } => outcome.reports.push(DocReport {
            disposition: Disposition::NotCarried(what),
            findings,
        }),
    }
}

/// The namespace `--from-cluster` reads (none: every namespace, which `-A`
/// also says). `KMS_OPERATOR_NAMESPACE` is read as a deprecated alias of
/// `-n`. The cluster flags need `--from-cluster`.
fn cluster_namespace(args: &MigrateArgs) -> anyhow::Result<Option<String>> {
    let c = &args.cluster;
    let flags =
        c.namespace.is_some() || c.all_namespaces || c.kubeconfig.is_some() || c.context.is_some();
    if flags && !args.from_cluster {
        anyhow::bail!(
            "--namespace, --all-namespaces, --kubeconfig and --context read a cluster: add --from-cluster"
        );
    }
    if c.namespace.is_none()
        && !c.all_namespaces
        && let Ok(ns) = std::env::var("KMS_OPERATOR_NAMESPACE")
        && !ns.is_empty()
    {
        eprintln!("warning: KMS_OPERATOR_NAMESPACE is deprecated; use -n/--namespace");
        return Ok(args.from_cluster.then_some(ns));
    }
    Ok(c.namespace.clone())
}

/// `kms-operator migrate`: read, convert, print; returns the exit status.
pub fn run(args: MigrateArgs) -> anyhow::Result<i32> {
    let namespace = cluster_namespace(&args)?;
    let mut outcome = Outcome::default();
    if args.from_cluster {
        let values = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(cluster::read(&args.cluster, namespace.as_deref()))?;
        for v in values {
            migrate_value(v, None, &mut outcome);
        }
    } else {
        let files = if args.files.is_empty() {
            vec![std::path::PathBuf::from("-")]
        } else {
            args.files
        };
        for file in files {
            let (text, origin) = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .context("reading stdin")?;
                (s, "stdin".to_owned())
            } else {
                let s = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading {}", file.display()))?;
                (s, file.display().to_string())
            };
            migrate_stream(&text, &origin, &mut outcome);
        }
    }
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(outcome.yaml().as_bytes())?;
        stdout.flush()?;
    }
    eprint!("{}", outcome.report());
    Ok(outcome.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> Result<MigrateArgs, clap::Error> {
        use clap::Parser as _;
        let mut full = vec!["kms-operator", "migrate"];
        full.extend_from_slice(argv);
        match kms_operator::cli::Cli::try_parse_from(full)?.command {
            kms_operator::cli::Command::Migrate(a) => Ok(a),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn command_line_takes_files_or_the_cluster() {
        let a = args(&["a.yaml", "-"]).unwrap();
        assert_eq!(
            a.files,
            vec![std::path::PathBuf::from("a.yaml"), "-".into()]
        );
        assert!(!a.from_cluster && a.cluster.namespace.is_none());
        assert!(args(&[]).unwrap().files.is_empty());
        let a = args(&["--from-cluster", "--namespace", "app"]).unwrap();
        assert!(a.from_cluster);
        assert_eq!(cluster_namespace(&a).unwrap().as_deref(), Some("app"));
        let a = args(&["--from-cluster", "-n", "app", "--context", "c"]).unwrap();
        assert_eq!(a.cluster.context.as_deref(), Some("c"));
        assert_eq!(cluster_namespace(&a).unwrap().as_deref(), Some("app"));
        assert!(args(&["--from-cluster", "-A", "-n", "app"]).is_err());
        assert!(args(&["--from-cluster", "a.yaml"]).is_err());
        let err = cluster_namespace(&args(&["--namespace", "app"]).unwrap()).unwrap_err();
        assert!(err.to_string().contains("add --from-cluster"), "{err}");
    }

    #[test]
    fn split_keeps_document_text_and_drops_empty_documents() {
        let stream = "# leading comment\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a # c\n---   # marker comment\n\n--- \n# only a comment\n---\nkind: ConfigMap\ndata:\n  x: |\n    ---not a marker\n    y\n...\n--- {kind: Flow}\n";
        let docs = split_documents(stream);
        let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(
            texts,
            vec![
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a # c\n",
                "kind: ConfigMap\ndata:\n  x: |\n    ---not a marker\n    y\n",
                "{kind: Flow}\n",
            ]
        );
    }

    #[test]
    fn other_documents_pass_through_byte_for_byte() {
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kms-operator-system\n";
        let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kms-config\n  namespace: kms-operator-system\ndata:\n  hostAPI: https://example.com/api # <-- global hostAPI\n";
        let mut out = Outcome::default();
        migrate_stream(&format!("{ns}---\n{cm}"), "bundle.yaml", &mut out);
        assert_eq!(out.documents, vec![ns.to_owned(), cm.to_owned()]);
        assert_eq!(out.yaml(), format!("---\n{ns}---\n{cm}"));
        assert_eq!(out.exit_code(), EXIT_OK);
        let report = out.report();
        assert!(report.contains("passed       Namespace kms-operator-system (unchanged)"));
        assert!(report.contains("ConfigMap kms-operator-system/kms-config"));
    }

    #[test]
    fn invalid_yaml_is_reported_and_the_rest_still_converts() {
        let mut out = Outcome::default();
        migrate_stream(
            "kind: [unclosed\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
            "in.yaml",
            &mut out,
        );
        assert_eq!(out.documents.len(), 1);
        assert_eq!(out.exit_code(), EXIT_NOT_CARRIED);
        assert!(
            out.report()
                .contains("document 1 of in.yaml: not valid YAML")
        );
    }

    #[test]
    fn list_items_are_converted_one_by_one() {
        let list = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: secrets.infisical.com/v1alpha1
    kind: InfisicalSecret
    metadata: {name: a, namespace: app, resourceVersion: "12", uid: x}
    spec:
      authentication:
        universalAuth:
          credentialsRef: {secretName: creds, secretNamespace: app}
          secretsScope: {projectSlug: p, envSlug: dev, secretsPath: /}
      managedKubeSecretReferences: [{secretName: out, secretNamespace: app}]
    status: {conditions: []}
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: c, resourceVersion: "7", uid: y}
"#;
        let mut out = Outcome::default();
        migrate_stream(list, "list.yaml", &mut out);
        assert_eq!(out.documents.len(), 2);
        assert!(out.documents[0].contains("kind: KmsSecret"));
        assert!(!out.documents[0].contains("resourceVersion"));
        assert!(!out.documents[0].contains("status"));
        assert!(out.documents[1].contains("kind: ConfigMap"));
        assert!(!out.documents[1].contains("resourceVersion"));
        assert_eq!(out.exit_code(), EXIT_OK, "{}", out.report());
    }
}
