//! Go `time.Duration` / `metav1.Duration` syntax: parsing, formatting and a serde newtype.
//!
//! Go serializes a `metav1.Duration` as the output of `time.Duration.String()`, e.g.
//! `"20m0s"`, `"2h0m0s"`, `"500ms"`, and parses it with `time.ParseDuration`, which accepts
//! any sequence of decimal numbers with units (`"1h30m"`, `"1.5h"`, `"300ms"`, `"0"`).
//! [`GoDuration`] reproduces both directions exactly for non-negative durations.
//!
//! Negative durations are rejected with [`DurationError::Negative`]: every duration of this
//! API is a timeout, for which a negative value has no meaning, and `std::time::Duration`
//! cannot represent it.

use std::{borrow::Cow, fmt, str::FromStr, time::Duration};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// Largest duration Go can represent: `i64::MAX` nanoseconds (about 292 years).
const MAX_NANOS: u128 = i64::MAX as u128;

/// Why a Go duration string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string was empty.
    #[error("empty duration string")]
    Empty,
    /// A component had no unit (only `"0"` may omit the unit).
    #[error("missing unit in duration {0:?}")]
    MissingUnit(String),
    /// A component used a unit Go does not know.
    #[error("unknown unit {unit:?} in duration {input:?} (expected ns, us, µs, ms, s, m or h)")]
    UnknownUnit {
        /// The offending unit.
        unit: String,
        /// The whole input.
        input: String,
    },
    /// A number was expected but not found (e.g. `"h"`, `"1.h"` is fine, `".h"` is not).
    #[error("invalid number in duration {0:?}")]
    InvalidNumber(String),
    /// The duration was negative.
    #[error("negative duration {0:?} is not allowed")]
    Negative(String),
    /// The duration exceeds what Go can represent (about 2562047h).
    #[error("duration {0:?} overflows")]
    Overflow(String),
}

/// Parses a Go duration string (`time.ParseDuration` syntax) into a [`Duration`].
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let mut s = input;
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(DurationError::InvalidNumber(input.to_owned()));
    }
    let overflow = || DurationError::Overflow(input.to_owned());
    let mut total: u128 = 0;
    while !s.is_empty() {
        // Integer part.
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int_digits, rest) = s.split_at(int_len);
        s = rest;
        // Fraction part.
        let mut frac_digits = "";
        if let Some(rest) = s.strip_prefix('.') {
            let frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            frac_digits = &rest[..frac_len];
            s = &rest[frac_len..];
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(DurationError::InvalidNumber(input.to_owned()));
        }
        // Unit.
        let unit_len = s
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(s.len(), |(i, _)| i);
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(input.to_owned()));
        }
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "\u{00b5}s" | "\u{03bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            _ => {
                return Err(DurationError::UnknownUnit {
                    unit: unit.to_owned(),
                    input: input.to_owned(),
                });
            }
        };
        let mut value: u128 = 0;
        for d in int_digits.bytes() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u128::from(d - b'0')))
                .filter(|v| *v <= MAX_NANOS)
                .ok_or_else(overflow)?;
        }
        let mut component = value.checked_mul(unit_nanos).ok_or_else(overflow)?;
        // Fraction: Go truncates digits beyond nanosecond precision.
        let mut scale = unit_nanos;
        for d in frac_digits.bytes() {
            if scale < 10 {
                break;
            }
            scale /= 10;
            component += u128::from(d - b'0') * scale;
        }
        total = total.checked_add(component).ok_or_else(overflow)?;
        if total > MAX_NANOS {
            return Err(overflow());
        }
    }
    if negative && total != 0 {
        return Err(DurationError::Negative(input.to_owned()));
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| overflow())?;
    // The remainder is below 1e9 and always fits.
    let nanos = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

/// Formats a [`Duration`] exactly like Go's `time.Duration.String()`
/// (`"0s"`, `"1.5µs"`, `"500ms"`, `"20m0s"`, `"2h0m0s"`, `"1h30m15.5s"`).
pub fn format_go_duration(d: Duration) -> String {
    let total = d.as_nanos();
    if total == 0 {
        return "0s".to_owned();
    }
    if total < 1_000_000_000 {
        return if total < 1_000 {
            format!("{total}ns")
        } else if total < 1_000_000 {
            format!("{}\u{00b5}s", with_fraction(total, 3))
        } else {
            format!("{}ms", with_fraction(total, 6))
        };
    }
    let secs = total / 1_000_000_000;
    let hours = secs / 3_600;
    let minutes = (secs / 60) % 60;
    let seconds_nanos = total % 60_000_000_000;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h{minutes}m"));
    } else if minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&with_fraction(seconds_nanos, 9));
    out.push('s');
    out
}

