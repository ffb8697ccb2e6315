//! gpuslice node daemon: serves the kubelet device-plugin API for a node's
//! GPUs, hands each container its slice (HAMi-core env and mounts), and
//! publishes the node's GPUs as the HAMi register annotation. In DRA mode
//! (`--mode dra`, module [`dra`]) it publishes them as a `ResourceSlice`
//! instead and serves the kubelet DRA plugin (`grpc::dra`), handing each
//! claim the same slice through a CDI spec.
//!
//! ```text
//!              kubelet (device manager)                   kube-apiserver
//!                 │ Register ▲   │ ListAndWatch/Allocate        ▲ pods on node, node lock,
//!                 ▼          │   ▼                              │ pod/node annotations
//!  grpc::registration   grpc::plugin::DevicePluginService   cluster::Cluster (kube-rs)
//!   (serve, register,        │ one send per call                ▲
//!    re-register)            ▼                                  │
//!                     actors::kubelet::KubeletActor ────────────┘
//!                       │ allocation::{identify_pod, plan_container}  (pure)
//!                       ▼ commit / release / release_except(snapshot)
//!  actors::pod_watch ─> actors::pool::GpuPool (addresses by UUID, epoch::CommitClock)
//!                       ▼ CommitSlice / ReleaseSlice / ReleasePod / ReleasePodsExcept
//!                     actors::gpu::GpuActor × N ── ledger::SliceLedger (pure, one per GPU)
//!
//!  devices::DeviceSource ─health events─> actors::health::HealthActor ─> watch<Inventory>
//!                                                 ListAndWatch, registrar, metrics read it
//! ```
//!
//! Start-up order ([`daemon::run`]): discover GPUs, rebuild every ledger
//! from the pods bound to this node, start the actors, and only then serve
//! and register the socket. Shutdown: stop accepting, let in-flight
//! Allocates finish, remove the socket.

pub mod actors;
pub mod allocation;
pub mod cluster;
pub mod daemon;
pub mod devices;
pub mod dra;
pub mod epoch;
pub mod grpc;
pub mod ledger;
pub mod metrics;
pub mod mig;
pub mod registrar;
pub mod settings;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod usage;
