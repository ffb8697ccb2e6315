//! Pod device annotations (`hami.io/vgpu-devices-to-allocate`,
//! `hami.io/vgpu-devices-allocated`).
//!
//! Owns [`PodDevices`] and its text form ([`std::fmt::Display`] /
//! [`std::str::FromStr`]):
//!
//! - a device is `UUID,VENDOR,<mem MiB>,<cores %>` followed by `:`;
//! - a container is the concatenation of its devices followed by `;`, so a
//!   container without devices is just `;`;
//! - containers are in pod order: init containers first, then app containers.
//!
//! Example: init container without a GPU, `app1` with one GPU, `app2` with
//! two: `;GPU-aaa,NVIDIA,3000,30:;GPU-bbb,NVIDIA,1000,0:GPU-ccc,NVIDIA,1000,0:;`.
//!
//! **How `;` maps to containers.** Every container ends with `;`, so a value
//! with *n* `;` and nothing after the last one holds exactly *n* containers:
//! `""` is no container, `";"` one empty container, `";;;"` three. Decoding
//! splits on `;` and drops the one empty piece after the final `;` (the
//! terminator, not a container). Text after the last `;` (a hand-written
//! value without the final terminator) is read as one more container. This
//! makes decode(encode(x)) = x for every valid value. HAMi's own decoder keeps
//! that trailing piece as an extra empty container (*n*+1); since it is last
//! and empty it shifts no index, so both readers agree on every real container.
//!
//! Inside a container, pieces between `:` without a `,` are ignored (the empty
//! piece after the final `:` among them); a piece with fewer than 4 fields is
//! an error carrying HAMi's hint; fields after the fourth are ignored. UUID
//! and vendor must be non-empty; mem and cores are non-negative `int32`.

use std::fmt;
use std::str::FromStr;

use super::register::parse_decimal;
use super::snippet;

/// The vendor word of NVIDIA entries (HAMi's "common word" for NVIDIA).
pub const NVIDIA_VENDOR: &str = "NVIDIA";

/// One GPU slice held by one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDevice {
    /// Physical GPU UUID.
    pub uuid: String,
    /// Vendor word, `NVIDIA` for this device type.
    pub vendor: String,
    /// Device memory in MiB (after `memoryFactor`).
    pub usedmem: i32,
    /// Cores in percent.
    pub usedcores: i32,
}

/// The devices of one container, possibly none.
pub type ContainerDevices = Vec<ContainerDevice>;

/// The devices of every container of a pod: init containers first, then
/// app containers, one entry each (empty for a GPU-less container).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDevices(pub Vec<ContainerDevices>);

/// Why a pod devices value could not be decoded, validated or edited.
/// Container and device numbers count from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodDevicesError {
    /// A device entry has fewer than the 4 fields `uuid,vendor,mem,cores`.
    #[error(
        "container {container}, device {device}: expected 4 comma-separated fields \
         (uuid,vendor,mem,cores), found {found} in {entry:?}; the pod annotation is \
         incomplete (do not use nodeName in task spec)"
    )]
    MissingFields {
        /// Container position.
        container: usize,
        /// Device position within the container.
        device: usize,
        /// How many fields the entry had.
        found: usize,
        /// The entry (shortened when long).
        entry: String,
    },
    /// A field is empty, malformed or out of range.
    #[error("container {container}, device {device}, field {field}: {reason}")]
    Field {
        /// Container position.
        container: usize,
        /// Device position within the container.
        device: usize,
        /// `uuid`, `vendor`, `mem` or `cores`.
        field: &'static str,
        /// What is wrong, e.g. `invalid digit in "12x"`.
        reason: String,
    },
    /// [`PodDevices::erase_container`] was given an index past the end.
    #[error("container index {index} is out of range: the pod has {len} containers")]
    NoSuchContainer {
        /// The index asked for.
        index: usize,
        /// How many containers there are.
        len: usize,
    },
}

// === impl ContainerDevice ===

impl ContainerDevice {
    /// An NVIDIA slice: `uuid`, `mem` MiB, `cores` percent.
    #[must_use]
    pub fn nvidia(uuid: impl Into<String>, usedmem: i32, usedcores: i32) -> Self {
        Self {
            uuid: uuid.into(),
            vendor: NVIDIA_VENDOR.to_owned(),
            usedmem,
            usedcores,
        }
    }

