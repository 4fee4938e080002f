//! Encoding helpers: base64, hashes, JSON and YAML.
//!
//! JSON output matches Go's `encoding/json` as Sprig uses it: map keys
//! sorted, `<`, `>` and `&` escaped as `\u003c`… in `toJson`/`toPrettyJson`
//! (`toRawJson` leaves them), two-space indentation for `toPrettyJson`.
//! Values are converted with a depth limit so a deeply nested value cannot
//! exhaust the stack.
//!
//! Costs: hashing and encoding charge the bytes they read; conversions
//! charge every node they visit (a list that holds another list many times
//! is walked, and charged, as often); JSON and YAML are written through a
//! bounded writer, and parsed input reserves the memory of its values,
//! before the work is done.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use minijinja::value::ValueKind;
use minijinja::{Error, State, Value};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use crate::args::{
    Bounded, arity, binary, defined, fail, fuel_left, out_of_fuel, reserve, text, text_or_bytes,
    work,
};
use crate::cost;

/// Deepest nesting converted to or from JSON/YAML.
pub(crate) const MAX_DEPTH: usize = 64;

/// Standard alphabet; padding optional on input, written on output.
const STANDARD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Memory one byte of JSON or YAML text may become once parsed into
/// values (`[0,0,…]`: a 32-byte value for every two bytes).
pub(crate) const PARSED_GROWTH: u64 = 16;

/// Most bytes one character of JSON becomes when escaped (`\u003c`).
const JSON_ESCAPE_GROWTH: u64 = 6;

/// Fuel of parsing one byte of YAML (about 100 ns a byte).
const YAML_FUEL_PER_BYTE: u64 = 2;

/// Bytes of JSON or YAML written per fuel (writing walks the value).
const SERIALIZED_BYTES_PER_FUEL: u64 = 16;

/// Decodes standard base64; line breaks and surrounding blanks are ignored
/// (as Go's decoder ignores `\r` and `\n`). The error never shows the input.
/// The copy and the decoded bytes are reserved first.
pub(crate) fn decode_base64(state: &State, func: &str, input: &[u8]) -> Result<Vec<u8>, Error> {
    reserve(
        state,
        (input.len() as u64).saturating_add(input.len() as u64 / 4 * 3),
    )?;
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
        state,
        "decodeBase64ToBytes",
        input,
    )?))
}

