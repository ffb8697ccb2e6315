//! The node handshake annotation (`hami.io/node-handshake`).
//!
//! Owns [`Handshake`], the value the scheduler stamps on a node to check
//! that the node's device plugin is alive:
//!
//! - `Requesting_<YYYY-MM-DD HH:MM:SS>` (Go `time.DateTime`), written by the
//!   scheduler; the ≤v2.4 layout `YYYY.MM.DD HH:MM:SS` is also read;
//! - `Deleted_<time>`, written by ≤v2.9 schedulers for an unhealthy node —
//!   read only;
//! - `Reported <Go time.String()>`, written by ≤v2.7 device plugins — read
//!   only (see [`ReportedTime`]).
//!
//! HAMi writes the stamps in the scheduler's local time with no zone; its
//! pods run in UTC. gpuslice writes and reads them as UTC. Ages are computed
//! against a "now" in unix seconds that the caller passes in; the module has
//! no clock.

use std::fmt;
use std::str::FromStr;

use super::civil_time::{CivilDateTime, TimeError, two_digits};
use super::snippet;

/// Seconds a `Requesting_` stamp stays fresh: younger means the node is
/// healthy without further checks (HAMi: 60 s).
pub const REQUESTING_FRESH_SECS: i64 = 60;

const REQUESTING_PREFIX: &str = "Requesting_";
const DELETED_PREFIX: &str = "Deleted_";
const REPORTED_PREFIX: &str = "Reported ";

/// A handshake annotation value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// `Requesting_<time>`: the scheduler asked the plugin to report, at
    /// this (UTC) time. The only variant gpuslice writes.
    Requesting(CivilDateTime),
    /// `Deleted_<time>` (≤v2.9): the scheduler declared the node unhealthy.
    Deleted(CivilDateTime),
    /// `Reported <time>` (≤v2.7): the plugin reported at this time.
    Reported(ReportedTime),
}

/// Why a handshake value could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The value starts with none of `Requesting_`, `Deleted_`, `Reported `.
    #[error(
        "unknown handshake {value:?}: expected Requesting_<time>, Deleted_<time> or Reported <time>"
    )]
    UnknownKind {
        /// The value (shortened when long).
        value: String,
    },
    /// The time after the prefix is invalid.
    #[error("handshake {kind}: {source}")]
    Time {
        /// `Requesting_`, `Deleted_` or `Reported `.
        kind: &'static str,
        /// What is wrong with the time.
        #[source]
        source: TimeError,
    },
}

// === impl Handshake ===

impl Handshake {
    /// `Requesting_<now>`, the value the scheduler writes.
    ///
    /// # Errors
    /// [`TimeError::UnixRange`] outside the years 0000–9999.
    pub fn requesting_at(now_unix: i64) -> Result<Self, TimeError> {
        CivilDateTime::from_unix_seconds(now_unix).map(Self::Requesting)
    }

    /// When the stamp was written, in unix seconds.
    #[must_use]
    pub fn stamped_at_unix(&self) -> i64 {
        match self {
            Self::Requesting(t) | Self::Deleted(t) => t.to_unix_seconds(),
            Self::Reported(r) => r.to_unix_seconds(),
        }
    }

    /// Seconds from the stamp to `now_unix` (negative if the stamp is in the
    /// future, e.g. clock skew).
    #[must_use]
    pub fn age_seconds(&self, now_unix: i64) -> i64 {
        now_unix.saturating_sub(self.stamped_at_unix())
    }

    /// Whether this is a `Requesting_` stamp younger than
    /// [`REQUESTING_FRESH_SECS`] at `now_unix` (HAMi: healthy, nothing to
    /// re-read).
    #[must_use]
    pub fn is_fresh_request(&self, now_unix: i64) -> bool {
        matches!(self, Self::Requesting(_)) && self.age_seconds(now_unix) < REQUESTING_FRESH_SECS
    }
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Requesting(t) => write!(f, "{REQUESTING_PREFIX}{t}"),
            Self::Deleted(t) => write!(f, "{DELETED_PREFIX}{t}"),
            Self::Reported(r) => write!(f, "{REPORTED_PREFIX}{r}"),
        }
    }
}

