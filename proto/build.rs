//! Generates the kubelet gRPC servers and clients from `proto/*.proto`.
//!
//! Uses `$PROTOC` when set, otherwise the protoc binary vendored by
//! `protoc-bin-vendored`, so the build works offline.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            config,
            &[
                "proto/deviceplugin_v1beta1.proto",
                "proto/podresources_v1.proto",
                "proto/dra_v1.proto",
                "proto/pluginregistration_v1.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
