//! Kubernetes resource quantities (`3000`, `3k`, `1Gi`, `500m`) as whole
//! numbers, the way HAMi reads its extended resources (`Quantity.Value()`).
//!
//! Written here on purpose: `k8s-openapi`'s `Quantity` is only the string,
//! and kube-rs has no parser. The crates that parse quantities give a
//! decimal or a float, not Go's `Value()` (a whole number, a fraction
//! rounded up, an error rather than a saturated value on overflow), so we
//! would still write that rule on top of them.

/// A quantity string that is not a whole number we can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a whole-number quantity: {why}")]
pub struct QuantityError {
    /// The text given.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parses a quantity into an integer, rounding a fraction up as
/// Kubernetes' `Value()` does (`500m` → 1). Accepts decimal suffixes
/// `k M G T P E`, binary suffixes `Ki Mi Gi Ti Pi Ei`, `n u m` (nano,
/// micro, milli), and a plain decimal exponent (`3e3`).
///
/// # Errors
/// A [`QuantityError`] for anything else, negative values, or overflow.
pub fn parse_whole(text: &str) -> Result<i64, QuantityError> {
    parse_scaled(text, 1, 1)
}

/// Parses a quantity in thousandths, rounding a finer fraction up as
/// Kubernetes' `MilliValue()` does: CPU in milli-cores (`500m` → 500,
/// `2` → 2000, `0.1` → 100, `100u` → 1).
///
/// # Errors
/// As [`parse_whole`].
pub fn parse_milli(text: &str) -> Result<i64, QuantityError> {
    parse_scaled(text, 1000, 1)
}

/// Parses a byte quantity in MiB, rounding a partial MiB up (`1Gi` → 1024,
/// `128974848` → 123, `1k` → 1).
///
/// # Errors
/// As [`parse_whole`].
pub fn parse_mib(text: &str) -> Result<i64, QuantityError> {
    parse_scaled(text, 1, 1 << 20)
}

/// The quantity × `mul` ÷ `div`, a fraction rounded up.
fn parse_scaled(text: &str, mul: i128, div: i128) -> Result<i64, QuantityError> {
    let err = |why| QuantityError {
        value: text.to_owned(),
        why,
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.starts_with('-') {
        return Err(err("negative"));
    }
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("no digits"));
    }
    if !int_part
        .bytes()
        .chain(frac_part.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return Err(err("not a number"));
    }
    // value = mantissa / 10^frac_digits * multiplier, with multiplier = num / den.
    let (num, den): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
            if exp > 18 {
                return Err(err("too large"));
            }
            if exp < -18 {
                return Err(err("too small"));
            }
            if exp >= 0 {
                (10_i128.pow(exp.unsigned_abs()), 1)
            } else {
                (1, 10_i128.pow(exp.unsigned_abs()))
            }
        }
        _ => return Err(err("unknown suffix")),
    };
    if int_part.len() + frac_part.len() > 30 {
        return Err(err("too many digits"));
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: i128 = digits.parse().map_err(|_| err("not a number"))?;
    let scale = 10_i128.pow(u32::try_from(frac_part.len()).map_err(|_| err("too many digits"))?);
    let numerator = mantissa
        .checked_mul(num)
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| err("too large"))?;
    let denominator = scale * den * div;
    let value = (numerator + denominator - 1) / denominator;
    i64::try_from(value).map_err(|_| err("too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_and_suffixes() {
        for (text, want) in [
            ("3000", 3000),
            ("3k", 3000),
            ("1Ki", 1024),
            ("2Gi", 2 << 30),
            ("500m", 1),
            ("1500m", 2),
            ("0", 0),
            ("1.5k", 1500),
            ("3e3", 3000),
            ("+7", 7),
        ] {
            assert_eq!(parse_whole(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn milli_values_and_mib() {
        for (text, want) in [
            ("500m", 500),
            ("2", 2000),
            ("0.1", 100),
            ("1.0005", 1001),
            ("1k", 1_000_000),
            ("100u", 1),
            ("1500000n", 2),
            ("1e-3", 1),
            ("25e-1", 2500),
        ] {
            assert_eq!(parse_milli(text), Ok(want), "{text}");
        }
        for (text, want) in [
            ("1Gi", 1024),
            ("128974848", 123),
            ("1k", 1),
            ("0", 0),
            ("512Mi", 512),
        ] {
            assert_eq!(parse_mib(text), Ok(want), "{text}");
        }
        assert!(parse_milli("-1").is_err());
        assert!(
            parse_mib("9Ei").is_ok(),
            "9 EiB is 9 × 2^40 MiB, within i64"
        );
        assert!(parse_milli("9E").is_err(), "9e21 milli overflows i64");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for text in [
            "",
            "-1",
            "abc",
            "1x",
            "1..2",
            "9Ei",
            "99999999999999999999999999999999",
            "1e99",
            ".",
        ] {
            assert!(parse_whole(text).is_err(), "{text}");
        }
    }
}