impl FromStr for Handshake {
    type Err = HandshakeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let time = |kind: &'static str, text: &str| {
            CivilDateTime::parse_date_time(text)
                .or_else(|err| CivilDateTime::parse_dotted(text).map_err(|_| err))
                .map_err(|source| HandshakeError::Time { kind, source })
        };
        if let Some(rest) = s.strip_prefix(REQUESTING_PREFIX) {
            time(REQUESTING_PREFIX, rest).map(Self::Requesting)
        } else if let Some(rest) = s.strip_prefix(DELETED_PREFIX) {
            time(DELETED_PREFIX, rest).map(Self::Deleted)
        } else if let Some(rest) = s.strip_prefix(REPORTED_PREFIX) {
            rest.parse()
                .map(Self::Reported)
                .map_err(|source| HandshakeError::Time {
                    kind: REPORTED_PREFIX,
                    source,
                })
        } else {
            Err(HandshakeError::UnknownKind { value: snippet(s) })
        }
    }
}

/// A time as Go's `time.Time.String()` prints it:
/// `2006-01-02 15:04:05.999999999 -0700 MST`, optionally followed by a
/// monotonic clock reading ` m=+0.000000001`, which is accepted and dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedTime {
    /// Wall-clock date and time in the zone below.
    pub local: CivilDateTime,
    /// Fraction of the second, 0–999 999 999 ns (trailing zeros are not
    /// printed, like Go).
    pub nanos: u32,
    /// Offset from UTC in minutes, −1439 to 1439.
    pub offset_minutes: i16,
    /// Zone abbreviation, e.g. `UTC`, `CST`, `+08`: ASCII letters, digits,
    /// `+` and `-` only.
    pub zone: String,
}

const GO_STRING_LAYOUT: &str = "2006-01-02 15:04:05.999999999 -0700 MST";

impl ReportedTime {
    /// The instant in unix seconds (the fraction truncated).
    #[must_use]
    pub fn to_unix_seconds(&self) -> i64 {
        self.local.to_unix_seconds() - i64::from(self.offset_minutes) * 60
    }
}

impl fmt::Display for ReportedTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.local)?;
        if self.nanos != 0 {
            let digits = format!("{:09}", self.nanos);
            write!(f, ".{}", digits.trim_end_matches('0'))?;
        }
        let sign = if self.offset_minutes < 0 { '-' } else { '+' };
        let abs = self.offset_minutes.unsigned_abs();
        write!(f, " {sign}{:02}{:02} {}", abs / 60, abs % 60, self.zone)
    }
}

impl FromStr for ReportedTime {
    type Err = TimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let layout_error = || TimeError::Layout {
            layout: GO_STRING_LAYOUT,
            found: snippet(s),
        };
        let mut parts = s.split(' ');
        let (Some(date), Some(clock), Some(offset), Some(zone)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(layout_error());
        };
        match (parts.next(), parts.next()) {
            (None, _) => {}
            (Some(monotonic), None) if is_monotonic_reading(monotonic) => {}
            _ => return Err(layout_error()),
        }
        let (clock, nanos) = match clock.split_once('.') {
            None => (clock, 0),
            Some((whole, frac)) => {
                if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(layout_error());
                }
                let scaled = format!("{frac:0<9}");
                (whole, scaled.parse::<u32>().map_err(|_| layout_error())?)
            }
        };
        let local = CivilDateTime::parse_date_time(&format!("{date} {clock}"))?;
        let offset_minutes = match offset.as_bytes() {
            [sign @ (b'+' | b'-'), h1, h2, m1, m2] => {
                let hours = two_digits(*h1, *h2).ok_or_else(layout_error)?;
                let minutes = two_digits(*m1, *m2).ok_or_else(layout_error)?;
                if hours > 23 || minutes > 59 {
                    return Err(layout_error());
                }
                let total = i16::from(hours) * 60 + i16::from(minutes);
                if *sign == b'-' { -total } else { total }
            }
            _ => return Err(layout_error()),
        };
        if zone.is_empty()
            || !zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-')
        {
            return Err(layout_error());
        }
        Ok(Self {
            local,
            nanos,
            offset_minutes,
            zone: zone.to_owned(),
        })
    }
}

