//! MIG (Multi-Instance GPU) values of HAMi v2.10's dynamic-MIG protocol.
//!
//! Owns:
//! - [`MigProfile`] and [`MigPlacement`]: what a GPU in `mig` mode can be cut
//!   into, as the device plugin publishes it under `migProfiles` in the node
//!   register annotation (`[{"name","memoryMB","core","sliceCount",
//!   "placements":[{"start","size"}]}]`; HAMi reads these from NVML on the
//!   node). The register codec ([`super::register`]) embeds them.
//! - [`MigAllocation`] and the `hami.io/vgpu-mig-allocations` pod value
//!   ([`encode_allocations`], [`decode_allocations`]): which profile at which
//!   placement the scheduler chose for each (container, device) entry of
//!   `vgpu-devices-allocated`, and the runtime identity (MIG UUID, GPU and
//!   compute instance ids) the device plugin adds after creating it.
//! - [`split_legacy_uuid`]: ≤v2.9 HAMi (`knownMigGeometries`) marked a MIG
//!   entry by suffixing the GPU UUID in `vgpu-devices-allocated` with
//!   `[<geometry>-<instance>]`; readers strip it to find the GPU.
//! - [`known_profiles`]: the profiles NVML reports for the common MIG-capable
//!   models, for the simulated device source and for a register entry in
//!   `mig` mode that carries no `migProfiles` (a ≤v2.9 plugin).
//!
//! It does not choose profiles or placements; that is the scheduler's core.

use std::fmt::Write as _;

use serde_json::Value;

use super::snippet;

/// A span of memory slices a GPU instance occupies (NVML's
/// `nvmlGpuInstancePlacement_t`): slices `start .. start + size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl MigPlacement {
    /// Whether two placements share a slice (HAMi's `migPlacementsOverlap`).
    #[must_use]
    pub fn overlaps(self, other: Self) -> bool {
        self.start < other.start.saturating_add(other.size)
            && other.start < self.start.saturating_add(self.size)
    }

    /// The slices as a bit mask (bit `i` = slice `i`); slices at 32 and
    /// above are not representable and give `None`.
    #[must_use]
    pub fn mask(self) -> Option<u32> {
        let end = self.start.checked_add(self.size)?;
        if end > 32 || self.size == 0 {
            return None;
        }
        let ones = if self.size == 32 {
            u32::MAX
        } else {
            (1_u32 << self.size) - 1
        };
        Some(ones << self.start)
    }
}

/// One GPU instance profile a MIG-mode GPU offers, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigProfile {
    /// Profile name, e.g. `1g.5gb`.
    pub name: String,
    /// Memory of one instance, MiB.
    pub memory_mb: u32,
    /// Compute of one instance in percent of the GPU (e.g. 14 for 1 of 7
    /// slices); what a pod on it is charged in cores.
    pub core: u32,
    /// Compute slices of one instance (the `1` of `1g`).
    pub slice_count: u32,
    /// The legal placements of an instance of this profile.
    pub placements: Vec<MigPlacement>,
}

impl MigProfile {
    /// How many instances of this profile fit on an empty GPU at once:
    /// the greedy count of pairwise disjoint placements.
    #[must_use]
    pub fn instance_count(&self) -> u32 {
        let mut taken: Vec<MigPlacement> = Vec::new();
        for p in &self.placements {
            if taken.iter().all(|t| !t.overlaps(*p)) {
                taken.push(*p);
            }
        }
        u32::try_from(taken.len()).unwrap_or(u32::MAX)
    }
}

/// Why a MIG value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// Not valid JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A value of the wrong shape (`what` says where and what).
    #[error("{0}")]
    Shape(String),
    /// An allocation misses its container index, device index, GPU UUID,
    /// profile or a non-empty placement (HAMi: "is incomplete").
    #[error("MIG allocation {0} is incomplete")]
    Incomplete(usize),
    /// An allocation has some but not all of `migUUID`, `gpuInstanceID` and
    /// `computeInstanceID`.
    #[error("MIG allocation {0} has partial runtime identity")]
    PartialRuntime(usize),
    /// Two allocations for the same (container, device) entry.
    #[error("duplicate MIG allocation for container {container} device {device}")]
    Duplicate {
        /// Container index.
        container: u32,
        /// Device index within the container.
        device: u32,
    },
}

