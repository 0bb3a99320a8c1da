//! Durations written as text: `"250ms"`, `"1.5s"`, `"1h"`.
//!
//! Units are `us`, `ms`, `s`, `m`, `h` and `d`; a number without a unit is
//! refused rather than guessed. Parsing is exact decimal arithmetic into whole
//! microseconds: `"0.1s"` is 100 000 µs, and anything finer than a
//! microsecond is an error, never a rounding.

use std::fmt;
use std::time::Duration;

/// The longest duration a limit may use: 2^52 µs (about 142 years), so that
/// every instant and every sum stays exact in Redis's Lua numbers.
pub const MAX_MICROS: u64 = 1 << 52;

/// Why a duration's text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError(String);

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DurationError {}

const UNITS: [(&str, u64); 6] = [
    ("us", 1),
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
    ("d", 86_400_000_000),
];

/// Parses `text` (`"1.5s"`) into a [`Duration`] of whole microseconds.
///
/// # Errors
///
/// When the text is empty, has no unit or an unknown one, has more than one
/// decimal point, is finer than a microsecond, or exceeds [`MAX_MICROS`].
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let fail = |why: &str| DurationError(format!("duration \"{text}\" {why}"));
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(fail("needs a number before its unit"));
    }
    if unit.is_empty() {
        return Err(fail("needs a unit (us, ms, s, m, h, d)"));
    }
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, scale)| *scale)
        .ok_or_else(|| fail("has an unknown unit (use us, ms, s, m, h, d)"))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(fail("is not a number"));
    }
    let too_long = || fail(&format!("is too long (at most {MAX_MICROS} us)"));
    let mut total: u64 = 0;
    if !whole.is_empty() {
        let whole: u64 = whole.parse().map_err(|_| too_long())?;
        total = whole.checked_mul(scale).ok_or_else(too_long)?;
    }
    let mut place = scale;
    for digit in fraction.bytes() {
        let digit = u64::from(digit - b'0');
        if place % 10 != 0 {
            if digit != 0 {
                return Err(fail("is finer than a microsecond"));
            }
            continue;
        }
        place /= 10;
        total = total.checked_add(digit * place).ok_or_else(too_long)?;
    }
    if total > MAX_MICROS {
        return Err(too_long());
    }
    Ok(Duration::from_micros(total))
}

/// Writes `duration` in the largest unit that keeps it exact (`"1500ms"`, `"2h"`).
pub fn format_duration(duration: Duration) -> String {
    let micros = crate::clock::micros(duration);
    if micros == 0 {
        return "0s".to_owned();
    }
    let (name, scale) = UNITS
        .iter()
        .rev()
        .find(|(_, scale)| micros.is_multiple_of(*scale))
        .copied()
        .unwrap_or(("us", 1));
    format!("{}{name}", micros / scale)
}

/// Serde support: an optional duration field written as text (with
/// `#[serde(default)]`: absent is `None`).
pub mod serde_text_option {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    /// Reads `"1.5s"` as `Some`.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        super::serde_text::deserialize(deserializer).map(Some)
    }

    /// Writes `Some` as text, `None` as null.
    #[allow(clippy::ref_option)] // serde's `with` passes the field by reference
    pub fn serialize<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) => super::serde_text::serialize(duration, serializer),
            None => serializer.serialize_none(),
        }
    }
}

/// Serde support: a duration field written as text, like `"10s"`.
pub mod serde_text {
    use super::{format_duration, parse_duration};
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Reads `"1.5s"`; a bare number is refused with a hint.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(serde_json::Number),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Text(text) => parse_duration(&text).map_err(de::Error::custom),
            Raw::Number(number) => Err(de::Error::custom(format!(
                "duration \"{number}\" needs a unit (us, ms, s, m, h, d), as a string like \"{number}s\""
            ))),
        }
    }

    /// Writes the duration as text in its largest exact unit.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(*duration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(text: &str) -> u64 {
        crate::clock::micros(parse_duration(text).unwrap())
    }

    #[test]
    fn parses_every_unit() {
        assert_eq!(us("7us"), 7);
        assert_eq!(us("250ms"), 250_000);
        assert_eq!(us("1s"), 1_000_000);
        assert_eq!(us("2m"), 120_000_000);
        assert_eq!(us("3h"), 10_800_000_000);
        assert_eq!(us("1d"), 86_400_000_000);
    }

    #[test]
    fn parses_fractions_exactly() {
        assert_eq!(us("1.5s"), 1_500_000);
        assert_eq!(us("0.1s"), 100_000);
        assert_eq!(us(".25ms"), 250);
        assert_eq!(us("1.000001s"), 1_000_001);
        assert_eq!(us("2.00us"), 2);
        assert_eq!(us("1.5h"), 5_400_000_000);
    }

    #[test]
    fn refuses_what_it_cannot_read_exactly() {
        let message = |text: &str| parse_duration(text).unwrap_err().to_string();
        assert_eq!(message("10"), "duration \"10\" needs a unit (us, ms, s, m, h, d)");
        assert!(message("10 parsecs").contains("unknown unit"));
        assert!(message("s").contains("needs a number"));
        assert!(message("1.5us").contains("finer than a microsecond"));
        assert!(message("1.2.3s").contains("not a number"));
        assert!(message("99999999999999999999d").contains("too long"));
        assert!(message("200y").contains("unknown unit"));
        assert!(message("1000000000d").contains("too long"));
        assert!(message("-1s").contains("needs a number"));
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_micros(3)), "3us");
    }
}
