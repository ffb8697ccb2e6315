//! The CDI spec file of a prepared claim: the pure spec
//! ([`proto::cdi::claim_spec`]) written atomically (a temporary file in the
//! same folder, then a rename), and removed on unprepare.

use std::path::{Path, PathBuf};

use proto::cdi::Spec;
use proto::dra::cdi_file_name;

/// The path of claim `claim_uid`'s spec in `dir`.
#[must_use]
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(cdi_file_name(claim_uid))
}

/// Writes `spec` as claim `claim_uid`'s file in `dir` (created if
/// missing): readers see the old file or the new one, never a part.
///
/// # Errors
/// The I/O error.
pub async fn write_spec(dir: &Path, claim_uid: &str, spec: &Spec) -> std::io::Result<PathBuf> {
    let text = proto::cdi::to_json(spec).map_err(std::io::Error::other)?;
    tokio::fs::create_dir_all(dir).await?;
    let path = spec_path(dir, claim_uid);
    let temp = dir.join(format!(".{}.tmp", cdi_file_name(claim_uid)));
    tokio::fs::write(&temp, text).await?;
    if let Err(e) = tokio::fs::rename(&temp, &path).await {
        let _ = tokio::fs::remove_file(&temp).await;
        return Err(e);
    }
    Ok(path)
}

/// Removes claim `claim_uid`'s file from `dir`; a missing file is fine.
///
/// # Errors
/// Any other I/O error.
pub async fn remove_spec(dir: &Path, claim_uid: &str) -> std::io::Result<()> {
    match tokio::fs::remove_file(spec_path(dir, claim_uid)).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes the claim spec files in `dir` (`gpuslice.dev-<uid>.json`) of
/// claims not in `keep` (left by claims unprepared or deallocated while
/// the daemon was down); how many were removed. A missing folder is empty.
///
/// # Errors
/// The folder cannot be read, or a file cannot be removed.
pub async fn remove_stale_specs(
    dir: &Path,
    keep: &std::collections::BTreeSet<String>,
) -> std::io::Result<usize> {
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    while let Some(entry) = entries.next_entry().await? {
        let name = entry.file_name();
        let Some(uid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("gpuslice.dev-"))
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        if !keep.contains(uid) {
            tokio::fs::remove_file(entry.path()).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