/// The runtime identity of a created MIG device, filled in by the device
/// plugin.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigRuntime {
    /// The MIG device UUID (`MIG-…`).
    pub mig_uuid: String,
    /// NVML GPU instance id.
    pub gpu_instance_id: u32,
    /// NVML compute instance id.
    pub compute_instance_id: u32,
}

/// One MIG instance chosen for one entry of `vgpu-devices-allocated`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigAllocation {
    /// Container index, counted as in `vgpu-devices-allocated` (init
    /// containers first).
    pub container_index: u32,
    /// Position of the device within that container's entry.
    pub device_index: u32,
    /// The physical GPU.
    pub gpu_uuid: String,
    /// Profile name, e.g. `2g.10gb`.
    pub profile: String,
    /// Where on the GPU the instance sits.
    pub placement: MigPlacement,
    /// Set once the device plugin created the instance.
    pub runtime: Option<MigRuntime>,
}

/// Encodes allocations as HAMi's JSON (`containerIndex`, `deviceIndex`,
/// `gpuUUID`, `profile`, `placement`, then the runtime fields when set).
#[must_use]
pub fn encode_allocations(allocations: &[MigAllocation]) -> String {
    let mut out = String::from("[");
    for (i, a) in allocations.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"containerIndex\":{},\"deviceIndex\":{},\"gpuUUID\":{},\"profile\":{},\"placement\":{{\"start\":{},\"size\":{}}}",
            a.container_index,
            a.device_index,
            Value::String(a.gpu_uuid.clone()),
            Value::String(a.profile.clone()),
            a.placement.start,
            a.placement.size,
        );
        if let Some(r) = &a.runtime {
            let _ = write!(
                out,
                ",\"migUUID\":{},\"gpuInstanceID\":{},\"computeInstanceID\":{}",
                Value::String(r.mig_uuid.clone()),
                r.gpu_instance_id,
                r.compute_instance_id,
            );
        }
        out.push('}');
    }
    out.push(']');
    out
}

/// Decodes `hami.io/vgpu-mig-allocations` with HAMi's checks: an empty
/// value is no allocation; each entry needs a GPU UUID, a profile and a
/// non-empty placement; the runtime fields come all together or not at
/// all; one entry per (container, device).
///
/// # Errors
/// [`MigError`] naming the entry.
pub fn decode_allocations(value: &str) -> Result<Vec<MigAllocation>, MigError> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let parsed: Value = serde_json::from_str(value).map_err(|e| MigError::Json(e.to_string()))?;
    let Value::Array(items) = parsed else {
        return Err(MigError::Shape(format!(
            "expected a JSON array, found {}",
            snippet(value)
        )));
    };
    let mut out: Vec<MigAllocation> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(map) = item else {
            return Err(MigError::Shape(format!("allocation {i} is not an object")));
        };
        let get = |key: &str| {
            map.get(key).or_else(|| {
                map.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, v)| v)
            })
        };
        let num = |key: &str| -> Result<Option<u32>, MigError> {
            match get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| MigError::Shape(format!("allocation {i}: {key} is not a u32"))),
            }
        };
        let text = |key: &str| -> Result<String, MigError> {
            match get(key) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(MigError::Shape(format!(
                    "allocation {i}: {key} is not a string"
                ))),
            }
        };
        let placement = match get("placement") {
            None | Some(Value::Null) => MigPlacement { start: 0, size: 0 },
            Some(v) => placement_from_json(v)
                .map_err(|e| MigError::Shape(format!("allocation {i}: placement: {e}")))?,
        };
        let container_index = num("containerIndex")?.unwrap_or(0);
        let device_index = num("deviceIndex")?.unwrap_or(0);
        let gpu_uuid = text("gpuUUID")?;
        let profile = text("profile")?;
        if gpu_uuid.is_empty() || profile.is_empty() || placement.size == 0 {
            return Err(MigError::Incomplete(i));
        }
        let mig_uuid = text("migUUID")?;
        let gi = num("gpuInstanceID")?;
        let ci = num("computeInstanceID")?;
        let runtime = match (mig_uuid.is_empty(), gi, ci) {
            (true, None, None) => None,
            (false, Some(gpu_instance_id), Some(compute_instance_id)) => Some(MigRuntime {
                mig_uuid,
                gpu_instance_id,
                compute_instance_id,
            }),
            _ => return Err(MigError::PartialRuntime(i)),
        };
        if out
            .iter()
            .any(|a| a.container_index == container_index && a.device_index == device_index)
        {
            return Err(MigError::Duplicate {
                container: container_index,
                device: device_index,
            });
        }
        out.push(MigAllocation {
            container_index,
            device_index,
            gpu_uuid,
            profile,
            placement,
            runtime,
        });
    }
    Ok(out)
}

