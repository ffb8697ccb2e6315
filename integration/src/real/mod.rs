//! The real Kubernetes control plane under the end-to-end tests: etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler built from their
//! published Go modules by `integration/k8s/build.sh`, run as processes on
//! loopback, with the objects `helm template` renders from our chart.
//!
//! - [`audit`]: kube-apiserver's audit log, tallied by client;
//! - [`binaries`]: where the built binaries live, and building them;
//! - [`pki`]: the cluster's certificates and service-account keys;
//! - [`chart`]: rendering the chart and refusing any object that would make the
//!   apiserver dial anything but 127.0.0.1;
//! - [`control_plane`]: the processes, their readiness and their clients;
//! - [`kubelet`]: the real kubelet of one node, on the fake CRI runtime, in
//!   its own mount namespace.
//!
//! Network rule: every address here is on 127.0.0.1. Registrations are by
//! `url:`; no component reads in-cluster configuration (the child processes
//! run without `KUBERNETES_SERVICE_HOST`/`PORT`).

pub mod audit;
pub mod binaries;
pub mod chart;
pub mod control_plane;
pub mod install;
pub mod kubelet;
pub mod pki;
