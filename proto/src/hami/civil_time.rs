//! A small civil (calendar) date-time, seconds precision, with the text
//! formats HAMi writes into annotations.
//!
//! Owns: [`CivilDateTime`] (year 0000–9999, no time zone), its conversion to
//! and from unix seconds (proleptic Gregorian, the date-time read as UTC), and
//! the formats Go's `time` package produces for HAMi:
//!
//! - `time.DateTime`, `2006-01-02 15:04:05` (handshake, v2.5+);
//! - the ≤v2.4 handshake layout `2006.01.02 15:04:05`;
//! - `time.RFC3339`, `2006-01-02T15:04:05Z07:00` (node lock).
//!
//! The calendar (leap years, month lengths, unix conversion) and the
//! formatting are `jiff`'s; what stays here is HAMi's layouts. They are read
//! byte by byte because Go's `01`/`02`/`15` fields are exactly two digits
//! while `jiff`'s `%m`/`%d`/`%H` also read one, and our errors name the field
//! out of range.
//!
//! It does not own a clock: callers pass "now" in as unix seconds.

use std::fmt;

use jiff::SignedDuration;
use jiff::civil::{Date, DateTime};

/// 1970-01-01 00:00:00, the unix epoch read as UTC.
const UNIX_EPOCH: DateTime = DateTime::constant(1970, 1, 1, 0, 0, 0, 0);

/// Why a date-time could not be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// The text does not have the expected layout.
    #[error("expected a time like {layout:?}, found {found:?}")]
    Layout {
        /// The layout that was expected (Go reference-time notation).
        layout: &'static str,
        /// The text that was found (shortened when long).
        found: String,
    },
    /// A calendar or clock field is out of its range.
    #[error("{field} {value} is out of range {min}..={max}")]
    FieldRange {
        /// Which field (`year`, `month`, `day`, `hour`, `minute`, `second`,
        /// `utc offset hours`, `utc offset minutes`).
        field: &'static str,
        /// The value found.
        value: i64,
        /// Smallest allowed value.
        min: i64,
        /// Largest allowed value.
        max: i64,
    },
    /// A unix time outside the years 0000–9999.
    #[error("unix time {0} is outside the years 0000-9999")]
    UnixRange(i64),
}

/// A calendar date and wall-clock time to the second, without a time zone.
///
/// Conversions to unix seconds read it as UTC. Ordering is chronological.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CivilDateTime(DateTime);

// === impl CivilDateTime ===

impl CivilDateTime {
    /// Builds a date-time, checking every field (leap years included).
    ///
    /// # Errors
    /// [`TimeError::FieldRange`] naming the first field out of range.
    pub fn new(
        year: u16,
        month: u8,
        day: u8,
        hour: u8,
        minute: u8,
        second: u8,
    ) -> Result<Self, TimeError> {
        let year = check_range("year", year, 0, 9999)?;
        let month = check_range("month", month, 1, 12)?;
        // Year and month are valid here, so the fallback is never taken.
        let days_in_month = Date::new(year, month, 1).map_or(31, Date::days_in_month);
        let day = check_range("day", day, 1, days_in_month)?;
        let hour = check_range("hour", hour, 0, 23)?;
        let minute = check_range("minute", minute, 0, 59)?;
        let second = check_range("second", second, 0, 59)?;
        // Every field was checked above; jiff checks them again.
        DateTime::new(year, month, day, hour, minute, second, 0)
            .map(Self)
            .map_err(|_| TimeError::FieldRange {
                field: "day",
                value: i64::from(day),
                min: 1,
                max: i64::from(days_in_month),
            })
    }

    /// The date-time at `secs` seconds after 1970-01-01 00:00:00 UTC.
    ///
    /// # Errors
    /// [`TimeError::UnixRange`] outside the years 0000–9999.
    pub fn from_unix_seconds(secs: i64) -> Result<Self, TimeError> {
        if !(Self::MIN_UNIX..=Self::MAX_UNIX).contains(&secs) {
            return Err(TimeError::UnixRange(secs));
        }
        UNIX_EPOCH
            .checked_add(SignedDuration::from_secs(secs))
            .map(Self)
            .map_err(|_| TimeError::UnixRange(secs))
    }