/// `value / 10^digits` printed with the fraction's trailing zeros removed.
fn with_fraction(value: u128, digits: u32) -> String {
    let div = 10u128.pow(digits);
    let int = value / div;
    let frac = value % div;
    if frac == 0 {
        return int.to_string();
    }
    let frac = format!("{frac:0width$}", width = digits as usize);
    format!("{int}.{}", frac.trim_end_matches('0'))
}

/// A `metav1.Duration`: serialized as a Go duration string, convertible to
/// [`std::time::Duration`].
///
/// Serialization always produces Go's canonical form (`"1h30m"` is written back as
/// `"1h30m0s"`), exactly like the Go controllers do when they rewrite an object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    /// Wraps a [`Duration`].
    pub const fn new(d: Duration) -> Self {
        Self(d)
    }

    /// The wrapped [`Duration`].
    pub const fn as_duration(&self) -> Duration {
        self.0
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl From<GoDuration> for Duration {
    fn from(d: GoDuration) -> Self {
        d.0
    }
}

impl FromStr for GoDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_go_duration(s).map(Self)
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_go_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for GoDuration {
    fn schema_name() -> Cow<'static, str> {
        "GoDuration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A duration in Go syntax, e.g. \"20m\", \"1h30m\", \"500ms\"."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const S: u64 = 1;
    const M: u64 = 60;
    const H: u64 = 3600;

    #[test]
    fn parses_go_durations() {
        let cases: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("+5s", Duration::from_secs(5 * S)),
            ("20m", Duration::from_secs(20 * M)),
            ("20m0s", Duration::from_secs(20 * M)),
            ("1h30m", Duration::from_secs(H + 30 * M)),
            ("2h0m0s", Duration::from_secs(2 * H)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(H + 30 * M)),
            ("1.h", Duration::from_secs(H)),
            (".5s", Duration::from_millis(500)),
            ("1us", Duration::from_micros(1)),
            ("1\u{00b5}s", Duration::from_micros(1)),
            ("1\u{03bc}s", Duration::from_micros(1)),
            ("3ns", Duration::from_nanos(3)),
            ("1h1m1s1ms1us1ns", Duration::new(H + M + 1, 1_001_001)),
            ("1.0000000009s", Duration::from_secs(1)),
            ("2562047h", Duration::from_secs(2_562_047 * H)),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_go_duration(input).as_ref(),
                Ok(want),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn rejects_bad_durations() {
        let cases: &[(&str, DurationError)] = &[
            ("", DurationError::Empty),
            ("5", DurationError::MissingUnit("5".into())),
            ("1h5", DurationError::MissingUnit("1h5".into())),
            ("h", DurationError::InvalidNumber("h".into())),
            ("-", DurationError::InvalidNumber("-".into())),
            (".s", DurationError::InvalidNumber(".s".into())),
            (
                "5d",
                DurationError::UnknownUnit {
                    unit: "d".into(),
                    input: "5d".into(),
                },
            ),
            ("-5m", DurationError::Negative("-5m".into())),
            ("9999999999h", DurationError::Overflow("9999999999h".into())),
            ("2562048h", DurationError::Overflow("2562048h".into())),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_go_duration(input).as_ref(),
                Err(want),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_100), "1.1\u{00b5}s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_micros(2_500), "2.5ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(20 * M), "20m0s"),
            (Duration::from_secs(90 * M), "1h30m0s"),
            (Duration::from_secs(2 * H), "2h0m0s"),
            (Duration::new(H + 15, 500_000_000), "1h0m15.5s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go_duration(*d), *want, "duration {d:?}");
        }
    }

    #[test]
    fn serde_round_trip() {
        let d: GoDuration = serde_json::from_str("\"1h30m\"").expect("valid");
        assert_eq!(d.as_duration(), Duration::from_secs(90 * M));
        assert_eq!(
            serde_json::to_string(&d).expect("serializes"),
            "\"1h30m0s\""
        );
        assert!(serde_json::from_str::<GoDuration>("\"10 minutes\"").is_err());
        assert!(serde_json::from_str::<GoDuration>("600").is_err());
    }
}