/// Splits a ≤v2.9 MIG device id `GPU-…[<geometry>-<instance>]` into the GPU
/// UUID and the suffix's two numbers; a plain UUID gives `(uuid, None)`.
/// A malformed suffix still yields the UUID before `[` (HAMi strips at `[`
/// whatever follows).
#[must_use]
pub fn split_legacy_uuid(id: &str) -> (&str, Option<(u32, u32)>) {
    let Some((uuid, rest)) = id.split_once('[') else {
        return (id, None);
    };
    let suffix = rest
        .strip_suffix(']')
        .and_then(|inner| inner.split_once('-'))
        .and_then(|(g, i)| Some((g.parse().ok()?, i.parse().ok()?)));
    (uuid, suffix)
}

pub(crate) fn placement_from_json(v: &Value) -> Result<MigPlacement, String> {
    let Value::Object(map) = v else {
        return Err("expected an object".to_owned());
    };
    let field = |key: &str| -> Result<u32, String> {
        let found = map.get(key).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        });
        match found {
            None | Some(Value::Null) => Ok(0),
            Some(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{key} is not a u32")),
        }
    };
    Ok(MigPlacement {
        start: field("start")?,
        size: field("size")?,
    })
}

/// Decodes one `migProfiles` element.
pub(crate) fn profile_from_json(v: &Value) -> Result<MigProfile, String> {
    let Value::Object(map) = v else {
        return Err("expected an object".to_owned());
    };
    let get = |key: &str| {
        map.get(key).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
    };
    let num = |key: &str| -> Result<u32, String> {
        match get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{key} is not a u32")),
        }
    };
    let name = match get("name") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("name is not a string".to_owned()),
    };
    let placements = match get("placements") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(placement_from_json)
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("placements is not an array".to_owned()),
    };
    Ok(MigProfile {
        name,
        memory_mb: num("memoryMB")?,
        core: num("core")?,
        slice_count: num("sliceCount")?,
        placements,
    })
}

/// Appends the `migProfiles` JSON array.
pub(crate) fn push_profiles_json(out: &mut String, profiles: &[MigProfile]) {
    out.push('[');
    for (i, p) in profiles.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"name\":{},\"memoryMB\":{},\"core\":{},\"sliceCount\":{},\"placements\":[",
            Value::String(p.name.clone()),
            p.memory_mb,
            p.core,
            p.slice_count,
        );
        for (j, pl) in p.placements.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(out, "{{\"start\":{},\"size\":{}}}", pl.start, pl.size);
        }
        out.push_str("]}");
    }
    out.push(']');
}

/// One chosen instance: profile (position in the profile list) and placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigChoice {
    /// Position of the profile in the GPU's profile list.
    pub profile: usize,
    /// Where the instance sits.
    pub placement: MigPlacement,
    /// The placement's slice mask.
    pub mask: u32,
}

/// Whether HAMi tries this profile's placements from the highest start
/// down (`1g.*`, `3g.*`).
fn prefers_high(name: &str) -> bool {
    name.starts_with("1g.") || name.starts_with("3g.")
}

