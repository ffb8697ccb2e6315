//! gpuslice's Dynamic Resource Allocation driver: the kubelet DRA gRPC API
//! ([`v1`], generated), the names the driver publishes under, and the
//! Kubernetes quantity codec its capacities (`memory`, `cores`) use.
//!
//! The names are the contract between node-daemon (which publishes the
//! `ResourceSlice` and serves the kubelet plugin), the webhook (which writes
//! the `ResourceClaimTemplate`s) and the chart (which installs the
//! `DeviceClass`); see `docs/dra.md`.

/// Kubelet DRA plugin API, version `v1`.
pub mod v1 {
    /// The generated messages, server and client.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    mod generated {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub use generated::*;

    /// The gRPC service name a DRA plugin lists in
    /// `PluginInfo.supported_versions` for this API version.
    pub const SERVICE: &str = "v1.DRAPlugin";
}

/// The DRA driver name (also the `DeviceClass` name and the prefix of
/// qualified attribute names such as `gpu.gpuslice.dev/uuid`).
pub const DRIVER_NAME: &str = "gpu.gpuslice.dev";
/// Capacity name: device memory, a quantity in bytes (`"40960Mi"`).
pub const CAPACITY_MEMORY: &str = "memory";
/// Capacity name: compute in percent of the card (`"100"`).
pub const CAPACITY_CORES: &str = "cores";
/// The CDI kind of prepared claims: vendor `gpuslice.dev`, class `gpu`.
pub const CDI_KIND: &str = "gpuslice.dev/gpu";
/// Bytes in one MiB.
pub const MIB: u128 = 1 << 20;

/// The device name of GPU `index` in the slice: `gpu-<index>`.
#[must_use]
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The name of a node's `ResourceSlice`: `<node>-gpu.gpuslice.dev`.
#[must_use]
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
}

/// The CDI device ID of a prepared claim: `gpuslice.dev/gpu=<claimUID>`.
#[must_use]
pub fn cdi_device_id(claim_uid: &str) -> String {
    format!("{CDI_KIND}={claim_uid}")
}

/// The CDI spec file name of a prepared claim: `gpuslice.dev-<claimUID>.json`.
#[must_use]
pub fn cdi_file_name(claim_uid: &str) -> String {
    format!("gpuslice.dev-{claim_uid}.json")
}

/// Why a quantity string was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not `<number><suffix>` as Kubernetes writes quantities.
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    /// A negative quantity where only amounts make sense.
    #[error("{0:?} is negative")]
    Negative(String),
    /// Too large to count with.
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// A non-negative Kubernetes quantity, exactly: `numerator / denominator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    numerator: u128,
    denominator: u128,
}

impl Quantity {
    /// The quantity divided by `unit`, rounded up (e.g. bytes → MiB with
    /// [`MIB`], or percent with `1`). `unit` 0 counts as 1.
    #[must_use]
    pub fn ceil_in(self, unit: u128) -> u128 {
        let unit = unit.max(1);
        let denominator = self.denominator.saturating_mul(unit);
        self.numerator.div_ceil(denominator)
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    /// Parses `<digits>[.<digits>]<suffix>` where the suffix is binary
    /// (`Ki` … `Ei`), decimal (`n u m k M G T P E` or none) or an exponent
    /// (`e3`, `E-2`); a leading `+` is allowed, a `-` is refused.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let syntax = || QuantityError::Syntax(raw.to_owned());
        let overflow = || QuantityError::Overflow(raw.to_owned());
        let s = raw.trim();
        if s.starts_with('-') {
            return Err(QuantityError::Negative(raw.to_owned()));
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(syntax());
        }
        let mut numerator: u128 = 0;
        for digit in whole.bytes().chain(fraction.bytes()) {
            numerator = numerator
                .checked_mul(10)
                .and_then(|n| n.checked_add(u128::from(digit - b'0')))
                .ok_or_else(overflow)?;
        }
        let mut exponent: i32 = -i32::try_from(fraction.len()).map_err(|_| overflow())?;
        let mut multiplier: u128 = 1;
        match suffix {
            "" => {}
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let power = match suffix {
                    "Ki" => 10,
                    "Mi" => 20,
                    "Gi" => 30,
                    "Ti" => 40,
                    "Pi" => 50,
                    _ => 60,
                };
                multiplier = 1u128 << power;
            }
            "n" => exponent -= 9,
            "u" => exponent -= 6,
            "m" => exponent -= 3,
            "k" => exponent += 3,
            "M" => exponent += 6,
            "G" => exponent += 9,
            "T" => exponent += 12,
            "P" => exponent += 15,
            "E" => exponent += 18,
            _ => {
                let digits = suffix
                    .strip_prefix('e')
                    .or_else(|| suffix.strip_prefix('E'))
                    .ok_or_else(syntax)?;
                let value: i32 = digits.parse().map_err(|_| syntax())?;
                if !(-40..=40).contains(&value) {
                    return Err(overflow());
                }
                exponent += value;
            }
        }
        let ten = |power: i32| {
            10u128
                .checked_pow(power.unsigned_abs())
                .ok_or_else(overflow)
        };
        let (numerator, denominator) = if exponent >= 0 {
            (numerator.checked_mul(ten(exponent)?), 1)
        } else {
            (Some(numerator), ten(exponent)?)
        };
        let numerator = numerator
            .and_then(|n| n.checked_mul(multiplier))
            .ok_or_else(overflow)?;
        Ok(Self {
            numerator,
            denominator,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mib(s: &str) -> u128 {
        s.parse::<Quantity>().unwrap().ceil_in(MIB)
    }

    #[test]
    fn quantities_as_the_apiserver_writes_them() {
        assert_eq!(mib("40960Mi"), 40960);
        assert_eq!(mib("40Gi"), 40960);
        assert_eq!(mib("1073741824"), 1024);
        assert_eq!(mib("1G"), 954); // 1e9 bytes, rounded up
        assert_eq!(mib("1.5Gi"), 1536);
        assert_eq!(mib("0"), 0);
        let cores = |s: &str| s.parse::<Quantity>().unwrap().ceil_in(1);
        assert_eq!(cores("100"), 100);
        assert_eq!(cores("30"), 30);
        assert_eq!(cores("500m"), 1);
        assert_eq!(cores("1e2"), 100);
        assert_eq!(cores("+7"), 7);
    }

    #[test]
    fn bad_quantities_are_named() {
        for bad in ["", "Mi", "1.2.3", "12x", "1e", "1..0"] {
            assert_eq!(
                bad.parse::<Quantity>(),
                Err(QuantityError::Syntax(bad.to_owned())),
                "{bad}"
            );
        }
        assert_eq!(
            "-1".parse::<Quantity>(),
            Err(QuantityError::Negative("-1".into()))
        );
        assert!(matches!(
            "99999999999999999999999999999999999999999Ei".parse::<Quantity>(),
            Err(QuantityError::Overflow(_))
        ));
    }

    #[test]
    fn names_follow_the_contract() {
        assert_eq!(device_name(3), "gpu-3");
        assert_eq!(slice_name("n1"), "n1-gpu.gpuslice.dev");
        assert_eq!(cdi_device_id("u-1"), "gpuslice.dev/gpu=u-1");
        assert_eq!(cdi_file_name("u-1"), "gpuslice.dev-u-1.json");
    }
}