/// `m=+1.234567890` or `m=-0.5`: Go's monotonic clock suffix.
fn is_monotonic_reading(text: &str) -> bool {
    let Some(number) = text
        .strip_prefix("m=+")
        .or_else(|| text.strip_prefix("m=-"))
    else {
        return false;
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, "0"));
    !whole.is_empty()
        && !frac.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requesting_round_trips_and_ages() {
        let h: Handshake = "Requesting_2025-07-12 01:12:20".parse().unwrap();
        assert_eq!(h.to_string(), "Requesting_2025-07-12 01:12:20");
        let at = h.stamped_at_unix();
        assert_eq!(h.age_seconds(at + 59), 59);
        assert!(h.is_fresh_request(at + 59));
        assert!(!h.is_fresh_request(at + 60));
        assert_eq!(Handshake::requesting_at(at).unwrap(), h);
    }

    #[test]
    fn legacy_forms_are_read() {
        let dotted: Handshake = "Requesting_2025.07.12 01:12:20".parse().unwrap();
        assert_eq!(dotted.to_string(), "Requesting_2025-07-12 01:12:20");
        let deleted: Handshake = "Deleted_2025-07-12 01:12:20".parse().unwrap();
        assert!(matches!(deleted, Handshake::Deleted(_)));
        assert!(!deleted.is_fresh_request(deleted.stamped_at_unix()));
        let reported: Handshake =
            "Reported 2024-01-02 03:04:05.123456789 +0800 CST m=+12.000000001"
                .parse()
                .unwrap();
        let Handshake::Reported(r) = &reported else {
            panic!("{reported:?}");
        };
        assert_eq!(r.nanos, 123_456_789);
        assert_eq!(r.offset_minutes, 480);
        // 2024-01-01 19:04:05 UTC
        assert_eq!(reported.stamped_at_unix(), 1_704_135_845);
        assert_eq!(
            reported.to_string(),
            "Reported 2024-01-02 03:04:05.123456789 +0800 CST"
        );
        let utc: Handshake = "Reported 2024-01-02 03:04:05.5 +0000 UTC".parse().unwrap();
        assert_eq!(utc.to_string(), "Reported 2024-01-02 03:04:05.5 +0000 UTC");
    }

    #[test]
    fn errors_name_the_problem() {
        let err = "Requesting_2025-07-12".parse::<Handshake>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "handshake Requesting_: expected a time like \"2006-01-02 15:04:05\", found \"2025-07-12\""
        );
        let err = "Requesting_2025-02-30 00:00:00"
            .parse::<Handshake>()
            .unwrap_err();
        assert!(err.to_string().contains("day 30"), "{err}");
        assert!(matches!(
            "Hello".parse::<Handshake>(),
            Err(HandshakeError::UnknownKind { .. })
        ));
        for bad in [
            "Reported 2024-01-02 03:04:05 +0800",
            "Reported 2024-01-02 03:04:05 0800 CST",
            "Reported 2024-01-02 03:04:05. +0800 CST",
            "Reported 2024-01-02 03:04:05 +0800 CST m=",
            "Reported 2024-01-02 03:04:05 +0800 CST extra junk",
        ] {
            assert!(bad.parse::<Handshake>().is_err(), "{bad}");
        }
    }
}
