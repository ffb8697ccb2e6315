//! The kube-scheduler HTTP extender (`POST /filter`, `POST /bind`).
//!
//! [`wire`] is the request/response codec (pure).

pub mod wire;
