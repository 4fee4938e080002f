//! The Sprig v3.3.0 functions, over Go values, with Sprig's argument order,
//! types and quirks (`b64dec` of bad input returns the error text, `split`
//! returns a map `_0`, `_1`…, `atoi` of bad input is 0, `add` returns an
//! int64, `addf` computes in decimal, `fromJson` of bad input is nil, `set`
//! and `merge` change the map in place, …).
//!
//! Where Sprig panics (e.g. `first` of a string, `div` by zero), the
//! function returns an error, as Go's template runtime turns the panic into
//! one.
//!
//! Costs: a call pays for reading its string arguments (see
//! [`super::exec`]); on top of that every function reserves the bytes and
//! list slots it builds before building them (sizes computed with
//! saturating arithmetic, so `indent 100000000000 "x"` runs out of fuel
//! instead of allocating), charges the nodes it walks and the matches a
//! regular expression finds, and prints through a bounded sink. Error
//! messages never contain an argument's value.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::rc::Rc;

use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use super::exec::{Ctx, FnError};
use super::fmt::{QUOTE_GROWTH, quote_bytes, sprint_one, sprintf};
use super::funcs::{Row, Ty};
use super::json;
use super::value::{Elem, MapRef, Meter, V, WalkError, deep_equal_with, holds_map};
use crate::cost;
use crate::encoding::encode_base64;

type Res = Result<V, FnError>;

fn msg<T>(m: impl Into<String>) -> Result<T, FnError> {
    Err(FnError::Msg(m.into()))
}

/// A `string` argument (already checked).
fn s(v: &V) -> Cow<'_, str> {
    match v {
        V::Str(s) => Cow::Borrowed(s),
        V::Bytes(b) => String::from_utf8_lossy(b),
        _ => Cow::Borrowed(""),
    }
}

/// The bytes of a `string` argument.
fn b(v: &V) -> &[u8] {
    v.as_bytes().unwrap_or_default()
}

/// An `int` argument.
fn i(v: &V) -> i64 {
    match v {
        V::Int(n, _) => *n,
        _ => 0,
    }
}

fn string(s: impl Into<Rc<str>>) -> Res {
    Ok(V::Str(s.into()))
}

/// Bytes a list slot or map entry costs besides its text (a value and its
/// share of the list).
const SLOT: u64 = 32;

/// Most bytes a character grows to when Go maps its case (one rune to one
/// rune: 2 bytes to 3 at most).
const CASE_GROWTH: u64 = 2;

/// Reserves `n` list slots.
fn reserve_slots(c: &Ctx, n: usize) -> Result<(), FnError> {
    c.reserve((n as u64).saturating_mul(SLOT))
}

/// Reserves `len` bytes of text `growth` times.
fn reserve_text(c: &Ctx, len: usize, growth: u64) -> Result<(), FnError> {
    c.reserve((len as u64).saturating_mul(growth))
}

/// Sprig's `strval`: strings as they are, anything else as `%v` (printed
/// through a bounded sink, charged).
pub(crate) fn strval(c: &Ctx, v: &V) -> Result<Vec<u8>, FnError> {
    c.print(|out| sprint_one(out, v))
}

fn strval_text(c: &Ctx, v: &V) -> Result<String, FnError> {
    Ok(String::from_utf8_lossy(&strval(c, v)?).into_owned())
}

/// Sprig's `strslice`.
fn strslice(c: &Ctx, v: &V) -> Result<Vec<String>, FnError> {
    match v {
        V::List(items, _) => {
            reserve_slots(c, items.len())?;
            items
                .iter()
                .filter(|i| !matches!(i, V::Nil))
                .map(|i| strval_text(c, i))
                .collect()
        }
        V::Nil => Ok(Vec::new()),
        other => Ok(vec![strval_text(c, other)?]),
    }
}

/// A meter for the walks of [`super::value`] that charges `c` a node per
/// node, keeping the error that stopped it.
fn walk<T>(c: &Ctx, run: impl FnOnce(Meter) -> Result<T, WalkError>) -> Result<T, FnError> {
    let mut stopped = None;
    let mut meter = || match c.work(cost::NODE) {
        Ok(()) => true,
        Err(e) => {
            stopped = Some(e);
            false
        }
    };
    match run(&mut meter) {
        Ok(v) => Ok(v),
        Err(WalkError::TooDeep) => msg("a value is nested too deep"),
        Err(WalkError::Stopped) => Err(stopped.unwrap_or(FnError::Fuel)),
    }
}

/// Go's `reflect.DeepEqual`, charged per node visited.
fn deep_equal(c: &Ctx, a: &V, b: &V) -> Result<bool, FnError> {
    walk(c, |meter| deep_equal_with(a, b, meter))
}

/// Fails when storing `value` in `map` would make the map hold itself.
fn no_cycle(c: &Ctx, value: &V, map: &MapRef) -> Result<(), FnError> {
    if walk(c, |meter| holds_map(value, map, meter))? {
        return msg("a map cannot contain itself");
    }
    Ok(())
}

/// Go's `strconv.ParseInt(s, 0, 64)`.
fn parse_int_base0(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d.to_owned(), true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d.to_owned(), true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d.to_owned(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_owned(), true)
    } else {
        (10, lower.clone(), false)
    };
    if digits.is_empty() || digits.starts_with('+') || digits.starts_with('-') {
        return None;
    }
    if digits.contains('_') {
        if !prefixed && radix == 10 {
            // Underscores are only allowed with base 0; Go accepts
            // them between digits.
        }
        if digits.ends_with('_') || digits.contains("__") || (!prefixed && digits.starts_with('_'))
        {
            return None;
        }
    }
    let u = u64::from_str_radix(&digits.replace('_', ""), radix).ok()?;
    if neg {
        if u <= i64::MAX as u64 + 1 {
            Some((u as i128).wrapping_neg() as i64)
        } else {
            None
        }
    } else {
        i64::try_from(u).ok()
    }
}

/// `cast`'s removal of a zero decimal part (`"1.00"` → `"1"`).
fn trim_zero_decimal(s: &str) -> &str {
    let mut found_zero = false;
    for (i, c) in s.bytes().enumerate().rev() {
        match c {
            b'.' => {
                if found_zero {
                    return &s[..i];
                }
            }
            b'0' => found_zero = true,
            _ => return s,
        }
    }
    s
}

/// Go's float64 to int64 conversion on amd64 (out of range gives MinInt64).
fn f2i(f: f64) -> i64 {
    if f.is_nan() || !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) {
        i64::MIN
    } else {
        f as i64
    }
}

/// `cast.ToInt64`.
fn to_int64(v: &V) -> i64 {
    match v {
        V::Int(n, _) => *n,
        V::Float(f) => f2i(*f),
        V::Str(_) | V::Bytes(_) => parse_int_base0(trim_zero_decimal(&s(v))).unwrap_or(0),
        V::Bool(b) => i64::from(*b),
        _ => 0,
    }
}

/// `cast.ToFloat64`.
fn to_f64(v: &V) -> f64 {
    match v {
        V::Int(n, _) => *n as f64,
        V::Float(f) => *f,
        V::Str(_) | V::Bytes(_) => parse_go_float(&s(v)).unwrap_or(0.0),
        V::Bool(b) => f64::from(u8::from(*b)),
        _ => 0.0,
    }
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal input.
fn parse_go_float(s: &str) -> Option<f64> {
    let lower = s.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    match body {
        "inf" | "infinity" => {
            return Some(if lower.starts_with('-') {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            });
        }
        "nan" => return Some(f64::NAN),
        _ => {}
    }
    if lower.contains('x') || lower.contains('_') || body.starts_with(['+', '-']) {
        return None;
    }
    lower.parse().ok()
}

/// The items of a slice argument (Sprig's `reflect` loops).
fn items<'a>(v: &'a V, what: &str) -> Result<&'a [V], FnError> {
    match v {
        V::List(items, _) => Ok(items),
        other => msg(format!("Cannot {what} on type {}", other.kind_name())),
    }
}

fn go_upper(c: char) -> char {
    let mut u = c.to_uppercase();
    match (u.next(), u.next()) {
        (Some(x), None) => x,
        _ => c,
    }
}

fn go_lower(c: char) -> char {
    // Go maps one rune to one rune: İ (U+0130) becomes i.
    c.to_lowercase().next().unwrap_or(c)
}

/// Go's `unicode.ToTitle`: upper case, except the digraphs with a title
/// case of their own (ǅ, ǈ, ǋ, ǲ).
fn go_title(c: char) -> char {
    match c as u32 {
        0x1C4..=0x1C6 => '\u{1C5}',
        0x1C7..=0x1C9 => '\u{1C8}',
        0x1CA..=0x1CC => '\u{1CB}',
        0x1F1..=0x1F3 => '\u{1F2}',
        _ => go_upper(c),
    }
}

