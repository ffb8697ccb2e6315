//! The HAMi annotation protocol (NVIDIA path) as pure codecs.
//!
//! Every value a scheduler or device plugin writes into a node or pod
//! annotation is a type here with an encoder and a decoder that returns a
//! typed error instead of panicking.

pub mod pod_devices;
pub mod register;
pub mod resources;