    /// Checks that the device encodes to text that decodes back to itself.
    fn validate(&self, container: usize, device: usize) -> Result<(), PodDevicesError> {
        let error = |field, reason: String| PodDevicesError::Field {
            container,
            device,
            field,
            reason,
        };
        for (field, text) in [("uuid", &self.uuid), ("vendor", &self.vendor)] {
            if text.is_empty() {
                return Err(error(field, "must not be empty".to_owned()));
            }
            if let Some(c) = text.chars().find(|c| matches!(c, ',' | ':' | ';')) {
                return Err(error(
                    field,
                    format!("{:?} contains the separator {c:?}", snippet(text)),
                ));
            }
        }
        for (field, value) in [("mem", self.usedmem), ("cores", self.usedcores)] {
            if value < 0 {
                return Err(error(
                    field,
                    format!("negative value {value} is not allowed"),
                ));
            }
        }
        Ok(())
    }
}

/// `UUID,VENDOR,mem,cores` (without the `:` terminator).
impl fmt::Display for ContainerDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},{},{},{}",
            self.uuid, self.vendor, self.usedmem, self.usedcores
        )
    }
}

// === impl PodDevices ===

impl PodDevices {
    /// The containers, in pod order.
    #[must_use]
    pub fn containers(&self) -> &[ContainerDevices] {
        &self.0
    }

    /// Checks that [`Display`](fmt::Display) produces text that decodes back
    /// to this value: UUIDs and vendors non-empty and free of `,` `:` `;`,
    /// mem and cores non-negative. Values decoded from text always pass.
    ///
    /// # Errors
    /// [`PodDevicesError::Field`] for the first offending field.
    pub fn validate(&self) -> Result<(), PodDevicesError> {
        for (container, devices) in self.0.iter().enumerate() {
            for (device, dev) in devices.iter().enumerate() {
                dev.validate(container, device)?;
            }
        }
        Ok(())
    }

    /// [`validate`](Self::validate), then encode.
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn try_encode(&self) -> Result<String, PodDevicesError> {
        self.validate()?;
        Ok(self.to_string())
    }

    /// A copy with container `index` emptied: what the device plugin writes
    /// back to `vgpu-devices-to-allocate` after allocating that container.
    /// The number of containers is unchanged so indices stay aligned.
    ///
    /// # Errors
    /// [`PodDevicesError::NoSuchContainer`] if `index` is out of range.
    pub fn erase_container(&self, index: usize) -> Result<Self, PodDevicesError> {
        let mut out = self.clone();
        let len = out.0.len();
        out.0
            .get_mut(index)
            .ok_or(PodDevicesError::NoSuchContainer { index, len })?
            .clear();
        Ok(out)
    }

    /// Whether any container still has a device entry (allocation pending).
    #[must_use]
    pub fn has_pending_devices(&self) -> bool {
        self.0.iter().any(|devices| !devices.is_empty())
    }

    /// The first container that still has devices, with its index: the
    /// entry Allocate consumes next.
    #[must_use]
    pub fn first_pending(&self) -> Option<(usize, &ContainerDevices)> {
        self.0
            .iter()
            .enumerate()
            .find(|(_, devices)| !devices.is_empty())
    }

    /// The index of the first container that still has devices.
    #[must_use]
    pub fn first_pending_index(&self) -> Option<usize> {
        self.first_pending().map(|(index, _)| index)
    }

    /// Every device of every container, in order.
    pub fn devices(&self) -> impl Iterator<Item = &ContainerDevice> {
        self.0.iter().flatten()
    }
}

/// Encodes as HAMi does; see the module docs. Only a value that passes
/// [`PodDevices::validate`] is guaranteed to decode back to itself.
impl fmt::Display for PodDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for devices in &self.0 {
            for dev in devices {
                write!(f, "{dev}:")?;
            }
            f.write_str(";")?;
        }
        Ok(())
    }
}

/// Decodes as described in the module docs.
impl FromStr for PodDevices {
    type Err = PodDevicesError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pieces: Vec<&str> = s.split(';').collect();
        if pieces.last() == Some(&"") {
            pieces.pop();
        }
        pieces
            .into_iter()
            .enumerate()
            .map(|(container, piece)| decode_container(container, piece))
            .collect::<Result<Vec<_>, _>>()
            .map(PodDevices)
    }
}

