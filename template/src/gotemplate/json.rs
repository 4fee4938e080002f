//! JSON as Go's `encoding/json` writes and reads it for Sprig's `toJson`,
//! `toPrettyJson`, `toRawJson` and `fromJson`: map keys sorted, the secret
//! struct by its JSON tags (`value`, `secretPath`, in that order), `<`, `>`
//! and `&` escaped unless raw, floats in Go's notation (`1`, `1.5`, `1e+21`,
//! `1e-7`), and every parsed number a float64. Text is written into a
//! bounded [`Sink`]; parsing reserves the memory of what it builds.

use std::collections::BTreeMap;

use super::exec::{Ctx, FnError};
use super::fmt::{PrintError, Sink, float_v};
use super::value::V;
use crate::cost;

/// Deepest nesting written or read.
const MAX_DEPTH: usize = 1000;

/// Memory one byte of JSON text may become once parsed (`[0,0,…]`: a
/// value of 32 bytes for every two bytes).
const PARSED_GROWTH: u64 = 16;

/// Why a value was not written as JSON.
#[derive(Debug)]
pub(crate) enum EncodeError {
    /// The value has no JSON form (the message says why).
    Unsupported(String),
    /// The sink refused more (or the value is nested too deep to print).
    Print(PrintError),
}

impl From<PrintError> for EncodeError {
    fn from(e: PrintError) -> EncodeError {
        EncodeError::Print(e)
    }
}

type R = Result<(), EncodeError>;

/// Writes `v` as JSON into `out` (one node of the sink per value).
pub(crate) fn encode(out: &mut Sink, v: &V, escape_html: bool, indent: bool) -> R {
    write(out, v, escape_html, indent, 0)
}

fn newline(out: &mut Sink, indent: bool, depth: usize) -> R {
    if indent {
        out.byte(b'\n')?;
        out.fill(b' ', depth.saturating_mul(2))?;
    }
    Ok(())
}

fn write(out: &mut Sink, v: &V, html: bool, indent: bool, depth: usize) -> R {
    if depth > MAX_DEPTH {
        return Err(EncodeError::Unsupported(
            "json: the value is nested too deep".into(),
        ));
    }
    out.node()?;
    match v {
        V::Nil => out.put(b"null")?,
        V::Bool(b) => out.put(if *b { b"true" } else { b"false" })?,
        V::Int(n, _) => out.put(n.to_string().as_bytes())?,
        V::Float(f) => out.put(float(*f)?.as_bytes())?,
        V::Str(_) | V::Bytes(_) => string(out, v.as_bytes().unwrap_or_default(), html)?,
        V::List(items, _) => {
            if items.is_empty() {
                out.put(b"[]")?;
                return Ok(());
            }
            out.byte(b'[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.byte(b',')?;
                }
                newline(out, indent, depth + 1)?;
                write(out, item, html, indent, depth + 1)?;
            }
            newline(out, indent, depth)?;
            out.byte(b']')?;
        }
        V::Map(map, _) => {
            let map = map.borrow();
            if map.is_empty() {
                out.put(b"{}")?;
                return Ok(());
            }
            out.byte(b'{')?;
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.byte(b',')?;
                }
                newline(out, indent, depth + 1)?;
                string(out, k.as_bytes(), html)?;
                out.byte(b':')?;
                if indent {
                    out.byte(b' ')?;
                }
                write(out, item, html, indent, depth + 1)?;
            }
            newline(out, indent, depth)?;
            out.byte(b'}')?;
        }
        V::Secret(s) => {
            out.byte(b'{')?;
            newline(out, indent, depth + 1)?;
            out.put(b"\"value\":")?;
            if indent {
                out.byte(b' ')?;
            }
            write(out, &s.value, html, indent, depth + 1)?;
            out.byte(b',')?;
            newline(out, indent, depth + 1)?;
            out.put(b"\"secretPath\":")?;
            if indent {
                out.byte(b' ')?;
            }
            string(out, s.path.as_bytes(), html)?;
            newline(out, indent, depth)?;
            out.byte(b'}')?;
        }
    }
    Ok(())
}

/// A float as `encoding/json` writes it.
fn float(f: f64) -> Result<String, EncodeError> {
    if !f.is_finite() {
        return Err(EncodeError::Unsupported(format!(
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
    Ok(format!("{f}"))
}

fn string(out: &mut Sink, bytes: &[u8], html: bool) -> R {
    out.byte(b'"')?;
    let mut esc = [0u8; 4];
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.put(b"\\\"")?,
                '\\' => out.put(b"\\\\")?,
                '\n' => out.put(b"\\n")?,
                '\r' => out.put(b"\\r")?,
                '\t' => out.put(b"\\t")?,
                '\u{08}' => out.put(b"\\b")?,
                '\u{0C}' => out.put(b"\\f")?,
                c if (c as u32) < 0x20 => out.put(format!("\\u{:04x}", c as u32).as_bytes())?,
                '<' | '>' | '&' if html => out.put(format!("\\u{:04x}", c as u32).as_bytes())?,
                '\u{2028}' | '\u{2029}' => out.put(format!("\\u{:04x}", c as u32).as_bytes())?,
                c => out.put(c.encode_utf8(&mut esc).as_bytes())?,
            }
        }
        if !chunk.invalid().is_empty() {
            // Invalid UTF-8 becomes U+FFFD, as Go writes it.
            out.put("\u{FFFD}".as_bytes())?;
        }
    }
    out.byte(b'"')?;
    Ok(())
}

/// Why JSON text was not read.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// The text is not JSON (the message gives the position, never the
    /// text).
    Invalid(String),
    /// The render ran out of fuel or was cancelled.
    Stopped(FnError),
}

/// Parses JSON as Go's `json.Unmarshal` into `interface{}` does. The memory
/// of the parsed values is reserved before parsing, and every node is
/// charged as it is converted.
pub(crate) fn decode(c: &Ctx, text: &str) -> Result<V, DecodeError> {
    c.reserve((text.len() as u64).saturating_mul(PARSED_GROWTH))
        .map_err(DecodeError::Stopped)?;
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        DecodeError::Invalid(format!(
            "the input is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    from_json(c, value).map_err(DecodeError::Stopped)
}

fn from_json(c: &Ctx, value: serde_json::Value) -> Result<V, FnError> {
    c.work(cost::VALUE_NODE)?;
    Ok(match value {
        serde_json::Value::Null => V::Nil,
        serde_json::Value::Bool(b) => V::Bool(b),
        serde_json::Value::Number(n) => V::Float(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => V::str(s),
        serde_json::Value::Array(items) => V::list(
            items
                .into_iter()
                .map(|v| from_json(c, v))
                .collect::<Result<_, _>>()?,
        ),
        serde_json::Value::Object(map) => V::map(
            map.into_iter()
                .map(|(k, v)| Ok((k, from_json(c, v)?)))
                .collect::<Result<BTreeMap<String, V>, FnError>>()?,
        ),
    })
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
