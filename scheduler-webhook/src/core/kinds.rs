//! The policy kinds: which node policy ([`Policy`]) and how the GPUs inside
//! a node are chosen ([`GpuPolicy`], made of [`GpuPolicyName`]s), their
//! names, and how a name is read.
//!
//! The leaf of the core: it imports nothing from the rest of the crate, so
//! [`crate::core::request`] can read a pod's policy annotations and
//! [`crate::core::score`] can order GPUs without depending on
//! [`crate::core::policy`], which uses them both. The names here are the one
//! list of policies: settings, the simulator and the annotations all read
//! them from [`Policy::ALL`] and [`GpuPolicyName::ALL`].

use std::fmt;
use std::str::FromStr;

/// Errors reading a policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not a node policy this scheduler knows.
    #[error("unknown scheduling policy {0:?} ({choices})", choices = Policy::choices())]
    Unknown(String),
    /// A `gpu-scheduler-policy` entry that names no GPU policy (an empty
    /// entry included: HAMi refuses `binpack,`).
    #[error("unknown GPU scheduling policy {0:?} ({choices}, or a comma list of them)", choices = GpuPolicyName::choices())]
    UnknownGpu(String),
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
    /// FGD with a coarser score and a packing tie break
    /// (`crate::core::fgdpack`).
    FgdPack,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Self; 6] = [
        Self::Binpack,
        Self::Spread,
        Self::Fgd,
        Self::BestFit,
        Self::Random,
        Self::FgdPack,
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
            Self::FgdPack => "fgdpack",
        }
    }

    /// Whether the policy scores nodes with the fragmentation index.
    #[must_use]
    pub fn uses_fgd_index(self) -> bool {
        matches!(self, Self::Fgd | Self::FgdPack)
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

/// One name of a `gpu-scheduler-policy` value (HAMi v2.10,
/// `pkg/util/scheduler_policy.go`): three sort keys and two filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuPolicyName {
    /// Sort key: the fullest GPU (highest GPU score) first.
    Binpack,
    /// Sort key: the emptiest GPU (lowest GPU score) first.
    Spread,
    /// Sort key: by NUMA node (chains only).
    Numa,
    /// Filter: only GPUs no container uses yet.
    Mutex,
    /// Filter and pick: the GPUs best linked to each other (several GPUs),
    /// or worst linked to the rest (one GPU), by the node's pair scores.
    TopologyAware,
}

impl GpuPolicyName {
    /// Every name.
    pub const ALL: [Self; 5] = [
        Self::Binpack,
        Self::Spread,
        Self::Numa,
        Self::Mutex,
        Self::TopologyAware,
    ];

    /// The name as HAMi spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::Numa => "numa",
            Self::Mutex => "mutex",
            Self::TopologyAware => "topology-aware",
        }
    }

    /// Every name, comma separated, for messages and `--help`.
    #[must_use]
    pub fn choices() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

/// How to choose the GPUs inside the chosen node: HAMi's
/// `hami.io/gpu-scheduler-policy` / `gpuSchedulerPolicy`, one name or an
/// ordered comma list (`mutex,binpack,numa`).
///
/// HAMi reads a value with a comma, or the bare `numa`, as a *chain*: the
/// filters it names apply, and its sort keys order the GPUs in the order
/// written, then the GPU index. Any other single name keeps HAMi's
/// pre-v2.10 order (see [`crate::core::score::gpu_order`]). The names are
/// kept deduplicated, in the order first written; whether the value was a
/// chain is kept apart, since `binpack,binpack` (a chain) and `binpack` do
/// not order ties alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuPolicy {
    /// The first `len` are the names; the rest repeat the first.
    names: [GpuPolicyName; 5],
    len: u8,
    chain: bool,
}

impl GpuPolicy {
    /// `binpack`.
    pub const BINPACK: Self = Self::single(GpuPolicyName::Binpack);
    /// `spread` (HAMi's default).
    pub const SPREAD: Self = Self::single(GpuPolicyName::Spread);

    /// The policy of one name, as written alone.
    #[must_use]
    pub const fn single(name: GpuPolicyName) -> Self {
        Self {
            names: [name; 5],
            len: 1,
            chain: matches!(name, GpuPolicyName::Numa),
        }
    }

    /// The names, deduplicated, in the order first written.
    #[must_use]
    pub fn names(&self) -> &[GpuPolicyName] {
        self.names.get(..usize::from(self.len)).unwrap_or_default()
    }

    /// Whether HAMi reads the value as a chain (it has a comma, or is `numa`).
    #[must_use]
    pub fn is_chain(&self) -> bool {
        self.chain
    }

    /// Whether the value names `name`.
    #[must_use]
    pub fn contains(&self, name: GpuPolicyName) -> bool {
        self.names().contains(&name)
    }

    /// Whether GPUs already in use are refused (`mutex`).
    #[must_use]
    pub fn mutex(&self) -> bool {
        self.contains(GpuPolicyName::Mutex)
    }

    /// Whether the GPUs are picked by pair score (`topology-aware`).
    #[must_use]
    pub fn topology_aware(&self) -> bool {
        self.contains(GpuPolicyName::TopologyAware)
    }

    /// Reads a setting: the names exactly as HAMi spells them (HAMi's
    /// `--gpu-scheduler-policy` refuses `Binpack`); [`FromStr`], for
    /// annotations, also takes other letter cases.
    ///
    /// # Errors
    /// [`PolicyError::UnknownGpu`] naming the first entry that is no policy.
    pub fn parse_exact(s: &str) -> Result<Self, PolicyError> {
        Self::parse(s, true)
    }

