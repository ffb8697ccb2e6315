//! Layered settings for the gpuslice binaries, as a pure function.
//!
//! Precedence, lowest first: built-in defaults < config file < environment
//! (`GPUSLICE_<KEY>`) < command-line flags. Keys are camelCase and mirror
//! HAMi's chart values where one exists (`deviceSplitCount`, …); the
//! environment name of a key is its SCREAMING_SNAKE form with the `GPUSLICE_`
//! prefix (`deviceSplitCount` → `GPUSLICE_DEVICE_SPLIT_COUNT`).
//!
//! [`layered`] is pure: the caller passes the file's text and an environment
//! lookup, so tests never touch the process environment. [`load`] is the
//! thin shell the binaries use: it reads the file and the real environment.
//! An unknown key in the file is an error, not silently ignored.

use std::collections::BTreeSet;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Prefix of every environment variable that sets a key.
pub const ENV_PREFIX: &str = "GPUSLICE_";

/// Format of a config file's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// YAML (`.yaml`, `.yml`); JSON is valid YAML too.
    Yaml,
    /// TOML (`.toml`).
    Toml,
}

impl FileFormat {
    /// Picks the format from a file name: `.toml` is TOML, anything else YAML.
    #[must_use]
    pub fn from_file_name(name: &str) -> Self {
        if name.to_ascii_lowercase().ends_with(".toml") {
            Self::Toml
        } else {
            Self::Yaml
        }
    }
}

/// A config file's text, read by the caller.
#[derive(Debug, Clone)]
pub struct FileLayer<'a> {
    /// Where the text came from, for error messages.
    pub origin: &'a str,
    /// The file's content.
    pub text: &'a str,
    /// How to parse it.
    pub format: FileFormat,
}

/// Why settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The defaults could not be represented (a programming error).
    #[error("built-in defaults are not a map of keys")]
    Defaults,
    /// The config file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file does not parse.
    #[error("config file {origin}: {message}")]
    File {
        /// Where the text came from.
        origin: String,
        /// What the parser said.
        message: String,
    },
    /// The config file names a key this binary does not have.
    #[error("config file {origin}: unknown key `{key}` (known keys: {known})")]
    UnknownKey {
        /// Where the text came from.
        origin: String,
        /// The unknown key.
        key: String,
        /// Every key this binary knows, comma separated.
        known: String,
    },
    /// A value has the wrong type or is out of range.
    #[error("{0}")]
    Value(String),
}

