//! The GPU pair scores of a node (`hami.io/node-nvidia-score`), which the
//! `topology-aware` GPU policy reads.
//!
//! HAMi's device plugin writes them, next to the register annotation and
//! only with `ENABLE_TOPOLOGY_SCORE=true`, as a JSON array with one entry per
//! GPU: its UUID and, for every other GPU of the node, how well the two are
//! linked (HAMi `pkg/device/nvidia/calculate_score.go`: the sum over their
//! links of 10 for a cross-CPU PCIe path up to 60 for the same board, and 100
//! per NVLink). The scheduler only compares the numbers. The register
//! annotation itself carries no scores, so a node without this annotation
//! (an older or unconfigured plugin) simply has none: every pair scores 0.
//!
//! ```text
//! [{"uuid":"GPU-a","score":{"GPU-b":200,"GPU-c":10}},{"uuid":"GPU-b","score":{"GPU-a":200}}]
//! ```
//!
//! [`decode`] reads it as Go's `encoding/json` reads HAMi's
//! `DevicePairScores` (`pkg/device/devices.go`): key names match
//! case-insensitively, unknown keys are ignored, `null` reads as empty, and a
//! score must be a whole number that fits an `int64`. [`encode`] writes what
//! Go writes (`omitempty` on both keys, map keys sorted).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::register::push_go_json_string;

/// One GPU's scores against the other GPUs of its node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DevicePairScore {
    /// The GPU's UUID.
    pub uuid: String,
    /// Link score against each other GPU, by UUID (higher is closer).
    pub score: BTreeMap<String, i64>,
}

/// Why a pair score value could not be decoded. Entries count from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairScoreError {
    /// Not valid JSON.
    #[error("invalid JSON pair score value: {0}")]
    Json(String),
    /// Not a JSON array (nor `null`).
    #[error("expected a JSON array of pair scores, found {found}")]
    NotAnArray {
        /// The JSON kind found.
        found: &'static str,
    },
    /// An entry, or a field of one, has the wrong type or value.
    #[error("pair score entry {entry}: {reason}")]
    Entry {
        /// Position of the entry.
        entry: usize,
        /// What is wrong.
        reason: String,
    },
}

/// Decodes the annotation value.
///
/// # Errors
/// [`PairScoreError`] for invalid JSON, a non-array, or an entry whose
/// `uuid` is not a string or whose `score` is not an object of whole numbers.
pub fn decode(value: &str) -> Result<Vec<DevicePairScore>, PairScoreError> {
    let parsed: Value =
        serde_json::from_str(value).map_err(|e| PairScoreError::Json(e.to_string()))?;
    let items = match parsed {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => {
            return Err(PairScoreError::NotAnArray {
                found: kind(&other),
            });
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(entry, item)| entry_from_json(entry, item))
        .collect()
}

fn entry_from_json(entry: usize, item: &Value) -> Result<DevicePairScore, PairScoreError> {
    let bad = |reason: String| PairScoreError::Entry { entry, reason };
    let fields = match item {
        Value::Null => return Ok(DevicePairScore::default()),
        Value::Object(fields) => fields,
        other => {
            return Err(bad(format!(
                "expected a JSON object, found {}",
                kind(other)
            )));
        }
    };
    let mut out = DevicePairScore::default();
    // Go matches keys case-insensitively; the last matching key wins.
    for (key, value) in fields {
        if key.eq_ignore_ascii_case("uuid") {
            out.uuid = match value {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                other => {
                    return Err(bad(format!(
                        "uuid: expected a string, found {}",
                        kind(other)
                    )));
                }
            };
        } else if key.eq_ignore_ascii_case("score") {
            out.score = match value {
                Value::Null => BTreeMap::new(),
                Value::Object(scores) => scores
                    .iter()
                    .map(|(peer, s)| match s.as_i64() {
                        Some(n) => Ok((peer.clone(), n)),
                        None => Err(bad(format!(
                            "score of {peer:?}: expected a whole number, found {s}"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                other => {
                    return Err(bad(format!(
                        "score: expected a JSON object, found {}",
                        kind(other)
                    )));
                }
            };
        }
    }
    Ok(out)
}

/// Encodes the scores as HAMi's plugin writes them: `uuid` and `score` left
/// out when empty, peers in sorted order, no spaces.
#[must_use]
pub fn encode(scores: &[DevicePairScore]) -> String {
    let mut out = String::from("[");
    for (i, s) in scores.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        if !s.uuid.is_empty() {
            out.push_str("\"uuid\":");
            push_go_json_string(&mut out, &s.uuid);
        }
        if !s.score.is_empty() {
            if !s.uuid.is_empty() {
                out.push(',');
            }
            out.push_str("\"score\":{");
            for (j, (peer, n)) in s.score.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                push_go_json_string(&mut out, peer);
                let _ = write!(out, ":{n}");
            }
            out.push('}');
        }
        out.push('}');
    }
    out.push(']');
    out
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uuid: &str, peers: &[(&str, i64)]) -> DevicePairScore {
        DevicePairScore {
            uuid: uuid.to_owned(),
            score: peers.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect(),
        }
    }

    #[test]
    fn decodes_what_hamis_plugin_writes() {
        // Shape of HAMi's `ListDeviceScore` (pkg/device/nvidia/calculate_score.go,
        // json tags `uuid` and `score`).
        let v = r#"[{"uuid":"GPU-a","score":{"GPU-b":200,"GPU-c":10}},{"uuid":"GPU-b","score":{"GPU-a":200}}]"#;
        let got = decode(v).unwrap();
        assert_eq!(
            got,
            vec![
                entry("GPU-a", &[("GPU-b", 200), ("GPU-c", 10)]),
                entry("GPU-b", &[("GPU-a", 200)])
            ]
        );
        assert_eq!(encode(&got), v);
    }

    #[test]
    fn reads_like_go_encoding_json() {
        assert_eq!(decode("null").unwrap(), vec![]);
        assert_eq!(decode("[]").unwrap(), vec![]);
        let got = decode(r#"[{"UUID":"GPU-a","Score":null,"extra":[1]},null]"#).unwrap();
        assert_eq!(got, vec![entry("GPU-a", &[]), DevicePairScore::default()]);
        for bad in [
            "{",
            "{}",
            r#"[{"uuid":1}]"#,
            r#"[{"uuid":"a","score":{"b":1.5}}]"#,
            r#"[{"uuid":"a","score":{"b":"1"}}]"#,
            r#"[{"uuid":"a","score":[1]}]"#,
            "[7]",
        ] {
            assert!(decode(bad).is_err(), "{bad}");
        }
        let err = decode(r#"[{"uuid":"a"},{"uuid":"b","score":{"a":1e2}}]"#).unwrap_err();
        assert!(err.to_string().starts_with("pair score entry 1:"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn encode_then_decode_is_identity(
            list in proptest::collection::vec(
                ("[ -~]{0,12}", proptest::collection::btree_map("[ -~]{1,8}", proptest::num::i64::ANY, 0..4)),
                0..4,
            )
        ) {
            let scores: Vec<DevicePairScore> = list
                .into_iter()
                .map(|(uuid, score)| DevicePairScore { uuid, score })
                .collect();
            proptest::prop_assert_eq!(decode(&encode(&scores)).unwrap(), scores);
        }
    }
}
