//! The scheduler's in-memory view of the cluster.
//!
//! - [`model`]: the pure model fed with Kubernetes objects and asked to place pods;
//! - [`pods`]: one record per pod and the sums over them (quota use, the
//!   `fgd` workload), moved together by the pod's transitions;
//! - [`hosts`]: the CPU and memory every pod on a node takes, summed per node;
//! - [`fragmentation`]: the live workload shapes and fragmentation index the
//!   pod book keeps for the `fgd` policy;
//! - [`owner`]: the single task that owns the model and serializes every change;
//! - [`watch`]: kube-rs watchers over nodes, pods and resource quotas feeding the owner.

pub mod fragmentation;
pub mod hosts;
pub mod model;
pub mod owner;
pub mod pods;
pub mod watch;