    /// Seconds since 1970-01-01 00:00:00 UTC, reading this date-time as UTC.
    #[must_use]
    pub fn to_unix_seconds(&self) -> i64 {
        // Civil arithmetic, not jiff's `Timestamp`: that stops a day short
        // of 9999-12-31 so that every offset stays representable.
        self.0.duration_since(UNIX_EPOCH).as_secs()
    }

    /// Smallest unix time representable: 0000-01-01 00:00:00 UTC.
    pub const MIN_UNIX: i64 = -62_167_219_200;
    /// Largest unix time representable: 9999-12-31 23:59:59 UTC.
    pub const MAX_UNIX: i64 = 253_402_300_799;

    /// Year, 0–9999.
    #[must_use]
    pub fn year(&self) -> u16 {
        u16::try_from(self.0.year()).unwrap_or(0)
    }
    /// Month, 1–12.
    #[must_use]
    pub fn month(&self) -> u8 {
        self.0.month().unsigned_abs()
    }
    /// Day of the month, 1–31.
    #[must_use]
    pub fn day(&self) -> u8 {
        self.0.day().unsigned_abs()
    }
    /// Hour, 0–23.
    #[must_use]
    pub fn hour(&self) -> u8 {
        self.0.hour().unsigned_abs()
    }
    /// Minute, 0–59.
    #[must_use]
    pub fn minute(&self) -> u8 {
        self.0.minute().unsigned_abs()
    }
    /// Second, 0–59 (no leap seconds, like Go).
    #[must_use]
    pub fn second(&self) -> u8 {
        self.0.second().unsigned_abs()
    }

    /// Parses Go's `time.DateTime` layout, `2006-01-02 15:04:05`.
    ///
    /// # Errors
    /// [`TimeError`] if the layout or a field is wrong.
    pub fn parse_date_time(text: &str) -> Result<Self, TimeError> {
        Self::parse_with_separators(text, b'-', b' ', DATE_TIME_LAYOUT)
    }

    /// Parses the ≤v2.4 handshake layout, `2006.01.02 15:04:05`.
    ///
    /// # Errors
    /// [`TimeError`] if the layout or a field is wrong.
    pub fn parse_dotted(text: &str) -> Result<Self, TimeError> {
        Self::parse_with_separators(text, b'.', b' ', DOTTED_LAYOUT)
    }

    /// Parses Go's `time.RFC3339` layout and converts it to UTC.
    ///
    /// Accepts `Z` or a `±hh:mm` offset and, like Go's parser, an optional
    /// fractional second, which is truncated.
    ///
    /// # Errors
    /// [`TimeError`] if the layout or a field is wrong, or the UTC result is
    /// outside the years 0000–9999.
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimeError> {
        let layout_error = || layout_error(RFC3339_LAYOUT, text);
        let bytes = text.as_bytes();
        let head = bytes.get(..19).ok_or_else(layout_error)?;
        let local = Self::parse_fields(head, b'-', b'T').ok_or_else(layout_error)??;
        let mut rest = bytes.get(19..).ok_or_else(layout_error)?;
        if let Some((&b'.', frac)) = rest.split_first() {
            let digits = frac.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == 0 || digits > 9 {
                return Err(layout_error());
            }
            rest = frac.get(digits..).ok_or_else(layout_error)?;
        }
        let offset_secs = match rest {
            b"Z" => 0,
            [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
                let hours = two_digits(*h1, *h2).ok_or_else(layout_error)?;
                let minutes = two_digits(*m1, *m2).ok_or_else(layout_error)?;
                check_range("utc offset hours", i64::from(hours), 0, 23)?;
                check_range("utc offset minutes", i64::from(minutes), 0, 59)?;
                let secs = i64::from(hours) * 3600 + i64::from(minutes) * 60;
                if *sign == b'-' { -secs } else { secs }
            }
            _ => return Err(layout_error()),
        };
        Self::from_unix_seconds(local.to_unix_seconds() - offset_secs)
    }

