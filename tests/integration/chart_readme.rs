//! The chart's README lists every documented value of `values.yaml` (the
//! `# -- ` comments) with its default, in a table generated from the file,
//! so the two cannot drift. `KMS_BLESS=1 cargo test --test integration
//! chart_readme` rewrites the table. No cluster is needed.

use std::path::PathBuf;

use crate::harness;

const BEGIN: &str = "<!-- values:begin (generated from values.yaml by the chart_readme test) -->";
const END: &str = "<!-- values:end -->";

/// One documented value: its dotted path, its default as written, and its
/// description.
#[derive(Debug, PartialEq)]
struct Documented {
    path: String,
    default: String,
    description: String,
}

/// The documented values of a values file: each `# -- ` comment (and the
/// comment lines that continue it) describes the key on the next line;
/// paths follow the indentation.
fn documented(values: &str) -> Vec<Documented> {
    let mut out = Vec::new();
    let mut parents: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in values.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if let Some(comment) = text.strip_prefix("# --") {
            pending = Some(comment.trim().to_owned());
            continue;
        }
        if let Some(more) = text.strip_prefix('#') {
            let more = more.trim();
            // A key left unset, documented above its commented-out line.
            let unset = more.split_once(':').filter(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            match (pending.take(), unset) {
                (Some(description), Some((key, default))) => {
                    while parents.last().is_some_and(|(i, _)| *i >= indent) {
                        parents.pop();
                    }
                    let path = parents
                        .iter()
                        .map(|(_, k)| k.as_str())
                        .chain([key])
                        .collect::<Vec<_>>()
                        .join(".");
                    out.push(Documented {
                        path,
                        default: format!("unset (e.g. {})", default.trim()),
                        description: without_type_hint(description),
                    });
                }
                (Some(mut description), None) => {
                    description.push(' ');
                    description.push_str(more);
                    pending = Some(description);
                }
                (None, _) => {}
            }
            continue;
        }
        if text.is_empty() || text.starts_with('-') {
            pending = None;
            continue;
        }
        let Some((key, rest)) = text.split_once(':') else {
            continue;
        };
        while parents.last().is_some_and(|(i, _)| *i >= indent) {
            parents.pop();
        }
        let key = key.trim().trim_matches('"').to_owned();
        let path = parents
            .iter()
            .map(|(_, k)| k.as_str())
            .chain([key.as_str()])
            .collect::<Vec<_>>()
            .join(".");
        if let Some(description) = pending.take() {
            let default = match rest.trim() {
                "" => "(see values.yaml)".to_owned(),
                v => v.to_owned(),
            };
            out.push(Documented {
                path: path.clone(),
                default,
                description: without_type_hint(description),
            });
        }
        if rest.trim().is_empty() {
            parents.push((indent, key));
        }
    }
    out
}

/// A description without its leading type hint (`(int) …`), which only
/// values left unset carry.
fn without_type_hint(description: String) -> String {
    description
        .strip_prefix('(')
        .and_then(|d| d.split_once(") "))
        .map_or(description.clone(), |(_, d)| d.to_owned())
}

fn table(values: &[Documented]) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from("| value | default | description |\n|---|---|---|\n");
    for v in values {
        out.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            v.path,
            cell(&v.default),
            cell(&v.description)
        ));
    }
    out
}

#[test]
fn the_chart_readme_lists_every_documented_value() {
    let chart = harness::repo().join("helm/secrets-operator");
    let values = std::fs::read_to_string(chart.join("values.yaml")).unwrap();
    let documented = documented(&values);
    assert!(
        documented.len() > 60,
        "only {} values read",
        documented.len()
    );
    let want = table(&documented);
    let path: PathBuf = chart.join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = readme.split_once(BEGIN).expect("the values markers");
    let (current, tail) = rest.split_once(END).expect("the end marker");
    if current.trim() == want.trim() {
        return;
    }
    if std::env::var_os("KMS_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{BEGIN}\n{want}{END}{tail}")).unwrap();
        return;
    }
    panic!(
        "helm/secrets-operator/README.md's values table is stale; run \
         KMS_BLESS=1 cargo test --test integration chart_readme"
    );
}

#[test]
fn documented_values_are_read_with_their_paths() {
    let yaml = "# -- Top.\ntop: 1\nparent:\n  # -- A child,\n  # on two lines.\n  child: \"x\"\n  list:\n    # -- Not a key.\n    - a\n  # -- (int) Unset.\n  # unset: 3\n  after: {}\n";
    let got = documented(yaml);
    let paths: Vec<&str> = got.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(paths, ["top", "parent.child", "parent.unset"], "{got:#?}");
    assert_eq!(got[1].description, "A child, on two lines.");
    assert_eq!(got[1].default, "\"x\"");
    assert_eq!(got[2].description, "Unset.");
    assert_eq!(got[2].default, "unset (e.g. 3)");
}

