//! The differential test of Go templates: every case of the corpus
//! (`tests/gotemplate/corpus.json` at the workspace root) is rendered here
//! and compared with what real Go (`text/template` + Sprig v3.3.0, the
//! oracle in `tests/gotemplate/main.go`) rendered, stored in
//! `tests/gotemplate/expected.json` (rebuilt by `tests/gotemplate/bless.sh`).
//!
//! A case passes when the output is byte-identical, when both Go and this
//! engine fail at the same stage (parsing or executing), or, for a case marked `deliberate` in the corpus (with the
//! reason), when this engine refuses it with a clear message.

use std::path::PathBuf;

use kms_template::{Engine, ErrorKind, Limits, SecretData, SecretEntry};
use serde_json::Value;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/gotemplate")
}

fn load(name: &str) -> Value {
    let path = corpus_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn data_of(value: &Value) -> SecretData {
    let mut data = SecretData::new();
    for (key, entry) in value.as_object().unwrap() {
        let v = entry["value"].as_str().unwrap_or_default();
        // The corpus writes bytes that are not UTF-8 as U+0000–U+00FF
        // escapes; Go reads them as UTF-8 too, so keep the UTF-8 bytes.
        data.insert(
            key.clone(),
            SecretEntry::new(
                v.as_bytes(),
                entry["secretPath"].as_str().unwrap_or_default(),
            ),
        );
    }
    data
}

fn expected_bytes(result: &Value) -> Option<Vec<u8>> {
    if result.get("error").is_some() {
        return None;
    }
    if let Some(b64) = result.get("outputBase64").and_then(Value::as_str) {
        use base64::Engine as _;
        return Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
        );
    }
    Some(
        result
            .get("output")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .as_bytes()
            .to_vec(),
    )
}

#[test]
fn go_templates_render_as_go_renders_them() {
    let corpus = load("corpus.json");
    let expected = load("expected.json");
    let cases = corpus["cases"].as_array().unwrap();
    let results = expected.as_array().unwrap();
    assert_eq!(
        cases.len(),
        results.len(),
        "expected.json is stale: run tests/gotemplate/bless.sh"
    );
    let default_data = data_of(&corpus["data"]);
    let engine = Engine::new(Limits::default());

    let (mut identical, mut both_fail, mut refused) = (0, 0, 0);
    let mut failures = Vec::new();
    for (case, result) in cases.iter().zip(results) {
        let name = case["name"].as_str().unwrap();
        assert_eq!(
            result["name"].as_str(),
            Some(name),
            "expected.json is stale: run bless.sh"
        );
        let template = case["template"].as_str().unwrap();
        let data = case
            .get("data")
            .map_or_else(|| default_data.clone(), data_of);
        let ours = engine.render_go_bytes("template.data.case", template, &data);
        if let Err(e) = &ours {
            // Errors never carry a secret value.
            for entry in data.values() {
                let value = String::from_utf8_lossy(&entry.value);
                if value.len() >= 4 {
                    assert!(
                        !e.message.contains(value.as_ref()),
                        "{name}: error shows a secret: {e}"
                    );
                }
            }
        }
        let deliberate = case.get("deliberate").and_then(Value::as_str);
        match (deliberate, expected_bytes(result), ours) {
            (Some(reason), _, Err(e)) => {
                let func = template
                    .trim_start_matches("{{")
                    .split_whitespace()
                    .next()
                    .unwrap_or_default();
                let clear = if reason.contains("missing key") {
                    e.message.contains("missing key")
                } else {
                    e.message.contains(&format!("{func:?}"))
                        && (e.message.contains("refused") || e.message.contains("unsupported"))
                };
                if clear {
                    refused += 1;
                } else {
                    failures.push(format!("{name}: refused without a clear message: {e}"));
                }
            }
            (Some(_), _, Ok(out)) => failures.push(format!(
                "{name}: marked deliberate but rendered {:?}",
                String::from_utf8_lossy(&out)
            )),
            (None, None, Err(e)) => {
                // Both fail, and at the same stage: Go's parse errors are
                // ours too, and so are its execution errors.
                let go_parse = !result["error"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("executing \"");
                let ours_parse = matches!(e.kind, ErrorKind::Syntax | ErrorKind::UnknownFunction);
                if go_parse == ours_parse {
                    both_fail += 1;
                } else {
                    failures.push(format!(
                        "{name}: Go fails {} ({}), we fail {} ({e})",
                        if go_parse { "parsing" } else { "executing" },
                        result["error"].as_str().unwrap_or_default(),
                        if ours_parse { "parsing" } else { "executing" },
                    ));
                }
            }
            (None, None, Ok(out)) => failures.push(format!(
                "{name}: Go fails ({}), we rendered {:?}",
                result["error"].as_str().unwrap_or_default(),
                String::from_utf8_lossy(&out)
            )),
            (None, Some(want), Ok(out)) if out == want => identical += 1,
            (None, Some(want), Ok(out)) => failures.push(format!(
                "{name}: want {:?}, got {:?}",
                String::from_utf8_lossy(&want),
                String::from_utf8_lossy(&out)
            )),
            (None, Some(want), Err(e)) => failures.push(format!(
                "{name}: want {:?}, got error {e}",
                String::from_utf8_lossy(&want)
            )),
        }
    }
    let total = cases.len();
    let passed = identical + both_fail + refused;
    eprintln!(
        "Go-template corpus: {total} cases, {passed} pass ({identical} byte-identical, \
         {both_fail} fail in both, {refused} refused on purpose), {} differ",
        failures.len()
    );
    for f in &failures {
        eprintln!("  {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {total} cases differ from Go",
        failures.len()
    );
}
