//! Generated values for push: random passwords following a ClusterGenerator's
//! password spec, and version-4 UUIDs. Randomness comes from the operating
//! system's CSPRNG (`ring::rand::SystemRandom`); indexes are drawn without
//! modulo bias.
//!
//! The password rules follow the Go operators (their `go-password`
//! algorithm): `length` characters of which `digits` are digits and `symbols`
//! are symbols, the rest letters (lower case, plus upper case unless
//! `noUpper`), in random order; without `allowRepeat` no character appears
//! twice. Defaults: length 24, a quarter of the length each for digits and
//! symbols (rounded down), and the symbols ``~!@#$%^&*()_+`-={}|[]\:"<>?,./``.

use ring::rand::{SecureRandom, SystemRandom};

use crate::api::cluster_generator::{ClusterGeneratorSpec, PasswordSpec};
use crate::api::kms_push_secret::GeneratorKind;

/// Lower-case letters.
const LOWER: &str = "abcdefghijklmnopqrstuvwxyz";
/// Upper-case letters.
const UPPER: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// Digits.
const DIGITS: &str = "0123456789";
/// The default symbol set.
pub const DEFAULT_SYMBOLS: &str = "~!@#$%^&*()_+`-={}|[]\\:\"<>?,./";
/// The default password length.
pub const DEFAULT_LENGTH: usize = 24;

/// The password rules, with defaults applied and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PasswordRules {
    /// Total length.
    pub length: usize,
    /// How many digits.
    pub digits: usize,
    /// How many symbols.
    pub symbols: usize,
    /// The symbols to choose from (distinct, no whitespace or control
    /// characters: the KMS trims values).
    pub symbol_set: Vec<char>,
    /// No upper-case letters.
    pub no_upper: bool,
    /// Characters may repeat.
    pub allow_repeat: bool,
}

fn count(v: Option<i32>, default: usize, field: &str) -> Result<usize, String> {
    match v {
        None => Ok(default),
        Some(n) => usize::try_from(n).map_err(|_| format!("{field} must not be negative")),
    }
}

impl PasswordRules {
    /// The rules of a password spec (defaults when absent), or why they
    /// cannot produce a password.
    pub fn from_spec(spec: Option<&PasswordSpec>) -> Result<Self, String> {
        let length = match spec {
            None => DEFAULT_LENGTH,
            Some(s) => usize::try_from(s.length)
                .ok()
                .filter(|l| *l > 0)
                .ok_or_else(|| "length must be at least 1".to_owned())?,
        };
        let digits = count(spec.and_then(|s| s.digits), length / 4, "digits")?;
        let symbols = count(spec.and_then(|s| s.symbols), length / 4, "symbols")?;
        let mut symbol_set: Vec<char> = Vec::new();
        let chars = spec
            .and_then(|s| s.symbol_characters.as_deref())
            .unwrap_or(DEFAULT_SYMBOLS);
        for c in chars.chars() {
            if !c.is_whitespace() && !c.is_control() && !symbol_set.contains(&c) {
                symbol_set.push(c);
            }
        }
        let rules = PasswordRules {
            length,
            digits,
            symbols,
            symbol_set,
            no_upper: spec.is_some_and(|s| s.no_upper),
            allow_repeat: spec.is_some_and(|s| s.allow_repeat),
        };
        rules.check()?;
        Ok(rules)
    }

    fn letters(&self) -> Vec<char> {
        let mut l: Vec<char> = LOWER.chars().collect();
        if !self.no_upper {
            l.extend(UPPER.chars());
        }
        l
    }

    fn check(&self) -> Result<(), String> {
        let Some(letters) = self.length.checked_sub(self.digits + self.symbols) else {
            return Err(format!(
                "digits ({}) plus symbols ({}) exceed the length ({})",
                self.digits, self.symbols, self.length
            ));
        };
        if self.symbols > 0 && self.symbol_set.is_empty() {
            return Err("symbolCharacters holds no usable character".to_owned());
        }
        if !self.allow_repeat {
            let available = self.letters().len();
            if letters > available {
                return Err(format!(
                    "{letters} letters without repeats need allowRepeat: true (only {available} letters exist)"
                ));
            }
            if self.digits > DIGITS.len() {
                return Err(format!(
                    "{} digits without repeats need allowRepeat: true (only 10 digits exist)",
                    self.digits
                ));
            }
            if self.symbols > self.symbol_set.len() {
                return Err(format!(
                    "{} symbols without repeats need allowRepeat: true (only {} symbols are allowed)",
                    self.symbols,
                    self.symbol_set.len()
                ));
            }
        }
        Ok(())
    }
}

/// A source of random indexes.
pub trait Random {
    /// A uniform number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> Result<usize, String>;
    /// Fill `out` with random bytes.
    fn fill(&mut self, out: &mut [u8]) -> Result<(), String>;
}