    /// Formats as Go's `time.RFC3339` in UTC: `2025-10-20T03:07:02Z`.
    #[must_use]
    pub fn to_rfc3339_utc(&self) -> String {
        self.0.strftime(RFC3339_UTC_FORMAT).to_string()
    }

    fn parse_with_separators(
        text: &str,
        date_sep: u8,
        time_sep: u8,
        layout: &'static str,
    ) -> Result<Self, TimeError> {
        let bytes = text.as_bytes();
        if bytes.len() != 19 {
            return Err(layout_error(layout, text));
        }
        Self::parse_fields(bytes, date_sep, time_sep).ok_or_else(|| layout_error(layout, text))?
    }

    /// Reads `YYYY?MM?DD?hh:mm:ss` from exactly 19 bytes; `None` on a layout
    /// mismatch, `Some(Err)` on a field out of range.
    fn parse_fields(bytes: &[u8], date_sep: u8, time_sep: u8) -> Option<Result<Self, TimeError>> {
        let [
            y1,
            y2,
            y3,
            y4,
            s1,
            mo1,
            mo2,
            s2,
            d1,
            d2,
            s3,
            h1,
            h2,
            c1,
            mi1,
            mi2,
            c2,
            se1,
            se2,
        ] = *bytes
        else {
            return None;
        };
        if s1 != date_sep || s2 != date_sep || s3 != time_sep || c1 != b':' || c2 != b':' {
            return None;
        }
        let year = u16::from(two_digits(y1, y2)?) * 100 + u16::from(two_digits(y3, y4)?);
        Some(Self::new(
            year,
            two_digits(mo1, mo2)?,
            two_digits(d1, d2)?,
            two_digits(h1, h2)?,
            two_digits(mi1, mi2)?,
            two_digits(se1, se2)?,
        ))
    }
}

/// Formats as Go's `time.DateTime`: `2025-07-12 01:12:20`.
impl fmt::Display for CivilDateTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.strftime(DATE_TIME_FORMAT))
    }
}

/// Parses Go's `time.DateTime` layout (see [`CivilDateTime::parse_date_time`]).
impl std::str::FromStr for CivilDateTime {
    type Err = TimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_date_time(s)
    }
}

/// Go's `time.DateTime` layout.
const DATE_TIME_LAYOUT: &str = "2006-01-02 15:04:05";
/// The same layout as a `jiff` format description.
const DATE_TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S";
/// The ≤v2.4 handshake layout.
const DOTTED_LAYOUT: &str = "2006.01.02 15:04:05";
/// Go's `time.RFC3339` layout.
const RFC3339_LAYOUT: &str = "2006-01-02T15:04:05Z07:00";
/// Go's `time.RFC3339` of a UTC time as a `jiff` format description.
const RFC3339_UTC_FORMAT: &str = "%Y-%m-%dT%H:%M:%SZ";

/// Builds a layout error quoting at most 64 characters of `found`.
fn layout_error(layout: &'static str, found: &str) -> TimeError {
    TimeError::Layout {
        layout,
        found: super::snippet(found),
    }
}

