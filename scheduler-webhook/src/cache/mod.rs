//! The scheduler's in-memory view of the cluster.
//!
//! - [`model`]: the pure model fed with Kubernetes objects and asked to place pods;
//! - [`fragmentation`]: the live workload shapes and fragmentation index the
//!   model keeps for the `fgd` policy;
//! - [`owner`]: the single task that owns the model and serializes every change;
//! - [`watch`]: kube-rs watchers over nodes, pods and resource quotas feeding the owner.

pub mod fragmentation;
pub mod model;
pub mod owner;
pub mod watch;
