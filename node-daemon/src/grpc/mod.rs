//! The kubelet-facing gRPC side: [`plugin`] (the `DevicePlugin` service, a
//! thin adapter that converts protobuf to domain data, makes one send to
//! `KubeletActor`, and converts back) and [`registration`] (the plugin
//! socket's lifecycle: serve, register with kubelet, re-register when
//! kubelet restarts, drain and remove the socket on shutdown); in DRA mode,
//! [`dra`] (the kubelet DRA plugin and its registration socket).

pub mod authority;
pub mod dra;
pub mod plugin;
pub mod registration;