/// The instance a request for `mem` MiB gets on a GPU with these profiles
/// when the slices in `taken` are occupied (bit `i` = memory slice `i`);
/// `None` when no profile holding `mem` has a free placement.
///
/// HAMi v2.10's rule (`pkg/device/nvidia/device.go` `selectMigCandidate`,
/// `mig_topology.go`): profiles from the smallest memory up (then the
/// fewest compute slices); the first that holds `mem` and has a placement
/// overlapping nothing taken wins; `1g.*` and `3g.*` placements are tried
/// from the highest start down, the others from the lowest up. The
/// scheduler places by it, and the node-daemon when the pod carries no
/// placement from the scheduler: one rule, written once.
#[must_use]
pub fn choose(profiles: &[MigProfile], taken: u32, mem: u64) -> Option<MigChoice> {
    let mut order: Vec<usize> = (0..profiles.len()).collect();
    order.sort_by_key(|&i| (profiles[i].memory_mb, profiles[i].slice_count));
    for i in order {
        let p = &profiles[i];
        if u64::from(p.memory_mb) < mem {
            continue;
        }
        let mut placements = p.placements.clone();
        if prefers_high(&p.name) {
            placements.sort_by_key(|pl| std::cmp::Reverse(pl.start));
        } else {
            placements.sort_by_key(|pl| pl.start);
        }
        for pl in placements {
            if let Some(mask) = pl.mask()
                && mask & taken == 0
            {
                return Some(MigChoice {
                    profile: i,
                    placement: pl,
                    mask,
                });
            }
        }
    }
    None
}

/// A profile with `placements` spaced `size` apart from `first`.
fn profile(
    name: &str,
    memory_mb: u32,
    core: u32,
    slices: u32,
    starts: &[u32],
    size: u32,
) -> MigProfile {
    MigProfile {
        name: name.to_owned(),
        memory_mb,
        core,
        slice_count: slices,
        placements: starts
            .iter()
            .map(|&start| MigPlacement { start, size })
            .collect(),
    }
}

