//! The scheduler's in-memory view of the cluster.
//!
//! [`model`] is the pure model fed with Kubernetes objects and asked to
//! place pods.

pub mod model;
