//! The tracing setup both gpuslice binaries share: [`LogFormat`] (the
//! `logFormat` setting), [`LogFlags`] (`--log-format human|json` and its
//! alias `--log-json`, the same in both binaries) and [`init`], which
//! installs the global subscriber (`RUST_LOG`-style filtering, default
//! `info`, lines on stderr).
//!
//! Owns nothing else: signals and shutdown stay with each binary.

#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Every format.
    pub const ALL: [Self; 2] = [Self::Human, Self::Json];

    /// The name used in flags and config files.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Human => "human",
            Self::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A log format name that is neither `human` nor `json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("log format must be human or json, got `{0}`")]
pub struct UnknownLogFormat(pub String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownLogFormat(s.to_owned()))
    }
}

/// The log flags of both binaries, flattened into their flags (clap and
/// serde): they set the `logFormat` key at the flag layer.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogFlags {
    /// Log output [default: human].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Same as --log-format=json (kept for existing charts).
    #[arg(long, env = "GPUSLICE_LOG_JSON")]
    pub log_json: bool,
}

impl LogFlags {
    /// The format these flags ask for, if any: `--log-json` wins.
    #[must_use]
    pub fn format(&self) -> Option<LogFormat> {
        if self.log_json {
            Some(LogFormat::Json)
        } else {
            self.log_format
        }
    }
}

impl Serialize for LogFlags {
    /// `{"logFormat": …}` when a flag was given, `{}` otherwise.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let format = self.format();
        let mut map = s.serialize_map(Some(usize::from(format.is_some())))?;
        if let Some(format) = format {
            map.serialize_entry("logFormat", &format)?;
        }
        map.end()
    }
}

/// Installs the global subscriber: `RUST_LOG` filtering (default `info`),
/// `format` lines on stderr. A second call does nothing.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Err only when a subscriber is already installed: keep that one.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_reads_back_from_its_name_in_flags_and_files() {
        use clap::ValueEnum;
        for f in LogFormat::ALL {
            assert_eq!(f.as_str().parse::<LogFormat>(), Ok(f));
            assert_eq!(
                f.to_string().to_ascii_uppercase().parse::<LogFormat>(),
                Ok(f)
            );
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{f}\""));
            assert_eq!(serde_json::from_str::<LogFormat>(&json).unwrap(), f);
            assert_eq!(<LogFormat as ValueEnum>::from_str(f.as_str(), false), Ok(f));
        }
        assert_eq!(
            "yaml".parse::<LogFormat>(),
            Err(UnknownLogFormat("yaml".into()))
        );
    }

    #[test]
    fn log_json_is_log_format_json_at_the_flag_layer() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            log: LogFlags,
        }
        let json = |args: &[&str]| {
            let cli =
                Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).unwrap();
            serde_json::to_string(&cli.log).unwrap()
        };
        assert_eq!(json(&[]), "{}");
        assert_eq!(json(&["--log-format", "human"]), r#"{"logFormat":"human"}"#);
        assert_eq!(json(&["--log-json"]), r#"{"logFormat":"json"}"#);
        assert_eq!(
            json(&["--log-format", "human", "--log-json"]),
            r#"{"logFormat":"json"}"#
        );
    }

    #[test]
    fn init_twice_keeps_the_first_subscriber() {
        init(LogFormat::Human);
        init(LogFormat::Json);
    }
}
