//! gpuslice node daemon: serves the kubelet device-plugin API for a node's
//! GPUs, hands each container its slice (HAMi-core env and mounts), and
//! publishes the node's GPUs as the HAMi register annotation.

pub mod actors;
pub mod allocation;
pub mod cluster;
pub mod daemon;
pub mod devices;
pub mod grpc;
pub mod ledger;
pub mod metrics;
pub mod registrar;
pub mod settings;
pub mod telemetry;
