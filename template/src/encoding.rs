//! Encoding helpers: base64, hashes, JSON and YAML.
//!
//! JSON output matches Go's `encoding/json` as Sprig uses it: map keys
//! sorted, `<`, `>` and `&` escaped as `\u003c`… in `toJson`/`toPrettyJson`
//! (`toRawJson` leaves them), two-space indentation for `toPrettyJson`.
//! Values are converted with a depth limit so a deeply nested value cannot
//! exhaust the stack.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use minijinja::value::ValueKind;
use minijinja::{Error, State, Value};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::args::{arity, binary, charge, defined, fail, text, text_or_bytes};

/// Deepest nesting converted to or from JSON/YAML.
pub(crate) const MAX_DEPTH: usize = 64;

/// Standard alphabet; padding optional on input, written on output.
const STANDARD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes standard base64; line breaks and surrounding blanks are ignored
/// (as Go's decoder ignores `\r` and `\n`). The error never shows the input.
pub(crate) fn decode_base64(func: &str, input: &[u8]) -> Result<Vec<u8>, Error> {
    let cleaned: Vec<u8> = input
        .iter()
        .copied()
        .filter(|b| !matches!(b, b'\r' | b'\n' | b' ' | b'\t'))
        .collect();
    STANDARD
        .decode(&cleaned)
        .map_err(|_| fail(func, "the input is not valid base64"))
}