/// The environment name of a camelCase key: `deviceSplitCount` →
/// `GPUSLICE_DEVICE_SPLIT_COUNT`, `defaultGPUNum` → `GPUSLICE_DEFAULT_GPU_NUM`.
#[must_use]
pub fn env_name(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    let mut out = String::from(ENV_PREFIX);
    for (i, &c) in chars.iter().enumerate() {
        if i > 0 && c.is_ascii_uppercase() {
            let prev = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            if !prev.is_ascii_uppercase() || next_is_lower {
                out.push('_');
            }
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// The top-level keys of a settings type, read off its serialized defaults.
///
/// # Errors
/// [`SettingsError::Defaults`] if `T` does not serialize to a map.
pub fn keys<T: Serialize + Default>() -> Result<Vec<String>, SettingsError> {
    match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(map)) => Ok(map.keys().cloned().collect()),
        _ => Err(SettingsError::Defaults),
    }
}

/// Builds settings from the layers, lowest precedence first.
///
/// `env` answers an environment variable by name (pass `|k| std::env::var(k).ok()`
/// in a binary, a map in tests). `flags` serializes to a map from key to the
/// value of each flag the user actually gave; flags not given serialize as
/// `null` or are skipped (a clap struct of `Option`s does this).
///
/// # Errors
/// A [`SettingsError`] naming the file, key or value that is wrong.
pub fn layered<T, F>(
    file: Option<FileLayer<'_>>,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &F,
) -> Result<T, SettingsError>
where
    T: Serialize + DeserializeOwned + Default,
    F: Serialize + ?Sized,
{
    let known = keys::<T>()?;
    let defaults = config::Config::try_from(&T::default()).map_err(|_| SettingsError::Defaults)?;
    let mut builder = config::Config::builder().add_source(defaults);

    if let Some(file) = file {
        let format = match file.format {
            FileFormat::Yaml => config::FileFormat::Yaml,
            FileFormat::Toml => config::FileFormat::Toml,
        };
        let parsed = config::Config::builder()
            .add_source(config::File::from_str(file.text, format))
            .build()
            .map_err(|e| SettingsError::File {
                origin: file.origin.to_owned(),
                message: one_line(&e.to_string()),
            })?;
        let table = parsed
            .clone()
            .try_deserialize::<std::collections::HashMap<String, config::Value>>()
            .map_err(|e| SettingsError::File {
                origin: file.origin.to_owned(),
                message: one_line(&e.to_string()),
            })?;
        let known_set: BTreeSet<&str> = known.iter().map(String::as_str).collect();
        let mut names: Vec<&String> = table.keys().collect();
        names.sort();
        if let Some(key) = names.into_iter().find(|k| !known_set.contains(k.as_str())) {
            return Err(SettingsError::UnknownKey {
                origin: file.origin.to_owned(),
                key: key.clone(),
                known: known.join(", "),
            });
        }
        builder = builder.add_source(parsed);
    }

    for key in &known {
        let name = env_name(key);
        if let Some(value) = env(&name) {
            builder = builder.set_override(key.as_str(), value).map_err(|e| {
                SettingsError::Value(format!("{name}: {}", one_line(&e.to_string())))
            })?;
        }
    }
    let flags = match serde_json::to_value(flags) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => return Err(SettingsError::Defaults),
    };
    for (key, value) in flags {
        let value = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        };
        builder = builder.set_override(key.as_str(), value).map_err(|e| {
            SettingsError::Value(format!("flag for {key}: {}", one_line(&e.to_string())))
        })?;
    }

    builder
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|e| SettingsError::Value(one_line(&e.to_string())))
}

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

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", default)]
    struct Sample {
        device_split_count: u32,
        node_name: Option<String>,
        insecure_http: bool,
    }

    impl Default for Sample {
        fn default() -> Self {
            Self {
                device_split_count: 10,
                node_name: None,
                insecure_http: false,
            }
        }
    }

    #[derive(Serialize)]
    struct NoFlags {}
    const NO_FLAGS: NoFlags = NoFlags {};

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn yaml(text: &str) -> FileLayer<'_> {
        FileLayer {
            origin: "test.yaml",
            text,
            format: FileFormat::Yaml,
        }
    }

    #[test]
    fn env_names_are_screaming_snake_with_prefix() {
        assert_eq!(env_name("deviceSplitCount"), "GPUSLICE_DEVICE_SPLIT_COUNT");
        assert_eq!(env_name("kubeconfig"), "GPUSLICE_KUBECONFIG");
        assert_eq!(env_name("defaultGPUNum"), "GPUSLICE_DEFAULT_GPU_NUM");
        assert_eq!(env_name("tlsCert"), "GPUSLICE_TLS_CERT");
    }

    #[test]
    fn defaults_apply_when_nothing_is_given() {
        let s: Sample = layered(None, &no_env, &NO_FLAGS).unwrap();
        assert_eq!(s, Sample::default());
    }

    #[test]
    fn file_overrides_defaults_env_overrides_file_flags_override_env() {
        let file = yaml("deviceSplitCount: 4\nnodeName: from-file\ninsecureHttp: true\n");
        let s: Sample = layered(Some(file.clone()), &no_env, &NO_FLAGS).unwrap();
        assert_eq!(s.device_split_count, 4);
        assert_eq!(s.node_name.as_deref(), Some("from-file"));
        assert!(s.insecure_http);

        let env: HashMap<&str, &str> = [
            ("GPUSLICE_DEVICE_SPLIT_COUNT", "6"),
            ("GPUSLICE_NODE_NAME", "from-env"),
        ]
        .into();
        let env = move |k: &str| env.get(k).map(|v| (*v).to_owned());
        let s: Sample = layered(Some(file.clone()), &env, &NO_FLAGS).unwrap();
        assert_eq!(s.device_split_count, 6);
        assert_eq!(s.node_name.as_deref(), Some("from-env"));

        let s: Sample =
            layered(Some(file), &env, &HashMap::from([("deviceSplitCount", 8)])).unwrap();
        assert_eq!(s.device_split_count, 8);
        assert_eq!(s.node_name.as_deref(), Some("from-env"));
    }

    #[test]
    fn toml_files_are_read() {
        let file = FileLayer {
            origin: "c.toml",
            text: "deviceSplitCount = 3\n",
            format: FileFormat::from_file_name("c.toml"),
        };
        let s: Sample = layered(Some(file), &no_env, &NO_FLAGS).unwrap();
        assert_eq!(s.device_split_count, 3);
    }

    #[test]
    fn unknown_file_key_is_named_in_the_error() {
        let err = layered::<Sample, _>(Some(yaml("deviceSplitCnt: 4\n")), &no_env, &NO_FLAGS)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown key `deviceSplitCnt`"), "{msg}");
        assert!(msg.contains("deviceSplitCount"), "{msg}");
    }

    #[test]
    fn wrong_types_are_errors_not_panics() {
        let err = layered::<Sample, _>(Some(yaml("deviceSplitCount: lots\n")), &no_env, &NO_FLAGS);
        assert!(err.is_err());
        let env = |k: &str| (k == "GPUSLICE_DEVICE_SPLIT_COUNT").then(|| "-1".to_owned());
        assert!(layered::<Sample, _>(None, &env, &NO_FLAGS).is_err());
        let err = layered::<Sample, _>(Some(yaml("[unclosed\n")), &no_env, &NO_FLAGS).unwrap_err();
        assert!(
            err.to_string().starts_with("config file test.yaml:"),
            "{err}"
        );
    }
}
