//! The bind annotations (`hami.io/bind-phase`, `hami.io/bind-time`).
//!
//! Owns [`BindPhase`] (`allocating`, `success`, `failed`) and [`BindTime`]
//! (unix seconds as a decimal string, e.g. `1760929622`). The same unix-seconds
//! encoding is used by `hami.io/vgpu-time`, so [`BindTime`] reads that too.
//! "Now" is passed in; the module has no clock.

use std::fmt;
use std::str::FromStr;

use super::register::parse_decimal;
use super::snippet;

/// Where a pod is between bind and Allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindPhase {
    /// Bound by the scheduler, waiting for the device plugin's Allocate.
    Allocating,
    /// Every container was allocated.
    Success,
    /// Allocate failed; the pod will not get its devices.
    Failed,
}

impl BindPhase {
    /// The annotation value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allocating => "allocating",
            Self::Success => "success",
            Self::Failed => "failed",
        }
    }
}

/// Why a bind annotation could not be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// Not one of `allocating`, `success`, `failed`.
    #[error("unknown bind phase {0:?}: expected allocating, success or failed")]
    UnknownPhase(String),
    /// Not a non-negative decimal number of seconds.
    #[error("bind time: {0}")]
    Time(String),
}

impl fmt::Display for BindPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Exact, lowercase match, as HAMi compares.
impl FromStr for BindPhase {
    type Err = BindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allocating" => Ok(Self::Allocating),
            "success" => Ok(Self::Success),
            "failed" => Ok(Self::Failed),
            _ => Err(BindError::UnknownPhase(snippet(s))),
        }
    }
}

/// A unix time in whole seconds, never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BindTime(i64);

impl BindTime {
    /// A bind time at `secs` unix seconds.
    ///
    /// # Errors
    /// [`BindError::Time`] if `secs` is negative.
    pub fn from_unix_seconds(secs: i64) -> Result<Self, BindError> {
        if secs < 0 {
            Err(BindError::Time(format!(
                "negative value {secs} is not allowed"
            )))
        } else {
            Ok(Self(secs))
        }
    }

    /// Seconds since 1970-01-01 00:00:00 UTC.
    #[must_use]
    pub fn as_unix_seconds(self) -> i64 {
        self.0
    }

    /// Seconds from this time to `now_unix` (negative if in the future).
    #[must_use]
    pub fn age_seconds(self, now_unix: i64) -> i64 {
        now_unix.saturating_sub(self.0)
    }

    /// Whether more than `secs` seconds passed between this time and
    /// `now_unix`: an allocation that never completed.
    #[must_use]
    pub fn is_older_than(self, now_unix: i64, secs: i64) -> bool {
        self.age_seconds(now_unix) > secs
    }
}

impl fmt::Display for BindTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Decimal digits, optionally with a leading `+` (Go's `ParseInt` accepts it).
impl FromStr for BindTime {
    type Err = BindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_decimal(s, i64::MAX.unsigned_abs())
            .and_then(|v| i64::try_from(v).map_err(|_| format!("{v} overflows i64")))
            .map(Self)
            .map_err(BindError::Time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_and_reject_others() {
        for phase in [BindPhase::Allocating, BindPhase::Success, BindPhase::Failed] {
            assert_eq!(phase.to_string().parse::<BindPhase>(), Ok(phase));
        }
        assert_eq!(
            "Success".parse::<BindPhase>().unwrap_err().to_string(),
            "unknown bind phase \"Success\": expected allocating, success or failed"
        );
    }

    #[test]
    fn bind_time_parses_ages_and_rejects_garbage() {
        let t: BindTime = "1760929622".parse().unwrap();
        assert_eq!(t.as_unix_seconds(), 1_760_929_622);
        assert_eq!(t.to_string(), "1760929622");
        assert_eq!(t.age_seconds(1_760_929_682), 60);
        assert!(t.is_older_than(1_760_929_682, 59));
        assert!(!t.is_older_than(1_760_929_682, 60));
        assert_eq!(
            "17x".parse::<BindTime>().unwrap_err().to_string(),
            "bind time: invalid digit in \"17x\""
        );
        assert!("-5".parse::<BindTime>().is_err());
        assert!("9223372036854775808".parse::<BindTime>().is_err());
        assert!(BindTime::from_unix_seconds(-1).is_err());
    }
}
