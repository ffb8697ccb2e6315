//! What containers and GPUs really use, read at scrape time for HAMi's
//! node-monitor metrics: HAMi-core's per-container shared-region files
//! (decoded by `proto::hami::shared_region`, which trusts nothing in them)
//! and the device source's host readings.
//!
//! The files are under `<hook>/vgpu/containers/<pod UID>_<container>/`, the
//! folder Allocate creates and mounts as the container's `<hook>/vgpu`;
//! HAMi-core creates `<id>.cache` in it when the container's first process
//! initialises CUDA. A folder whose pod this node does not know, or with no
//! cache file yet, is skipped silently; a file that cannot be read or
//! decoded is skipped and reported in [`Scan::unreadable`] with its reason.
//! This module owns no state: nothing is cached between scrapes, and it
//! never writes or deletes the folders (their lifecycle is Allocate's).

use std::path::{Path, PathBuf};

use proto::hami::shared_region::{self, SharedRegion};
use tracing::debug;

use crate::cluster::PodNames;
use crate::devices::{DeviceSource, HostUsage};

/// One container's region, with the names HAMi labels it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUsage {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// The decoded file.
    pub region: SharedRegion,
}

/// Why a container's file was skipped.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    /// The folder or file could not be read.
    #[error("cannot read: {0}")]
    Io(#[source] std::io::Error),
    /// More than one `.cache` file: which one HAMi-core uses is a guess.
    #[error("{0} .cache files, expected one")]
    Ambiguous(usize),
    /// Longer than any layout: not read at all.
    #[error("{0} bytes, longer than any HAMi-core shared region")]
    TooLong(u64),
    /// The bytes do not decode.
    #[error(transparent)]
    Decode(#[from] shared_region::Error),
}

impl Unreadable {
    /// A short stable name for the metric label.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::Ambiguous(_) => "ambiguous",
            Self::TooLong(_) => "length",
            Self::Decode(e) => e.kind(),
        }
    }
}

/// The result of one scan.
#[derive(Debug, Default)]
pub struct Scan {
    /// Containers whose file decoded.
    pub containers: Vec<ContainerUsage>,
    /// Files skipped, with why.
    pub unreadable: Vec<(PathBuf, Unreadable)>,
}

/// Everything a scrape reports beyond the ledgers.
#[derive(Debug, Default)]
pub struct Observed {
    /// The containers' regions and the files skipped.
    pub scan: Scan,
    /// The host readings of every GPU.
    pub host: Vec<HostUsage>,
    /// Unix seconds at the scan, for the time since the last kernel.
    pub now_unix: u64,
}

/// The one `.cache` file of a container folder; `None` when HAMi-core has
/// not created it yet. Symbolic links and other non-regular entries are
/// not candidates: the folder is writable from inside the container.
fn cache_file(dir: &Path) -> Result<Option<PathBuf>, Unreadable> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(Unreadable::Io)? {
        let entry = entry.map_err(Unreadable::Io)?;
        let path = entry.path();
        let regular = entry.file_type().map_err(Unreadable::Io)?.is_file();
        if regular && path.extension().is_some_and(|e| e == "cache") {
            found.push(path);
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        n => Err(Unreadable::Ambiguous(n)),
    }
}

/// Reads a file a container controls: never through a symbolic link
/// (`O_NOFOLLOW`, so it cannot be swapped for one after the listing), never
/// waiting on a FIFO (`O_NONBLOCK`), only a regular file, and at most one
/// byte more than the longest layout whatever it grows to meanwhile.
fn read_region(file: &Path) -> Result<SharedRegion, Unreadable> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(file)
        .map_err(Unreadable::Io)?;
    let meta = f.metadata().map_err(Unreadable::Io)?;
    if !meta.is_file() {
        return Err(Unreadable::Io(std::io::Error::other("not a regular file")));
    }
    let max = shared_region::MAX_FILE_LEN as u64;
    if meta.len() > max {
        return Err(Unreadable::TooLong(meta.len()));
    }
    let mut bytes = Vec::with_capacity(shared_region::MAX_FILE_LEN);
    (&mut f)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(Unreadable::Io)?;
    if bytes.len() as u64 > max {
        return Err(Unreadable::TooLong(bytes.len() as u64));
    }
    Ok(shared_region::decode(&bytes)?)
}

