//! `--config` files of both binaries, YAML and TOML, through the layering
//! the binaries use: settings or a `SettingsError`, then validation, never
//! a panic. The first byte picks binary and format.
#![no_main]

use libfuzzer_sys::fuzz_target;
use gpuslice_config::{FileFormat, FileLayer, layered};

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let format = if which & 1 == 0 {
        FileFormat::Yaml
    } else {
        FileFormat::Toml
    };
    let file = FileLayer {
        origin: "fuzz",
        text,
        format,
    };
    let no_env = |_: &str| None;
    if which & 2 == 0 {
        let flags = scheduler_webhook::settings::ServeFlags::default();
        if let Ok(s) =
            layered::<scheduler_webhook::settings::Settings, _>(Some(file), &no_env, &flags)
        {
            let _ = s.validate();
            let _ = scheduler_webhook::serve::model_config(&s);
        }
    } else {
        let flags = node_daemon::settings::Flags::default();
        if let Ok(s) = layered::<node_daemon::settings::Settings, _>(Some(file), &no_env, &flags) {
            let _ = s.finish(Some("node-1".to_owned()));
        }
    }
});
