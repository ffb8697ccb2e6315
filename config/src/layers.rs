//! The layering itself, as a pure function: [`layered`] merges built-in
//! defaults < a config file's text < environment lookups < flags into one
//! settings type, and names the key and the layer of a value that does not
//! fit. It reads nothing: the caller passes the file's text and an
//! environment lookup, so tests never touch the process environment
//! ([`crate::load`] is the thin shell that does the reading).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

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
    /// A key's value has the wrong type or is not one the key accepts.
    #[error("{key} from {layer}: {message}")]
    Key {
        /// The top-level key.
        key: String,
        /// The layer that gave the value.
        layer: Layer,
        /// What is wrong with it.
        message: String,
    },
    /// A value is wrong in a way no single key explains.
    #[error("{0}")]
    Value(String),
}

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// The built-in defaults.
    Defaults,
    /// The config file.
    File(String),
    /// An environment variable.
    Env(String),
    /// A command-line flag.
    Flag,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Defaults => f.write_str("the built-in defaults"),
            Self::File(origin) => write!(f, "config file {origin}"),
            Self::Env(name) => write!(f, "environment variable {name}"),
            Self::Flag => f.write_str("the command line"),
        }
    }
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
    // The layer that last set each top-level key, to name it in errors.
    let mut set_by: BTreeMap<String, Layer> = BTreeMap::new();

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
        for key in table.keys() {
            set_by.insert(key.clone(), Layer::File(file.origin.to_owned()));
        }
        builder = builder.add_source(parsed);
    }

    for key in &known {
        let name = env_name(key);
        if let Some(value) = env(&name) {
            builder = builder.set_override(key.as_str(), value).map_err(|e| {
                SettingsError::Value(format!("{name}: {}", one_line(&e.to_string())))
            })?;
            set_by.insert(key.clone(), Layer::Env(name));
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
        set_by.insert(key, Layer::Flag);
    }

    builder
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|e| keyed(e, &set_by))
}

/// The error of the final merge, with the key it is about and the layer
/// that gave that key its value.
fn keyed(error: config::ConfigError, set_by: &BTreeMap<String, Layer>) -> SettingsError {
    let (key, message) = match &error {
        config::ConfigError::At {
            error,
            key: Some(key),
            ..
        } => (key, error.to_string()),
        config::ConfigError::Type {
            unexpected,
            expected,
            key: Some(key),
            ..
        } => (
            key,
            format!("invalid type: {unexpected}, expected {expected}"),
        ),
        _ => return SettingsError::Value(one_line(&error.to_string())),
    };
    let top = key.split(['.', '[']).next().unwrap_or(key);
    SettingsError::Key {
        key: key.clone(),
        layer: set_by.get(top).cloned().unwrap_or(Layer::Defaults),
        message: one_line(&message),
    }
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

    #[test]
    fn a_bad_value_is_named_with_its_key_and_the_layer_that_gave_it() {
        let file = || Some(yaml("deviceSplitCount: lots\n"));
        let err = layered::<Sample, _>(file(), &no_env, &NO_FLAGS)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("deviceSplitCount from config file test.yaml: "),
            "{err}"
        );
        assert!(err.contains("lots"), "{err}");

        let env = |k: &str| (k == "GPUSLICE_DEVICE_SPLIT_COUNT").then(|| "many".to_owned());
        let err = layered::<Sample, _>(file(), &env, &NO_FLAGS)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "deviceSplitCount from environment variable GPUSLICE_DEVICE_SPLIT_COUNT: "
            ),
            "{err}"
        );

        let flags = HashMap::from([("deviceSplitCount", "x")]);
        let err = layered::<Sample, _>(file(), &env, &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("deviceSplitCount from the command line: "),
            "{err}"
        );
    }
}
