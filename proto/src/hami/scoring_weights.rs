//! The pod annotation `hami.io/device-scoring-weights`: how much each part of
//! HAMi's GPU score counts for one pod.
//!
//! HAMi v2.10 (`pkg/util/device_scoring_weights.go`, PR #2469) scores a GPU
//! for a pod as
//! `10 × (slot × (entries + used)/count + core × (cores + usedcores)/totalcore + memory × (mem + usedmem)/totalmem)`;
//! the annotation sets the three weights, which are 1 each when it is
//! absent. The value must name all three, in any order, as
//! `slot=<n>,core=<n>,memory=<n>` with non-negative whole numbers (spaces
//! around keys and numbers allowed), and at least one must be positive. A
//! value HAMi refuses makes the pod unschedulable; [`DeviceScoringWeights`]'s
//! [`FromStr`] refuses exactly those, in HAMi's order of checks, with HAMi's
//! message.

use std::fmt;
use std::str::FromStr;

use super::keys::DEVICE_SCORING_WEIGHTS;

/// The three weights of the GPU score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceScoringWeights {
    /// Weight of the slot (split count) ratio.
    pub slot: u64,
    /// Weight of the cores ratio.
    pub core: u64,
    /// Weight of the memory ratio.
    pub memory: u64,
}

impl Default for DeviceScoringWeights {
    /// 1 each: HAMi's score without the annotation.
    fn default() -> Self {
        Self {
            slot: 1,
            core: 1,
            memory: 1,
        }
    }
}

impl fmt::Display for DeviceScoringWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot={},core={},memory={}",
            self.slot, self.core, self.memory
        )
    }
}

/// What is wrong with a weights value (HAMi's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeightsProblem {
    /// Not exactly three comma-separated entries.
    #[error("expected slot, core, and memory weights")]
    NotThree,
    /// An entry without `=`.
    #[error("expected key=value entries")]
    NotKeyValue,
    /// The same key twice.
    #[error("duplicate {0:?} weight")]
    Duplicate(String),
    /// A value that is not a whole number (or overflows `int64`).
    #[error("{0:?} weight must be an integer")]
    NotInteger(String),
    /// A negative value.
    #[error("{0:?} weight must not be negative")]
    Negative(String),
    /// A key other than `slot`, `core` and `memory`.
    #[error("unknown weight {0:?}")]
    Unknown(String),
    /// A key missing.
    #[error("missing {0:?} weight")]
    Missing(&'static str),
    /// All three are zero.
    #[error("at least one weight must be positive")]
    AllZero,
}

/// A `hami.io/device-scoring-weights` value HAMi refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {DEVICE_SCORING_WEIGHTS} annotation {value:?}: {problem}")]
pub struct WeightsError {
    /// The annotation value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: WeightsProblem,
}

impl FromStr for DeviceScoringWeights {
    type Err = WeightsError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let fail = |problem| WeightsError {
            value: value.to_owned(),
            problem,
        };
        let parts: Vec<&str> = value.split(',').collect();
        if parts.len() != 3 {
            return Err(fail(WeightsProblem::NotThree));
        }
        let mut weights: [Option<u64>; 3] = [None; 3];
        let mut seen: Vec<&str> = Vec::with_capacity(3);
        for part in parts {
            let Some((key, number)) = part.trim().split_once('=') else {
                return Err(fail(WeightsProblem::NotKeyValue));
            };
            let key = key.trim();
            if seen.contains(&key) {
                return Err(fail(WeightsProblem::Duplicate(key.to_owned())));
            }
            // Go's strconv.ParseInt(s, 10, 64): an optional sign, digits.
            let weight: i64 = number
                .trim()
                .parse()
                .map_err(|_| fail(WeightsProblem::NotInteger(key.to_owned())))?;
            let weight = u64::try_from(weight)
                .map_err(|_| fail(WeightsProblem::Negative(key.to_owned())))?;
            let slot = match key {
                "slot" => 0,
                "core" => 1,
                "memory" => 2,
                _ => return Err(fail(WeightsProblem::Unknown(key.to_owned()))),
            };
            weights[slot] = Some(weight);
            seen.push(key);
        }
        let [Some(slot), Some(core), Some(memory)] = weights else {
            // Unreachable with three distinct known keys; HAMi checks it too.
            let missing = ["slot", "core", "memory"]
                .into_iter()
                .zip(weights)
                .find_map(|(k, w)| w.is_none().then_some(k))
                .unwrap_or("slot");
            return Err(fail(WeightsProblem::Missing(missing)));
        };
        if slot == 0 && core == 0 && memory == 0 {
            return Err(fail(WeightsProblem::AllZero));
        }
        Ok(Self { slot, core, memory })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(slot: u64, core: u64, memory: u64) -> DeviceScoringWeights {
        DeviceScoringWeights { slot, core, memory }
    }

    /// HAMi's own table, `pkg/util/device_scoring_weights_test.go`
    /// (`TestParseDeviceScoringWeights`): the same inputs, the same verdicts
    /// and the same message parts.
    #[test]
    fn parses_and_refuses_as_hami_does() {
        let ok = [
            ("slot=1,core=2,memory=3", w(1, 2, 3)),
            (" memory = 3, slot = 1, core = 0 ", w(1, 0, 3)),
            ("slot=+2,core=0,memory=0", w(2, 0, 0)),
        ];
        for (value, want) in ok {
            assert_eq!(value.parse::<DeviceScoringWeights>(), Ok(want), "{value}");
        }
        let bad = [
            ("", "expected slot, core, and memory weights"),
            ("slot=1,memory=3", "expected slot, core, and memory weights"),
            ("slot=1,core,memory=3", "expected key=value entries"),
            (
                "slot=1,core=high,memory=3",
                r#""core" weight must be an integer"#,
            ),
            (
                "slot=1,core=-1,memory=3",
                r#""core" weight must not be negative"#,
            ),
            (
                "slot=1,bandwidth=2,memory=3",
                r#"unknown weight "bandwidth""#,
            ),
            ("slot=1,slot=2,memory=3", r#"duplicate "slot" weight"#),
            (
                "slot=0,core=0,memory=0",
                "at least one weight must be positive",
            ),
            (
                "slot=1,core=99999999999999999999,memory=1",
                r#""core" weight must be an integer"#,
            ),
        ];
        for (value, part) in bad {
            let err = value.parse::<DeviceScoringWeights>().unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(&format!(
                    "invalid hami.io/device-scoring-weights annotation {value:?}: "
                )),
                "{text}"
            );
            assert!(text.ends_with(part), "{value}: {text}");
        }
    }

    #[test]
    fn default_is_one_each() {
        assert_eq!(DeviceScoringWeights::default(), w(1, 1, 1));
        assert_eq!(
            DeviceScoringWeights::default().to_string(),
            "slot=1,core=1,memory=1"
        );
    }

    proptest::proptest! {
        #[test]
        fn display_reads_back(slot in 0u64..=i64::MAX as u64, core in 0u64..1000, memory in 1u64..1000) {
            let weights = w(slot, core, memory);
            proptest::prop_assert_eq!(weights.to_string().parse::<DeviceScoringWeights>(), Ok(weights));
        }
    }
}
