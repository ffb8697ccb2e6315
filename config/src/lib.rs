//! Settings for the gpuslice binaries: how they are layered and how a value
//! is spelled. Each binary owns its own keys, defaults, flags and checks
//! (`scheduler_webhook::settings`, `node_daemon::settings`); this crate owns
//! what they share.
//!
//! Precedence, lowest first: built-in defaults < config file < environment
//! (`GPUSLICE_<KEY>`) < command-line flags. Keys are camelCase and mirror
//! HAMi's chart values where one exists (`deviceSplitCount`, …); the
//! environment name of a key is its SCREAMING_SNAKE form with the `GPUSLICE_`
//! prefix (`deviceSplitCount` → `GPUSLICE_DEVICE_SPLIT_COUNT`). An unknown
//! key in the file is an error, not silently ignored, and a bad value is
//! named with its key and the layer that gave it.
//!
//! ```text
//!  --config FILE ──read──┐
//!  process environment ──┤ load ──▶ layered (pure) ──▶ the binary's Settings
//!  flags (clap) ─────────┘            │                 (typed: Named values,
//!                                     └─ SettingsError    listen addresses)
//! ```
//!
//! - [`layers`]: [`layered`], the pure merge of the layers.
//! - [`value`]: values read from text once, the same in every layer
//!   ([`Named`] names such as policies, [`parse_listen`] addresses).
//! - [`load`]: the only I/O, reading the file and the process environment.
//!
//! The wire formats (`proto`) stay pure codecs; reading files and the
//! environment happens here.

#![warn(missing_docs)]

pub mod layers;
pub mod value;

pub use layers::{
    ENV_PREFIX, FileFormat, FileLayer, Layer, SettingsError, env_name, keys, layered,
};
pub use value::{BadAddress, Named, UnknownName, by_name, listen, named_parser, parse_listen};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Reads the config file (if any) and the process environment, and layers
/// them under `flags` with [`layered`].
///
/// # Errors
/// A [`SettingsError`] with a one-line reason.
pub fn load<T, F>(file: Option<&std::path::Path>, flags: &F) -> Result<T, SettingsError>
where
    T: Serialize + DeserializeOwned + Default,
    F: Serialize + ?Sized,
{
    let origin = file.map(|p| p.display().to_string()).unwrap_or_default();
    let text = file
        .map(|path| {
            std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
                path: origin.clone(),
                source,
            })
        })
        .transpose()?;
    let layer = text.as_deref().map(|text| FileLayer {
        origin: &origin,
        text,
        format: FileFormat::from_file_name(&origin),
    });
    layered(layer, &|k| std::env::var(k).ok(), flags)
}
