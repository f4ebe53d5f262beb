//! Kubernetes quantities as exact whole amounts (pure): parsed to bytes and millicores (rounded up:
//! a quantity below a byte or a millicore still counts as one) and printed back as the largest exact
//! unit. Retry escalation and snapshot quotas count with them.

/// One MiB in bytes.
pub const MIB: u64 = 1 << 20;

/// `bytes` as a quantity text (pure): `2Gi`, `96Mi`, or the bytes.
pub fn memory_text(bytes: u64) -> String {
    for (suffix, unit) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", MIB)] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// `millicores` as a quantity text (pure): `2` or `1500m`.
pub fn cpu_text(millicores: u64) -> String {
    if millicores >= 1000 && millicores.is_multiple_of(1000) {
        format!("{}", millicores / 1000)
    } else {
        format!("{millicores}m")
    }
}

/// A Kubernetes quantity in thousandths of its unit, rounded up (pure): `1500m` is 1,500, `2` is
/// 2,000, `64Mi` is 67,108,864,000. Refuses a sign other than `+`, an unknown suffix and amounts
/// beyond `u64` units.
pub fn thousandths(text: &str) -> Result<u128, String> {
    let invalid = || format!("`{text}` is not a quantity");
    let unsigned = text.trim().strip_prefix('+').unwrap_or(text.trim());
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(invalid());
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = digits.parse().map_err(|_| invalid())?;
    let fraction_digits = u32::try_from(fraction.len()).map_err(|_| invalid())?;
    // value = mantissa / 10^fraction_digits x 2^binary x 10^decimal; thousandths = value x 10^3.
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        exponent => {
            let power = exponent
                .strip_prefix(['e', 'E'])
                .filter(|p| !p.is_empty())
                .ok_or_else(invalid)?;
            let power: i32 = power.parse().map_err(|_| invalid())?;
            if !(-40..=40).contains(&power) {
                return Err(invalid());
            }
            (0, power)
        }
    };
    let too_large = || format!("`{text}` is too large");
    let ten = |power: u32| 10u128.checked_pow(power).ok_or_else(too_large);
    let scale = decimal + 3 - i32::try_from(fraction_digits).map_err(|_| invalid())?;
    let mut numerator = mantissa
        .checked_mul(1u128 << binary)
        .ok_or_else(too_large)?;
    let mut denominator = 1u128;
    if scale >= 0 {
        numerator = numerator
            .checked_mul(ten(scale.unsigned_abs())?)
            .ok_or_else(too_large)?;
    } else {
        denominator = ten(scale.unsigned_abs())?;
    }
    let value = numerator.div_ceil(denominator);
    if value > u128::from(u64::MAX) * 1000 {
        return Err(too_large());
    }
    Ok(value)
}

/// A memory quantity in bytes, rounded up (pure).
pub fn bytes(text: &str) -> Result<u64, String> {
    u64::try_from(thousandths(text)?.div_ceil(1000)).map_err(|_| format!("`{text}` is too large"))
}

/// A CPU quantity in millicores, rounded up (pure).
pub fn millicores(text: &str) -> Result<u64, String> {
    u64::try_from(thousandths(text)?).map_err(|_| format!("`{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn quantities_parse_exactly_and_round_up() {
        let cases: Vec<(&str, u128)> = vec![
            ("1", 1_000),
            ("+2", 2_000),
            ("500m", 500),
            ("0.5", 500),
            (".5", 500),
            ("2.", 2_000),
            ("1.5k", 1_500_000),
            ("64Mi", 64 * 1_048_576 * 1_000),
            ("2Gi", 2 * 1_073_741_824 * 1_000),
            ("0.5Gi", 536_870_912 * 1_000),
            ("1G", 1_000_000_000_000),
            ("1e3", 1_000_000),
            ("1E3", 1_000_000),
            ("1E", 1_000_000_000_000_000_000_000),
            ("1e-3", 1),
            ("1u", 1),
            ("1n", 1),
            ("2500u", 3),
        ];
        for (text, expected) in cases {
            assert_eq!(thousandths(text), Ok(expected), "{text}");
        }
        for bad in [
            "", ".", "-1", "1..5", "1.2.3", "lots", "1Xi", "1e", "1e99", "1Mi2",
        ] {
            assert!(thousandths(bad).is_err(), "{bad}");
        }
        assert_eq!(bytes("64Mi"), Ok(64 * MI));
        assert_eq!(bytes("100m"), Ok(1), "a tenth of a byte still asks for one");
        assert_eq!(bytes("1.5Gi"), Ok(3 * GI / 2));
        assert_eq!(millicores("1500m"), Ok(1500));
        assert_eq!(
            millicores("1.2345"),
            Ok(1235),
            "rounded up to whole millicores"
        );
        assert!(bytes("100Ei").is_err(), "beyond u64");
    }

    #[test]
    fn amounts_print_as_the_largest_exact_unit() {
        let cases: Vec<(u64, &str)> = vec![
            (128 * MI, "128Mi"),
            (2 * GI, "2Gi"),
            (1536 * MI, "1536Mi"),
            (4 << 40, "4Ti"),
            (1_000_000_000, "1000000000"),
            (512, "512"),
        ];
        for (value, text) in cases {
            assert_eq!(memory_text(value), text);
            assert_eq!(bytes(text), Ok(value), "{text} parses back");
        }
        for (value, text) in [(1000, "1"), (1500, "1500m"), (4000, "4"), (1, "1m")] {
            assert_eq!(cpu_text(value), text);
            assert_eq!(millicores(text), Ok(value), "{text} parses back");
        }
    }
}
