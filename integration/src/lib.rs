//! Stand-ins for a Kubernetes cluster (kube-apiserver, kubelet,
//! kube-scheduler) that speak the real protocols, used by the end-to-end
//! tests, the benchmarks and the sandbox.

pub mod browser;
pub mod chaos;
pub mod checker;
pub mod cluster;
pub mod fake_apiserver;
pub mod fake_kubelet;
pub mod fake_scheduler;
pub mod harness;
pub mod prometheus;
pub mod real;
pub mod sandbox;
pub mod scheduler_bench;
pub mod workload;