pub(crate) fn encode_base64(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// `decodeBase64ToBytes(b64)`: the decoded bytes (a bytes value).
pub(crate) fn decode_base64_to_bytes(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("decodeBase64ToBytes", args, 1, 1)?;
    let input = binary(state, "decodeBase64ToBytes", "the input", &args[0])?;
    Ok(Value::from_bytes(decode_base64(
        "decodeBase64ToBytes",
        input,
    )?))
}

fn encode_with(state: &State, func: &str, args: &[Value]) -> Result<Value, Error> {
    arity(func, args, 1, 1)?;
    let input = binary(state, func, "the input", &args[0])?;
    charge(state, input.len() * 4 / 3)?;
    Ok(Value::from(encode_base64(input)))
}

/// `encodeBase64(plain)`.
pub(crate) fn encode_base64_fn(state: &State, args: &[Value]) -> Result<Value, Error> {
    encode_with(state, "encodeBase64", args)
}

/// `b64enc(plain)` (Sprig).
pub(crate) fn b64enc(state: &State, args: &[Value]) -> Result<Value, Error> {
    encode_with(state, "b64enc", args)
}

/// `b64dec(b64)` (Sprig): text when the result is UTF-8, bytes otherwise.
/// Unlike Sprig, bad input is an error rather than the error text.
pub(crate) fn b64dec(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("b64dec", args, 1, 1)?;
    let input = binary(state, "b64dec", "the input", &args[0])?;
    Ok(text_or_bytes(decode_base64("b64dec", input)?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256sum(s)`: lowercase hex.
pub(crate) fn sha256sum(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("sha256sum", args, 1, 1)?;
    let input = binary(state, "sha256sum", "the input", &args[0])?;
    Ok(Value::from(hex(&Sha256::digest(input))))
}

/// `sha1sum(s)`: lowercase hex.
pub(crate) fn sha1sum(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("sha1sum", args, 1, 1)?;
    let input = binary(state, "sha1sum", "the input", &args[0])?;
    Ok(Value::from(hex(&Sha1::digest(input))))
}

/// Converts a template value to JSON, refusing what JSON cannot hold.
pub(crate) fn to_json_value(
    state: &State,
    func: &str,
    value: &Value,
    depth: usize,
) -> Result<serde_json::Value, Error> {
    if depth > MAX_DEPTH {
        return Err(fail(
            func,
            format!("the value is nested more than {MAX_DEPTH} levels deep"),
        ));
    }
    defined(state, value)?;
    Ok(match value.kind() {
        ValueKind::None | ValueKind::Undefined => serde_json::Value::Null,
        ValueKind::Bool => serde_json::Value::Bool(value.is_true()),
        ValueKind::Number => {
            if let Ok(n) = i64::try_from(value.clone()) {
                serde_json::Value::from(n)
            } else if let Ok(n) = u64::try_from(value.clone()) {
                serde_json::Value::from(n)
            } else {
                let f = f64::try_from(value.clone())
                    .map_err(|_| fail(func, "a number is out of range"))?;
                serde_json::Number::from_f64(f)
                    .map(serde_json::Value::Number)
                    .ok_or_else(|| fail(func, "NaN and infinity have no JSON form"))?
            }
        }
        ValueKind::String => serde_json::Value::String(value.as_str().unwrap_or("").to_owned()),
        // Go's json.Marshal writes []byte as base64.
        ValueKind::Bytes => {
            let bytes = value.as_bytes().unwrap_or_default();
            match std::str::from_utf8(bytes) {
                Ok(text) => serde_json::Value::String(text.to_owned()),
                Err(_) => serde_json::Value::String(encode_base64(bytes)),
            }
        }
        ValueKind::Map => {
            let mut map = serde_json::Map::new();
            for key in value
                .try_iter()
                .map_err(|_| fail(func, "a map cannot be read"))?
            {
                let item = value
                    .get_item(&key)
                    .map_err(|_| fail(func, "a map cannot be read"))?;
                let key = text(state, func, "a map key", &key)?.into_owned();
                map.insert(key, to_json_value(state, func, &item, depth + 1)?);
            }
            serde_json::Value::Object(map)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let mut list = Vec::new();
            for item in value
                .try_iter()
                .map_err(|_| fail(func, "a list cannot be read"))?
            {
                list.push(to_json_value(state, func, &item, depth + 1)?);
            }
            serde_json::Value::Array(list)
        }
        kind => return Err(fail(func, format!("a {kind} has no JSON form"))),
    })
}

/// Converts parsed JSON (or YAML) into a template value.
pub(crate) fn from_json_value(value: serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s),
        serde_json::Value::Array(items) => Value::from_iter(items.into_iter().map(from_json_value)),
        serde_json::Value::Object(map) => Value::from(
            map.into_iter()
                .map(|(k, v)| (k, from_json_value(v)))
                .collect::<BTreeMap<String, Value>>(),
        ),
    }
}

/// Go's `encoding/json` escapes `<`, `>`, `&`, U+2028 and U+2029. These
/// characters can only occur inside JSON strings, so replacing them in the
/// serialized text is safe.
fn go_html_escape(json: String) -> String {
    if !json.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

fn json_out(
    state: &State,
    func: &str,
    args: &[Value],
    pretty: bool,
    escape: bool,
) -> Result<Value, Error> {
    arity(func, args, 1, 1)?;
    let json = to_json_value(state, func, &args[0], 0)?;
    let out = if pretty {
        serde_json::to_string_pretty(&json)
    } else {
        serde_json::to_string(&json)
    }
    .map_err(|_| fail(func, "the value cannot be written as JSON"))?;
    Ok(Value::from(if escape { go_html_escape(out) } else { out }))
}

/// `toJson(v)`.
pub(crate) fn to_json(state: &State, args: &[Value]) -> Result<Value, Error> {
    json_out(state, "toJson", args, false, true)
}

/// `toRawJson(v)`: like `toJson` without HTML escaping.
pub(crate) fn to_raw_json(state: &State, args: &[Value]) -> Result<Value, Error> {
    json_out(state, "toRawJson", args, false, false)
}

/// `toPrettyJson(v)`.
pub(crate) fn to_pretty_json(state: &State, args: &[Value]) -> Result<Value, Error> {
    json_out(state, "toPrettyJson", args, true, true)
}

/// `fromJson(s)`. Unlike Sprig (which returns an empty map), invalid JSON is
/// an error; the error gives the position, never the text.
pub(crate) fn from_json(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("fromJson", args, 1, 1)?;
    let input = text(state, "fromJson", "the input", &args[0])?;
    let value: serde_json::Value = serde_json::from_str(&input).map_err(|e| {
        fail(
            "fromJson",
            format!(
                "the input is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    check_depth("fromJson", &value, 0)?;
    Ok(from_json_value(value))
}

fn check_depth(func: &str, value: &serde_json::Value, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(fail(
            func,
            format!("the value is nested more than {MAX_DEPTH} levels deep"),
        ));
    }
    match value {
        serde_json::Value::Array(items) => items
            .iter()
            .try_for_each(|v| check_depth(func, v, depth + 1)),
        serde_json::Value::Object(map) => map
            .values()
            .try_for_each(|v| check_depth(func, v, depth + 1)),
        _ => Ok(()),
    }
}

/// `toYaml(v)`: YAML without the trailing newline.
pub(crate) fn to_yaml(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("toYaml", args, 1, 1)?;
    let json = to_json_value(state, "toYaml", &args[0], 0)?;
    let out = serde_saphyr::to_string(&json)
        .map_err(|_| fail("toYaml", "the value cannot be written as YAML"))?;
    Ok(Value::from(out.trim_end_matches('\n')))
}

/// `fromYaml(s)`: the parsed document (a map for the usual input). The
/// parser's budget (depth, nodes, aliases) guards against YAML bombs; errors
/// never quote the input.
pub(crate) fn from_yaml(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("fromYaml", args, 1, 1)?;
    let input = text(state, "fromYaml", "the input", &args[0])?;
    if input.trim().is_empty() {
        return Ok(Value::from(BTreeMap::<String, Value>::new()));
    }
    let value: serde_json::Value = serde_saphyr::from_str(&input).map_err(|_| {
        fail(
            "fromYaml",
            "the input is not valid YAML (or exceeds the parser limits)",
        )
    })?;
    check_depth("fromYaml", &value, 0)?;
    Ok(from_json_value(value))
}
