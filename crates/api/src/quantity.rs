//! Parsing Kubernetes resource quantities into comparable exact numbers.
//!
//! [`ParsedQuantity`] holds the value in nano-units as an `i128`, which represents every
//! quantity Kubernetes accepts (up to `2^63` Ei-scale magnitudes, down to `1n`) exactly, so
//! `"1Gi"`, `"1024Mi"` and `"1073741824"` compare equal and `"100m"` cpu is 100 millis.
//! Precision finer than a nano-unit is rounded up, as Kubernetes does.

use std::{fmt, str::FromStr};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const NANO: i128 = 1_000_000_000;

/// Why a quantity string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string was empty.
    #[error("empty quantity")]
    Empty,
    /// The numeric part is malformed.
    #[error("invalid number in quantity {0:?}")]
    InvalidNumber(String),
    /// The suffix is not a Kubernetes suffix.
    #[error("invalid suffix {suffix:?} in quantity {quantity:?}")]
    InvalidSuffix {
        /// The whole quantity.
        quantity: String,
        /// The offending suffix.
        suffix: String,
    },
    /// The value is too large to represent.
    #[error("quantity {0:?} is too large")]
    Overflow(String),
}

/// An exact, comparable quantity (in nano-units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ParsedQuantity {
    nanos: i128,
}

impl ParsedQuantity {
    /// Parses a Kubernetes quantity string (`"100m"`, `"1.5Gi"`, `"2"`, `"1e3"`).
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let s = input.trim();
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let invalid = || QuantityError::InvalidNumber(input.to_owned());
        let overflow = || QuantityError::Overflow(input.to_owned());
        let (negative, rest) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, suffix) = rest.split_at(num_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(invalid());
        }
        // Multiplier as (numerator, power of ten) applied to the decimal number.
        let (mult, exp10): (i128, i32) = match suffix {
            "" => (1, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            other => {
                let exp = other
                    .strip_prefix('e')
                    .or_else(|| other.strip_prefix('E'))
                    .ok_or_else(|| QuantityError::InvalidSuffix {
                        quantity: input.to_owned(),
                        suffix: other.to_owned(),
                    })?;
                let exp: i32 = exp.parse().map_err(|_| QuantityError::InvalidSuffix {
                    quantity: input.to_owned(),
                    suffix: other.to_owned(),
                })?;
                (1, exp)
            }
        };
        // digits as an integer mantissa, scaled by 10^-frac_len.
        let mut mantissa: i128 = 0;
        for d in int_part.bytes().chain(frac_part.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(d - b'0')))
                .ok_or_else(overflow)?;
        }
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| overflow())?;
        // nanos = mantissa * mult * 10^(exp10 - frac_len + 9)
        let value = mantissa.checked_mul(mult).ok_or_else(overflow)?;
        let shift = exp10 - frac_len + 9;
        let nanos = if shift >= 0 {
            let factor = 10i128
                .checked_pow(shift.unsigned_abs())
                .ok_or_else(overflow)?;
            value.checked_mul(factor).ok_or_else(overflow)?
        } else {
            match 10i128.checked_pow(shift.unsigned_abs()) {
                // Round up any precision below a nano-unit.
                Some(div) => (value + div - 1) / div,
                None => i128::from(value != 0),
            }
        };
        Ok(Self {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// Parses a k8s-openapi [`Quantity`].
    pub fn from_quantity(q: &Quantity) -> Result<Self, QuantityError> {
        Self::parse(&q.0)
    }

    /// The exact value in nano-units.
    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }

    /// The value in milli-units, rounded up (cpu millis: `"1"` is 1000, `"100m"` is 100).
    pub fn as_millis_ceil(&self) -> i128 {
        ceil_div(self.nanos, NANO / 1_000)
    }

    /// The value in whole units, rounded up (bytes for memory: `"1Ki"` is 1024).
    pub fn as_units_ceil(&self) -> i128 {
        ceil_div(self.nanos, NANO)
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b > 0 { q + 1 } else { q }
}

impl FromStr for ParsedQuantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<&Quantity> for ParsedQuantity {
    type Error = QuantityError;

    fn try_from(q: &Quantity) -> Result<Self, Self::Error> {
        Self::from_quantity(q)
    }
}

impl fmt::Display for ParsedQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}n", self.nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn parses_quantities() {
        let cases: &[(&str, i128, i128)] = &[
            // input, millis (ceil), units (ceil)
            ("0", 0, 0),
            ("1", 1_000, 1),
            ("100m", 100, 1),
            ("1.5", 1_500, 2),
            ("0.5", 500, 1),
            (".5", 500, 1),
            ("4", 4_000, 4),
            ("1k", 1_000_000, 1_000),
            ("1Ki", 1_024_000, 1_024),
            ("61Gi", 61 * (1 << 30) * 1_000, 61 * (1 << 30)),
            ("1.5Gi", 1_610_612_736_000, 1_610_612_736),
            ("1e3", 1_000_000, 1_000),
            ("1E-3", 1, 1),
            ("+2M", 2_000_000_000, 2_000_000),
            ("-1", -1_000, -1),
            ("1n", 1, 1),
            ("1u", 1, 1),
            ("8Ei", (1i128 << 63) * 1_000, 1i128 << 63),
        ];
        for (input, millis, units) in cases {
            let q = ParsedQuantity::parse(input).expect(input);
            assert_eq!(
                (q.as_millis_ceil(), q.as_units_ceil()),
                (*millis, *units),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn compares_across_suffixes() {
        let a: ParsedQuantity = "1Gi".parse().expect("valid");
        let b: ParsedQuantity = "1024Mi".parse().expect("valid");
        let c: ParsedQuantity = "1073741824".parse().expect("valid");
        let d: ParsedQuantity = "1G".parse().expect("valid");
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!(d < a);
        let q = Quantity("250m".into());
        assert_eq!(
            ParsedQuantity::try_from(&q).map(|p| p.as_millis_ceil()),
            Ok(250)
        );
        // Sub-nano precision is rounded up.
        assert_eq!(ParsedQuantity::parse("0.1n").map(|p| p.as_nanos()), Ok(1));
    }

    #[test]
    fn rejects_bad_quantities() {
        let cases: &[(&str, QuantityError)] = &[
            ("", QuantityError::Empty),
            ("  ", QuantityError::Empty),
            ("Gi", QuantityError::InvalidNumber("Gi".into())),
            ("-", QuantityError::InvalidNumber("-".into())),
            ("1.2.3", QuantityError::InvalidNumber("1.2.3".into())),
            (
                "1gb",
                QuantityError::InvalidSuffix {
                    quantity: "1gb".into(),
                    suffix: "gb".into(),
                },
            ),
            (
                "1ex",
                QuantityError::InvalidSuffix {
                    quantity: "1ex".into(),
                    suffix: "ex".into(),
                },
            ),
            ("1e40", QuantityError::Overflow("1e40".into())),
            (
                "99999999999999999999999999999999999999999",
                QuantityError::Overflow("99999999999999999999999999999999999999999".into()),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                ParsedQuantity::parse(input).as_ref(),
                Err(want),
                "input {input:?}"
            );
        }
    }
}
