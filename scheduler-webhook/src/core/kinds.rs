//! The policy kinds: which node policy ([`Policy`]) and which GPU order
//! inside a node ([`GpuPolicy`]), their names, and how a name is read.
//!
//! The leaf of the core: it imports nothing from the rest of the crate, so
//! [`crate::core::request`] can read a pod's policy annotations and
//! [`crate::core::score`] can order GPUs without depending on
//! [`crate::core::policy`], which uses them both. The names here are the one
//! list of policies: settings, the simulator and the annotations all read
//! them from [`Policy::ALL`] and [`GpuPolicy::ALL`].

use std::fmt;
use std::str::FromStr;

/// Errors reading a policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not a policy this scheduler knows.
    #[error("unknown scheduling policy {0:?} ({choices})", choices = Policy::choices())]
    Unknown(String),
    /// A HAMi GPU policy this scheduler does not implement.
    #[error("GPU scheduling policy {0:?} is not supported ({choices})", choices = GpuPolicy::choices())]
    Unsupported(String),
}

/// How to choose the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// HAMi binpack: the fullest node.
    Binpack,
    /// HAMi spread: the emptiest node.
    Spread,
    /// Fragmentation gradient descent.
    Fgd,
    /// Smallest leftover after placement.
    BestFit,
    /// Uniformly random.
    Random,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Self; 5] = [
        Self::Binpack,
        Self::Spread,
        Self::Fgd,
        Self::BestFit,
        Self::Random,
    ];

    /// The name used on the command line and in annotations.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::Fgd => "fgd",
            Self::BestFit => "bestfit",
            Self::Random => "random",
        }
    }

    /// Every name, comma separated, for messages and `--help`.
    #[must_use]
    pub fn choices() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == t)
            .or(if t == "best-fit" {
                Some(Self::BestFit)
            } else {
                None
            })
            .ok_or_else(|| PolicyError::Unknown(s.to_owned()))
    }
}

/// How to order GPUs inside a node (HAMi `gpu-scheduler-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuPolicy {
    /// The fullest GPU first.
    Binpack,
    /// The emptiest GPU first (HAMi's default).
    Spread,
}

impl GpuPolicy {
    /// Every GPU policy.
    pub const ALL: [Self; 2] = [Self::Binpack, Self::Spread];

    /// The name used on the command line and in annotations.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
        }
    }

    /// Every name, comma separated, for messages and `--help`.
    #[must_use]
    pub fn choices() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl fmt::Display for GpuPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GpuPolicy {
    type Err = PolicyError;

    /// `binpack`, `spread`, or a comma chain whose entries are all one of
    /// them (the first wins). HAMi's `mutex`, `topology-aware` and `numa`
    /// are refused rather than silently ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut first = None;
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let lower = part.to_ascii_lowercase();
            let p = match Self::ALL.into_iter().find(|p| p.as_str() == lower) {
                Some(p) => p,
                None if matches!(lower.as_str(), "mutex" | "topology-aware" | "numa") => {
                    return Err(PolicyError::Unsupported(part.to_owned()));
                }
                None => return Err(PolicyError::Unknown(part.to_owned())),
            };
            first.get_or_insert(p);
        }
        first.ok_or_else(|| PolicyError::Unknown(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_parse() {
        assert_eq!("BestFit".parse::<Policy>().unwrap(), Policy::BestFit);
        assert!("dotprod".parse::<Policy>().is_err());
        assert_eq!(
            "spread,binpack".parse::<GpuPolicy>().unwrap(),
            GpuPolicy::Spread
        );
        assert!(matches!(
            "binpack,numa".parse::<GpuPolicy>(),
            Err(PolicyError::Unsupported(_))
        ));
        assert!("".parse::<GpuPolicy>().is_err());
    }

    #[test]
    fn every_name_reads_back_as_its_policy() {
        for p in Policy::ALL {
            assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
            assert_eq!(p.to_string().to_ascii_uppercase().parse::<Policy>(), Ok(p));
        }
        for p in GpuPolicy::ALL {
            assert_eq!(p.as_str().parse::<GpuPolicy>(), Ok(p));
        }
        assert_eq!(Policy::choices(), "binpack, spread, fgd, bestfit, random");
        assert_eq!(
            PolicyError::Unknown("x".into()).to_string(),
            "unknown scheduling policy \"x\" (binpack, spread, fgd, bestfit, random)"
        );
    }
}