/// Reads every container folder under `containers` whose pod is in
/// `names`. Blocking file I/O.
#[must_use]
pub fn scan(containers: &Path, names: &PodNames) -> Scan {
    let mut out = Scan::default();
    let entries = match std::fs::read_dir(containers) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.unreadable
                .push((containers.to_owned(), Unreadable::Io(e)));
            return out;
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let Some((uid, container)) = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split_once('_'))
        else {
            continue;
        };
        let Some((namespace, pod)) = names.get(uid) else {
            debug!(dir = %dir.display(), "container folder of a pod not on this node; skipped");
            continue;
        };
        let file = match cache_file(&dir) {
            Ok(Some(file)) => file,
            Ok(None) => continue,
            Err(reason) => {
                out.unreadable.push((dir, reason));
                continue;
            }
        };
        match read_region(&file) {
            Ok(region) => out.containers.push(ContainerUsage {
                namespace: namespace.clone(),
                pod: pod.clone(),
                container: container.to_owned(),
                region,
            }),
            // A zero flag: HAMi-core created the file and has not set it up
            // yet. Any other flag is not HAMi-core's and is reported.
            Err(Unreadable::Decode(shared_region::Error::NotInitialized { flag: 0 })) => {
                debug!(file = %file.display(), "HAMi-core has not initialised the region yet");
            }
            Err(reason) => out.unreadable.push((file, reason)),
        }
    }
    out
}

/// A scan of `containers` and the host readings of `devices`; a source that
/// cannot be read gives no host readings (logged).
#[must_use]
pub fn observe(containers: &Path, names: &PodNames, devices: &dyn DeviceSource) -> Observed {
    let host = devices.usage().unwrap_or_else(|error| {
        tracing::warn!(%error, "GPU usage unavailable");
        Vec::new()
    });
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Observed {
        scan: scan(containers, names),
        host,
        now_unix,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proto::hami::shared_region::{Device, Layout, encode};

    use super::*;

    fn names() -> PodNames {
        Arc::new(
            [("u1".to_owned(), ("ns".to_owned(), "train".to_owned()))]
                .into_iter()
                .collect(),
        )
    }

    fn region() -> SharedRegion {
        SharedRegion {
            layout: Layout::V1 { minor: 2 },
            devices: vec![Device {
                uuid: Some("GPU-a".into()),
                memory_limit: 1 << 30,
                sm_limit: 30,
            }],
            processes: Vec::new(),
            utilization_switch: 1,
            recent_kernel: 2,
            priority: 1,
            last_kernel_time: Some(0),
        }
    }

    fn folder(root: &Path, name: &str, files: &[(&str, &[u8])]) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, bytes) in files {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
    }

    #[test]
    fn known_pods_decode_and_bad_files_are_reported_not_fatal() {
        let root = tempfile::tempdir().unwrap();
        let good = encode(&region()).unwrap();
        folder(
            root.path(),
            "u1_app",
            &[("abc.cache", &good), ("libvgpu.so", b"x")],
        );
        folder(root.path(), "u1_empty", &[]);
        folder(root.path(), "u1_garbage", &[("x.cache", b"not a region")]);
        folder(root.path(), "u1_short", &[("x.cache", &good[..100])]);
        folder(
            root.path(),
            "u1_two",
            &[("a.cache", &good), ("b.cache", &good)],
        );
        let mut uninit = good.clone();
        uninit[..4].fill(0);
        folder(root.path(), "u1_starting", &[("s.cache", &uninit)]);
        folder(root.path(), "other-pod_app", &[("o.cache", &good)]);
        folder(root.path(), "no-underscore", &[("o.cache", &good)]);
        // A link planted by the container is not followed.
        std::fs::create_dir_all(root.path().join("u1_link")).unwrap();
        std::os::unix::fs::symlink(
            root.path().join("u1_app/abc.cache"),
            root.path().join("u1_link/l.cache"),
        )
        .unwrap();

        assert_eq!(
            read_region(&root.path().join("u1_link/l.cache"))
                .unwrap_err()
                .kind(),
            "io",
            "even when named directly"
        );
        let scan = scan(root.path(), &names());
        assert_eq!(scan.containers.len(), 1);
        let c = &scan.containers[0];
        assert_eq!(
            (c.namespace.as_str(), c.pod.as_str(), c.container.as_str()),
            ("ns", "train", "app")
        );
        assert_eq!(c.region, region());
        let kinds: Vec<(String, &str)> = scan
            .unreadable
            .iter()
            .map(|(p, r)| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    r.kind(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("x.cache".to_owned(), "magic"),
                ("x.cache".to_owned(), "length"),
                ("u1_two".to_owned(), "ambiguous")
            ]
        );
    }

    #[test]
    fn a_missing_folder_is_an_empty_scan() {
        let root = tempfile::tempdir().unwrap();
        let scan = scan(&root.path().join("absent"), &names());
        assert!(scan.containers.is_empty() && scan.unreadable.is_empty());
    }
}
