//! The node device register annotation (`hami.io/node-nvidia-register`).
//!
//! Owns [`NodeDevice`] and its two wire formats:
//!
//! - **JSON (v2.8+), written and read.** [`encode_json`] produces exactly the
//!   bytes Go's `encoding/json` writes for HAMi's `DeviceInfo` with every key
//!   `omitempty`: keys in the order `id,index,count,devmem,devcore,type,numa,
//!   mode,migProfiles,health`, zero numbers, `false` and empty strings left out, no
//!   spaces, Go's string escaping (`<`, `>`, `&`, U+2028 and U+2029 as
//!   `\u003c`…). [`decode_json`] reads a missing key (or `null`) as 0, false
//!   or empty, reads `migProfiles` (MIG mode, v2.10; after `mode`), ignores unknown keys, matches key names
//!   case-insensitively like Go, and rejects negative, fractional and
//!   overflowing numbers.
//! - **Legacy (≤v2.7), read only.** [`decode_legacy`] reads
//!   `UUID,count,devmem,devcore,type,numa,health,index,mode:` per device; the
//!   7-field variant (no `index,mode`) means index 0 and mode `hami-core`. A
//!   value without `:` is rejected; empty pieces between `:` are skipped; a
//!   non-empty piece without `,` is rejected (HAMi HEAD does the same).
//!
//! [`decode`] picks the format: JSON when the value (after leading
//! whitespace) starts with `[`, legacy otherwise.
//!
//! Ranges: `count`, `devmem` and `devcore` are `int32` in HAMi, so values above
//! 2147483647 are rejected both ways; `index` and `numa` take any `u32`.

use std::fmt::Write as _;

use serde_json::Value;

use super::mig::{self, MigProfile};
use super::snippet;

/// One GPU as the device plugin publishes it in the node register annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDevice {
    /// GPU UUID, e.g. `GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448`.
    pub id: String,
    /// Index of the GPU on its node.
    pub index: u32,
    /// Split count: how many pods may share this GPU.
    pub count: u32,
    /// Device memory in MiB (after `deviceMemoryScaling`).
    pub devmem: u32,
    /// Device cores in percent (after `deviceCoreScaling`, 100 = one card).
    pub devcore: u32,
    /// Type, e.g. `NVIDIA-Tesla V100-PCIE-32GB`.
    pub device_type: String,
    /// NUMA node.
    pub numa: u32,
    /// Sharing mode: `hami-core`, `mig` or `mps`.
    pub mode: String,
    /// Whether the GPU is healthy.
    pub health: bool,
    /// In `mig` mode, the GPU instance profiles the GPU offers
    /// (`migProfiles`, HAMi v2.10); empty otherwise.
    pub mig_profiles: Vec<MigProfile>,
}

/// The default sharing mode, and the mode of every 7-field legacy entry.
pub const MODE_HAMI_CORE: &str = "hami-core";
/// MIG sharing mode.
pub const MODE_MIG: &str = "mig";
/// MPS sharing mode.
pub const MODE_MPS: &str = "mps";

/// Largest value HAMi's `int32` fields (`count`, `devmem`, `devcore`) hold.
const INT32_MAX: u32 = 0x7fff_ffff;

impl NodeDevice {
    /// Whether the scheduler treats this device as an NVIDIA GPU: its type
    /// contains `nvidia`, case-insensitively (HAMi's rule).
    #[must_use]
    pub fn is_nvidia(&self) -> bool {
        self.device_type.to_ascii_lowercase().contains("nvidia")
    }
}