/// The `artifacthub.io/changes` of a version: one entry per top-level item
/// of its section in CHANGELOG.md (`changed` under "Breaking", `fixed`
/// under "Fixed", `added` otherwise), its text on one line without the
/// Markdown emphasis and links.
fn changes(changelog: &str, version: &str) -> Vec<(&'static str, String)> {
    let heading = format!("## {version}");
    let mut section = changelog
        .split("\n## ")
        .map(|s| format!("## {s}"))
        .filter(|s| {
            s.lines()
                .next()
                .is_some_and(|l| l == heading || l.starts_with(&format!("{heading} ")))
        });
    let section = section
        .next()
        .unwrap_or_else(|| panic!("CHANGELOG.md has no section {heading}"));
    let link = regex::Regex::new(r"\[([^\]]+)\]\([^)]+\)").unwrap();
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let mut kind = "added";
    for line in section.lines().skip(1) {
        if line.starts_with("**") && line.ends_with(":**") {
            kind = if line.starts_with("**Breaking") {
                "changed"
            } else if line.starts_with("**Fixed") {
                "fixed"
            } else {
                "added"
            };
        } else if let Some(item) = line.strip_prefix("- ") {
            out.push((kind, item.to_owned()));
        } else if line.starts_with("  ")
            && !line.trim().is_empty()
            && let Some((_, text)) = out.last_mut()
        {
            text.push(' ');
            text.push_str(line.trim());
        }
    }
    out.into_iter()
        .map(|(k, t)| (k, link.replace_all(&t, "$1").replace("**", "")))
        .collect()
}

fn changes_yaml(changes: &[(&'static str, String)]) -> String {
    let mut out = String::new();
    for (kind, description) in changes {
        out.push_str(&format!(
            "    - kind: {kind}\n      description: {}\n",
            serde_json::to_string(description).unwrap()
        ));
    }
    out
}

/// Chart.yaml's Artifact Hub annotations say what this version is: the
/// image is the one the chart deploys by default, at the chart's
/// appVersion, and the changes are CHANGELOG.md's for the chart's version.
#[test]
fn artifact_hub_annotations_follow_the_changelog_and_the_image() {
    let chart = harness::repo().join("helm/secrets-operator");
    let path = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let meta: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let values: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap())
            .unwrap();
    let images: serde_json::Value = serde_saphyr::from_str(
        meta["annotations"]["artifacthub.io/images"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let repository = values["controllerManager"]["manager"]["image"]["repository"]
        .as_str()
        .unwrap();
    assert_eq!(
        images[0]["image"].as_str().unwrap(),
        format!("{repository}:{}", meta["appVersion"].as_str().unwrap()),
        "artifacthub.io/images names another image than the chart deploys"
    );
    let changelog = std::fs::read_to_string(harness::repo().join("CHANGELOG.md")).unwrap();
    let want = changes(&changelog, meta["version"].as_str().unwrap());
    assert!(want.len() >= 10, "{want:#?}");
    let key = "  artifacthub.io/changes: |\n";
    let (head, rest) = text.split_once(key).expect("artifacthub.io/changes");
    let end = rest
        .lines()
        .position(|l| !l.starts_with("    "))
        .unwrap_or(rest.lines().count());
    let current: String = rest.lines().take(end).map(|l| format!("{l}\n")).collect();
    let tail: String = rest.lines().skip(end).map(|l| format!("{l}\n")).collect();
    let expected = changes_yaml(&want);
    if current == expected {
        let parsed: serde_json::Value = serde_saphyr::from_str(
            meta["annotations"]["artifacthub.io/changes"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(parsed.as_array().unwrap().len(), want.len());
        return;
    }
    if std::env::var_os("KMS_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{key}{expected}{tail}")).unwrap();
        return;
    }
    panic!(
        "helm/secrets-operator/Chart.yaml's artifacthub.io/changes is not CHANGELOG.md's; run \
         KMS_BLESS=1 cargo test --test integration chart_readme"
    );
}

#[test]
fn changes_are_read_per_item_with_their_kind() {
    let log = "# C\n\n## 1.1.0\n\n- x\n\n## 1.0.0 (unreleased)\n\nIntro.\n\n**Breaking:**\n\n- **A** is\n  gone, see [docs](d.md).\n\n**New:**\n\n- B.\n\n**Fixed:**\n\n- C.\n";
    assert_eq!(
        changes(log, "1.0.0"),
        [
            ("changed", "A is gone, see docs.".to_owned()),
            ("added", "B.".to_owned()),
            ("fixed", "C.".to_owned())
        ]
    );
}