/// The operating system's CSPRNG.
pub struct SystemRandomSource(SystemRandom);

impl Default for SystemRandomSource {
    fn default() -> Self {
        Self(SystemRandom::new())
    }
}

impl Random for SystemRandomSource {
    fn below(&mut self, n: usize) -> Result<usize, String> {
        let n = u64::try_from(n).map_err(|_| "range too large".to_owned())?;
        if n == 0 {
            return Err("empty range".to_owned());
        }
        // Rejection sampling: accept only values below the largest multiple
        // of n, so every residue is equally likely.
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let mut b = [0u8; 8];
            self.fill(&mut b)?;
            let v = u64::from_le_bytes(b);
            if v < zone {
                return usize::try_from(v % n).map_err(|_| "range too large".to_owned());
            }
        }
    }

    fn fill(&mut self, out: &mut [u8]) -> Result<(), String> {
        self.0
            .fill(out)
            .map_err(|_| "the system random number generator failed".to_owned())
    }
}

/// Draw `n` characters from `set`; without repeats, each drawn character
/// leaves the pool (and so does any character already in `taken`).
fn draw(
    rng: &mut dyn Random,
    set: &[char],
    n: usize,
    allow_repeat: bool,
    taken: &[char],
) -> Result<Vec<char>, String> {
    let mut pool: Vec<char> = set
        .iter()
        .copied()
        .filter(|c| allow_repeat || !taken.contains(c))
        .collect();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if pool.is_empty() {
            return Err("not enough distinct characters".to_owned());
        }
        let i = rng.below(pool.len())?;
        if allow_repeat {
            out.push(pool[i]);
        } else {
            out.push(pool.swap_remove(i));
        }
    }
    Ok(out)
}

/// A password following `rules`.
pub fn password(rules: &PasswordRules, rng: &mut dyn Random) -> Result<String, String> {
    rules.check()?;
    let letters = rules.length - rules.digits - rules.symbols;
    let mut chars = draw(rng, &rules.letters(), letters, rules.allow_repeat, &[])?;
    let digits: Vec<char> = DIGITS.chars().collect();
    let more = draw(rng, &digits, rules.digits, rules.allow_repeat, &chars)?;
    chars.extend(more);
    let more = draw(
        rng,
        &rules.symbol_set,
        rules.symbols,
        rules.allow_repeat,
        &chars,
    )?;
    chars.extend(more);
    // Fisher–Yates: every order equally likely.
    for i in (1..chars.len()).rev() {
        let j = rng.below(i + 1)?;
        chars.swap(i, j);
    }
    Ok(chars.into_iter().collect())
}