    fn parse(s: &str, exact: bool) -> Result<Self, PolicyError> {
        let mut out = Self {
            names: [GpuPolicyName::Spread; 5],
            len: 0,
            chain: s.contains(','),
        };
        for part in s.split(',').map(str::trim) {
            let name = GpuPolicyName::ALL
                .into_iter()
                .find(|n| {
                    if exact {
                        n.as_str() == part
                    } else {
                        n.as_str().eq_ignore_ascii_case(part)
                    }
                })
                .ok_or_else(|| PolicyError::UnknownGpu(part.to_owned()))?;
            if !out.contains(name)
                && let Some(slot) = out.names.get_mut(usize::from(out.len))
            {
                *slot = name;
                out.len += 1;
            }
        }
        if out.names() == [GpuPolicyName::Numa] {
            out.chain = true;
        }
        // Unused slots repeat the first name, as in `single`, so equal
        // policies are equal field by field.
        let first = out.names[0];
        for slot in out.names.iter_mut().skip(usize::from(out.len)) {
            *slot = first;
        }
        Ok(out)
    }
}

impl fmt::Display for GpuPolicy {
    /// The names joined by `,`; a chain of one name other than `numa` (only
    /// written by repeating it) prints it twice, so it reads back the same.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names();
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(n.as_str())?;
        }
        if let [one] = names
            && self.chain
            && *one != GpuPolicyName::Numa
        {
            write!(f, ",{}", one.as_str())?;
        }
        Ok(())
    }
}

impl FromStr for GpuPolicy {
    type Err = PolicyError;

    /// One name or a comma list of them, spaces around each ignored, any
    /// letter case. An empty entry or an unknown name is an error naming it
    /// (HAMi logs and falls back to the default policy instead; see
    /// `docs/protocol.md`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_parse() {
        assert_eq!("BestFit".parse::<Policy>().unwrap(), Policy::BestFit);
        assert!("dotprod".parse::<Policy>().is_err());
        assert!("".parse::<GpuPolicy>().is_err());
    }

    /// HAMi's validator table (`pkg/util/util_test.go`,
    /// `TestIsValidGPUSchedulerPolicy`): every name, chains, and what it
    /// refuses; and its normalisation (`pkg/util/scheduler_policy_normalize_test.go`):
    /// spaces around entries do not matter.
    #[test]
    fn gpu_policies_and_chains_read_as_hami_validates_them() {
        for ok in [
            "binpack",
            "spread",
            "numa",
            "mutex",
            "topology-aware",
            "binpack,numa",
            "binpack, numa",
            "mutex,topology-aware",
            " spread ,  mutex ",
        ] {
            assert!(GpuPolicy::parse_exact(ok).is_ok(), "{ok}");
        }
        for bad in ["", "   ", "binpakc", "Binpack", "binpack,nmua", "binpack,"] {
            assert!(GpuPolicy::parse_exact(bad).is_err(), "{bad}");
        }
        // Annotations take any letter case.
        assert_eq!("Binpack".parse::<GpuPolicy>(), Ok(GpuPolicy::BINPACK));
        let p = " mutex, binpack ,numa,binpack"
            .parse::<GpuPolicy>()
            .unwrap();
        assert_eq!(
            p.names(),
            [
                GpuPolicyName::Mutex,
                GpuPolicyName::Binpack,
                GpuPolicyName::Numa
            ]
        );
        assert!(p.is_chain() && p.mutex() && !p.topology_aware());
        assert_eq!(p.to_string(), "mutex,binpack,numa");
        assert!(!GpuPolicy::BINPACK.is_chain());
        assert!("numa".parse::<GpuPolicy>().unwrap().is_chain());
        let twice = "binpack,binpack".parse::<GpuPolicy>().unwrap();
        assert!(twice.is_chain());
        assert_eq!(twice.to_string().parse::<GpuPolicy>(), Ok(twice));
        assert_eq!(
            "binpack,nmua".parse::<GpuPolicy>().unwrap_err().to_string(),
            "unknown GPU scheduling policy \"nmua\" (binpack, spread, numa, mutex, topology-aware, or a comma list of them)"
        );
    }

    #[test]
    fn every_name_reads_back_as_its_policy() {
        for p in Policy::ALL {
            assert_eq!(p.as_str().parse::<Policy>(), Ok(p));
            assert_eq!(p.to_string().to_ascii_uppercase().parse::<Policy>(), Ok(p));
        }
        for n in GpuPolicyName::ALL {
            let p = GpuPolicy::single(n);
            assert_eq!(n.as_str().parse::<GpuPolicy>(), Ok(p));
            assert_eq!(GpuPolicy::parse_exact(&p.to_string()), Ok(p));
        }
        assert_eq!(
            Policy::choices(),
            "binpack, spread, fgd, bestfit, random, fgdpack"
        );
        assert_eq!(
            PolicyError::Unknown("x".into()).to_string(),
            "unknown scheduling policy \"x\" (binpack, spread, fgd, bestfit, random, fgdpack)"
        );
    }

    proptest::proptest! {
        /// Any list of names reads back from its display.
        #[test]
        fn gpu_policy_display_reads_back(picks in proptest::collection::vec(0usize..5, 1..7)) {
            let text: Vec<&str> = picks.iter().map(|&i| GpuPolicyName::ALL[i].as_str()).collect();
            let p = GpuPolicy::parse_exact(&text.join(",")).unwrap();
            proptest::prop_assert_eq!(GpuPolicy::parse_exact(&p.to_string()), Ok(p));
        }
    }
}
