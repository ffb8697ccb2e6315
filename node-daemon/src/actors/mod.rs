//! The actix actors of the daemon and the messages between them.
//!
//! ```text
//!  kubelet ──gRPC──> grpc::DevicePluginService ──AllocateContainers──> KubeletActor
//!                          │ ListAndWatch                                 │ CommitSlice / ReleaseSlice
//!                          ▼                                              ▼
//!              watch<Inventory> <── HealthActor <── DeviceSource    GpuActor × N (one ledger each)
//!                          │
//!                          └──> registrar (node register annotation, on change only)
//! ```
//!
//! Each actor is a shell: [`gpu::GpuActor`] makes one ledger call per
//! message, [`kubelet::KubeletActor`] runs the pure decisions of
//! `allocation` with I/O around them, [`health::HealthActor`] folds health
//! events into the inventory snapshot, [`pod_watch::PodWatch`] frees the
//! slices of pods that leave the node.

pub mod gpu;
pub mod health;
pub mod kubelet;
pub mod pod_watch;