/// Why a register value could not be encoded or decoded. Device numbers count
/// from 0 in the order the devices appear.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The value starts with `[` but is not valid JSON.
    #[error("invalid JSON register value: {0}")]
    Json(String),
    /// The JSON value is not an array.
    #[error("expected a JSON array of devices, found {found}")]
    NotAnArray {
        /// The JSON kind found.
        found: &'static str,
    },
    /// An element of the JSON array is not an object.
    #[error("device {device}: expected a JSON object, found {found}")]
    NotAnObject {
        /// Position of the device.
        device: usize,
        /// The JSON kind found.
        found: &'static str,
    },
    /// A field has the wrong type or an unacceptable value.
    #[error("device {device}, field {field}: {reason}")]
    Field {
        /// Position of the device.
        device: usize,
        /// The field's JSON key (`id`, `index`, `count`, `devmem`, `devcore`,
        /// `type`, `numa`, `mode`, `health`).
        field: &'static str,
        /// What is wrong, e.g. `invalid digit in "12x"`.
        reason: String,
    },
    /// A legacy value without any `:` device terminator.
    #[error("legacy register value has no ':' device terminator: {value:?}")]
    MissingTerminator {
        /// The value (shortened when long).
        value: String,
    },
    /// A legacy device entry without `,`.
    #[error("device {device}: legacy entry {entry:?} has no ',' separated fields")]
    MalformedEntry {
        /// Position of the device.
        device: usize,
        /// The entry (shortened when long).
        entry: String,
    },
    /// A legacy device entry with a field count other than 7 or 9.
    #[error(
        "device {device}: legacy entry has {found} comma-separated fields, expected 7 or 9: {entry:?}"
    )]
    FieldCount {
        /// Position of the device.
        device: usize,
        /// How many fields it had.
        found: usize,
        /// The entry (shortened when long).
        entry: String,
    },
}

/// Encodes devices as the v2.8+ JSON array, byte for byte what HAMi writes.
///
/// ```
/// use proto::hami::register::{encode_json, NodeDevice};
/// let gpu = NodeDevice {
///     id: "GPU-a".into(), index: 0, count: 10, devmem: 32768, devcore: 100,
///     device_type: "NVIDIA-Tesla T4".into(), numa: 0, mode: "hami-core".into(),
///     health: true, mig_profiles: vec![],
/// };
/// assert_eq!(
///     encode_json(&[gpu]).unwrap(),
///     r#"[{"id":"GPU-a","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla T4","mode":"hami-core","health":true}]"#,
/// );
/// ```
///
/// # Errors
/// [`RegisterError::Field`] if `count`, `devmem` or `devcore` exceeds
/// 2147483647, which HAMi (an `int32`) could not read.
pub fn encode_json(devices: &[NodeDevice]) -> Result<String, RegisterError> {
    let mut out = String::with_capacity(devices.len().saturating_mul(160).saturating_add(2));
    out.push('[');
    for (device, dev) in devices.iter().enumerate() {
        for (field, value) in [
            ("count", dev.count),
            ("devmem", dev.devmem),
            ("devcore", dev.devcore),
        ] {
            if value > INT32_MAX {
                return Err(RegisterError::Field {
                    device,
                    field,
                    reason: format!("{value} overflows int32 (max {INT32_MAX})"),
                });
            }
        }
        if device > 0 {
            out.push(',');
        }
        out.push('{');
        let mut first = true;
        let mut key = |out: &mut String, name: &str| {
            if !first {
                out.push(',');
            }
            first = false;
            out.push('"');
            out.push_str(name);
            out.push_str("\":");
        };
        if !dev.id.is_empty() {
            key(&mut out, "id");
            push_go_json_string(&mut out, &dev.id);
        }
        for (name, value) in [
            ("index", dev.index),
            ("count", dev.count),
            ("devmem", dev.devmem),
            ("devcore", dev.devcore),
        ] {
            if value != 0 {
                key(&mut out, name);
                let _ = write!(out, "{value}");
            }
        }
        if !dev.device_type.is_empty() {
            key(&mut out, "type");
            push_go_json_string(&mut out, &dev.device_type);
        }
        if dev.numa != 0 {
            key(&mut out, "numa");
            let _ = write!(out, "{}", dev.numa);
        }
        if !dev.mode.is_empty() {
            key(&mut out, "mode");
            push_go_json_string(&mut out, &dev.mode);
        }
        if !dev.mig_profiles.is_empty() {
            key(&mut out, "migProfiles");
            mig::push_profiles_json(&mut out, &dev.mig_profiles);
        }
        if dev.health {
            key(&mut out, "health");
            out.push_str("true");
        }
        out.push('}');
    }
    out.push(']');
    Ok(out)
}

/// Decodes either format: JSON when the value (after leading whitespace)
/// starts with `[`, the legacy `…:` list otherwise.
///
/// # Errors
/// [`RegisterError`] saying which device and field is wrong.
pub fn decode(value: &str) -> Result<Vec<NodeDevice>, RegisterError> {
    if value.trim_start().starts_with('[') {
        decode_json(value)
    } else {
        decode_legacy(value)
    }
}

