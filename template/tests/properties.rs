//! Property tests: random templates and random inputs never panic, never
//! exceed the limits and never put a secret value into an error message.

mod common;

use kms_template::{Engine, ErrorKind, Limits, SecretData, SecretEntry, helper_names};
use proptest::prelude::*;

const SECRET: &str = "Zq9-secret-marker-XY";

fn limits() -> Limits {
    Limits {
        template_bytes: 4096,
        output_bytes: 64 * 1024,
        fuel: 20_000,
        recursion: 32,
        ..Limits::default()
    }
}

fn secrets(value: Vec<u8>) -> SecretData {
    let mut d = SecretData::new();
    d.insert("A".into(), SecretEntry::new(SECRET, "/a"));
    d.insert("B".into(), SecretEntry::new(value, "/b"));
    d.insert("my-key".into(), SecretEntry::new("x,y,z", "/"));
    d
}

fn fragment() -> impl Strategy<Value = String> {
    let names: Vec<String> = helper_names().into_iter().map(str::to_owned).collect();
    prop_oneof![
        Just("{{ ".to_owned()),
        Just(" }}".to_owned()),
        Just("{% for x in ".to_owned()),
        Just(" %}".to_owned()),
        Just("{% endfor %}".to_owned()),
        Just("{% if ".to_owned()),
        Just("{% endif %}".to_owned()),
        Just("{% set ns = namespace(v=[]) %}".to_owned()),
        Just("{% set ns.v = [ns.v] %}".to_owned()),
        Just("A.Value".to_owned()),
        Just("B.Value".to_owned()),
        Just("A.SecretPath".to_owned()),
        Just("secrets[\"my-key\"].Value".to_owned()),
        Just("secrets".to_owned()),
        Just(" | ".to_owned()),
        Just("(".to_owned()),
        Just(")".to_owned()),
        Just(", ".to_owned()),
        Just(" ~ ".to_owned()),
        Just(" * ".to_owned()),
        Just("range(".to_owned()),
        Just("'x'".to_owned()),
        Just("\"-----BEGIN CERTIFICATE-----\\nAAAA\\n-----END CERTIFICATE-----\"".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("dict(\"k\", 1)".to_owned()),
        Just(".".to_owned()),
        Just("$".to_owned()),
        Just("\n".to_owned()),
        (0i64..100_000).prop_map(|n| n.to_string()),
        "[a-z ]{0,6}",
        proptest::sample::select(names).prop_map(|n| n.to_owned()),
    ]
}

fn template() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..24).prop_map(|parts| parts.concat())
}

fn check(result: Result<Vec<u8>, kms_template::TemplateError>, limits: &Limits) {
    match result {
        Ok(out) => assert!(out.len() <= limits.output_bytes),
        Err(err) => {
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains(SECRET), "secret in error: {shown}");
            assert!(!err.field.is_empty());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn random_templates_never_panic(source in template(), value in prop::collection::vec(any::<u8>(), 0..64)) {
        let limits = limits();
        let engine = Engine::new(limits.clone());
        check(engine.render_bytes("template.data.p", &source, &secrets(value)), &limits);
        let _ = engine.check("template.data.p", &source);
    }

    #[test]
    fn random_inputs_to_every_helper(
        name in proptest::sample::select(helper_names()),
        value in prop::collection::vec(any::<u8>(), 0..256),
        text in ".{0,40}",
    ) {
        let limits = limits();
        let engine = Engine::new(limits.clone());
        let mut d = secrets(value);
        d.insert("T".into(), SecretEntry::new(text, "/"));
        for source in [
            format!("{{{{ {name}(B.Value) }}}}"),
            format!("{{{{ B.Value | {name} }}}}"),
            format!("{{{{ {name}(T.Value, B.Value) }}}}"),
            format!("{{{{ B.Value | {name}(T.Value) }}}}"),
            format!("{{{{ {name}(A.Value, T.Value, B.Value) }}}}"),
            format!("{{{{ {name}() }}}}"),
            format!("{{{{ {name}(B.Value | b64enc) | {name} }}}}"),
        ] {
            check(engine.render_bytes("template.data.p", &source, &d), &limits);
        }
    }

    #[test]
    fn filter_form_equals_function_form(s in ".{0,40}", sep in "[,;: ]") {
        let engine = Engine::new(limits());
        let mut d = SecretData::new();
        d.insert("S".into(), SecretEntry::new(s, "/"));
        d.insert("P".into(), SecretEntry::new(sep, "/"));
        for (function, filter) in [
            ("b64enc(S.Value)", "S.Value | b64enc"),
            ("upper(S.Value)", "S.Value | upper"),
            ("quote(S.Value)", "S.Value | quote"),
            ("sha256sum(S.Value)", "S.Value | sha256sum"),
            ("trimPrefix(P.Value, S.Value)", "S.Value | trimPrefix(P.Value)"),
            ("join(P.Value, split(P.Value, S.Value))", "S.Value | split(P.Value) | join(P.Value)"),
            ("indent(2, S.Value)", "S.Value | indent(2)"),
            ("toJson(S.Value)", "S.Value | toJson"),
            ("b64dec(b64enc(S.Value))", "S.Value | b64enc | b64dec"),
        ] {
            let a = engine.render("f", &format!("{{{{ {function} }}}}"), &d).unwrap();
            let b = engine.render("f", &format!("{{{{ {filter} }}}}"), &d).unwrap();
            prop_assert_eq!(&a, &b);
        }
        let round = engine.render("f", "{{ S.Value | b64enc | b64dec }}", &d).unwrap();
        prop_assert_eq!(round.as_bytes(), d["S"].value.as_slice());
        let joined = engine.render("f", "{{ S.Value | split(P.Value) | join(P.Value) }}", &d).unwrap();
        prop_assert_eq!(joined.as_bytes(), d["S"].value.as_slice());
    }
}

#[test]
fn runaway_templates_stop_with_a_clear_error() {
    let engine = Engine::new(Limits::default());
    let d = secrets(vec![]);
    for source in [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
        "{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = [ns.v, ns.v] %}{% endfor %}",
        "{% macro m(n) %}{{ m(n) ~ m(n) }}{% endmacro %}{{ m(1) }}",
        "{{ A.Value * 100000000 }}",
    ] {
        let started = std::time::Instant::now();
        let err = engine.render("template.data.loop", source, &d).unwrap_err();
        assert!(
            matches!(
                err.kind,
                ErrorKind::OutOfFuel | ErrorKind::Render | ErrorKind::OutputTooLarge
            ),
            "{source}: {err}"
        );
        assert!(
            started.elapsed().as_secs() < 20,
            "{source} took {:?}",
            started.elapsed()
        );
        assert!(err.to_string().starts_with("template.data.loop"), "{err}");
    }
}