fn encode_with(state: &State, func: &str, args: &[Value]) -> Result<Value, Error> {
    arity(func, args, 1, 1)?;
    let input = binary(state, func, "the input", &args[0])?;
    reserve(state, (input.len() as u64).div_ceil(3).saturating_mul(4))?;
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
    Ok(text_or_bytes(decode_base64(state, "b64dec", input)?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `sha256sum(s)`: lowercase hex.
pub(crate) fn sha256sum(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("sha256sum", args, 1, 1)?;
    let input = binary(state, "sha256sum", "the input", &args[0])?;
    work(state, cost::hash(input.len(), false))?;
    Ok(Value::from(hex(&Sha256::digest(input))))
}

/// `sha1sum(s)`: lowercase hex.
pub(crate) fn sha1sum(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("sha1sum", args, 1, 1)?;
    let input = binary(state, "sha1sum", "the input", &args[0])?;
    work(state, cost::hash(input.len(), false))?;
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
    work(state, cost::VALUE_NODE)?;
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
        ValueKind::String => {
            let text = value.as_str().unwrap_or("");
            reserve(state, text.len() as u64)?;
            serde_json::Value::String(text.to_owned())
        }
        // Go's json.Marshal writes []byte as base64.
        ValueKind::Bytes => {
            let bytes = value.as_bytes().unwrap_or_default();
            reserve(state, (bytes.len() as u64).saturating_mul(2))?;
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
                reserve(state, key.len() as u64)?;
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

/// Converts parsed JSON (or YAML) into a template value, charging every
/// node.
pub(crate) fn from_json_value(state: &State, value: serde_json::Value) -> Result<Value, Error> {
    work(state, cost::VALUE_NODE)?;
    Ok(match value {
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
        serde_json::Value::Array(items) => Value::from(
            items
                .into_iter()
                .map(|v| from_json_value(state, v))
                .collect::<Result<Vec<Value>, Error>>()?,
        ),
        serde_json::Value::Object(map) => Value::from(
            map.into_iter()
                .map(|(k, v)| Ok((k, from_json_value(state, v)?)))
                .collect::<Result<BTreeMap<String, Value>, Error>>()?,
        ),
    })
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
    let mut out = BoundedIo(Bounded::new(serialized_limit(state)));
    let written = if pretty {
        serde_json::to_writer_pretty(&mut out, &json)
    } else {
        serde_json::to_writer(&mut out, &json)
    };
    let out = serialized(state, func, written.is_ok(), out.0, "JSON")?;
    if escape {
        reserve(state, (out.len() as u64).saturating_mul(JSON_ESCAPE_GROWTH))?;
        return Ok(Value::from(go_html_escape(out)));
    }
    Ok(Value::from(out))
}

/// The bytes of JSON or YAML the fuel left can pay for.
fn serialized_limit(state: &State) -> u64 {
    fuel_left(state).saturating_mul(SERIALIZED_BYTES_PER_FUEL)
}

/// The text a serializer wrote into `out`, its fuel charged; out of fuel
/// when the writer refused more.
fn serialized(
    state: &State,
    func: &str,
    ok: bool,
    out: Bounded,
    format: &str,
) -> Result<String, Error> {
    if out.exceeded {
        return Err(out_of_fuel(state));
    }
    if !ok {
        return Err(fail(
            func,
            format!("the value cannot be written as {format}"),
        ));
    }
    work(
        state,
        (out.text.len() as u64).div_ceil(SERIALIZED_BYTES_PER_FUEL),
    )?;
    Ok(out.text)
}

/// A [`Bounded`] text buffer as an `io::Write` (serde_json writes UTF-8).
struct BoundedIo(Bounded);

impl std::io::Write for BoundedIo {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(data).map_err(std::io::Error::other)?;
        self.0
            .write_str(text)
            .map_err(|_| std::io::Error::other("limit"))?;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
    reserve(state, (input.len() as u64).saturating_mul(PARSED_GROWTH))?;
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
    from_json_value(state, value)
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
    let mut out = Bounded::new(serialized_limit(state));
    let written = serde_saphyr::to_fmt_writer(&mut out, &json);
    let out = serialized(state, "toYaml", written.is_ok(), out, "YAML")?;
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
    reserve(state, (input.len() as u64).saturating_mul(PARSED_GROWTH))?;
    work(
        state,
        (input.len() as u64).saturating_mul(YAML_FUEL_PER_BYTE),
    )?;
    let options = yaml_options(fuel_left(state));
    let value: serde_json::Value =
        serde_saphyr::from_str_with_options(&input, options).map_err(|_| {
            fail(
                "fromYaml",
                "the input is not valid YAML (or exceeds the parser limits)",
            )
        })?;
    check_depth("fromYaml", &value, 0)?;
    from_json_value(state, value)
}

/// The parser's budget for a render with `fuel` left: no more nodes and
/// scalar bytes (aliases expanded) than the fuel can pay for.
fn yaml_options(fuel: u64) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    let nodes = usize::try_from(fuel / cost::NODE.max(1)).unwrap_or(usize::MAX);
    let bytes = usize::try_from(cost::bytes_for(fuel)).unwrap_or(usize::MAX);
    budget.max_events = budget.max_events.min(nodes);
    budget.max_nodes = budget.max_nodes.min(nodes);
    budget.max_recorded_anchor_events = budget.max_recorded_anchor_events.min(nodes);
    budget.max_total_scalar_bytes = budget.max_total_scalar_bytes.min(bytes);
    budget.max_recorded_anchor_bytes = budget.max_recorded_anchor_bytes.min(bytes);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}
