//! JSON as Go's `encoding/json` writes and reads it for Sprig's `toJson`,
//! `toPrettyJson`, `toRawJson` and `fromJson`: map keys sorted, the secret
//! struct by its JSON tags (`value`, `secretPath`, in that order), `<`, `>`
//! and `&` escaped unless raw, floats in Go's notation (`1`, `1.5`, `1e+21`,
//! `1e-7`), and every parsed number a float64.

use std::collections::BTreeMap;

use super::fmt::float_v;
use super::value::V;

/// Deepest nesting written or read.
const MAX_DEPTH: usize = 1000;

/// Why a value has no JSON form.
#[derive(Debug)]
pub(crate) struct Unsupported(pub String);

/// Writes `v` as JSON.
pub(crate) fn encode(v: &V, escape_html: bool, indent: bool) -> Result<String, Unsupported> {
    let mut out = String::new();
    write(&mut out, v, escape_html, indent, 0)?;
    Ok(out)
}

fn newline(out: &mut String, indent: bool, depth: usize) {
    if indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
}

fn write(
    out: &mut String,
    v: &V,
    html: bool,
    indent: bool,
    depth: usize,
) -> Result<(), Unsupported> {
    if depth > MAX_DEPTH {
        return Err(Unsupported("json: the value is nested too deep".into()));
    }
    match v {
        V::Nil => out.push_str("null"),
        V::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        V::Int(n, _) => out.push_str(&n.to_string()),
        V::Float(f) => out.push_str(&float(*f)?),
        V::Str(_) | V::Bytes(_) => string(out, v.as_bytes().unwrap_or_default(), html),
        V::List(items, _) => {
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent, depth + 1);
                write(out, item, html, indent, depth + 1)?;
            }
            newline(out, indent, depth);
            out.push(']');
        }
        V::Map(map, _) => {
            let map = map.borrow();
            if map.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent, depth + 1);
                string(out, k.as_bytes(), html);
                out.push(':');
                if indent {
                    out.push(' ');
                }
                write(out, item, html, indent, depth + 1)?;
            }
            newline(out, indent, depth);
            out.push('}');
        }
        V::Secret(s) => {
            out.push('{');
            newline(out, indent, depth + 1);
            out.push_str("\"value\":");
            if indent {
                out.push(' ');
            }
            write(out, &s.value, html, indent, depth + 1)?;
            out.push(',');
            newline(out, indent, depth + 1);
            out.push_str("\"secretPath\":");
            if indent {
                out.push(' ');
            }
            string(out, s.path.as_bytes(), html);
            newline(out, indent, depth);
            out.push('}');
        }
    }
    Ok(())
}

/// A float as `encoding/json` writes it.
fn float(f: f64) -> Result<String, Unsupported> {
    if !f.is_finite() {
        return Err(Unsupported(format!(
            "json: unsupported value: {}",
            float_v(f)
        )));
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Exponent form, with Go's exponent cleanup (e-07 → e-7).
        let s = format!("{f:e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        let sign = if e < 0 { '-' } else { '+' };
        return Ok(format!("{m}e{sign}{}", e.unsigned_abs()));
    }
    // Shortest plain decimal.
    let s = format!("{f}");
    Ok(s)
}

fn string(out: &mut String, bytes: &[u8], html: bool) {
    let text = String::from_utf8_lossy(bytes);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            '<' | '>' | '&' if html => out.push_str(&format!("\\u{:04x}", c as u32)),
            '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses JSON as Go's `json.Unmarshal` into `interface{}` does.
pub(crate) fn decode(text: &str) -> Result<V, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "the input is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    Ok(from_json(value))
}

fn from_json(value: serde_json::Value) -> V {
    match value {
        serde_json::Value::Null => V::Nil,
        serde_json::Value::Bool(b) => V::Bool(b),
        serde_json::Value::Number(n) => V::Float(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => V::str(s),
        serde_json::Value::Array(items) => V::list(items.into_iter().map(from_json).collect()),
        serde_json::Value::Object(map) => V::map(
            map.into_iter()
                .map(|(k, v)| (k, from_json(v)))
                .collect::<BTreeMap<String, V>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats() {
        assert_eq!(float(1.0).unwrap(), "1");
        assert_eq!(float(1.5).unwrap(), "1.5");
        assert_eq!(float(1e21).unwrap(), "1e+21");
        assert_eq!(float(1e-7).unwrap(), "1e-7");
        assert_eq!(float(123456789.0).unwrap(), "123456789");
        assert_eq!(float(1e20).unwrap(), "100000000000000000000");
    }
}
