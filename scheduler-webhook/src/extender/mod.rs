//! The kube-scheduler HTTP extender (`POST /filter`, `POST /bind`).
//!
//! - [`wire`]: the request/response codec (pure);
//! - [`lock`]: the node lock decision (pure);
//! - [`bind`]: lock, annotate, bind, roll back (the API calls);
//! - [`handler`]: the actix-web routes.

pub mod bind;
pub mod handler;
pub mod lock;
pub mod wire;
