//! `kubectl gpuslice`: who holds which slice of which GPU, and why a GPU
//! pod is Pending, read from the annotations gpuslice and HAMi write.
//!
//! - [`inventory`]: nodes, GPUs and pods → per-node, per-GPU and per-pod views (pure);
//! - [`why`]: one pod and its events → why it is where it is (pure);
//! - [`render`]: views → tables, JSON or YAML (pure);
//! - [`run`]: the command line and the reads through the user's kubeconfig
//!   (read-only: list nodes, pods and events).

pub mod inventory;
pub mod render;
pub mod run;
pub mod why;
