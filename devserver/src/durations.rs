//! Duration strings. The API takes `ms`-style strings (`"30s"`, `"1h"`,
//! `"2 days"`; a bare number is milliseconds, as on the real server); the
//! seed takes the same strings, but a bare number there is seconds.

use std::time::Duration;

/// Longest duration accepted anywhere (about 100 years), so that arithmetic
/// on timestamps cannot overflow.
const MAX_MS: f64 = 100.0 * 365.25 * 86_400_000.0;

/// A lease TTL as the API sends it.
pub(crate) fn parse_api(s: &str) -> Option<Duration> {
    parse(s, 1.0)
}

/// A duration as the seed writes it.
pub(crate) fn parse_seed(s: &str) -> Option<Duration> {
    parse(s, 1000.0)
}

fn parse(s: &str, bare_unit_ms: f64) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    let split = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(s.len(), |(i, _)| i);
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().ok()?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" => bare_unit_ms,
        "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1.0,
        "s" | "sec" | "secs" | "second" | "seconds" => 1000.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
        "d" | "day" | "days" => 86_400_000.0,
        "w" | "week" | "weeks" => 604_800_000.0,
        "y" | "yr" | "yrs" | "year" | "years" => 31_557_600_000.0,
        _ => return None,
    };
    let ms = value * factor;
    if !ms.is_finite() || !(0.0..=MAX_MS).contains(&ms) {
        return None;
    }
    // In range and finite, so the conversion is exact enough and cannot wrap.
    Some(Duration::from_millis(ms.round() as u64))
}

/// A short human form for messages: `1min`, `30s`, `2h`, `1d`.
pub(crate) fn short(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 || s == 0 {
        format!("{}ms", d.as_millis())
    } else if s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}min", s / 60)
    } else {
        format!("{s}s")
    }
}

/// Milliseconds of a duration as a signed timestamp offset.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_strings() {
        assert_eq!(parse_api("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_api("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_api("2 days"), Some(Duration::from_secs(172_800)));
        assert_eq!(parse_api("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_api("60000"), Some(Duration::from_secs(60)));
        assert_eq!(parse_api("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_api("1H"), Some(Duration::from_secs(3600)));
        for bad in ["", "h", "-1h", "1 fortnight", "1e3s", "abc", "1000y"] {
            assert_eq!(parse_api(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn seed_bare_numbers_are_seconds() {
        assert_eq!(parse_seed("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_seed("24h"), Some(Duration::from_secs(86_400)));
    }

    #[test]
    fn short_forms() {
        assert_eq!(short(Duration::from_secs(60)), "1min");
        assert_eq!(short(Duration::from_secs(30)), "30s");
        assert_eq!(short(Duration::from_secs(7200)), "2h");
        assert_eq!(short(Duration::from_secs(86_400)), "1d");
        assert_eq!(short(Duration::from_millis(1500)), "1500ms");
    }
}
