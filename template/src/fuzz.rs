//! Property-based fuzzing of the engine with templates built from its own
//! syntax and helpers and from random text, over random secrets: a render
//! never panics, and its output respects the output limit. The shapes of
//! the hostile templates that once stalled or crashed the operator (huge
//! sizes, shared lists walked exponentially, costly key derivations,
//! `fail` with a secret) are seeds among the fragments. Runs on stable
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

/// Hostile shapes: each a whole template, or a piece that builds a huge
/// or shared value (`$s`, `$c`, `$a`, `ns.c`) for the fragments after it.
const SEEDS: &[&str] = &[
    "{{ indent 100000000000 \"x\" }}",
    "{{ nindent 3000000000 \"x\" }}",
    "{{ indent 9223372036854775807 \"x\" }}",
    "{{ range until 5000 }}{{ $_ := printf \"%1048576d\" 1 }}{{ end }}",
    "{{ join (repeat 60000 \"x\") (until 100000) }}",
    "{{ $s := repeat 1048576 \"x\" }}",
    "{{ $s := repeat 1048576 \"x\" }}{{ regexReplaceAllLiteral \"\" $s \"yy\" }}",
    "{{ $c := list (repeat 1048576 \"x\") }}{{ range until 10 }}{{ $c = list $c $c }}{{ end }}",
    "{{ $a := list \"x\" }}{{ range until 40 }}{{ $a = list $a $a }}{{ end }}",
    "{{ $_ := set (dict) \"k\" $a }}",
    "{{ deepEqual $a $c }}",
    "{{ toJson $c }}{{ quote $c }}{{ $c }}",
    "{{ sha512sum $s }}",
    "{{ $b := decodeBase64ToBytes .P.Value }}{{ range until 100000 }}{{ $_ := pkcs12certPass \"pw\" $b }}{{ end }}",
    "{{ fail (upper .A.Value) }}",
    "{{ .A.Value | b64enc | fail }}",
    "{% set ns = namespace(c=['x' * 1048576]) %}{% for i in range(10) %}{% set ns.c = [ns.c, ns.c] %}{% endfor %}",
    "{{ toJson(ns.c) }}{{ upper(ns.c) }}",
];

fn template() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        8 => fragment(),
        1 => prop::sample::select(SEEDS).prop_map(str::to_owned),
    ];
    prop::collection::vec(part, 0..24).prop_map(|parts| parts.concat())
}

/// A PKCS#12 bundle whose MAC asks for 1,000,000 key-derivation
/// iterations (its content is empty), base64.
const COSTLY_BUNDLE: &str = "MFgCAQMwEQYJKoZIhvcNAQcBoAQEAjAAMEAwLzALBglghkgBZQMEAgEEIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAgBAQEBAQEBAQIDD0JA";

fn secrets() -> impl Strategy<Value = SecretData> {
    let value = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..48),
        ".{0,32}".prop_map(String::into_bytes),
        Just(b"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t".to_vec()),
        Just(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec()),
        Just(b"{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"AA\",\"y\":\"AA\"}".to_vec()),
        Just(COSTLY_BUNDLE.as_bytes().to_vec()),
    ];
    prop::collection::btree_map(
        prop_oneof![
            Just("A".to_owned()),
            Just("B".to_owned()),
            Just("P".to_owned()),
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
