//! The pure scheduling model: cluster, fit, score, policies, reservations.
//!
//! No kube, actix, tokio, clock or file I/O: the extender and the simulator
//! run this very code.
//!
//! Layers, each importing only from the layers below it (tests may reach
//! across; `.ci/check-layers.sh` fails on any import cycle):
//!
//! ```text
//!  policy        schedule: node policy, tie-break scan, Decision
//!    │
//!  fgd           fragmentation index and score
//!    │
//!  rare_hosts    the few nodes that alone can host a rare multi-GPU shape
//!    │
//!  fit  score  quota   GPU fit, HAMi scores, namespace quota book
//!    │     │     │
//!  request       what a pod asks (PodRequest, Constraints, QuotaRoom)
//!    │
//!  kinds         Policy, GpuPolicy and their names
//!
//!  reservation   reserve / commit / release / observe on the Cluster
//!    │
//!  mig           MIG instance choice and slice masks (fit reads it too)
//!    │
//!  model         Cluster, Node, Gpu, GpuUse, the pod ledger's data
//!
//!  rng           SplitMix64, TieBreak (no imports)
//! ```
//!
//! `fit`, `score` and `fgd` read `model`; `policy` reads `model`,
//! `fit`, `score`, `fgd` and `rng`; nothing reads `policy` but the shell.
//!
//! ```text
//!  PodSpecLite ──request──▶ PodRequest ─┐
//!  NodeDevice[] ──model───▶ Cluster ────┼─▶ policy::schedule ─▶ Decision
//!                            ▲          │     (fit + score / fgd)   │
//!                            └──────────┴── reservation (reserve/commit/release)
//! ```

pub mod fgd;
pub mod fgdpack;
pub mod fit;
pub mod kinds;
pub mod mig;
pub mod model;
pub mod policy;
pub mod quota;
pub mod rare_hosts;
pub mod request;
pub mod reservation;
pub mod rng;
pub mod score;