fn title(text: &str) -> String {
    let mut prev = ' ';
    text.chars()
        .map(|c| {
            let sep = if prev.is_ascii() {
                !(prev.is_ascii_alphanumeric() || prev == '_')
            } else if prev.is_alphabetic() || prev.is_numeric() {
                false
            } else {
                prev.is_whitespace()
            };
            prev = c;
            if sep { go_title(c) } else { c }
        })
        .collect()
}

fn abbreviate_full(text: &[u8], offset: i64, width: i64) -> Vec<u8> {
    let len = text.len() as i64;
    if text.is_empty() || width < 4 || len <= width {
        return text.to_vec();
    }
    let mut offset = offset.min(len);
    if len - offset < width - 3 {
        offset = len - (width - 3);
    }
    if offset <= 4 {
        let mut out = text[..(width - 3) as usize].to_vec();
        out.extend_from_slice(b"...");
        return out;
    }
    if width < 7 {
        return Vec::new();
    }
    let mut out = b"...".to_vec();
    if offset + width - 3 < len {
        out.extend(abbreviate_full(&text[offset as usize..], 0, width - 3));
    } else {
        out.extend_from_slice(&text[(len - (width - 3)) as usize..]);
    }
    out
}

/// Sprig's `untilStep`: `start`, `start + step`, … before `stop`. The
/// count is computed in 128 bits, the list reserved before it is built.
fn untilstep(start: i64, stop: i64, step: i64, ctx: &Ctx) -> Result<Vec<i64>, FnError> {
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    let count = if stop < start {
        if step >= 0 {
            return Ok(Vec::new());
        }
        (start - stop + (-step) - 1) / (-step)
    } else {
        if step <= 0 {
            return Ok(Vec::new());
        }
        (stop - start + step - 1) / step
    };
    let count = usize::try_from(count.max(0)).unwrap_or(usize::MAX);
    reserve_slots(ctx, count)?;
    let mut out = Vec::with_capacity(count);
    let mut v = start;
    for _ in 0..count {
        out.push(v as i64);
        v += step;
    }
    Ok(out)
}

fn int_list(values: Vec<i64>) -> V {
    V::List(Rc::new(values.into_iter().map(V::int).collect()), Elem::Int)
}

/// A decimal number: mantissa × 10^exp (Sprig's `addf`… compute with
/// shopspring/decimal from the shortest form of each float).
#[derive(Clone, Copy)]
struct Dec {
    m: i128,
    e: i32,
}

impl Dec {
    fn from_f64(f: f64) -> Option<Dec> {
        if !f.is_finite() {
            return None;
        }
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e')?;
        let exp: i32 = exp.parse().ok()?;
        let neg = mant.starts_with('-');
        let mant = mant.trim_start_matches('-');
        let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
        let digits = format!("{int}{frac}");
        let m: i128 = digits.parse().ok()?;
        Some(Dec {
            m: if neg { -m } else { m },
            e: exp - frac.len() as i32,
        })
    }

    fn align(a: Dec, b: Dec) -> Option<(i128, i128, i32)> {
        let e = a.e.min(b.e);
        let scale =
            |d: Dec| -> Option<i128> { d.m.checked_mul(10i128.checked_pow((d.e - e) as u32)?) };
        Some((scale(a)?, scale(b)?, e))
    }

    fn to_f64(self) -> f64 {
        format!("{}e{}", self.m, self.e).parse().unwrap_or(f64::NAN)
    }
}

fn decimal_op(
    first: &V,
    rest: &[V],
    op: fn(Dec, Dec) -> Option<Dec>,
    fallback: fn(f64, f64) -> f64,
) -> f64 {
    let mut acc = to_f64(first);
    let mut dec = Dec::from_f64(acc);
    for x in rest {
        let fx = to_f64(x);
        dec = match (dec, Dec::from_f64(fx)) {
            (Some(a), Some(b)) => op(a, b),
            _ => None,
        };
        acc = match dec {
            Some(d) => d.to_f64(),
            None => fallback(acc, fx),
        };
        if dec.is_none() {
            dec = Dec::from_f64(acc);
        }
    }
    acc
}

fn dec_add(a: Dec, b: Dec) -> Option<Dec> {
    let (x, y, e) = Dec::align(a, b)?;
    Some(Dec {
        m: x.checked_add(y)?,
        e,
    })
}

fn dec_sub(a: Dec, b: Dec) -> Option<Dec> {
    let (x, y, e) = Dec::align(a, b)?;
    Some(Dec {
        m: x.checked_sub(y)?,
        e,
    })
}

fn dec_mul(a: Dec, b: Dec) -> Option<Dec> {
    Some(Dec {
        m: a.m.checked_mul(b.m)?,
        e: a.e + b.e,
    })
}

/// Division rounded half away from zero to 16 decimal places.
fn dec_div(a: Dec, b: Dec) -> Option<Dec> {
    if b.m == 0 {
        return None;
    }
    // a/b = (a.m / b.m) × 10^(a.e - b.e); want q with 16 places.
    let shift = 16 + a.e - b.e;
    let (num, den) = if shift >= 0 {
        (a.m.checked_mul(10i128.checked_pow(shift as u32 + 1)?)?, b.m)
    } else {
        (
            a.m.checked_mul(10)?,
            b.m.checked_mul(10i128.checked_pow((-shift) as u32)?)?,
        )
    };
    let q10 = num / den;
    let q = if q10 % 10 >= 5 {
        q10 / 10 + 1
    } else if q10 % 10 <= -5 {
        q10 / 10 - 1
    } else {
        q10 / 10
    };
    Some(Dec { m: q, e: -16 })
}

/// Go's base64 decoding (standard alphabet, padding required, `\r` and
/// `\n` ignored); the error is the offset Go reports. The caller reserves
/// three bytes per four of input.
fn b64_decode(src: &[u8]) -> Result<Vec<u8>, usize> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let value = |c: u8| ALPHABET.iter().position(|a| *a == c).map(|p| p as u32);
    let mut out = Vec::with_capacity(src.len() * 3 / 4);
    let mut si = 0;
    loop {
        let mut buf = [0u32; 4];
        let mut j = 0;
        let mut dlen = 4;
        while j < 4 {
            if si == src.len() {
                if j == 0 {
                    return Ok(out);
                }
                return Err(si - j);
            }
            let c = src[si];
            si += 1;
            if c == b'\n' || c == b'\r' {
                continue;
            }
            if c == b'=' {
                match j {
                    0 | 1 => return Err(si - 1),
                    2 => {
                        while si < src.len() && (src[si] == b'\n' || src[si] == b'\r') {
                            si += 1;
                        }
                        if si == src.len() {
                            return Err(src.len());
                        }
                        if src[si] != b'=' {
                            return Err(si - 1);
                        }
                        si += 1;
                    }
                    _ => {}
                }
                while si < src.len() && (src[si] == b'\n' || src[si] == b'\r') {
                    si += 1;
                }
                if si < src.len() {
                    return Err(si);
                }
                dlen = j;
                break;
            }
            match value(c) {
                Some(v) => buf[j] = v,
                None => return Err(si - 1),
            }
            j += 1;
        }
        let n = (buf[0] << 18) | (buf[1] << 12) | (buf[2] << 6) | buf[3];
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        match dlen {
            4 => out.extend_from_slice(&bytes),
            3 => out.extend_from_slice(&bytes[..2]),
            2 => out.extend_from_slice(&bytes[..1]),
            _ => {}
        }
        if dlen < 4 {
            return Ok(out);
        }
    }
}

