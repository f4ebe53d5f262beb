//! Exact non-negative rationals for `positiveFraction`, so the integer bounds of BAR never depend on binary
//! floating point (`0.7 x 10` is 7, not the 7.000000000000001 an `f64` product gives).
//!
//! A [`Fraction`] is a reduced `numerator / denominator` of two `u64`s. Every product the bounds need
//! (`numerator x N`, cross-multiplied comparisons) fits in a `u128`, so no arithmetic here can overflow.
//! Decimals are parsed digit by digit; an `f64` is converted through its shortest round-trip decimal
//! representation (what `format!("{:e}", x)` prints), so `0.3_f64` becomes exactly `3/10`.

use std::cmp::Ordering;
use std::fmt;

/// A reduced, non-negative rational number `numerator / denominator` (denominator > 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fraction {
    numerator: u64,
    denominator: u64,
}

/// Why a number cannot be turned into a [`Fraction`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FractionError {
    /// The text is not a plain decimal number.
    #[error(
        "`{0}` is not a decimal number (expected digits with an optional `.` and exponent, like `0.375`)"
    )]
    Syntax(String),
    /// The number is below zero.
    #[error("`{0}` is negative; a fraction must be 0 or more")]
    Negative(String),
    /// The number is NaN or infinite.
    #[error("`{0}` is not a finite number")]
    NotFinite(String),
    /// The number needs a numerator or denominator beyond `u64` to be exact.
    #[error(
        "`{0}` has too many significant digits to be represented exactly (use at most 18 decimal places)"
    )]
    TooPrecise(String),
    /// `Fraction::new(_, 0)`.
    #[error("a fraction's denominator must not be zero")]
    ZeroDenominator,
}

/// Digits beyond this cannot be accumulated in a `u128` mantissa.
const MAX_MANTISSA_DIGITS: usize = 38;

impl Fraction {
    /// Zero (`0/1`).
    pub const ZERO: Fraction = Fraction {
        numerator: 0,
        denominator: 1,
    };
    /// One (`1/1`).
    pub const ONE: Fraction = Fraction {
        numerator: 1,
        denominator: 1,
    };

    /// `numerator / denominator`, reduced. Fails only on a zero denominator.
    pub fn new(numerator: u64, denominator: u64) -> Result<Fraction, FractionError> {
        if denominator == 0 {
            return Err(FractionError::ZeroDenominator);
        }
        let divisor = gcd(numerator, denominator);
        Ok(Fraction {
            numerator: numerator / divisor,
            denominator: denominator / divisor,
        })
    }

    /// The reduced numerator.
    pub fn numerator(self) -> u64 {
        self.numerator
    }

    /// The reduced denominator (never zero).
    pub fn denominator(self) -> u64 {
        self.denominator
    }

    /// Parses a decimal such as `0.375`, `.5`, `1`, `3e-1` or `+0.25` exactly.
    ///
    /// Surrounding ASCII whitespace is ignored. A minus sign is accepted only on zero (`-0` is 0).
    pub fn from_decimal_str(text: &str) -> Result<Fraction, FractionError> {
        let trimmed = text.trim();
        let syntax = || FractionError::Syntax(text.to_string());
        let (negative, unsigned) = match trimmed.as_bytes().first() {
            Some(b'-') => (true, &trimmed[1..]),
            Some(b'+') => (false, &trimmed[1..]),
            _ => (false, trimmed),
        };
        let (mantissa_text, exponent_text) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
            None => (unsigned, None),
        };
        let (integer_digits, fraction_digits) = match mantissa_text.split_once('.') {
            Some((integer, fraction)) => (integer, fraction),
            None => (mantissa_text, ""),
        };
        let all_digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
        if integer_digits.len() + fraction_digits.len() == 0
            || !all_digits(integer_digits)
            || !all_digits(fraction_digits)
        {
            return Err(syntax());
        }
        let exponent = match exponent_text {
            None => 0_i64,
            Some(exponent) => parse_exponent(exponent).ok_or_else(syntax)?,
        };

