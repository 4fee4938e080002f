//! Parsing of the interval strings used in specs and on the command line:
//! a bare number of seconds (`60`) or `<number><unit>` parts with units `s`,
//! `m`, `h`, `d` and `w` (`30s`, `5m`, `1h30m`, `1w`). The CRD schema accepts
//! exactly the strings this parser accepts (`common::DURATION_PATTERN`).

use std::time::Duration;

/// Why an interval string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string is empty.
    #[error("empty duration")]
    Empty,
    /// The string does not follow the grammar.
    #[error(
        "invalid duration {0:?}: use a number of seconds or <number><s|m|h|d|w> parts, e.g. 30s, 5m, 1h30m"
    )]
    Invalid(String),
    /// The value does not fit in 64 bits of seconds.
    #[error("duration {0:?} is too large")]
    TooLarge(String),
}

/// Parse an interval string. An empty string is an error; callers that treat
/// empty as "use the default" check for it first.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let secs = s
            .parse::<u64>()
            .map_err(|_| DurationError::TooLarge(input.to_owned()))?;
        return Ok(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    for c in s.chars() {
        if let Some(d) = c.to_digit(10) {
            let n = number.unwrap_or(0);
            number = Some(
                n.checked_mul(10)
                    .and_then(|n| n.checked_add(u64::from(d)))
                    .ok_or_else(|| DurationError::TooLarge(input.to_owned()))?,
            );
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(DurationError::Invalid(input.to_owned())),
        };
        let n = number
            .take()
            .ok_or_else(|| DurationError::Invalid(input.to_owned()))?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| DurationError::TooLarge(input.to_owned()))?;
    }
    if number.is_some() {
        // Trailing digits without a unit after a unit part, e.g. "1h30".
        return Err(DurationError::Invalid(input.to_owned()));
    }
    Ok(Duration::from_secs(total))
}

/// Parse an optional interval where empty, `0` and `0s` mean "use the default".
pub fn parse_optional_duration(input: Option<&str>) -> Result<Option<Duration>, DurationError> {
    match input.map(str::trim) {
        None | Some("") => Ok(None),
        Some(s) => {
            let d = parse_duration(s)?;
            Ok(if d.is_zero() { None } else { Some(d) })
        }
    }
}

/// Format a duration the way the parser reads it back (`1h30m`, `45s`).
pub fn format_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    if secs == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("w", 604_800),
        ("d", 86_400),
        ("h", 3600),
        ("m", 60),
        ("s", 1),
    ] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1w2d"), Ok(Duration::from_secs(9 * 86_400)));
    }

    #[test]
    fn refuses_what_the_schema_refuses() {
        for bad in ["", "1x", "h", "1h30", "-5s", "1.5h", "5 m", "1m-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(matches!(
            parse_duration("99999999999999999999999s"),
            Err(DurationError::TooLarge(_))
        ));
    }

    #[test]
    fn optional_zero_means_default() {
        assert_eq!(parse_optional_duration(None), Ok(None));
        assert_eq!(parse_optional_duration(Some("")), Ok(None));
        assert_eq!(parse_optional_duration(Some("0s")), Ok(None));
        assert_eq!(
            parse_optional_duration(Some("2m")),
            Ok(Some(Duration::from_secs(120)))
        );
    }

    #[test]
    fn format_round_trips() {
        for secs in [1, 59, 60, 61, 3600, 5400, 86_400, 694_861] {
            let d = Duration::from_secs(secs);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn parser_agrees_with_the_schema_pattern() {
        let pattern = regex::Regex::new(crate::api::common::DURATION_PATTERN).unwrap();
        for s in [
            "1h30m",
            "10",
            "5m",
            "0s",
            "1w2d3h4m5s",
            "1x",
            "h1",
            "1h30",
            "m",
            "1.5h",
            " 5m",
            "5m ",
            "-1s",
            "1hm",
        ] {
            assert_eq!(
                pattern.is_match(s),
                parse_duration(s).is_ok() && s.trim() == s,
                "the CRD pattern and the parser disagree on {s:?}"
            );
        }
    }
}
