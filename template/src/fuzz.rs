//! Property-based fuzzing of the engine with templates built from its own
//! syntax and helpers and from random text, over random secrets: a render
//! never panics, and its output respects the output limit. Runs on stable
//! Rust with proptest: `FUZZ_CASES` cases (256 by default, as in CI;
//! `FUZZ_CASES=100000 cargo test --release -p kms-template fuzz` for a long
//! run, see docs/testing.md).

use proptest::prelude::*;

use crate::engine::HELPERS;
use crate::{Engine, SecretData, SecretEntry};

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// A piece of template: syntax, names of secrets and helpers, literals, or
/// random text.
fn fragment() -> impl Strategy<Value = String> {
    let helper = prop::sample::select(HELPERS.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    prop_oneof![
        prop::sample::select(vec![
            "{{ ",
            " }}",
            "{% ",
            " %}",
            "{#",
            "#}",
            "{{- ",
            " -}}",
            "|",
            "(",
            ")",
            ",",
            ".Value",
            ".SecretPath",
            "A",
            "B",
            "secrets[\"k-1\"]",
            "[0]",
            "for x in ",
            " endfor",
            "if ",
            " else ",
            " endif",
            "set y = ",
            " in ",
            "range",
            "\"pw\"",
            "'x'",
            "42",
            "-1",
            "1e309",
            "~",
            "*",
            "**",
            "dict(a=1)",
            "{{ .A.Value }}",
            "loop.index",
        ])
        .prop_map(str::to_owned),
        helper.prop_map(str::to_owned),
        ".{0,8}",
    ]
}

fn template() -> impl Strategy<Value = String> {
    prop::collection::vec(fragment(), 0..24).prop_map(|parts| parts.concat())
}

fn secrets() -> impl Strategy<Value = SecretData> {
    let value = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..48),
        ".{0,32}".prop_map(String::into_bytes),
        Just(b"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t".to_vec()),
        Just(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec()),
        Just(b"{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"AA\",\"y\":\"AA\"}".to_vec()),
    ];
    prop::collection::btree_map(
        prop_oneof![
            Just("A".to_owned()),
            Just("B".to_owned()),
            Just("k-1".to_owned()),
            "[A-Z_]{1,4}"
        ],
        (value, prop_oneof![Just("/".to_owned()), "/[a-z]{1,4}"])
            .prop_map(|(v, p)| SecretEntry::new(v, p)),
        0..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn fuzz_templates_never_panic_and_stay_within_the_output_limit(
        source in template(),
        data in secrets(),
    ) {
        let engine = Engine::default();
        let limit = engine.limits().output_bytes;
        if let Ok(out) = engine.render_bytes("fuzz", &source, &data) {
            prop_assert!(out.len() <= limit, "{} bytes", out.len());
        }
        if let Ok(out) = engine.render("fuzz", &source, &data) {
            prop_assert!(out.len() <= limit, "{} bytes", out.len());
        }
        let _ = engine.check("fuzz", &source);
    }
}
