//! The HAMi annotation protocol (NVIDIA path) as pure codecs.
//!
//! Every value a scheduler or device plugin writes into a node or pod
//! annotation is a type here with an encoder and a decoder that returns a
//! typed error instead of panicking. Nothing here does I/O or reads a clock:
//! callers pass "now" in as unix seconds. The protocol itself is described in
//! `docs/protocol.md`.
//!
//! | module | owns |
//! |---|---|
//! | [`keys`] | every annotation and label key |
//! | [`register`] | node device list (`hami.io/node-nvidia-register`) |
//! | [`pair_score`] | GPU pair scores (`hami.io/node-nvidia-score`) |
//! | [`scoring_weights`] | `hami.io/device-scoring-weights` |
//! | [`handshake`] | `hami.io/node-handshake` values |
//! | [`node_lock`] | `hami.io/mutex.lock` values |
//! | [`mig`] | MIG profiles, placements and `hami.io/vgpu-mig-allocations` |
//! | [`pod_devices`] | `hami.io/vgpu-devices-{to-allocate,allocated}` |
//! | [`bind`] | `hami.io/bind-phase`, `hami.io/bind-time` (and `vgpu-time`) |
//! | [`container_contract`] | env and mounts for HAMi-core in a container |
//! | [`civil_time`] | the date-time type and Go time layouts the values use |
//! | [`resources`] | extended resource names |
//! | [`shared_region`] | HAMi-core's per-container shared-memory file (read for usage metrics) |

#![warn(missing_docs)]
#![warn(clippy::pedantic)]
#![allow(
    clippy::doc_markdown,
    reason = "product names (HAMi, HAMi-core, MiB) in prose are not code"
)]

pub mod bind;
pub mod civil_time;
pub mod container_contract;
pub mod handshake;
pub mod keys;
pub mod mig;
pub mod node_lock;
pub mod pair_score;
pub mod pod_devices;
pub mod register;
pub mod resources;
pub mod scoring_weights;
pub mod shared_region;

/// Quotes at most 64 characters of `text` in an error message, marking a cut
/// with `…`, so errors stay short whatever the input.
pub(crate) fn snippet(text: &str) -> String {
    const MAX_CHARS: usize = 64;
    match text.char_indices().nth(MAX_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", text.get(..cut).unwrap_or_default()),
    }
}
