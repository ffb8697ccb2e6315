//! DRA mode (`--mode dra`): the node's GPUs as a `ResourceSlice` of driver
//! `gpu.gpuslice.dev`, and the kubelet DRA plugin's work behind the gRPC
//! adapter (`grpc::dra`).
//!
//! ```text
//!  watch<Inventory> ──> publisher ── slice::slice_update (pure) ──> Cluster (ResourceSlice)
//!
//!  kubelet ──NodePrepareResources──> grpc::dra ──> driver::DraDriver::prepare
//!                                       Cluster::resource_claim ─> claims::plan_claim (pure)
//!                                       GpuPool::commit_claim (per-GPU actors, one ledger each)
//!                                       cdi::write_spec (pure spec, atomic file write)
//!  kubelet ──NodeUnprepareResources─> driver::DraDriver::unprepare
//!                                       GpuPool::release_claim, cdi::remove_spec
//! ```
//!
//! The ledgers keep DRA claims apart from device-plugin containers (keyed
//! by claim UID) and count both, so a GPU is never over-committed across
//! the two paths. A restart rebuilds the claims' holdings from the
//! `ResourceClaim`s allocated to this node's pool ([`driver::rebuild`]).

pub mod cdi;
pub mod claims;
pub mod driver;
pub mod publisher;
pub mod slice;
