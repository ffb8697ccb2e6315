//! The pure scheduling model: cluster, fit, score, policies, reservations.
//!
//! No kube, actix, tokio, clock or file I/O: the extender and the simulator
//! run this very code.
