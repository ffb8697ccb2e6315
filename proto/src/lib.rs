//! Wire formats gpuslice speaks, with no I/O.
//!
//! - [`deviceplugin::v1beta1`] and [`podresources::v1`]: the kubelet gRPC APIs,
//!   generated at build time from the `.proto` files in `proto/proto/`.
//! - [`dra::v1`] and [`pluginregistration::v1`]: the kubelet DRA plugin API
//!   and the kubelet plugin-registration API (generated), with [`dra`]'s
//!   names of gpuslice's DRA driver and the Kubernetes quantity codec its
//!   capacities use.
//! - [`cdi`]: the CDI spec file a prepared claim gets (pure builder).
//! - [`hami`]: the HAMi scheduler ↔ device-plugin annotation protocol as pure
//!   codecs (see `docs/protocol.md`).
//! - [`accounting`]: how a pod's containers add up (app containers summed,
//!   init containers at their peak), the one rule the scheduler and the node
//!   both count by.

/// Kubelet device plugin API.
pub mod deviceplugin {
    /// Kubelet device plugin API, version `v1beta1` (generated).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// The API version string sent in `RegisterRequest.version`.
        pub const VERSION: &str = "v1beta1";
        /// Device health value for a usable device.
        pub const HEALTHY: &str = "Healthy";
        /// Device health value for an unusable device.
        pub const UNHEALTHY: &str = "Unhealthy";
        /// Kubelet's registration socket file name inside the device-plugins folder.
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
    }
}

/// Kubelet pod-resources API.
pub mod podresources {
    /// Kubelet pod-resources API, version `v1` (generated).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// Kubelet plugin-registration API (the `plugins_registry` watcher).
pub mod pluginregistration {
    /// Kubelet plugin-registration API, version `v1` (generated; the proto
    /// package is `pluginregistration`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("pluginregistration");

        /// `PluginInfo.type` of a DRA driver.
        pub const DRA_PLUGIN: &str = "DRAPlugin";
    }
}

pub mod accounting;
pub mod cdi;
pub mod dra;
pub mod hami;
