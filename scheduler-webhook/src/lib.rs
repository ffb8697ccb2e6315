//! gpuslice scheduler: the mutating admission webhook and kube-scheduler
//! HTTP extender (`serve`), and the trace simulator (`simulate`), both over
//! the same pure scheduling [`core`].

pub mod body;
pub mod cache;
pub mod clock;
pub mod convert;
pub mod core;
pub mod events;
pub mod extender;
pub mod handshake;
pub mod metrics;
pub mod quantity;
pub mod serve;
pub mod settings;
pub mod simulate;
pub mod tls;
pub mod ui;
pub mod webhook;
