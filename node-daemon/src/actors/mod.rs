//! The actix actors of the daemon and the messages between them.
//!
//! ```text
//!  kubelet ──gRPC──> grpc::DevicePluginService ──AllocateContainers──> KubeletActor
//!                          │ ListAndWatch                                 │ commit / release_except
//!                          ▼                                              ▼
//!              watch<Inventory> <── HealthActor <── DeviceSource    GpuPool <── PodWatch
//!                          │                                              │ one message per GPU
//!                          │                                              ▼
//!                          │                                        GpuActor × N (one ledger each)
//!                          │
//!                          └──> registrar (node register annotation, on change only)
//! ```
//!
//! Each actor is a shell: [`gpu::GpuActor`] makes one ledger call per
//! message, [`kubelet::KubeletActor`] runs the pure decisions of
//! `allocation` with I/O around them (and reuses a GetPreferredAllocation's
//! read of the node for the Allocate after it: [`kept_read`]), [`health::HealthActor`] folds health
//! events into the inventory snapshot, [`pod_watch::PodWatch`] frees the
//! slices of pods that leave the node. [`pool::GpuPool`] is the one handle
//! to the GPU actors the others hold (and the only broadcast to them).

pub mod gpu;
pub mod health;
pub mod kept_read;
pub mod kubelet;
pub mod pod_watch;
pub mod pool;