fn decode_container(container: usize, text: &str) -> Result<ContainerDevices, PodDevicesError> {
    let mut devices = ContainerDevices::new();
    for entry in text.split(':').filter(|entry| entry.contains(',')) {
        let device = devices.len();
        let fields: Vec<&str> = entry.split(',').collect();
        let [uuid, vendor, mem, cores, ..] = fields.as_slice() else {
            return Err(PodDevicesError::MissingFields {
                container,
                device,
                found: fields.len(),
                entry: snippet(entry),
            });
        };
        let error = |field, reason| PodDevicesError::Field {
            container,
            device,
            field,
            reason,
        };
        if uuid.is_empty() {
            return Err(error("uuid", "must not be empty".to_owned()));
        }
        if vendor.is_empty() {
            return Err(error("vendor", "must not be empty".to_owned()));
        }
        let int32 = |field, text: &str| {
            parse_decimal(text, 0x7fff_ffff)
                .and_then(|v| i32::try_from(v).map_err(|_| format!("{v} overflows int32")))
                .map_err(|reason| error(field, reason))
        };
        devices.push(ContainerDevice {
            uuid: (*uuid).to_owned(),
            vendor: (*vendor).to_owned(),
            usedmem: int32("mem", mem)?,
            usedcores: int32("cores", cores)?,
        });
    }
    Ok(devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semicolon_count_is_container_count() {
        assert_eq!("".parse::<PodDevices>().unwrap(), PodDevices(vec![]));
        assert_eq!(";".parse::<PodDevices>().unwrap(), PodDevices(vec![vec![]]));
        assert_eq!(
            ";;;".parse::<PodDevices>().unwrap(),
            PodDevices(vec![vec![], vec![], vec![]])
        );
        assert_eq!(PodDevices(vec![]).to_string(), "");
        assert_eq!(PodDevices(vec![vec![]]).to_string(), ";");
    }

    #[test]
    fn unterminated_tail_is_one_more_container() {
        let pd: PodDevices = ";GPU-a,NVIDIA,1,2:".parse().unwrap();
        assert_eq!(
            pd,
            PodDevices(vec![vec![], vec![ContainerDevice::nvidia("GPU-a", 1, 2)]])
        );
        let pd: PodDevices = "GPU-a,NVIDIA,1,2".parse().unwrap();
        assert_eq!(pd.0.len(), 1);
        assert_eq!(pd.0[0].len(), 1);
    }

    #[test]
    fn pieces_without_comma_are_ignored_and_extra_fields_dropped() {
        let pd: PodDevices = "junk:GPU-a,NVIDIA,1,2,extra::;".parse().unwrap();
        assert_eq!(
            pd,
            PodDevices(vec![vec![ContainerDevice::nvidia("GPU-a", 1, 2)]])
        );
    }

    #[test]
    fn errors_say_where_and_what() {
        let err = ";GPU-a,NVIDIA,1,2:GPU-b,NVIDIA:;"
            .parse::<PodDevices>()
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("container 1, device 1: expected 4"),
            "{text}"
        );
        assert!(text.contains("do not use nodeName in task spec"), "{text}");
        let err = "GPU-a,NVIDIA,12x,0:;".parse::<PodDevices>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "container 0, device 0, field mem: invalid digit in \"12x\""
        );
        let err = "GPU-a,NVIDIA,1,2147483648:;"
            .parse::<PodDevices>()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "container 0, device 0, field cores: \"2147483648\" overflows the maximum 2147483647"
        );
        let err = ",NVIDIA,1,2:;".parse::<PodDevices>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "container 0, device 0, field uuid: must not be empty"
        );
        let err = "GPU-a,,1,2:;".parse::<PodDevices>().unwrap_err();
        assert!(err.to_string().contains("field vendor"), "{err}");
    }

    #[test]
    fn erase_and_pending_helpers() {
        let pd: PodDevices = ";GPU-a,NVIDIA,1,2:;".parse().unwrap();
        assert!(pd.has_pending_devices());
        assert_eq!(pd.first_pending_index(), Some(1));
        assert_eq!(pd.first_pending().map(|(_, d)| d.len()), Some(1));
        let erased = pd.erase_container(1).unwrap();
        assert_eq!(erased.to_string(), ";;");
        assert!(!erased.has_pending_devices());
        assert_eq!(erased.first_pending(), None);
        assert_eq!(
            pd.erase_container(2),
            Err(PodDevicesError::NoSuchContainer { index: 2, len: 2 })
        );
        // Erasing an empty container is allowed and changes nothing.
        assert_eq!(pd.erase_container(0).unwrap(), pd);
    }

    #[test]
    fn validate_rejects_values_that_would_not_round_trip() {
        let bad = PodDevices(vec![vec![ContainerDevice::nvidia("GPU;a", 1, 1)]]);
        let err = bad.try_encode().unwrap_err();
        assert_eq!(
            err.to_string(),
            "container 0, device 0, field uuid: \"GPU;a\" contains the separator ';'"
        );
        let bad = PodDevices(vec![vec![], vec![ContainerDevice::nvidia("GPU-a", -1, 1)]]);
        assert!(matches!(
            bad.validate(),
            Err(PodDevicesError::Field {
                container: 1,
                field: "mem",
                ..
            })
        ));
    }
}
