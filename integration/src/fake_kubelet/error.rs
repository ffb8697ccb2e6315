//! Errors of the fake kubelet's own machinery, in their own module so the
//! submodules that return them do not import their parent.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Errors of the fake kubelet's own machinery (not admission outcomes).
#[derive(Debug, Error)]
pub enum Error {
    /// The state owner or admission worker has stopped.
    #[error("fake kubelet stopped")]
    Stopped,
    /// Filesystem work on the device-plugins folder failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A wait ran past its deadline.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;