/// Decodes the v2.8+ JSON array.
///
/// # Errors
/// [`RegisterError`] for invalid JSON, a non-array, a non-object element, or
/// a field of the wrong type or range.
pub fn decode_json(value: &str) -> Result<Vec<NodeDevice>, RegisterError> {
    let parsed: Value =
        serde_json::from_str(value).map_err(|e| RegisterError::Json(e.to_string()))?;
    let Value::Array(items) = parsed else {
        return Err(RegisterError::NotAnArray {
            found: json_kind(&parsed),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(device, item)| device_from_json(device, item))
        .collect()
}

/// Decodes the legacy (≤v2.7) `UUID,count,devmem,devcore,type,numa,health[,index,mode]:`
/// list.
///
/// # Errors
/// [`RegisterError`] for a value without `:`, an entry without `,` or with a
/// field count other than 7 or 9, or an invalid number or bool.
pub fn decode_legacy(value: &str) -> Result<Vec<NodeDevice>, RegisterError> {
    if !value.contains(':') {
        return Err(RegisterError::MissingTerminator {
            value: snippet(value),
        });
    }
    let mut devices = Vec::new();
    for entry in value.split(':').filter(|entry| !entry.is_empty()) {
        let device = devices.len();
        if !entry.contains(',') {
            return Err(RegisterError::MalformedEntry {
                device,
                entry: snippet(entry),
            });
        }
        let fields: Vec<&str> = entry.split(',').collect();
        let (index, mode) = match fields.as_slice() {
            [_, _, _, _, _, _, _] => (0, MODE_HAMI_CORE.to_owned()),
            [_, _, _, _, _, _, _, index, mode] => (
                legacy_number(device, "index", index, u32::MAX)?,
                (*mode).to_owned(),
            ),
            _ => {
                return Err(RegisterError::FieldCount {
                    device,
                    found: fields.len(),
                    entry: snippet(entry),
                });
            }
        };
        let field = |i: usize| fields.get(i).copied().unwrap_or_default();
        devices.push(NodeDevice {
            id: field(0).to_owned(),
            index,
            count: legacy_number(device, "count", field(1), INT32_MAX)?,
            devmem: legacy_number(device, "devmem", field(2), INT32_MAX)?,
            devcore: legacy_number(device, "devcore", field(3), INT32_MAX)?,
            device_type: field(4).to_owned(),
            numa: legacy_number(device, "numa", field(5), u32::MAX)?,
            health: parse_go_bool(field(6)).ok_or_else(|| RegisterError::Field {
                device,
                field: "health",
                reason: format!("invalid bool {:?}", snippet(field(6))),
            })?,
            mode,
            mig_profiles: Vec::new(),
        });
    }
    Ok(devices)
}

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` / `0 f F FALSE false False`.
#[must_use]
pub fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses a non-negative decimal number no larger than `max`, with an error
/// that says what is wrong (`invalid digit in "12x"`, …).
pub(crate) fn parse_decimal(text: &str, max: u64) -> Result<u64, String> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() {
        return Err(format!("expected a number, found {:?}", snippet(text)));
    }
    if let Some(rest) = digits.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(format!("negative value {:?} is not allowed", snippet(text)));
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid digit in {:?}", snippet(text)));
    }
    let value = digits.bytes().try_fold(0_u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    });
    match value {
        Some(v) if v <= max => Ok(v),
        _ => Err(format!("{:?} overflows the maximum {max}", snippet(text))),
    }
}

fn legacy_number(
    device: usize,
    field: &'static str,
    text: &str,
    max: u32,
) -> Result<u32, RegisterError> {
    parse_decimal(text, u64::from(max))
        .and_then(|v| u32::try_from(v).map_err(|_| format!("{v} overflows u32")))
        .map_err(|reason| RegisterError::Field {
            device,
            field,
            reason,
        })
}

/// The JSON keys of `DeviceInfo` this module reads.
const JSON_KEYS: [&str; 10] = [
    "id",
    "index",
    "count",
    "devmem",
    "devcore",
    "type",
    "numa",
    "mode",
    "migProfiles",
    "health",
];

fn device_from_json(device: usize, item: &Value) -> Result<NodeDevice, RegisterError> {
    let Value::Object(map) = item else {
        return Err(RegisterError::NotAnObject {
            device,
            found: json_kind(item),
        });
    };
    let mut out = NodeDevice {
        id: String::new(),
        index: 0,
        count: 0,
        devmem: 0,
        devcore: 0,
        device_type: String::new(),
        numa: 0,
        mode: String::new(),
        health: false,
        mig_profiles: Vec::new(),
    };
    for (key, value) in map {
        // Go matches a key exactly first, then case-insensitively.
        let Some(field) = JSON_KEYS
            .iter()
            .find(|k| **k == key)
            .or_else(|| JSON_KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)))
        else {
            continue;
        };
        if value.is_null() {
            continue;
        }
        let field: &'static str = field;
        match field {
            "id" => out.id = json_string(device, field, value)?,
            "type" => out.device_type = json_string(device, field, value)?,
            "mode" => out.mode = json_string(device, field, value)?,
            "migProfiles" => {
                let Value::Array(items) = value else {
                    return Err(RegisterError::Field {
                        device,
                        field,
                        reason: format!("expected an array, found {}", json_kind(value)),
                    });
                };
                out.mig_profiles = items
                    .iter()
                    .map(mig::profile_from_json)
                    .collect::<Result<_, _>>()
                    .map_err(|reason| RegisterError::Field {
                        device,
                        field,
                        reason,
                    })?;
            }
            "health" => {
                out.health = value.as_bool().ok_or_else(|| RegisterError::Field {
                    device,
                    field,
                    reason: format!("expected a bool, found {}", json_kind(value)),
                })?;
            }
            "index" => out.index = json_number(device, field, value, u32::MAX)?,
            "count" => out.count = json_number(device, field, value, INT32_MAX)?,
            "devmem" => out.devmem = json_number(device, field, value, INT32_MAX)?,
            "devcore" => out.devcore = json_number(device, field, value, INT32_MAX)?,
            _ => out.numa = json_number(device, field, value, u32::MAX)?,
        }
    }
    Ok(out)
}

fn json_string(device: usize, field: &'static str, value: &Value) -> Result<String, RegisterError> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| RegisterError::Field {
            device,
            field,
            reason: format!("expected a string, found {}", json_kind(value)),
        })
}

fn json_number(
    device: usize,
    field: &'static str,
    value: &Value,
    max: u32,
) -> Result<u32, RegisterError> {
    let error = |reason: String| RegisterError::Field {
        device,
        field,
        reason,
    };
    let Value::Number(number) = value else {
        return Err(error(format!(
            "expected a number, found {}",
            json_kind(value)
        )));
    };
    if let Some(v) = number.as_u64() {
        return u32::try_from(v)
            .ok()
            .filter(|v| *v <= max)
            .ok_or_else(|| error(format!("{v} overflows the maximum {max}")));
    }
    if number.as_i64().is_some() {
        return Err(error(format!("negative value {number} is not allowed")));
    }
    Err(error(format!(
        "expected an integer from 0 to {max}, found {number}"
    )))
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Appends `text` as a JSON string the way Go's `json.Marshal` does (HTML
/// escaping on, `\b` `\f` short forms as in Go 1.22+).
pub(crate) fn push_go_json_string(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if u32::from(c) < 0x20 || matches!(c, '<' | '>' | '&') => {
                let b = u32::from(c);
                out.push_str("\\u00");
                out.push(char::from(HEX[(b >> 4) as usize & 0xf]));
                out.push(char::from(HEX[b as usize & 0xf]));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str) -> NodeDevice {
        NodeDevice {
            id: id.to_owned(),
            index: 0,
            count: 10,
            devmem: 32768,
            devcore: 100,
            device_type: "NVIDIA-Tesla V100-PCIE-32GB".to_owned(),
            numa: 0,
            mode: MODE_HAMI_CORE.to_owned(),
            health: true,
            mig_profiles: Vec::new(),
        }
    }

    #[test]
    fn zero_device_encodes_as_empty_object_and_decodes_back() {
        let zero = NodeDevice {
            id: String::new(),
            index: 0,
            count: 0,
            devmem: 0,
            devcore: 0,
            device_type: String::new(),
            numa: 0,
            mode: String::new(),
            health: false,
            mig_profiles: Vec::new(),
        };
        let text = encode_json(std::slice::from_ref(&zero)).unwrap();
        assert_eq!(text, "[{}]");
        assert_eq!(decode(&text).unwrap(), vec![zero]);
        assert_eq!(encode_json(&[]).unwrap(), "[]");
        assert_eq!(decode("[]").unwrap(), vec![]);
    }

    #[test]
    fn strings_are_escaped_like_go() {
        let mut dev = gpu("GPU-<a>&\"b\"\\\n\u{1}\u{2028}\u{7f}é");
        dev.count = 0;
        dev.devmem = 0;
        dev.devcore = 0;
        dev.device_type = String::new();
        dev.mode = String::new();
        dev.health = false;
        let text = encode_json(std::slice::from_ref(&dev)).unwrap();
        assert_eq!(
            text,
            "[{\"id\":\"GPU-\\u003ca\\u003e\\u0026\\\"b\\\"\\\\\\n\\u0001\\u2028\u{7f}é\"}]"
        );
        assert_eq!(decode(&text).unwrap(), vec![dev]);
    }

    #[test]
    fn json_errors_name_device_and_field() {
        let err = decode(r#"[{"id":"a"},{"id":"b","devmem":-1}]"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 1, field devmem: negative value -1 is not allowed"
        );
        let err = decode(r#"[{"count":2147483648}]"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 0, field count: 2147483648 overflows the maximum 2147483647"
        );
        let err = decode(r#"[{"numa":1.5}]"#).unwrap_err();
        assert!(
            err.to_string().contains("field numa: expected an integer"),
            "{err}"
        );
        let err = decode(r#"[{"health":"true"}]"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 0, field health: expected a bool, found a string"
        );
        assert!(matches!(
            decode("[1]"),
            Err(RegisterError::NotAnObject { device: 0, .. })
        ));
        assert!(matches!(decode("[{"), Err(RegisterError::Json(_))));
        assert!(matches!(
            decode_json("{}"),
            Err(RegisterError::NotAnArray { .. })
        ));
    }

    #[test]
    fn json_keys_are_case_insensitive_unknown_and_null_ignored() {
        let devices = decode(
            r#"[{"ID":"GPU-a","Count":4,"migProfiles":[{"name":"1g.5gb"}],"numa":null,"Health":true}]"#,
        )
        .unwrap();
        assert_eq!(devices[0].id, "GPU-a");
        assert_eq!(devices[0].count, 4);
        assert_eq!(devices[0].numa, 0);
        assert!(devices[0].health);
    }

    #[test]
    fn encode_rejects_values_hami_cannot_read() {
        let mut dev = gpu("GPU-a");
        dev.devcore = INT32_MAX + 1;
        let err = encode_json(&[gpu("GPU-0"), dev]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 1, field devcore: 2147483648 overflows int32 (max 2147483647)"
        );
    }

    #[test]
    fn legacy_errors_name_device_and_field() {
        let err = decode("GPU-a,10,12x,100,NVIDIA-T4,0,true:").unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 0, field devmem: invalid digit in \"12x\""
        );
        let err = decode("GPU-a,10,1,100,NVIDIA-T4,0,true:GPU-b,10,1,100,T4,-1,true:").unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 1, field numa: negative value \"-1\" is not allowed"
        );
        let err = decode("GPU-a,10,1,100,NVIDIA-T4,0,yes:").unwrap_err();
        assert_eq!(
            err.to_string(),
            "device 0, field health: invalid bool \"yes\""
        );
        assert!(matches!(
            decode("GPU-a,10,1,100,NVIDIA-T4,0,true,0:"),
            Err(RegisterError::FieldCount { found: 8, .. })
        ));
        assert!(matches!(
            decode("GPU-a,10"),
            Err(RegisterError::MissingTerminator { .. })
        ));
        assert!(matches!(
            decode("garbage:"),
            Err(RegisterError::MalformedEntry { .. })
        ));
        assert_eq!(decode(":::").unwrap(), vec![]);
    }

    #[test]
    fn legacy_accepts_go_bools_and_plus_signs() {
        let devices = decode("GPU-a,+10,1,100,T4,0,T,3,mps:GPU-b,1,1,1,T4,0,0:").unwrap();
        assert!(devices[0].health);
        assert_eq!((devices[0].count, devices[0].index), (10, 3));
        assert_eq!(devices[0].mode, "mps");
        assert!(!devices[1].health);
        assert_eq!(devices[1].mode, MODE_HAMI_CORE);
    }

    #[test]
    fn nvidia_type_is_case_insensitive_substring() {
        assert!(gpu("a").is_nvidia());
        let mut other = gpu("a");
        other.device_type = "Nvidia A100".to_owned();
        assert!(other.is_nvidia());
        other.device_type = "DCU-Z100".to_owned();
        assert!(!other.is_nvidia());
    }
}
