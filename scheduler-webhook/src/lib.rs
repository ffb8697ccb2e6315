//! gpuslice scheduler: the mutating admission webhook and kube-scheduler
//! HTTP extender (`serve`), and the trace simulator (`simulate`), both over
//! the same pure scheduling [`core`].

pub mod core;
pub mod settings;
pub mod simulate;