const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Memory of base32 decoding per input byte (each byte is kept with its
/// position).
const B32_DECODE_GROWTH: u64 = 17;

fn b32_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(5) {
        let mut buf = [0u8; 5];
        buf[..chunk.len()].copy_from_slice(chunk);
        let n = buf.iter().fold(0u64, |acc, b| (acc << 8) | *b as u64);
        let chars = match chunk.len() {
            1 => 2,
            2 => 4,
            3 => 5,
            4 => 7,
            _ => 8,
        };
        for k in 0..8 {
            if k < chars {
                out.push(B32[((n >> (35 - 5 * k)) & 31) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Go's base32 decoding. The caller reserves [`B32_DECODE_GROWTH`] bytes per
/// byte of input (positions are kept while decoding).
fn b32_decode(src: &[u8]) -> Result<Vec<u8>, usize> {
    let cleaned: Vec<(usize, u8)> = src
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, c)| *c != b'\n' && *c != b'\r')
        .collect();
    let mut out = Vec::new();
    for (q, quantum) in cleaned.chunks(8).enumerate() {
        if quantum.len() < 8 {
            return Err(quantum.first().map_or(src.len(), |(p, _)| *p));
        }
        let pad = quantum.iter().rev().take_while(|(_, c)| *c == b'=').count();
        let used = 8 - pad;
        let bytes = match used {
            8 => 5,
            7 => 4,
            5 => 3,
            4 => 2,
            2 => 1,
            _ => return Err(quantum[used.min(7)].0),
        };
        if pad > 0 && (q + 1) * 8 < cleaned.len() {
            return Err(quantum[used].0);
        }
        let mut n = 0u64;
        for (k, (p, c)) in quantum.iter().enumerate() {
            let v = if k < used {
                match B32.iter().position(|a| a == c) {
                    Some(v) => v as u64,
                    None => return Err(*p),
                }
            } else {
                0
            };
            n = (n << 5) | v;
        }
        for k in 0..bytes {
            out.push((n >> (32 - 8 * k)) as u8);
        }
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + byte as u32) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// Go's `path.Clean`.
fn clean(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

fn base(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return "/".into();
    }
    trimmed.rsplit('/').next().unwrap_or(trimmed).to_owned()
}

fn dir(path: &str) -> String {
    let cut = path.rfind('/').map_or(0, |p| p + 1);
    clean(&path[..cut])
}

fn ext(path: &str) -> String {
    for (i, c) in path.char_indices().rev() {
        if c == '/' {
            break;
        }
        if c == '.' {
            return path[i..].to_owned();
        }
    }
    String::new()
}

/// Charges a regular expression's scan of `input` (before it runs).
fn scan(c: &Ctx, input: &str) -> Result<(), FnError> {
    c.work(cost::regex_scan(input.len()))
}

/// Go's `Regexp.ReplaceAllString` template expansion (`$1`, `${name}`):
/// the pieces of the replacement, in order, handed to `out`.
fn expand<'t>(template: &'t str, caps: &regex::Captures<'t>, out: &mut impl FnMut(&'t str)) {
    let mut rest = template;
    while let Some(p) = rest.find('$') {
        out(&rest[..p]);
        rest = &rest[p + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            out("$");
            rest = r;
            continue;
        }
        let (name, after) = if let Some(r) = rest.strip_prefix('{') {
            match r.find('}') {
                Some(end)
                    if !r[..end].is_empty()
                        && r[..end].chars().all(|c| c.is_alphanumeric() || c == '_') =>
                {
                    (&r[..end], &r[end + 1..])
                }
                _ => {
                    out("$");
                    continue;
                }
            }
        } else {
            let end = rest
                .char_indices()
                .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
                .map_or(rest.len(), |(i, _)| i);
            if end == 0 {
                out("$");
                continue;
            }
            (&rest[..end], &rest[end..])
        };
        let group = match name.parse::<usize>() {
            Ok(n) => caps.get(n),
            Err(_) => caps.name(name),
        };
        if let Some(m) = group {
            out(m.as_str());
        }
        rest = after;
    }
    out(rest);
}

/// Go's `ReplaceAllString` (`literal`: `ReplaceAllLiteralString`). Each
/// match is charged, and what it adds to the output reserved, before the
/// output grows.
fn regex_replace(
    c: &Ctx,
    pattern: &str,
    input: &str,
    repl: &str,
    literal: bool,
) -> Result<String, FnError> {
    let re = c.regex(pattern)?;
    scan(c, input)?;
    c.reserve_usize(input.len())?;
    let mut out = String::with_capacity(input.len());
    let mut last = 0;
    let mut last_match_end: Option<usize> = None;
    for caps in re.captures_iter(input) {
        c.work(cost::REGEX_MATCH)?;
        let m = caps.get(0).expect("group 0");
        // Go skips an empty match right after the previous match.
        if m.start() == m.end() && last_match_end == Some(m.start()) && m.start() != 0 {
            continue;
        }
        out.push_str(&input[last..m.start()]);
        if literal {
            c.reserve_usize(repl.len())?;
            out.push_str(repl);
        } else {
            c.work(cost::bytes_usize(repl.len()))?;
            let mut size = 0u64;
            expand(repl, &caps, &mut |piece| {
                size = size.saturating_add(piece.len() as u64)
            });
            c.reserve(size)?;
            expand(repl, &caps, &mut |piece| out.push_str(piece));
        }
        last = m.end();
        last_match_end = Some(m.end());
    }
    out.push_str(&input[last..]);
    Ok(out)
}

fn find_all(c: &Ctx, pattern: &str, input: &str, n: i64) -> Result<Vec<String>, FnError> {
    let re = c.regex(pattern)?;
    scan(c, input)?;
    let mut out = Vec::new();
    let mut prev_end: Option<usize> = None;
    for m in re.find_iter(input) {
        c.work(cost::REGEX_MATCH)?;
        if n >= 0 && out.len() as i64 >= n {
            break;
        }
        if m.start() == m.end() && prev_end == Some(m.start()) {
            continue;
        }
        prev_end = Some(m.end());
        c.reserve((m.len() as u64).saturating_add(SLOT))?;
        out.push(m.as_str().to_owned());
    }
    Ok(out)
}

/// Go's `Regexp.Split`.
fn regex_split(c: &Ctx, pattern: &str, input: &str, n: i64) -> Result<Vec<String>, FnError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let re = c.regex(pattern)?;
    if !pattern.is_empty() && input.is_empty() {
        return Ok(vec![String::new()]);
    }
    let matches = match_indices(c, &re, input, n)?;
    reserve_slots(c, matches.len().saturating_add(1))?;
    c.reserve_usize(input.len())?;
    let mut out = Vec::new();
    let (mut beg, mut end) = (0, 0);
    for (start, stop) in matches {
        if n > 0 && out.len() as i64 == n - 1 {
            break;
        }
        end = start;
        if stop != 0 {
            out.push(input[beg..end].to_owned());
        }
        beg = stop;
    }
    if end != input.len() {
        out.push(input[beg..].to_owned());
    }
    Ok(out)
}

/// Go's `FindAllStringIndex`: an empty match right after a match is skipped.
fn match_indices(
    c: &Ctx,
    re: &regex::Regex,
    input: &str,
    n: i64,
) -> Result<Vec<(usize, usize)>, FnError> {
    scan(c, input)?;
    let mut out = Vec::new();
    let mut prev_end: Option<usize> = None;
    for m in re.find_iter(input) {
        c.work(cost::REGEX_MATCH)?;
        if n >= 0 && out.len() as i64 >= n {
            break;
        }
        if m.start() == m.end() && prev_end == Some(m.start()) {
            continue;
        }
        prev_end = Some(m.end());
        out.push((m.start(), m.end()));
    }
    Ok(out)
}

/// A copy of a map's entries (the map may change while they are merged),
/// its slots reserved.
fn snapshot(c: &Ctx, map: &MapRef) -> Result<BTreeMap<String, V>, FnError> {
    let map = map.borrow();
    let key_bytes = map
        .keys()
        .map(|k| k.len() as u64)
        .fold(0, u64::saturating_add);
    c.reserve(key_bytes.saturating_add((map.len() as u64).saturating_mul(SLOT)))?;
    Ok(map.clone())
}

fn merge_into(
    c: &Ctx,
    dst: &MapRef,
    src: &BTreeMap<String, V>,
    overwrite: bool,
    depth: usize,
) -> Result<(), FnError> {
    if depth > 100 {
        return msg("maps nested too deep to merge");
    }
    for (key, src_val) in src {
        c.work(cost::NODE)?;
        let dst_val = dst.borrow().get(key).cloned();
        if let V::Nil = src_val {
            if overwrite {
                dst.borrow_mut().insert(key.clone(), V::Nil);
            }
            continue;
        }
        if let (V::Map(sm, _), Some(V::Map(dm, _))) = (src_val, &dst_val)
            && !Rc::ptr_eq(sm, dm)
        {
            let entries = snapshot(c, sm)?;
            merge_into(c, dm, &entries, overwrite, depth + 1)?;
        }
        if let Some(d) = &dst_val
            && !d.is_empty()
        {
            if matches!(src_val, V::List(..)) && !overwrite {
                continue;
            }
            if matches!(src_val, V::Map(..)) && matches!(d, V::Map(..)) {
                continue;
            }
        }
        let empty_dst = dst_val.as_ref().is_none_or(V::is_empty);
        if overwrite || empty_dst {
            no_cycle(c, src_val, dst)?;
            c.reserve((key.len() as u64).saturating_add(SLOT))?;
            dst.borrow_mut().insert(key.clone(), src_val.clone());
        }
    }
    Ok(())
}

fn merge(c: &Ctx, args: Vec<V>, overwrite: bool) -> Res {
    let V::Map(dst, _) = &args[0] else {
        return msg("merge needs maps");
    };
    for src in &args[1..] {
        if let V::Map(m, _) = src {
            let entries = snapshot(c, m)?;
            merge_into(c, dst, &entries, overwrite, 0)?;
        }
    }
    Ok(args[0].clone())
}

fn dig_from(map: &V, default: &V, keys: &[String]) -> Res {
    let V::Map(m, Elem::Any) = map else {
        return msg("interface conversion: interface {} is not map[string]interface {}");
    };
    let step = m.borrow().get(&keys[0]).cloned();
    match step {
        None => Ok(default.clone()),
        Some(v) if keys.len() == 1 => Ok(v),
        Some(v) => dig_from(&v, default, &keys[1..]),
    }
}

/// A copy of `v` (strings are shared), every node charged and its slot
/// reserved: a list that holds another many times is copied, and charged,
/// as often.
fn deep_copy(c: &Ctx, v: &V, depth: usize) -> Res {
    if depth > 1000 {
        return msg("a value is nested too deep to copy");
    }
    c.work(cost::VALUE_NODE)?;
    Ok(match v {
        V::List(items, elem) => {
            reserve_slots(c, items.len())?;
            V::List(
                Rc::new(
                    items
                        .iter()
                        .map(|i| deep_copy(c, i, depth + 1))
                        .collect::<Result<_, _>>()?,
                ),
                *elem,
            )
        }
        V::Map(m, elem) => {
            let mut out = BTreeMap::new();
            for (k, item) in m.borrow().iter() {
                c.reserve((k.len() as u64).saturating_add(SLOT))?;
                out.insert(k.clone(), deep_copy(c, item, depth + 1)?);
            }
            V::Map(Rc::new(std::cell::RefCell::new(out)), *elem)
        }
        other => other.clone(),
    })
}

/// Sprig's `split` map (`_0`, `_1`, …), reserved first.
fn split_map(c: &Ctx, parts: Vec<&str>) -> Res {
    let bytes = parts
        .iter()
        .map(|p| p.len() as u64 + 8)
        .fold(0, u64::saturating_add);
    c.reserve(bytes.saturating_add((parts.len() as u64).saturating_mul(SLOT)))?;
    let map: BTreeMap<String, V> = parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| (format!("_{i}"), V::str(p)))
        .collect();
    Ok(V::Map(Rc::new(std::cell::RefCell::new(map)), Elem::Str))
}

/// JSON of `v`, written through a bounded sink (charged).
fn json_out(c: &Ctx, v: &V, html: bool, indent: bool) -> Result<String, FnError> {
    let mut unsupported = None;
    let bytes = c.print(|out| match json::encode(out, v, html, indent) {
        Ok(()) => Ok(()),
        Err(json::EncodeError::Print(e)) => Err(e),
        Err(json::EncodeError::Unsupported(m)) => {
            unsupported = Some(m);
            Ok(())
        }
    })?;
    if let Some(m) = unsupported {
        return msg(m);
    }
    Ok(String::from_utf8(bytes).unwrap_or_default())
}

/// Go's `strings.SplitN` parts of `text`, their list reserved first.
fn split_parts<'a>(c: &Ctx, text: &'a str, sep: &str, n: i64) -> Result<Vec<&'a str>, FnError> {
    let count = if sep.is_empty() {
        text.chars().count()
    } else {
        text.matches(sep).count() + 1
    };
    reserve_slots(c, count)?;
    // Each part becomes a string value of its own.
    c.work(cost::nodes(count as u64).saturating_mul(cost::VALUE_NODE))?;
    Ok(go_split(text, sep, n))
}