        // value = digits x 10^(-scale)
        let digits: String = integer_digits
            .chars()
            .chain(fraction_digits.chars())
            .collect();
        let digits = digits.trim_start_matches('0');
        if digits.is_empty() {
            return Ok(Fraction::ZERO);
        }
        if negative {
            return Err(FractionError::Negative(text.to_string()));
        }
        let significant = digits.trim_end_matches('0');
        let trailing_zeros = (digits.len() - significant.len()) as i64;
        let scale = (fraction_digits.len() as i64)
            .saturating_sub(exponent)
            .saturating_sub(trailing_zeros);
        let too_precise = || FractionError::TooPrecise(text.to_string());
        if significant.len() > MAX_MANTISSA_DIGITS {
            return Err(too_precise());
        }
        let mut mantissa: u128 = 0;
        for byte in significant.bytes() {
            mantissa = mantissa * 10 + u128::from(byte - b'0');
        }

        if scale <= 0 {
            let power = u32::try_from(-scale).map_err(|_| too_precise())?;
            let value = 10_u128
                .checked_pow(power)
                .and_then(|factor| mantissa.checked_mul(factor))
                .and_then(|value| u64::try_from(value).ok())
                .ok_or_else(too_precise)?;
            return Ok(Fraction {
                numerator: value,
                denominator: 1,
            });
        }
        // The denominator 10^scale = 2^scale 5^scale shares only factors 2 and 5 with the mantissa; a
        // denominator above 2^63 cannot fit, so a scale above 63 is rejected before any power is taken.
        if scale > 63 {
            return Err(too_precise());
        }
        let scale = scale as u32;
        let twos = mantissa.trailing_zeros().min(scale);
        let mut numerator = mantissa >> twos;
        let mut fives = 0;
        while fives < scale && numerator.is_multiple_of(5) {
            numerator /= 5;
            fives += 1;
        }
        let denominator = 2_u128
            .checked_pow(scale - twos)
            .zip(5_u128.checked_pow(scale - fives))
            .and_then(|(two_part, five_part)| two_part.checked_mul(five_part));
        match (u64::try_from(numerator), denominator.map(u64::try_from)) {
            (Ok(numerator), Some(Ok(denominator))) => Ok(Fraction {
                numerator,
                denominator,
            }),
            _ => Err(too_precise()),
        }
    }

    /// Converts an `f64` through its shortest round-trip decimal representation, so `0.3` is exactly
    /// `3/10` and `0.1 + 0.2` is exactly `30000000000000004/10^17`. `-0.0` is zero.
    pub fn from_f64(value: f64) -> Result<Fraction, FractionError> {
        if !value.is_finite() {
            return Err(FractionError::NotFinite(value.to_string()));
        }
        if value == 0.0 {
            return Ok(Fraction::ZERO);
        }
        if value < 0.0 {
            return Err(FractionError::Negative(value.to_string()));
        }
        Fraction::from_decimal_str(&format!("{value:e}"))
    }

    /// The nearest `f64` (for reports; never used for bounds). Fractions made by [`Fraction::from_f64`]
    /// convert back to the same `f64`.
    pub fn to_f64(self) -> f64 {
        // Parsing the exact decimal rounds once; dividing two rounded u64 conversions could be off by an ulp.
        exact_decimal(self)
            .and_then(|decimal| decimal.parse().ok())
            .unwrap_or(self.numerator as f64 / self.denominator as f64)
    }

    /// `floor(self x n)`, exact.
    pub fn floor_times(self, n: u64) -> u128 {
        u128::from(self.numerator) * u128::from(n) / u128::from(self.denominator)
    }

    /// `ceil(self x n)`, exact.
    pub fn ceil_times(self, n: u64) -> u128 {
        (u128::from(self.numerator) * u128::from(n)).div_ceil(u128::from(self.denominator))
    }

    /// The fractional part of `self x n` as `(remainder, denominator)`: `self x n - floor(self x n)` equals
    /// `remainder / denominator`.
    fn fractional_part_times(self, n: u64) -> (u128, u128) {
        let denominator = u128::from(self.denominator);
        (
            u128::from(self.numerator) * u128::from(n) % denominator,
            denominator,
        )
    }

    /// `floor((self + other) x n)`, exact (the sum itself may not fit in `u64` components, so the floors
    /// are added and the fractional parts compared).
    pub fn floor_sum_times(self, other: Fraction, n: u64) -> u128 {
        let (remainder_a, denominator_a) = self.fractional_part_times(n);
        let (remainder_b, denominator_b) = other.fractional_part_times(n);
        // remainder_a/denominator_a + remainder_b/denominator_b >= 1 ?  Each product is below 2^128; if the
        // sum overflows it is certainly at least denominator_a x denominator_b (< 2^128).
        let carry = match (remainder_a * denominator_b).checked_add(remainder_b * denominator_a) {
            Some(sum) => sum >= denominator_a * denominator_b,
            None => true,
        };
        self.floor_times(n) + other.floor_times(n) + u128::from(carry)
    }
}

