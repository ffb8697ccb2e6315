//! Wall-clock seconds: the one place the service turns a `SystemTime` into
//! the unix seconds the HAMi codecs take (`proto` reads no clock).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the unix epoch; 0 before it, saturating far after it.
#[must_use]
pub fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Now, in unix seconds.
#[must_use]
pub fn now_unix() -> i64 {
    unix_seconds(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn unix_seconds_clamps_before_the_epoch_and_counts_after_it() {
        assert_eq!(
            unix_seconds(UNIX_EPOCH + Duration::from_secs(1_760_929_622)),
            1_760_929_622
        );
        assert_eq!(unix_seconds(UNIX_EPOCH - Duration::from_secs(5)), 0);
    }
}
