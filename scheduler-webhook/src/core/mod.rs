//! The pure scheduling model: cluster, fit, score, policies, reservations.
//!
//! No kube, actix, tokio, clock or file I/O: the extender and the simulator
//! run this very code.
//!
//! ```text
//!  PodSpecLite ──request──▶ PodRequest ─┐
//!  NodeDevice[] ──model───▶ Cluster ────┼─▶ policy::schedule ─▶ Decision
//!                            ▲          │     (fit + score / fgd)   │
//!                            └──────────┴── reservation (reserve/commit/release)
//! ```

pub mod fgd;
pub mod fit;
pub mod model;
pub mod policy;
pub mod quota;
pub mod request;
pub mod reservation;
pub mod rng;
pub mod score;