/// Parses the exponent of a decimal (`-1`, `+3`, `12`); absurdly long exponents saturate.
fn parse_exponent(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let magnitude = digits.bytes().fold(0_i64, |value, byte| {
        value
            .saturating_mul(10)
            .saturating_add(i64::from(byte - b'0'))
    });
    Some(if negative { -magnitude } else { magnitude })
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

impl Ord for Fraction {
    fn cmp(&self, other: &Fraction) -> Ordering {
        let left = u128::from(self.numerator) * u128::from(other.denominator);
        let right = u128::from(other.numerator) * u128::from(self.denominator);
        left.cmp(&right)
    }
}

impl PartialOrd for Fraction {
    fn partial_cmp(&self, other: &Fraction) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Fraction {
    /// Prints an exact decimal when one exists (`3/8` prints `0.375`), else `numerator/denominator`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match exact_decimal(*self) {
            Some(decimal) => formatter.write_str(&decimal),
            None => write!(formatter, "{}/{}", self.numerator, self.denominator),
        }
    }
}

/// The exact decimal expansion of a fraction whose denominator is `2^a 5^b`, if it is short enough.
fn exact_decimal(fraction: Fraction) -> Option<String> {
    let mut rest = fraction.denominator;
    let (mut twos, mut fives) = (0_u32, 0_u32);
    while rest.is_multiple_of(2) {
        rest /= 2;
        twos += 1;
    }
    while rest.is_multiple_of(5) {
        rest /= 5;
        fives += 1;
    }
    if rest != 1 {
        return None;
    }
    let places = twos.max(fives);
    let factor = 2_u128.checked_pow(places - twos)? * 5_u128.checked_pow(places - fives)?;
    let scaled = u128::from(fraction.numerator).checked_mul(factor)?;
    let unit = 10_u128.checked_pow(places)?;
    let (whole, part) = (scaled / unit, scaled % unit);
    if places == 0 {
        return Some(whole.to_string());
    }
    Some(format!("{whole}.{part:0width$}", width = places as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frac(numerator: u64, denominator: u64) -> Fraction {
        Fraction::new(numerator, denominator).expect("non-zero denominator")
    }

    #[test]
    fn parses_decimals_exactly() {
        let cases = [
            ("0.3", frac(3, 10)),
            ("0.375", frac(3, 8)),
            ("0.625", frac(5, 8)),
            (".5", frac(1, 2)),
            ("1", Fraction::ONE),
            ("1.000", Fraction::ONE),
            ("0", Fraction::ZERO),
            ("-0.0", Fraction::ZERO),
            ("+0.25", frac(1, 4)),
            ("3e-1", frac(3, 10)),
            ("3E-1", frac(3, 10)),
            ("0.03e1", frac(3, 10)),
            ("30e-2", frac(3, 10)),
            (" 0.5 ", frac(1, 2)),
            ("2.5", frac(5, 2)),
            ("120", frac(120, 1)),
            ("1.2e2", frac(120, 1)),
            (
                "0.333333333333333333",
                frac(333_333_333_333_333_333, 1_000_000_000_000_000_000),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(Fraction::from_decimal_str(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_negative_and_overlong_decimals() {
        for text in [
            "", ".", "abc", "0.3.1", "1e", "1e+", "0x10", "1,5", "--1", "e5", "0.5%",
        ] {
            assert!(
                matches!(
                    Fraction::from_decimal_str(text),
                    Err(FractionError::Syntax(_))
                ),
                "{text}"
            );
        }
        assert!(matches!(
            Fraction::from_decimal_str("-0.1"),
            Err(FractionError::Negative(_))
        ));
        assert!(matches!(
            Fraction::from_decimal_str("0.1234567890123456789012345"),
            Err(FractionError::TooPrecise(_))
        ));
        assert!(matches!(
            Fraction::from_decimal_str("1e-70"),
            Err(FractionError::TooPrecise(_))
        ));
        assert!(matches!(
            Fraction::from_decimal_str("1e30"),
            Err(FractionError::TooPrecise(_))
        ));
        assert!(matches!(
            Fraction::from_decimal_str("1e-99999999999999999999999"),
            Err(FractionError::TooPrecise(_))
        ));
        assert_eq!(
            Fraction::from_decimal_str("0e-99999999999999999999999"),
            Ok(Fraction::ZERO)
        );
    }

    #[test]
    fn converts_floats_through_the_shortest_decimal() {
        assert_eq!(Fraction::from_f64(0.3), Ok(frac(3, 10)));
        assert_eq!(Fraction::from_f64(0.375), Ok(frac(3, 8)));
        assert_eq!(Fraction::from_f64(-0.0), Ok(Fraction::ZERO));
        assert_eq!(Fraction::from_f64(1.0), Ok(Fraction::ONE));
        assert_eq!(
            Fraction::from_f64(0.1 + 0.2),
            Ok(frac(30_000_000_000_000_004, 100_000_000_000_000_000))
        );
        assert!(matches!(
            Fraction::from_f64(f64::NAN),
            Err(FractionError::NotFinite(_))
        ));
        assert!(matches!(
            Fraction::from_f64(f64::INFINITY),
            Err(FractionError::NotFinite(_))
        ));
        assert!(matches!(
            Fraction::from_f64(-0.5),
            Err(FractionError::Negative(_))
        ));
        assert!(matches!(
            Fraction::from_f64(f64::MIN_POSITIVE),
            Err(FractionError::TooPrecise(_))
        ));
    }

    #[test]
    fn orders_and_prints() {
        assert!(frac(3, 8) < frac(5, 8));
        assert!(frac(1, 3) > frac(333, 1000));
        assert_eq!(frac(2, 4), frac(1, 2));
        assert_eq!(frac(3, 8).to_string(), "0.375");
        assert_eq!(frac(1, 3).to_string(), "1/3");
        assert_eq!(Fraction::ONE.to_string(), "1");
        assert_eq!(frac(3, 10).to_string(), "0.3");
        assert_eq!(Fraction::new(1, 0), Err(FractionError::ZeroDenominator));
    }

    #[test]
    fn exact_products() {
        // Binary floats get these wrong: 0.7 * 10.0 = 7.000000000000001, 0.29 * 100.0 = 28.999999999999996.
        assert_eq!(frac(7, 10).ceil_times(10), 7);
        assert_eq!(frac(29, 100).floor_times(100), 29);
        assert_eq!(frac(1, 3).floor_sum_times(frac(2, 3), 1), 1);
        assert_eq!(frac(1, 3).floor_sum_times(frac(1, 3), 1), 0);
        let huge = frac(u64::MAX - 1, u64::MAX);
        assert_eq!(huge.floor_sum_times(huge, 1), 1);
        assert_eq!(
            huge.floor_sum_times(huge, u64::from(u32::MAX)),
            2 * u128::from(u32::MAX) - 1
        );
    }
}