/// Every Sprig function implemented here.
pub(crate) fn functions() -> Vec<Row> {
    use Ty::{Any, Bool, Int, MapAny, Str};
    vec![
        ("hello", &[], None, |_, _| string("Hello!")),
        // Strings.
        ("abbrev", &[Int, Str], None, |c, a| {
            if i(&a[0]) < 4 {
                return Ok(a[1].clone());
            }
            c.reserve_usize(b(&a[1]).len())?;
            Ok(V::from_bytes(abbreviate_full(b(&a[1]), 0, i(&a[0]))))
        }),
        ("abbrevboth", &[Int, Int, Str], None, |c, a| {
            let (left, right) = (i(&a[0]), i(&a[1]));
            if right < 4 || left > 0 && right < 7 {
                return Ok(a[2].clone());
            }
            c.reserve_usize(b(&a[2]).len())?;
            Ok(V::from_bytes(abbreviate_full(b(&a[2]), left, right)))
        }),
        ("trunc", &[Int, Str], None, |c, a| {
            let (n, text) = (i(&a[0]), b(&a[1]));
            let len = text.len() as i64;
            if n < 0 && len.saturating_add(n) > 0 {
                let part = &text[(len + n) as usize..];
                c.reserve_usize(part.len())?;
                return Ok(V::from_bytes(part.to_vec()));
            }
            if n >= 0 && len > n {
                c.reserve(n as u64)?;
                return Ok(V::from_bytes(text[..n as usize].to_vec()));
            }
            Ok(a[1].clone())
        }),
        ("trim", &[Str], None, |c, a| {
            let text = s(&a[0]);
            c.reserve_usize(text.len())?;
            string(text.trim())
        }),
        ("upper", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), CASE_GROWTH * 3)?;
            string(s(&a[0]).chars().map(go_upper).collect::<String>())
        }),
        ("lower", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), CASE_GROWTH * 3)?;
            string(s(&a[0]).chars().map(go_lower).collect::<String>())
        }),
        ("title", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), CASE_GROWTH * 3)?;
            string(title(&s(&a[0])))
        }),
        ("untitle", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), CASE_GROWTH * 3)?;
            let mut next = true;
            let out: String = s(&a[0])
                .chars()
                .map(|c| {
                    if c.is_whitespace() {
                        next = true;
                        c
                    } else if next {
                        next = false;
                        go_lower(c)
                    } else {
                        c
                    }
                })
                .collect();
            string(out)
        }),
        ("substr", &[Int, Int, Str], None, |c, a| {
            let (start, end, text) = (i(&a[0]), i(&a[1]), b(&a[2]));
            let len = text.len() as i64;
            let out_of_range = || {
                msg(format!(
                    "runtime error: slice bounds out of range for a string of {len} bytes"
                ))
            };
            let slice = if start < 0 {
                if end < 0 || end > len {
                    return out_of_range();
                }
                &text[..end as usize]
            } else if end < 0 || end > len {
                if start > len {
                    return out_of_range();
                }
                &text[start as usize..]
            } else {
                if start > end {
                    return out_of_range();
                }
                &text[start as usize..end as usize]
            };
            c.reserve_usize(slice.len())?;
            Ok(V::from_bytes(slice.to_vec()))
        }),
        ("repeat", &[Int, Str], None, |c, a| {
            let n = i(&a[0]);
            if n < 0 {
                return msg("strings: negative Repeat count");
            }
            let text = b(&a[1]);
            c.reserve((text.len() as u64).saturating_mul(n as u64))?;
            Ok(V::from_bytes(text.repeat(n as usize)))
        }),
        ("trimall", &[Str, Str], None, |c, a| trim_all(c, &a)),
        ("trimAll", &[Str, Str], None, |c, a| trim_all(c, &a)),
        ("trimSuffix", &[Str, Str], None, |c, a| {
            let text = b(&a[1]);
            c.reserve_usize(text.len())?;
            Ok(V::from_bytes(
                text.strip_suffix(b(&a[0])).unwrap_or(text).to_vec(),
            ))
        }),
        ("trimPrefix", &[Str, Str], None, |c, a| {
            let text = b(&a[1]);
            c.reserve_usize(text.len())?;
            Ok(V::from_bytes(
                text.strip_prefix(b(&a[0])).unwrap_or(text).to_vec(),
            ))
        }),
        ("nospace", &[Str], None, |c, a| {
            // goutils reads the string byte by byte, each byte as a rune.
            let bytes = b(&a[0]);
            let space =
                |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x85 | 0xa0);
            if !bytes.iter().any(space) {
                return Ok(a[0].clone());
            }
            reserve_text(c, bytes.len(), 2)?;
            string(
                bytes
                    .iter()
                    .filter(|b| !space(b))
                    .map(|b| *b as char)
                    .collect::<String>(),
            )
        }),
        ("initials", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), 2)?;
            let mut gap = true;
            let mut out = String::new();
            for &byte in b(&a[0]) {
                let ch = byte as char;
                if matches!(
                    byte,
                    b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x85 | 0xa0
                ) {
                    gap = true;
                } else if gap {
                    out.push(ch);
                    gap = false;
                }
            }
            string(out)
        }),
        ("swapcase", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), CASE_GROWTH * 3)?;
            string(
                s(&a[0])
                    .chars()
                    .map(|c| {
                        if c.is_uppercase() || go_title(c) == c && go_lower(c) != c {
                            go_lower(c)
                        } else if c.is_lowercase() {
                            go_title(c)
                        } else {
                            c
                        }
                    })
                    .collect::<String>(),
            )
        }),
        ("contains", &[Str, Str], None, |_, a| {
            Ok(V::Bool(s(&a[1]).contains(s(&a[0]).as_ref())))
        }),
        ("hasPrefix", &[Str, Str], None, |_, a| {
            Ok(V::Bool(b(&a[1]).starts_with(b(&a[0]))))
        }),
        ("hasSuffix", &[Str, Str], None, |_, a| {
            Ok(V::Bool(b(&a[1]).ends_with(b(&a[0]))))
        }),
        ("quote", &[], Some(Any), |c, a| {
            let mut parts = Vec::new();
            for v in a.iter().filter(|v| !matches!(v, V::Nil)) {
                let text = strval(c, v)?;
                c.reserve(
                    (text.len() as u64)
                        .saturating_mul(QUOTE_GROWTH)
                        .saturating_add(3),
                )?;
                parts.push(quote_bytes(&text, false));
            }
            string(parts.join(" "))
        }),
        ("squote", &[], Some(Any), |c, a| {
            let mut out = Vec::new();
            for (n, v) in a.iter().filter(|v| !matches!(v, V::Nil)).enumerate() {
                let text = strval(c, v)?;
                c.reserve((text.len() as u64).saturating_add(3))?;
                if n > 0 {
                    out.push(b' ');
                }
                out.push(b'\'');
                out.extend(text);
                out.push(b'\'');
            }
            Ok(V::from_bytes(out))
        }),
        ("cat", &[], Some(Any), |c, a| {
            let items: Vec<V> = a.into_iter().filter(|v| !matches!(v, V::Nil)).collect();
            let format = vec!["%v"; items.len()].join(" ");
            Ok(V::from_bytes(
                c.print(|out| sprintf(out, format.as_bytes(), &items))?,
            ))
        }),
        ("indent", &[Int, Str], None, |c, a| indent(c, &a, false)),
        ("nindent", &[Int, Str], None, |c, a| indent(c, &a, true)),
        ("replace", &[Str, Str, Str], None, |c, a| {
            let (old, new, src) = (s(&a[0]), s(&a[1]), s(&a[2]));
            // Reserve the size of the result before building it.
            let count = if old.is_empty() {
                src.chars().count() + 1
            } else {
                src.matches(old.as_ref()).count()
            };
            c.reserve(
                (src.len() as u64).saturating_add((count as u64).saturating_mul(new.len() as u64)),
            )?;
            let out = if old.is_empty() {
                // Go inserts `new` before every character and at the end.
                let mut out = String::new();
                for ch in src.chars() {
                    out.push_str(&new);
                    out.push(ch);
                }
                out.push_str(&new);
                out
            } else {
                src.replace(old.as_ref(), &new)
            };
            string(out)
        }),
        ("plural", &[Str, Str, Int], None, |_, a| {
            Ok(if i(&a[2]) == 1 {
                a[0].clone()
            } else {
                a[1].clone()
            })
        }),
        ("sha1sum", &[Str], None, |c, a| {
            c.work(cost::hash(b(&a[0]).len(), false))?;
            string(hex(&Sha1::digest(b(&a[0]))))
        }),
        ("sha256sum", &[Str], None, |c, a| {
            c.work(cost::hash(b(&a[0]).len(), false))?;
            string(hex(&Sha256::digest(b(&a[0]))))
        }),
        ("sha512sum", &[Str], None, |c, a| {
            c.work(cost::hash(b(&a[0]).len(), true))?;
            string(hex(&Sha512::digest(b(&a[0]))))
        }),
        ("adler32sum", &[Str], None, |c, a| {
            c.work(cost::hash(b(&a[0]).len(), true))?;
            string(adler32(b(&a[0])).to_string())
        }),
        ("toString", &[Any], None, |c, a| {
            Ok(V::from_bytes(strval(c, &a[0])?))
        }),
        // Numbers.
        ("atoi", &[Str], None, |_, a| {
            let text = s(&a[0]);
            let digits = text.strip_prefix(['+', '-']).unwrap_or(&text);
            let ok = !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit());
            Ok(V::int(if ok {
                text.parse::<i64>().unwrap_or(0)
            } else {
                0
            }))
        }),
        ("int64", &[Any], None, |_, a| Ok(V::int64(to_int64(&a[0])))),
        ("int", &[Any], None, |_, a| Ok(V::int(to_int64(&a[0])))),
        ("float64", &[Any], None, |_, a| Ok(V::Float(to_f64(&a[0])))),
        ("seq", &[], Some(Int), |c, a| {
            let p: Vec<i64> = a.iter().map(i).collect();
            let values = match p.len() {
                1 => {
                    let (start, end) = (1, p[0]);
                    let inc = if end < start { -1 } else { 1 };
                    untilstep(start, end.wrapping_add(inc), inc, c)?
                }
                2 => {
                    let (start, end) = (p[0], p[1]);
                    let step = if end < start { -1 } else { 1 };
                    untilstep(start, end.wrapping_add(step), step, c)?
                }
                3 => {
                    let (start, step, end) = (p[0], p[1], p[2]);
                    let mut inc = 1;
                    if end < start {
                        inc = -1;
                        if step > 0 {
                            return string("");
                        }
                    }
                    untilstep(start, end.wrapping_add(inc), step, c)?
                }
                _ => Vec::new(),
            };
            // At most 20 digits and a space each.
            reserve_text(c, values.len(), 21)?;
            string(
                values
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        }),
        ("toDecimal", &[Any], None, |c, a| {
            let text = strval_text(c, &a[0])?;
            let digits = text.strip_prefix(['+', '-']).unwrap_or(&text);
            let ok = !digits.is_empty() && digits.bytes().all(|c| (b'0'..=b'7').contains(&c));
            let n = if ok {
                i64::from_str_radix(&text, 8).unwrap_or(0)
            } else {
                0
            };
            Ok(V::int64(n))
        }),
        ("until", &[Int], None, |c, a| {
            let n = i(&a[0]);
            let step = if n < 0 { -1 } else { 1 };
            Ok(int_list(untilstep(0, n, step, c)?))
        }),
        ("untilStep", &[Int, Int, Int], None, |c, a| {
            Ok(int_list(untilstep(i(&a[0]), i(&a[1]), i(&a[2]), c)?))
        }),
        ("add1", &[Any], None, |_, a| {
            Ok(V::int64(to_int64(&a[0]).wrapping_add(1)))
        }),
        ("add", &[], Some(Any), |_, a| {
            Ok(V::int64(
                a.iter().fold(0i64, |acc, v| acc.wrapping_add(to_int64(v))),
            ))
        }),
        ("sub", &[Any, Any], None, |_, a| {
            Ok(V::int64(to_int64(&a[0]).wrapping_sub(to_int64(&a[1]))))
        }),
        ("div", &[Any, Any], None, |_, a| {
            let (x, y) = (to_int64(&a[0]), to_int64(&a[1]));
            if y == 0 {
                return msg("runtime error: integer divide by zero");
            }
            Ok(V::int64(x.wrapping_div(y)))
        }),
        ("mod", &[Any, Any], None, |_, a| {
            let (x, y) = (to_int64(&a[0]), to_int64(&a[1]));
            if y == 0 {
                return msg("runtime error: integer divide by zero");
            }
            Ok(V::int64(x.wrapping_rem(y)))
        }),
        ("mul", &[Any], Some(Any), |_, a| {
            Ok(V::int64(a[1..].iter().fold(to_int64(&a[0]), |acc, v| {
                acc.wrapping_mul(to_int64(v))
            })))
        }),
        ("add1f", &[Any], None, |_, a| {
            Ok(V::Float(decimal_op(
                &a[0],
                &[V::int(1)],
                dec_add,
                |x, y| x + y,
            )))
        }),
        ("addf", &[], Some(Any), |_, a| {
            Ok(V::Float(decimal_op(&V::Float(0.0), &a, dec_add, |x, y| {
                x + y
            })))
        }),
        ("subf", &[Any], Some(Any), |_, a| {
            Ok(V::Float(decimal_op(&a[0], &a[1..], dec_sub, |x, y| x - y)))
        }),
        ("mulf", &[Any], Some(Any), |_, a| {
            Ok(V::Float(decimal_op(&a[0], &a[1..], dec_mul, |x, y| x * y)))
        }),
        ("divf", &[Any], Some(Any), |_, a| {
            for d in &a[1..] {
                if to_f64(d) == 0.0 {
                    return msg("decimal division by 0");
                }
            }
            Ok(V::Float(decimal_op(&a[0], &a[1..], dec_div, |x, y| x / y)))
        }),
        ("biggest", &[Any], Some(Any), |_, a| {
            Ok(V::int64(a.iter().map(to_int64).max().unwrap_or(0)))
        }),
        ("max", &[Any], Some(Any), |_, a| {
            Ok(V::int64(a.iter().map(to_int64).max().unwrap_or(0)))
        }),
        ("min", &[Any], Some(Any), |_, a| {
            Ok(V::int64(a.iter().map(to_int64).min().unwrap_or(0)))
        }),
        ("maxf", &[Any], Some(Any), |_, a| {
            Ok(V::Float(
                a[1..]
                    .iter()
                    .fold(to_f64(&a[0]), |acc, v| go_max(acc, to_f64(v))),
            ))
        }),
        ("minf", &[Any], Some(Any), |_, a| {
            Ok(V::Float(
                a[1..]
                    .iter()
                    .fold(to_f64(&a[0]), |acc, v| go_min(acc, to_f64(v))),
            ))
        }),
        ("ceil", &[Any], None, |_, a| {
            Ok(V::Float(to_f64(&a[0]).ceil()))
        }),
        ("floor", &[Any], None, |_, a| {
            Ok(V::Float(to_f64(&a[0]).floor()))
        }),
        ("round", &[Any, Int], Some(Ty::Float), |_, a| {
            let round_on = match a.get(2) {
                Some(V::Float(f)) => *f,
                _ => 0.5,
            };
            let val = to_f64(&a[0]);
            let pow = 10f64.powf(i(&a[1]) as f64);
            let digit = pow * val;
            let frac = digit - digit.trunc();
            let r = if frac >= round_on {
                digit.ceil()
            } else {
                digit.floor()
            };
            Ok(V::Float(r / pow))
        }),
        // String lists.
        ("join", &[Str, Any], None, |c, a| {
            let parts = strslice(c, &a[1])?;
            let sep = s(&a[0]);
            let size = parts
                .iter()
                .map(|p| (p.len() as u64).saturating_add(sep.len() as u64))
                .fold(0, u64::saturating_add);
            c.reserve(size)?;
            string(parts.join(&sep))
        }),
        ("sortAlpha", &[Any], None, |c, a| match &a[0] {
            V::List(..) => {
                let mut list = strslice(c, &a[0])?;
                let n = list.len() as u64;
                c.work(n.saturating_mul(u64::from(n.max(1).ilog2() + 1)))?;
                list.sort();
                Ok(V::str_list(list))
            }
            other => Ok(V::str_list(vec![strval_text(c, other)?])),
        }),
        ("split", &[Str, Str], None, |c, a| {
            let (sep, text) = (s(&a[0]), s(&a[1]));
            split_map(c, split_parts(c, &text, &sep, -1)?)
        }),
        ("splitList", &[Str, Str], None, |c, a| {
            let (sep, text) = (s(&a[0]), s(&a[1]));
            let parts = split_parts(c, &text, &sep, -1)?;
            c.reserve_usize(text.len())?;
            Ok(V::str_list(parts.into_iter().map(str::to_owned).collect()))
        }),
        ("splitn", &[Str, Int, Str], None, |c, a| {
            let (sep, n, text) = (s(&a[0]), i(&a[1]), s(&a[2]));
            split_map(c, split_parts(c, &text, &sep, n)?)
        }),
        ("toStrings", &[Any], None, |c, a| {
            Ok(V::str_list(strslice(c, &a[0])?))
        }),
        // Defaults and flow.
        ("default", &[Any], Some(Any), |_, a| {
            if a.len() < 2 || a[1].is_empty() {
                return Ok(a[0].clone());
            }
            Ok(a[1].clone())
        }),
        ("empty", &[Any], None, |_, a| Ok(V::Bool(a[0].is_empty()))),
        ("coalesce", &[], Some(Any), |_, a| {
            Ok(a.iter().find(|v| !v.is_empty()).cloned().unwrap_or(V::Nil))
        }),
        ("all", &[], Some(Any), |_, a| {
            Ok(V::Bool(a.iter().all(|v| !v.is_empty())))
        }),
        ("any", &[], Some(Any), |_, a| {
            Ok(V::Bool(a.iter().any(|v| !v.is_empty())))
        }),
        ("compact", &[Any], None, |c, a| {
            reserve_slots(c, items(&a[0], "compact")?.len())?;
            Ok(V::list(
                items(&a[0], "compact")?
                    .iter()
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .collect(),
            ))
        }),
        ("mustCompact", &[Any], None, |c, a| {
            reserve_slots(c, items(&a[0], "compact")?.len())?;
            Ok(V::list(
                items(&a[0], "compact")?
                    .iter()
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .collect(),
            ))
        }),
        ("ternary", &[Any, Any, Bool], None, |_, a| {
            Ok(if matches!(a[2], V::Bool(true)) {
                a[0].clone()
            } else {
                a[1].clone()
            })
        }),
        // The message is not shown: it is usually built from a secret, and
        // it would reach the status, the events and the log.
        ("fail", &[Str], None, |_, _| Err(FnError::Fail)),
        // JSON.
        ("fromJson", &[Str], None, |c, a| {
            match json::decode(c, &s(&a[0])) {
                Ok(v) => Ok(v),
                Err(json::DecodeError::Invalid(_)) => Ok(V::Nil),
                Err(json::DecodeError::Stopped(e)) => Err(e),
            }
        }),
        ("mustFromJson", &[Str], None, |c, a| {
            match json::decode(c, &s(&a[0])) {
                Ok(v) => Ok(v),
                Err(json::DecodeError::Invalid(m)) => Err(FnError::Helper(m)),
                Err(json::DecodeError::Stopped(e)) => Err(e),
            }
        }),
        ("toJson", &[Any], None, |c, a| {
            lenient_json(c, &a[0], true, false)
        }),
        ("mustToJson", &[Any], None, |c, a| {
            string(json_out(c, &a[0], true, false)?)
        }),
        ("toPrettyJson", &[Any], None, |c, a| {
            lenient_json(c, &a[0], true, true)
        }),
        ("mustToPrettyJson", &[Any], None, |c, a| {
            string(json_out(c, &a[0], true, true)?)
        }),
        ("toRawJson", &[Any], None, |c, a| {
            string(json_out(c, &a[0], false, false)?)
        }),
        ("mustToRawJson", &[Any], None, |c, a| {
            string(json_out(c, &a[0], false, false)?)
        }),
        ("deepCopy", &[Any], None, |c, a| deep_copy(c, &a[0], 0)),
        ("mustDeepCopy", &[Any], None, |c, a| deep_copy(c, &a[0], 0)),
        // Reflection.
        ("typeOf", &[Any], None, |_, a| string(type_of(&a[0]))),
        ("typeIs", &[Str, Any], None, |_, a| {
            Ok(V::Bool(s(&a[0]) == type_of(&a[1])))
        }),
        ("typeIsLike", &[Str, Any], None, |_, a| {
            let t = type_of(&a[1]);
            let target = s(&a[0]);
            Ok(V::Bool(target == t || format!("*{target}") == t))
        }),
        ("kindOf", &[Any], None, |_, a| string(a[0].kind_name())),
        ("kindIs", &[Str, Any], None, |_, a| {
            Ok(V::Bool(s(&a[0]) == a[1].kind_name()))
        }),
        ("deepEqual", &[Any, Any], None, |c, a| {
            Ok(V::Bool(deep_equal(c, &a[0], &a[1])?))
        }),
        // Paths.
        ("base", &[Str], None, |c, a| path(c, &a[0], base)),
        ("dir", &[Str], None, |c, a| path(c, &a[0], dir)),
        ("clean", &[Str], None, |c, a| path(c, &a[0], clean)),
        ("ext", &[Str], None, |c, a| path(c, &a[0], ext)),
        ("isAbs", &[Str], None, |_, a| {
            Ok(V::Bool(s(&a[0]).starts_with('/')))
        }),
        ("osBase", &[Str], None, |c, a| path(c, &a[0], base)),
        ("osDir", &[Str], None, |c, a| path(c, &a[0], dir)),
        ("osClean", &[Str], None, |c, a| path(c, &a[0], clean)),
        ("osExt", &[Str], None, |c, a| path(c, &a[0], ext)),
        ("osIsAbs", &[Str], None, |_, a| {
            Ok(V::Bool(s(&a[0]).starts_with('/')))
        }),
        // Encoding.
        ("b64enc", &[Str], None, |c, a| {
            c.reserve((b(&a[0]).len() as u64).div_ceil(3).saturating_mul(4))?;
            string(encode_base64(b(&a[0])))
        }),
        ("b64dec", &[Str], None, |c, a| {
            c.reserve((b(&a[0]).len() as u64).div_ceil(4).saturating_mul(3))?;
            match b64_decode(b(&a[0])) {
                Ok(bytes) => Ok(V::from_bytes(bytes)),
                Err(at) => string(format!("illegal base64 data at input byte {at}")),
            }
        }),
        ("b32enc", &[Str], None, |c, a| {
            c.reserve((b(&a[0]).len() as u64).div_ceil(5).saturating_mul(8))?;
            string(b32_encode(b(&a[0])))
        }),
        ("b32dec", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), B32_DECODE_GROWTH)?;
            match b32_decode(b(&a[0])) {
                Ok(bytes) => Ok(V::from_bytes(bytes)),
                Err(at) => string(format!("illegal base32 data at input byte {at}")),
            }
        }),
        // Lists and dicts.
        ("list", &[], Some(Any), |c, a| {
            reserve_slots(c, a.len())?;
            Ok(V::list(a))
        }),
        ("tuple", &[], Some(Any), |c, a| {
            reserve_slots(c, a.len())?;
            Ok(V::list(a))
        }),
        ("dict", &[], Some(Any), |c, a| {
            let mut map = BTreeMap::new();
            let mut it = a.chunks(2);
            for pair in &mut it {
                let key = strval_text(c, &pair[0])?;
                c.reserve((key.len() as u64).saturating_add(SLOT))?;
                map.insert(key, pair.get(1).cloned().unwrap_or_else(|| V::str("")));
            }
            Ok(V::map(map))
        }),
        ("get", &[MapAny, Str], None, |_, a| {
            let V::Map(m, _) = &a[0] else {
                return string("");
            };
            Ok(m.borrow()
                .get(s(&a[1]).as_ref())
                .cloned()
                .unwrap_or_else(|| V::str("")))
        }),
        ("set", &[MapAny, Str, Any], None, |c, a| {
            let V::Map(m, _) = &a[0] else {
                return msg("set needs a map");
            };
            no_cycle(c, &a[2], m)?;
            c.reserve((b(&a[1]).len() as u64).saturating_add(SLOT))?;
            m.borrow_mut().insert(s(&a[1]).into_owned(), a[2].clone());
            Ok(a[0].clone())
        }),
        ("unset", &[MapAny, Str], None, |_, a| {
            if let V::Map(m, _) = &a[0] {
                m.borrow_mut().remove(s(&a[1]).as_ref());
            }
            Ok(a[0].clone())
        }),
        ("hasKey", &[MapAny, Str], None, |_, a| {
            let V::Map(m, _) = &a[0] else {
                return Ok(V::Bool(false));
            };
            Ok(V::Bool(m.borrow().contains_key(s(&a[1]).as_ref())))
        }),
        ("pluck", &[Str], Some(MapAny), |c, a| {
            reserve_slots(c, a.len())?;
            let key = s(&a[0]);
            let mut out = Vec::new();
            for d in &a[1..] {
                if let V::Map(m, _) = d
                    && let Some(v) = m.borrow().get(key.as_ref())
                {
                    out.push(v.clone());
                }
            }
            Ok(V::list(out))
        }),
        ("keys", &[], Some(MapAny), |c, a| {
            let mut out = Vec::new();
            for d in &a {
                if let V::Map(m, _) = d {
                    let m = m.borrow();
                    let bytes = m
                        .keys()
                        .map(|k| k.len() as u64 + SLOT)
                        .fold(0, u64::saturating_add);
                    c.reserve(bytes)?;
                    out.extend(m.keys().cloned());
                }
            }
            Ok(V::str_list(out))
        }),
        ("pick", &[MapAny], Some(Str), |c, a| {
            reserve_slots(c, a.len())?;
            let V::Map(m, _) = &a[0] else {
                return Ok(V::map(BTreeMap::new()));
            };
            let m = m.borrow();
            let mut out = BTreeMap::new();
            for k in &a[1..] {
                let k = s(k);
                if let Some(v) = m.get(k.as_ref()) {
                    out.insert(k.into_owned(), v.clone());
                }
            }
            Ok(V::map(out))
        }),
        ("omit", &[MapAny], Some(Str), |c, a| {
            let V::Map(m, _) = &a[0] else {
                return Ok(V::map(BTreeMap::new()));
            };
            snapshot(c, m)?;
            c.work((m.borrow().len() as u64).saturating_mul(a.len() as u64))?;
            let omit: Vec<String> = a[1..].iter().map(|k| s(k).into_owned()).collect();
            let out = m
                .borrow()
                .iter()
                .filter(|(k, _)| !omit.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Ok(V::map(out))
        }),
        ("merge", &[MapAny], Some(MapAny), |c, a| merge(c, a, false)),
        ("mustMerge", &[MapAny], Some(MapAny), |c, a| {
            merge(c, a, false)
        }),
        ("mergeOverwrite", &[MapAny], Some(MapAny), |c, a| {
            merge(c, a, true)
        }),
        ("mustMergeOverwrite", &[MapAny], Some(MapAny), |c, a| {
            merge(c, a, true)
        }),
        ("values", &[MapAny], None, |c, a| {
            let V::Map(m, _) = &a[0] else {
                return Ok(V::list(Vec::new()));
            };
            reserve_slots(c, m.borrow().len())?;
            Ok(V::list(m.borrow().values().cloned().collect()))
        }),
        ("append", &[Any, Any], None, |c, a| {
            push(c, &a, false, "push on")
        }),
        ("push", &[Any, Any], None, |c, a| {
            push(c, &a, false, "push on")
        }),
        ("mustAppend", &[Any, Any], None, |c, a| {
            push(c, &a, false, "push on")
        }),
        ("mustPush", &[Any, Any], None, |c, a| {
            push(c, &a, false, "push on")
        }),
        ("prepend", &[Any, Any], None, |c, a| {
            push(c, &a, true, "prepend on")
        }),
        ("mustPrepend", &[Any, Any], None, |c, a| {
            push(c, &a, true, "prepend on")
        }),
        ("first", &[Any], None, |_, a| {
            Ok(items(&a[0], "find first")?
                .first()
                .cloned()
                .unwrap_or(V::Nil))
        }),
        ("mustFirst", &[Any], None, |_, a| {
            Ok(items(&a[0], "find first")?
                .first()
                .cloned()
                .unwrap_or(V::Nil))
        }),
        ("last", &[Any], None, |_, a| {
            Ok(items(&a[0], "find last")?.last().cloned().unwrap_or(V::Nil))
        }),
        ("mustLast", &[Any], None, |_, a| {
            Ok(items(&a[0], "find last")?.last().cloned().unwrap_or(V::Nil))
        }),
        ("rest", &[Any], None, |c, a| rest_initial(c, &a[0], true)),
        ("mustRest", &[Any], None, |c, a| {
            rest_initial(c, &a[0], true)
        }),
        ("initial", &[Any], None, |c, a| {
            rest_initial(c, &a[0], false)
        }),
        ("mustInitial", &[Any], None, |c, a| {
            rest_initial(c, &a[0], false)
        }),
        ("reverse", &[Any], None, |c, a| {
            reserve_slots(c, items(&a[0], "find reverse")?.len())?;
            Ok(V::list(
                items(&a[0], "find reverse")?
                    .iter()
                    .rev()
                    .cloned()
                    .collect(),
            ))
        }),
        ("mustReverse", &[Any], None, |c, a| {
            reserve_slots(c, items(&a[0], "find reverse")?.len())?;
            Ok(V::list(
                items(&a[0], "find reverse")?
                    .iter()
                    .rev()
                    .cloned()
                    .collect(),
            ))
        }),
        ("uniq", &[Any], None, |c, a| uniq(c, &a[0])),
        ("mustUniq", &[Any], None, |c, a| uniq(c, &a[0])),
        ("without", &[Any], Some(Any), |c, a| without(c, &a)),
        ("mustWithout", &[Any], Some(Any), |c, a| without(c, &a)),
        ("has", &[Any, Any], None, |c, a| has(c, &a)),
        ("mustHas", &[Any, Any], None, |c, a| has(c, &a)),
        ("slice", &[Any], Some(Any), |c, a| slice(c, &a)),
        ("mustSlice", &[Any], Some(Any), |c, a| slice(c, &a)),
        ("concat", &[], Some(Any), |c, a| {
            let mut total = 0usize;
            for l in &a {
                total = total.saturating_add(items(l, "concat")?.len());
            }
            reserve_slots(c, total)?;
            let mut out = Vec::with_capacity(total);
            for l in &a {
                out.extend(items(l, "concat")?.iter().cloned());
            }
            Ok(V::list(out))
        }),
        ("dig", &[], Some(Any), |_, a| {
            if a.len() < 3 {
                return msg("dig needs at least three arguments");
            }
            let mut keys = Vec::new();
            for k in &a[..a.len() - 2] {
                match k {
                    V::Str(_) | V::Bytes(_) => keys.push(s(k).into_owned()),
                    other => {
                        return msg(format!(
                            "interface conversion: interface {{}} is {}, not string",
                            other.type_name()
                        ));
                    }
                }
            }
            dig_from(&a[a.len() - 1], &a[a.len() - 2], &keys)
        }),
        ("chunk", &[Int, Any], None, |c, a| chunk(c, &a)),
        ("mustChunk", &[Int, Any], None, |c, a| chunk(c, &a)),
        // Regular expressions.
        ("regexMatch", &[Str, Str], None, |c, a| {
            // Sprig ignores a pattern that does not compile (no match).
            let re = match c.regex(&s(&a[0])) {
                Ok(re) => re,
                Err(FnError::Msg(_)) => return Ok(V::Bool(false)),
                Err(e) => return Err(e),
            };
            scan(c, &s(&a[1]))?;
            Ok(V::Bool(re.is_match(&s(&a[1]))))
        }),
        ("mustRegexMatch", &[Str, Str], None, |c, a| {
            let re = c.regex(&s(&a[0]))?;
            scan(c, &s(&a[1]))?;
            Ok(V::Bool(re.is_match(&s(&a[1]))))
        }),
        ("regexFindAll", &[Str, Str, Int], None, |c, a| {
            Ok(V::str_list(find_all(c, &s(&a[0]), &s(&a[1]), i(&a[2]))?))
        }),
        ("mustRegexFindAll", &[Str, Str, Int], None, |c, a| {
            Ok(V::str_list(find_all(c, &s(&a[0]), &s(&a[1]), i(&a[2]))?))
        }),
        ("regexFind", &[Str, Str], None, |c, a| regex_find(c, &a)),
        ("mustRegexFind", &[Str, Str], None, |c, a| regex_find(c, &a)),
        ("regexReplaceAll", &[Str, Str, Str], None, |c, a| {
            string(regex_replace(c, &s(&a[0]), &s(&a[1]), &s(&a[2]), false)?)
        }),
        ("mustRegexReplaceAll", &[Str, Str, Str], None, |c, a| {
            string(regex_replace(c, &s(&a[0]), &s(&a[1]), &s(&a[2]), false)?)
        }),
        ("regexReplaceAllLiteral", &[Str, Str, Str], None, |c, a| {
            string(regex_replace(c, &s(&a[0]), &s(&a[1]), &s(&a[2]), true)?)
        }),
        (
            "mustRegexReplaceAllLiteral",
            &[Str, Str, Str],
            None,
            |c, a| string(regex_replace(c, &s(&a[0]), &s(&a[1]), &s(&a[2]), true)?),
        ),
        ("regexSplit", &[Str, Str, Int], None, |c, a| {
            Ok(V::str_list(regex_split(c, &s(&a[0]), &s(&a[1]), i(&a[2]))?))
        }),
        ("mustRegexSplit", &[Str, Str, Int], None, |c, a| {
            Ok(V::str_list(regex_split(c, &s(&a[0]), &s(&a[1]), i(&a[2]))?))
        }),
        ("regexQuoteMeta", &[Str], None, |c, a| {
            reserve_text(c, b(&a[0]).len(), 2)?;
            let mut out = String::new();
            for c in s(&a[0]).chars() {
                if "\\.+*?()|[]{}^$".contains(c) {
                    out.push('\\');
                }
                out.push(c);
            }
            string(out)
        }),
    ]
}

fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// Go's `strings.SplitN` (`n` < 0: all).
fn go_split<'a>(text: &'a str, sep: &str, n: i64) -> Vec<&'a str> {
    if n == 0 {
        return Vec::new();
    }
    if sep.is_empty() {
        let mut out: Vec<&str> = text
            .char_indices()
            .map(|(i, c)| &text[i..i + c.len_utf8()])
            .collect();
        if n > 0 && out.len() as i64 > n {
            let at = text
                .char_indices()
                .nth((n - 1) as usize)
                .map_or(text.len(), |(i, _)| i);
            out.truncate((n - 1) as usize);
            out.push(&text[at..]);
        }
        return out;
    }
    if n < 0 {
        text.split(sep).collect()
    } else {
        text.splitn(n as usize, sep).collect()
    }
}

fn type_of(v: &V) -> String {
    v.type_name().into()
}

/// Sprig's `indent`/`nindent`: the size of the result (`lines × width`,
/// saturating) is reserved before the padding is built.
fn indent(c: &Ctx, a: &[V], newline: bool) -> Res {
    if i(&a[0]) < 0 {
        return msg("strings: negative Repeat count");
    }
    let n = i(&a[0]) as u64;
    let text = s(&a[1]);
    let lines = text.matches('\n').count() as u64 + 1;
    let size = (text.len() as u64)
        .saturating_add(lines.saturating_mul(n))
        .saturating_add(1);
    c.reserve(size)?;
    let pad = " ".repeat(n as usize);
    let mut out = String::with_capacity(size as usize);
    if newline {
        out.push('\n');
    }
    out.push_str(&pad);
    out.push_str(&text.replace('\n', &format!("\n{pad}")));
    string(out)
}