/// A random version-4 UUID, lower-case hex with hyphens.
pub fn uuid_v4(rng: &mut dyn Random) -> Result<String, String> {
    let mut b = [0u8; 16];
    rng.fill(&mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// A new value from a ClusterGenerator's spec, or why it cannot make one.
pub fn generate(spec: &ClusterGeneratorSpec, rng: &mut dyn Random) -> Result<String, String> {
    match spec.kind {
        GeneratorKind::Password => {
            let p = spec
                .generator
                .as_ref()
                .and_then(|g| g.password_spec.as_ref());
            let rules = PasswordRules::from_spec(p)?;
            password(&rules, rng)
        }
        GeneratorKind::Uuid => uuid_v4(rng),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> PasswordSpec {
        serde_json::from_value(v).unwrap()
    }

    fn classes(p: &str, symbols: &[char]) -> (usize, usize, usize, usize) {
        let lower = p.chars().filter(char::is_ascii_lowercase).count();
        let upper = p.chars().filter(char::is_ascii_uppercase).count();
        let digits = p.chars().filter(char::is_ascii_digit).count();
        let sym = p.chars().filter(|c| symbols.contains(c)).count();
        (lower, upper, digits, sym)
    }

    #[test]
    fn defaults_follow_the_reference() {
        let rules = PasswordRules::from_spec(None).unwrap();
        assert_eq!(
            (rules.length, rules.digits, rules.symbols),
            (24, 6, 6),
            "length 24, a quarter digits, a quarter symbols"
        );
        assert_eq!(rules.symbol_set.len(), DEFAULT_SYMBOLS.chars().count());
        let mut rng = SystemRandomSource::default();
        for _ in 0..200 {
            let p = password(&rules, &mut rng).unwrap();
            assert_eq!(p.chars().count(), 24);
            let (lower, upper, digits, sym) = classes(&p, &rules.symbol_set);
            assert_eq!(digits, 6, "{p}");
            assert_eq!(sym, 6, "{p}");
            assert_eq!(lower + upper, 12, "{p}");
            let mut seen = std::collections::HashSet::new();
            assert!(p.chars().all(|c| seen.insert(c)), "repeat in {p}");
        }
    }

    #[test]
    fn explicit_counts_no_upper_and_custom_symbols() {
        let rules = PasswordRules::from_spec(Some(&spec(serde_json::json!({
            "length": 16, "digits": 3, "symbols": 2, "symbolCharacters": "#- #", "noUpper": true
        }))))
        .unwrap();
        assert_eq!(rules.symbol_set, vec!['#', '-'], "deduplicated, no spaces");
        let mut rng = SystemRandomSource::default();
        for _ in 0..200 {
            let p = password(&rules, &mut rng).unwrap();
            let (lower, upper, digits, sym) = classes(&p, &['#', '-']);
            assert_eq!((lower, upper, digits, sym), (11, 0, 3, 2), "{p}");
            assert!(
                p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '#' || c == '-'),
                "{p}"
            );
        }
    }

    #[test]
    fn repeats_only_when_allowed() {
        // 40 digits cannot be distinct; with allowRepeat they are fine.
        let no = spec(serde_json::json!({"length": 40, "digits": 40, "symbols": 0}));
        let err = PasswordRules::from_spec(Some(&no)).unwrap_err();
        assert!(err.contains("allowRepeat"), "{err}");
        let yes = spec(
            serde_json::json!({"length": 40, "digits": 40, "symbols": 0, "allowRepeat": true}),
        );
        let rules = PasswordRules::from_spec(Some(&yes)).unwrap();
        let p = password(&rules, &mut SystemRandomSource::default()).unwrap();
        assert_eq!(p.len(), 40);
        assert!(p.chars().all(|c| c.is_ascii_digit()));
        // Exactly as many letters as exist, without repeats: a permutation.
        let all = spec(serde_json::json!({"length": 52, "digits": 0, "symbols": 0}));
        let rules = PasswordRules::from_spec(Some(&all)).unwrap();
        let p = password(&rules, &mut SystemRandomSource::default()).unwrap();
        let mut sorted: Vec<char> = p.chars().collect();
        sorted.sort_unstable();
        let mut expected: Vec<char> = UPPER.chars().chain(LOWER.chars()).collect();
        expected.sort_unstable();
        assert_eq!(sorted, expected);
    }

    #[test]
    fn impossible_specs_say_why() {
        let over = spec(serde_json::json!({"length": 8, "digits": 5, "symbols": 5}));
        let err = PasswordRules::from_spec(Some(&over)).unwrap_err();
        assert!(err.contains("exceed the length (8)"), "{err}");
        let few = spec(serde_json::json!({"length": 8, "symbols": 5, "symbolCharacters": "!@"}));
        let err = PasswordRules::from_spec(Some(&few)).unwrap_err();
        assert!(err.contains("only 2 symbols"), "{err}");
        let empty = spec(serde_json::json!({"length": 8, "symbols": 1, "symbolCharacters": "  "}));
        assert!(PasswordRules::from_spec(Some(&empty)).is_err());
        let neg = spec(serde_json::json!({"length": 8, "digits": -1}));
        assert!(PasswordRules::from_spec(Some(&neg)).is_err());
    }

    /// A deterministic source that always answers 0: the draw must still
    /// honour the counts and never repeat.
    struct Zero;
    impl Random for Zero {
        fn below(&mut self, _n: usize) -> Result<usize, String> {
            Ok(0)
        }
        fn fill(&mut self, out: &mut [u8]) -> Result<(), String> {
            out.fill(0);
            Ok(())
        }
    }

    #[test]
    fn draws_without_repeats_even_from_a_degenerate_source() {
        let rules = PasswordRules::from_spec(None).unwrap();
        let p = password(&rules, &mut Zero).unwrap();
        let mut seen = std::collections::HashSet::new();
        assert!(p.chars().all(|c| seen.insert(c)), "{p}");
    }

    #[test]
    fn uniform_indexes_cover_the_range() {
        let mut rng = SystemRandomSource::default();
        let mut hits = [0u32; 7];
        for _ in 0..7000 {
            hits[rng.below(7).unwrap()] += 1;
        }
        assert!(hits.iter().all(|h| *h > 700), "{hits:?}");
    }

    #[test]
    fn uuids_are_version_4() {
        let mut rng = SystemRandomSource::default();
        let a = uuid_v4(&mut rng).unwrap();
        let b = uuid_v4(&mut rng).unwrap();
        assert_ne!(a, b);
        let re = regex::Regex::new(
            "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
        )
        .unwrap();
        assert!(re.is_match(&a), "{a}");
        assert_eq!(
            uuid_v4(&mut Zero).unwrap(),
            "00000000-0000-4000-8000-000000000000"
        );
    }
}