/// `value` as jiff's field type when it lies in `min..=max`.
fn check_range<T, U>(field: &'static str, value: T, min: U, max: U) -> Result<U, TimeError>
where
    T: Copy + Into<i64>,
    U: Copy + Into<i64> + TryFrom<i64>,
{
    let (v, lo, hi) = (value.into(), min.into(), max.into());
    let out_of_range = || TimeError::FieldRange {
        field,
        value: v,
        min: lo,
        max: hi,
    };
    if (lo..=hi).contains(&v) {
        U::try_from(v).map_err(|_| out_of_range())
    } else {
        Err(out_of_range())
    }
}

/// Two ASCII digits as a number.
pub(crate) fn two_digits(hi: u8, lo: u8) -> Option<u8> {
    if hi.is_ascii_digit() && lo.is_ascii_digit() {
        Some((hi - b'0') * 10 + (lo - b'0'))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_epoch_and_known_instants_convert_both_ways() {
        let epoch = CivilDateTime::new(1970, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(epoch.to_unix_seconds(), 0);
        // `date -u -d '2025-10-20T03:07:02Z' +%s`
        let lock = CivilDateTime::new(2025, 10, 20, 3, 7, 2).unwrap();
        assert_eq!(lock.to_unix_seconds(), 1_760_929_622);
        assert_eq!(
            CivilDateTime::from_unix_seconds(1_760_929_622).unwrap(),
            lock
        );
        let leap = CivilDateTime::new(2024, 2, 29, 23, 59, 59).unwrap();
        assert_eq!(leap.to_unix_seconds(), 1_709_251_199);
    }

    #[test]
    fn range_limits_match_the_constants() {
        let min = CivilDateTime::new(0, 1, 1, 0, 0, 0).unwrap();
        let max = CivilDateTime::new(9999, 12, 31, 23, 59, 59).unwrap();
        assert_eq!(min.to_unix_seconds(), CivilDateTime::MIN_UNIX);
        assert_eq!(max.to_unix_seconds(), CivilDateTime::MAX_UNIX);
        assert_eq!(
            CivilDateTime::from_unix_seconds(CivilDateTime::MAX_UNIX + 1),
            Err(TimeError::UnixRange(CivilDateTime::MAX_UNIX + 1))
        );
        assert!(CivilDateTime::from_unix_seconds(i64::MIN).is_err());
    }

    #[test]
    fn invalid_calendar_dates_are_rejected_with_the_field() {
        let err = CivilDateTime::new(2023, 2, 29, 0, 0, 0).unwrap_err();
        assert_eq!(err.to_string(), "day 29 is out of range 1..=28");
        let err = CivilDateTime::parse_date_time("2025-13-01 00:00:00").unwrap_err();
        assert_eq!(err.to_string(), "month 13 is out of range 1..=12");
    }

    #[test]
    fn layouts_parse_and_format() {
        let t = CivilDateTime::parse_date_time("2025-07-12 01:12:20").unwrap();
        assert_eq!(t.to_string(), "2025-07-12 01:12:20");
        assert_eq!(
            CivilDateTime::parse_dotted("2025.07.12 01:12:20").unwrap(),
            t
        );
        assert!(CivilDateTime::parse_date_time("2025.07.12 01:12:20").is_err());
        assert!(CivilDateTime::parse_date_time("2025-07-12 01:12:2").is_err());
        assert!(CivilDateTime::parse_date_time("2025-07-12T01:12:20").is_err());
    }

    #[test]
    fn rfc3339_offsets_and_fractions_become_utc_seconds() {
        let utc = CivilDateTime::parse_rfc3339("2025-10-20T03:07:02Z").unwrap();
        assert_eq!(utc.to_rfc3339_utc(), "2025-10-20T03:07:02Z");
        let shifted = CivilDateTime::parse_rfc3339("2025-10-20T11:07:02+08:00").unwrap();
        assert_eq!(shifted, utc);
        let west = CivilDateTime::parse_rfc3339("2025-10-19T22:37:02.999-04:30").unwrap();
        assert_eq!(west, utc);
        for bad in [
            "2025-10-20T03:07:02",
            "2025-10-20 03:07:02Z",
            "2025-10-20T03:07:02.Z",
            "2025-10-20T03:07:02+0800",
            "2025-10-20T03:07:02+24:00",
            "0000-01-01T00:00:00+01:00",
        ] {
            assert!(CivilDateTime::parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// Every second of 0000-9999 goes to a date-time and back, and
        /// through both text layouts, unchanged.
        #[test]
        fn unix_seconds_and_layouts_round_trip(
            secs in CivilDateTime::MIN_UNIX..=CivilDateTime::MAX_UNIX,
        ) {
            let t = CivilDateTime::from_unix_seconds(secs).unwrap();
            proptest::prop_assert_eq!(t.to_unix_seconds(), secs);
            proptest::prop_assert_eq!(CivilDateTime::parse_date_time(&t.to_string()).unwrap(), t);
            proptest::prop_assert_eq!(CivilDateTime::parse_rfc3339(&t.to_rfc3339_utc()).unwrap(), t);
        }
    }
}