fn push(c: &Ctx, a: &[V], front: bool, what: &str) -> Res {
    let list = items(&a[0], what)?;
    reserve_slots(c, list.len().saturating_add(1))?;
    let mut out = Vec::with_capacity(list.len() + 1);
    if front {
        out.push(a[1].clone());
    }
    out.extend(list.iter().cloned());
    if !front {
        out.push(a[1].clone());
    }
    Ok(V::list(out))
}

fn rest_initial(c: &Ctx, v: &V, rest: bool) -> Res {
    let list = items(v, if rest { "find rest" } else { "find initial" })?;
    reserve_slots(c, list.len())?;
    if list.is_empty() {
        // A nil []interface{}: prints `[]`.
        return Ok(V::list(Vec::new()));
    }
    Ok(V::list(if rest {
        list[1..].to_vec()
    } else {
        list[..list.len() - 1].to_vec()
    }))
}

/// Whether `item` is deep-equal to one of `list` (each comparison charged).
fn contains(c: &Ctx, list: &[V], item: &V) -> Result<bool, FnError> {
    for o in list {
        if deep_equal(c, o, item)? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn uniq(c: &Ctx, v: &V) -> Res {
    let list = items(v, "find uniq")?;
    reserve_slots(c, list.len())?;
    let mut out: Vec<V> = Vec::new();
    for item in list {
        if !contains(c, &out, item)? {
            out.push(item.clone());
        }
    }
    Ok(V::list(out))
}

fn without(c: &Ctx, a: &[V]) -> Res {
    let omit = &a[1..];
    let list = items(&a[0], "find without")?;
    reserve_slots(c, list.len())?;
    let mut out = Vec::new();
    for item in list {
        if !contains(c, omit, item)? {
            out.push(item.clone());
        }
    }
    Ok(V::list(out))
}

fn has(c: &Ctx, a: &[V]) -> Res {
    match &a[1] {
        V::Nil => Ok(V::Bool(false)),
        V::List(items, _) => {
            for i in items.iter() {
                if deep_equal(c, &a[0], i)? {
                    return Ok(V::Bool(true));
                }
            }
            Ok(V::Bool(false))
        }
        other => msg(format!("Cannot find has on type {}", other.kind_name())),
    }
}

fn slice(c: &Ctx, a: &[V]) -> Res {
    let V::List(list, elem) = &a[0] else {
        return msg(format!(
            "list should be type of slice or array but {}",
            a[0].kind_name()
        ));
    };
    if list.is_empty() {
        return Ok(V::Nil);
    }
    let start = a.get(1).map_or(0, to_int64);
    let end = a.get(2).map_or(list.len() as i64, to_int64);
    if start < 0 || end < start || end > list.len() as i64 {
        return msg(format!(
            "reflect: slice index out of range for a list of {} items",
            list.len()
        ));
    }
    reserve_slots(c, (end - start) as usize)?;
    Ok(V::List(
        Rc::new(list[start as usize..end as usize].to_vec()),
        *elem,
    ))
}

fn chunk(c: &Ctx, a: &[V]) -> Res {
    let size = i(&a[0]);
    let list = items(&a[1], "chunk")?;
    if size <= 0 {
        return msg("runtime error: integer divide by zero");
    }
    reserve_slots(c, list.len().saturating_add(list.len() / size as usize + 1))?;
    let out: Vec<V> = list
        .chunks(size as usize)
        .map(|c| V::list(c.to_vec()))
        .collect();
    Ok(V::List(Rc::new(out), Elem::Any))
}

fn trim_all(c: &Ctx, a: &[V]) -> Res {
    let cut: Vec<char> = s(&a[0]).chars().collect();
    let text = s(&a[1]);
    // Each character is compared with every character to cut.
    c.work(cost::bytes(
        (text.len() as u64).saturating_mul(cut.len() as u64),
    ))?;
    c.reserve_usize(text.len())?;
    string(text.trim_matches(cut.as_slice()))
}

/// A path function over a string argument, its result reserved (and the
/// parts of the path it splits).
fn path(c: &Ctx, arg: &V, f: fn(&str) -> String) -> Res {
    reserve_text(c, b(arg).len(), 17)?;
    string(f(&s(arg)))
}

fn regex_find(c: &Ctx, a: &[V]) -> Res {
    let re = c.regex(&s(&a[0]))?;
    let input = s(&a[1]);
    scan(c, &input)?;
    let found = re.find(&input).map_or("", |m| m.as_str());
    c.reserve_usize(found.len())?;
    string(found)
}

/// `toJson`/`toPrettyJson`: the text, or empty when the value has no JSON
/// form (running out of fuel is still an error).
fn lenient_json(c: &Ctx, v: &V, html: bool, indent: bool) -> Res {
    match json_out(c, v, html, indent) {
        Ok(text) => string(text),
        Err(FnError::Msg(_)) => string(""),
        Err(e) => Err(e),
    }
}