/// The GPU instance profiles of a MIG-capable model, matched as a substring
/// of the register `type` (`NVIDIA A100-SXM4-40GB`); `None` for a model not
/// listed. The profiles are those HAMi's chart allows by default
/// (`migProfileAllowlist`; the same as its older `knownMigGeometries`), with
/// the chart's nominal memory (5120 MiB for `1g.5gb`; NVML reports a little
/// less on real cards) and NVML's placements over 8 memory slices (A100,
/// H100) or 4 (A30); `core` is the compute share in percent, as in HAMi's
/// tests (14 per slice of 7).
#[must_use]
pub fn known_profiles(device_type: &str) -> Option<Vec<MigProfile>> {
    let t = device_type.to_ascii_uppercase();
    let eight = [0, 1, 2, 3, 4, 5, 6];
    if t.contains("A100") && t.contains("80G") {
        return Some(vec![
            profile("1g.10gb", 10240, 14, 1, &eight, 1),
            profile("2g.20gb", 20480, 28, 2, &[0, 2, 4], 2),
            profile("3g.40gb", 40960, 42, 3, &[0, 4], 4),
            profile("7g.79gb", 80896, 100, 7, &[0], 8),
        ]);
    }
    if t.contains("A100") {
        return Some(vec![
            profile("1g.5gb", 5120, 14, 1, &eight, 1),
            profile("2g.10gb", 10240, 28, 2, &[0, 2, 4], 2),
            profile("3g.20gb", 20480, 42, 3, &[0, 4], 4),
            profile("7g.40gb", 40960, 100, 7, &[0], 8),
        ]);
    }
    if t.contains("H100") {
        return Some(vec![
            profile("1g.10gb", 10240, 14, 1, &eight, 1),
            profile("2g.20gb", 20480, 28, 2, &[0, 2, 4], 2),
            profile("3g.40gb", 40960, 42, 3, &[0, 4], 4),
            profile("7g.80gb", 81920, 100, 7, &[0], 8),
        ]);
    }
    if t.contains("A30") {
        return Some(vec![
            profile("1g.6gb", 6144, 25, 1, &[0, 1, 2, 3], 1),
            profile("2g.12gb", 12288, 50, 2, &[0, 2], 2),
            profile("4g.24gb", 24576, 100, 4, &[0], 4),
        ]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(c: u32, d: u32, profile: &str, start: u32, size: u32) -> MigAllocation {
        MigAllocation {
            container_index: c,
            device_index: d,
            gpu_uuid: "GPU-a".into(),
            profile: profile.into(),
            placement: MigPlacement { start, size },
            runtime: None,
        }
    }

    #[test]
    fn allocations_round_trip_with_and_without_runtime() {
        let mut done = alloc(1, 0, "2g.10gb", 4, 2);
        done.runtime = Some(MigRuntime {
            mig_uuid: "MIG-x".into(),
            gpu_instance_id: 5,
            compute_instance_id: 0,
        });
        let all = vec![alloc(0, 0, "1g.5gb", 6, 1), done];
        let text = encode_allocations(&all);
        assert_eq!(
            text,
            r#"[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}},{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb","placement":{"start":4,"size":2},"migUUID":"MIG-x","gpuInstanceID":5,"computeInstanceID":0}]"#
        );
        assert_eq!(decode_allocations(&text).unwrap(), all);
        assert_eq!(decode_allocations("").unwrap(), vec![]);
    }

    #[test]
    fn allocations_are_checked_as_hami_does() {
        let incomplete = r#"[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":0,"size":0}}]"#;
        assert_eq!(decode_allocations(incomplete), Err(MigError::Incomplete(0)));
        let partial = r#"[{"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":0,"size":1},"migUUID":"MIG-x"}]"#;
        assert_eq!(
            decode_allocations(partial),
            Err(MigError::PartialRuntime(0))
        );
        let dup = encode_allocations(&[alloc(0, 0, "1g.5gb", 0, 1), alloc(0, 0, "1g.5gb", 1, 1)]);
        assert_eq!(
            decode_allocations(&dup),
            Err(MigError::Duplicate {
                container: 0,
                device: 0
            })
        );
        assert!(matches!(decode_allocations("{"), Err(MigError::Json(_))));
        assert!(matches!(decode_allocations("{}"), Err(MigError::Shape(_))));
    }

    fn a100() -> Vec<MigProfile> {
        known_profiles("NVIDIA A100-SXM4-40GB").unwrap()
    }

    fn name(p: &[MigProfile], c: Option<MigChoice>) -> Option<(&str, u32, u32)> {
        c.map(|c| {
            (
                p[c.profile].name.as_str(),
                c.placement.start,
                c.placement.size,
            )
        })
    }

    #[test]
    fn smallest_profile_holding_the_request_wins() {
        let p = a100();
        // HAMi's documented example: 8000 MiB on an empty A100-40GB → 2g.10gb.
        assert_eq!(name(&p, choose(&p, 0, 8000)), Some(("2g.10gb", 0, 2)));
        assert_eq!(name(&p, choose(&p, 0, 3000)), Some(("1g.5gb", 6, 1)));
        assert_eq!(name(&p, choose(&p, 0, 5120)), Some(("1g.5gb", 6, 1)));
        assert_eq!(name(&p, choose(&p, 0, 20000)), Some(("3g.20gb", 4, 4)));
        assert_eq!(name(&p, choose(&p, 0, 30000)), Some(("7g.40gb", 0, 8)));
        assert_eq!(choose(&p, 0, 50000), None);
    }

    #[test]
    fn a_bigger_profile_is_taken_when_the_smaller_has_no_room() {
        let p = a100();
        // Three 2g.10gb at 0, 2, 4 (HAMi's test): a fourth 2g does not fit,
        // a 1g still does (slice 6).
        let taken = 0b0011_1111;
        assert_eq!(choose(&p, taken, 10000), None);
        assert_eq!(name(&p, choose(&p, taken, 5000)), Some(("1g.5gb", 6, 1)));
        // 1g at 6 taken: a 5000 MiB request moves up to a 2g only if one
        // fits; here none does.
        assert_eq!(choose(&p, taken | 0b0100_0000, 5000), None);
        // Slices 4..8 taken by a 3g: a 3g request takes the other half.
        assert_eq!(
            name(&p, choose(&p, 0b1111_0000, 20000)),
            Some(("3g.20gb", 0, 4))
        );
        // Anything live blocks the 7g.
        assert_eq!(choose(&p, 0b1000_0000, 30000), None);
    }

    #[test]
    fn legacy_uuid_suffix_is_split() {
        assert_eq!(split_legacy_uuid("GPU-a[1-2]"), ("GPU-a", Some((1, 2))));
        assert_eq!(split_legacy_uuid("GPU-a"), ("GPU-a", None));
        assert_eq!(split_legacy_uuid("GPU-a[x]"), ("GPU-a", None));
    }

    #[test]
    fn placements_overlap_like_intervals_and_masks() {
        let low = MigPlacement { start: 0, size: 4 };
        let high = MigPlacement { start: 4, size: 4 };
        let one = MigPlacement { start: 3, size: 1 };
        assert!(!low.overlaps(high));
        assert!(low.overlaps(one));
        assert_eq!(low.mask(), Some(0b1111));
        assert_eq!(high.mask(), Some(0b1111_0000));
        assert_eq!(MigPlacement { start: 31, size: 2 }.mask(), None);
        for s1 in 0..8 {
            for n1 in 1..4 {
                for s2 in 0..8 {
                    for n2 in 1..4 {
                        let first = MigPlacement {
                            start: s1,
                            size: n1,
                        };
                        let second = MigPlacement {
                            start: s2,
                            size: n2,
                        };
                        let by_mask = first.mask().unwrap() & second.mask().unwrap() != 0;
                        assert_eq!(first.overlaps(second), by_mask);
                    }
                }
            }
        }
    }

    #[test]
    fn known_a100_40gb_matches_hami_geometries() {
        let p = known_profiles("NVIDIA A100-SXM4-40GB").unwrap();
        let count = |name: &str| p.iter().find(|x| x.name == name).unwrap().instance_count();
        // HAMi's chart: 1g.5gb ×7, 2g.10gb ×3, 3g.20gb ×2, 7g.40gb ×1.
        assert_eq!(count("1g.5gb"), 7);
        assert_eq!(count("2g.10gb"), 3);
        assert_eq!(count("3g.20gb"), 2);
        assert_eq!(count("7g.40gb"), 1);
        assert!(known_profiles("NVIDIA-Tesla T4").is_none());
        assert_eq!(
            known_profiles("NVIDIA H100 80GB HBM3").unwrap()[0].name,
            "1g.10gb"
        );
        assert_eq!(
            known_profiles("NVIDIA A100-SXM4-80GB").unwrap()[0].name,
            "1g.10gb"
        );
    }

    #[test]
    fn register_carries_mig_profiles_after_mode() {
        use crate::hami::register::{NodeDevice, decode, encode_json};
        let dev = NodeDevice {
            id: "GPU-a".into(),
            index: 0,
            count: 7,
            devmem: 40960,
            devcore: 100,
            device_type: "NVIDIA A100-SXM4-40GB".into(),
            numa: 0,
            mode: "mig".into(),
            health: true,
            mig_profiles: vec![profile("1g.5gb", 5120, 14, 1, &[0, 1], 1)],
        };
        let text = encode_json(std::slice::from_ref(&dev)).unwrap();
        assert_eq!(
            text,
            r#"[{"id":"GPU-a","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB","mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":5120,"core":14,"sliceCount":1,"placements":[{"start":0,"size":1},{"start":1,"size":1}]}],"health":true}]"#
        );
        assert_eq!(decode(&text).unwrap(), vec![dev]);
        assert!(decode(r#"[{"id":"x","migProfiles":{}}]"#).is_err());
        assert!(decode(r#"[{"id":"x","migProfiles":[{"placements":[{"start":-1}]}]}]"#).is_err());
    }
}
