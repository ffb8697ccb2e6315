//! The node lock annotation (`hami.io/mutex.lock`).
//!
//! Owns [`NodeLock`]: `<RFC3339 UTC>,<namespace>,<pod>`, e.g.
//! `2025-10-20T03:07:02Z,default,train-0`. The legacy value, a bare RFC3339
//! time with no owner, is read (owner `None`) and, for a value read that
//! way, written back the same. Times are kept to the second in UTC; an
//! offset such as `+08:00` (HAMi writes local time) is converted on read.
//!
//! The lock is taken at bind and released after Allocate. HAMi releases a
//! lock only when its value ends with `,<ns>,<pod>` of the releasing pod or
//! is in the legacy format ([`NodeLock::may_be_released_by`]), and treats a
//! lock older than 5 minutes as abandoned ([`NodeLock::is_expired`]). "Now"
//! is passed in as unix seconds; the module has no clock.

use std::fmt;
use std::str::FromStr;

use super::civil_time::{CivilDateTime, TimeError};
use super::snippet;

/// HAMi's default lock expiry (`--node-lock-timeout`, 5 min), in seconds.
pub const DEFAULT_EXPIRY_SECS: i64 = 300;

/// The pod that holds a lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockOwner {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
}

/// A node lock value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLock {
    /// When the lock was taken (UTC, seconds).
    pub time: CivilDateTime,
    /// The pod holding it; `None` for the legacy bare-time format.
    pub owner: Option<LockOwner>,
}

/// Why a lock value could not be parsed or built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeLockError {
    /// The value has neither 1 nor 3 comma-separated parts.
    #[error(
        "node lock {value:?} has {parts} comma-separated parts, expected <time>,<namespace>,<pod> or a bare <time>"
    )]
    Parts {
        /// The value (shortened when long).
        value: String,
        /// How many parts it had.
        parts: usize,
    },
    /// The time part is not RFC3339.
    #[error("node lock time: {0}")]
    Time(#[from] TimeError),
    /// The namespace or pod name is empty or contains a `,`.
    #[error("node lock {field} {value:?} must be non-empty and contain no ','")]
    Name {
        /// `namespace` or `pod`.
        field: &'static str,
        /// The offending name (shortened when long).
        value: String,
    },
}

// === impl NodeLock ===

impl NodeLock {
    /// The lock `namespace/pod` takes at `now_unix`.
    ///
    /// # Errors
    /// [`NodeLockError::Name`] for an empty name or one with a `,`;
    /// [`NodeLockError::Time`] outside the years 0000–9999.
    pub fn acquired_at(now_unix: i64, namespace: &str, pod: &str) -> Result<Self, NodeLockError> {
        check_name("namespace", namespace)?;
        check_name("pod", pod)?;
        Ok(Self {
            time: CivilDateTime::from_unix_seconds(now_unix)?,
            owner: Some(LockOwner {
                namespace: namespace.to_owned(),
                pod: pod.to_owned(),
            }),
        })
    }

    /// Whether `namespace/pod` holds this lock.
    #[must_use]
    pub fn is_owned_by(&self, namespace: &str, pod: &str) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| o.namespace == namespace && o.pod == pod)
    }

    /// HAMi's release rule: the owner, or anyone for a legacy (ownerless)
    /// lock, may release it.
    #[must_use]
    pub fn may_be_released_by(&self, namespace: &str, pod: &str) -> bool {
        self.owner.is_none() || self.is_owned_by(namespace, pod)
    }

    /// Seconds since the lock was taken (negative if in the future).
    #[must_use]
    pub fn age_seconds(&self, now_unix: i64) -> i64 {
        now_unix.saturating_sub(self.time.to_unix_seconds())
    }

    /// Whether the lock is older than `expiry_secs` at `now_unix` (strictly,
    /// like Go's `time.Since(t) > timeout`).
    #[must_use]
    pub fn is_expired(&self, now_unix: i64, expiry_secs: i64) -> bool {
        self.age_seconds(now_unix) > expiry_secs
    }
}

fn check_name(field: &'static str, value: &str) -> Result<(), NodeLockError> {
    if value.is_empty() || value.contains(',') {
        Err(NodeLockError::Name {
            field,
            value: snippet(value),
        })
    } else {
        Ok(())
    }
}

/// `<RFC3339 UTC>,<ns>,<pod>`, or the bare time when there is no owner.
impl fmt::Display for NodeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.time.to_rfc3339_utc())?;
        if let Some(owner) = &self.owner {
            write!(f, ",{},{}", owner.namespace, owner.pod)?;
        }
        Ok(())
    }
}

impl FromStr for NodeLock {
    type Err = NodeLockError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(',').collect();
        match parts.as_slice() {
            [time] => Ok(Self {
                time: CivilDateTime::parse_rfc3339(time)?,
                owner: None,
            }),
            [time, namespace, pod] => {
                check_name("namespace", namespace)?;
                check_name("pod", pod)?;
                Ok(Self {
                    time: CivilDateTime::parse_rfc3339(time)?,
                    owner: Some(LockOwner {
                        namespace: (*namespace).to_owned(),
                        pod: (*pod).to_owned(),
                    }),
                })
            }
            _ => Err(NodeLockError::Parts {
                value: snippet(s),
                parts: parts.len(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_release_and_expiry() {
        let lock: NodeLock = "2025-10-20T03:07:02Z,ns,pod-a".parse().unwrap();
        let t = lock.time.to_unix_seconds();
        assert!(lock.is_owned_by("ns", "pod-a"));
        assert!(!lock.is_owned_by("ns", "pod-b"));
        assert!(!lock.is_owned_by("other", "pod-a"));
        assert!(lock.may_be_released_by("ns", "pod-a"));
        assert!(!lock.may_be_released_by("ns", "pod-b"));
        assert!(!lock.is_expired(t + DEFAULT_EXPIRY_SECS, DEFAULT_EXPIRY_SECS));
        assert!(lock.is_expired(t + DEFAULT_EXPIRY_SECS + 1, DEFAULT_EXPIRY_SECS));
        assert_eq!(
            NodeLock::acquired_at(t, "ns", "pod-a").unwrap().to_string(),
            "2025-10-20T03:07:02Z,ns,pod-a"
        );
    }

    #[test]
    fn legacy_lock_has_no_owner_and_anyone_may_release() {
        let lock: NodeLock = "2025-10-20T11:07:02+08:00".parse().unwrap();
        assert_eq!(lock.owner, None);
        assert!(!lock.is_owned_by("ns", "pod"));
        assert!(lock.may_be_released_by("ns", "pod"));
        assert_eq!(lock.to_string(), "2025-10-20T03:07:02Z");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = "2025-10-20T03:07:02Z,ns".parse::<NodeLock>().unwrap_err();
        assert!(
            matches!(err, NodeLockError::Parts { parts: 2, .. }),
            "{err}"
        );
        let err = "2025-10-20T03:07:02Z,,pod".parse::<NodeLock>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "node lock namespace \"\" must be non-empty and contain no ','"
        );
        let err = "yesterday,ns,pod".parse::<NodeLock>().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("node lock time: expected a time like"),
            "{err}"
        );
        assert!(NodeLock::acquired_at(0, "ns", "a,b").is_err());
    }
}
