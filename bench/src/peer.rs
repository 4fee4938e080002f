//! The command that starts one operator replica: kms-operator's own
//! command line by default, or a template given with `--operator-cmd` so
//! that another operator speaking the same KMS API can be measured the same
//! way. A template is split into words like a shell would (spaces separate,
//! single and double quotes group, backslash escapes) and then placeholders
//! are filled in each word: `{bin}`, `{kubeconfig}`, `{namespace}` (the
//! operator's own namespace), `{pod}`, `{kms_url}`, `{cache_dir}`,
//! `{metrics_addr}`, `{health_addr}`, `{lease_prefix}`, `{shards}`, `{key_file}`
//! (a 32-byte key for the cache's token encryption).
//! No shell runs the result, so the process started is the operator itself
//! (its PID is the one measured).

use std::collections::BTreeMap;

use anyhow::bail;

/// kms-operator's own command line.
pub const DEFAULT_TEMPLATE: &str = "{bin} --log-format json --log-level info run \
--pod-name {pod} --pod-namespace {namespace} --lease-prefix {lease_prefix} \
--shards {shards} --cache-dir {cache_dir} --cache-encryption-key-file {key_file} \
--metrics-addr {metrics_addr} --health-addr {health_addr} --expected-replicas {replicas}";

/// The placeholders a template may use.
pub const PLACEHOLDERS: [&str; 12] = [
    "bin",
    "kubeconfig",
    "namespace",
    "pod",
    "kms_url",
    "cache_dir",
    "metrics_addr",
    "health_addr",
    "lease_prefix",
    "shards",
    "key_file",
    "replicas",
];

/// Split `template` into words: whitespace separates, `'…'` keeps
/// everything literally, `"…"` keeps everything but `\"` and `\\`, a
/// backslash outside quotes escapes the next character.
pub fn split_words(template: &str) -> anyhow::Result<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => bail!("unclosed ' in the operator command"),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(x @ ('"' | '\\')) => cur.push(x),
                            Some(x) => {
                                cur.push('\\');
                                cur.push(x);
                            }
                            None => bail!("unclosed \" in the operator command"),
                        },
                        Some(x) => cur.push(x),
                        None => bail!("unclosed \" in the operator command"),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(x) => cur.push(x),
                    None => bail!("trailing backslash in the operator command"),
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Fill the placeholders of `word`; an unknown `{name}` is an error (so a
/// typo does not start an operator with a literal `{pdo}`).
pub fn fill(word: &str, values: &BTreeMap<&str, String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else {
            bail!("unclosed {{ in {word:?}");
        };
        let name = &after[..end];
        match values.get(name) {
            Some(v) => out.push_str(v),
            None => bail!(
                "unknown placeholder {{{name}}} in the operator command (known: {})",
                PLACEHOLDERS.join(", ")
            ),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The program and arguments of `template` with `values` filled in.
pub fn render(template: &str, values: &BTreeMap<&str, String>) -> anyhow::Result<Vec<String>> {
    let words = split_words(template)?;
    if words.is_empty() {
        bail!("the operator command is empty");
    }
    words.iter().map(|w| fill(w, values)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> BTreeMap<&'static str, String> {
        PLACEHOLDERS
            .iter()
            .map(|p| (*p, format!("<{p}>")))
            .collect()
    }

    #[test]
    fn default_template_renders_every_flag() {
        let argv = render(DEFAULT_TEMPLATE, &values()).unwrap();
        assert_eq!(argv[0], "<bin>");
        assert!(argv.windows(2).any(|w| w == ["--pod-name", "<pod>"]));
        assert!(argv.windows(2).any(|w| w == ["--cache-dir", "<cache_dir>"]));
        assert!(
            argv.windows(2)
                .any(|w| w == ["--expected-replicas", "<replicas>"])
        );
        assert!(
            argv.windows(2)
                .any(|w| w == ["--health-addr", "<health_addr>"])
        );
        assert!(!argv.iter().any(|a| a.contains('{')));
    }

    #[test]
    fn words_and_quotes() {
        assert_eq!(
            split_words(r#"  a "b c" 'd "e"' f\ g "h\"i" x"y"z '' "#).unwrap(),
            vec!["a", "b c", "d \"e\"", "f g", "h\"i", "xyz", ""]
        );
        assert!(split_words("a 'b").is_err());
        assert!(split_words("a \"b").is_err());
        assert!(split_words("a \\").is_err());
        assert!(split_words("   ").unwrap().is_empty());
    }

    #[test]
    fn placeholders_inside_words() {
        let argv = render(
            "/opt/peer --kubeconfig={kubeconfig} -e 'KMS={kms_url}/x' {pod}-{shards}",
            &values(),
        )
        .unwrap();
        assert_eq!(
            argv,
            vec![
                "/opt/peer",
                "--kubeconfig=<kubeconfig>",
                "-e",
                "KMS=<kms_url>/x",
                "<pod>-<shards>"
            ]
        );
    }

    #[test]
    fn unknown_or_broken_placeholders_are_errors() {
        assert!(render("x {pdo}", &values()).is_err());
        assert!(render("x {pod", &values()).is_err());
        assert!(render("", &values()).is_err());
    }
}
