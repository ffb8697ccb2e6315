//! Pods to submit: the demo mix, a burst of one-slice pods, and pods read
//! from an openb trace. Pure builders; nothing here talks to a cluster.

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

/// Namespace every workload pod is created in.
pub const NAMESPACE: &str = "default";

/// A pod with one GPU container asking for `limits`, and no scheduler name:
/// the admission webhook routes it, as it would for a user's pod.
#[must_use]
pub fn gpu_pod(name: &str, limits: &Value) -> Pod {
    pod_from(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "gpuslice-demo"}},
        "spec": {"containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
            "resources": {"limits": limits}}]}
    }))
}

fn pod_from(value: Value) -> Pod {
    // The JSON literals above are valid pods; a failure here is a bug in this file.
    serde_json::from_value(value).unwrap_or_default()
}

/// What a demo pod is meant to show, for the sandbox's report.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoPod {
    /// The pod.
    pub pod: Pod,
    /// What it demonstrates.
    pub shows: &'static str,
    /// Whether it is expected to stay unschedulable.
    pub expect_unschedulable: bool,
}

/// The demo mix: slices of various sizes, a multi-GPU pod, an init
/// container, an exclusive pod, a type-constrained pod, and one that cannot
/// fit anywhere.
#[must_use]
pub fn demo(gpu_memory_mib: u32) -> Vec<DemoPod> {
    let slice = |name, mem: u32, cores: u32, shows| DemoPod {
        pod: gpu_pod(
            name,
            &json!({"nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": cores.to_string()}),
        ),
        shows,
        expect_unschedulable: false,
    };
    let mut with_init = gpu_pod(
        "prepare-and-train",
        &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20"}),
    );
    if let Some(spec) = with_init.spec.as_mut() {
        let warmup: Container = serde_json::from_value(json!({
            "name": "warmup", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}}
        }))
        .unwrap_or_default();
        spec.init_containers = Some(vec![warmup]);
    }
    let mut typed = gpu_pod(
        "a100-only",
        &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "25"}),
    );
    typed.metadata.annotations =
        Some([("nvidia.com/use-gputype".to_owned(), "A100".to_owned())].into());
    vec![
        slice(
            "notebook-small",
            2000,
            10,
            "a small slice (2000 MiB, 10 % of a card)",
        ),
        slice(
            "inference-medium",
            8000,
            30,
            "a medium slice (8000 MiB, 30 %)",
        ),
        slice(
            "inference-large",
            16000,
            50,
            "a large slice (16000 MiB, 50 %)",
        ),
        DemoPod {
            pod: gpu_pod(
                "train-2gpu",
                &json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "40"}),
            ),
            shows: "a slice on each of two different GPUs",
            expect_unschedulable: false,
        },
        DemoPod {
            pod: with_init,
            shows: "an init container with its own slice, then the app container",
            expect_unschedulable: false,
        },
        DemoPod {
            pod: gpu_pod("exclusive", &json!({"nvidia.com/gpu": "1"})),
            shows: "a whole card: the webhook makes it exclusive (gpucores 100)",
            expect_unschedulable: false,
        },
        DemoPod {
            pod: typed,
            shows: "a type-constrained slice (nvidia.com/use-gputype: A100)",
            expect_unschedulable: false,
        },
        DemoPod {
            pod: gpu_pod(
                "too-big",
                &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": (u64::from(gpu_memory_mib) * 2).to_string()}),
            ),
            shows: "more memory than any card has: stays Pending with reasons",
            expect_unschedulable: true,
        },
    ]
}

/// The MIG mix for GPUs in `mig` mode with these `profiles` (the model's,
/// from [`proto::hami::mig::known_profiles`]): one pod sized to each
/// profile (asking memory between the next smaller profile's and its own,
/// so exactly that profile is the smallest that holds it), a pod with an
/// instance on each of two GPUs, a pod whose init container and app
/// container get instances of their own, and `mig-no-room`, which cannot
/// run: it is pinned to the GPU `pinned` (`nvidia.com/use-gpuuuid`; every
/// other pod avoids it with `nvidia.com/nouse-gpuuuid`, so it has the GPU
/// to itself) and asks for the smallest instance in one container and the
/// whole-GPU instance in another; the second finds the memory but no free
/// placement (`CardMigTopologyInfeasible`). Pods ask `nvidia.com/gpumem`
/// only: a MIG instance's compute is its profile's.
#[must_use]
pub fn mig(profiles: &[proto::hami::mig::MigProfile], pinned: &str) -> Vec<DemoPod> {
    let mut sorted: Vec<&proto::hami::mig::MigProfile> = profiles.iter().collect();
    sorted.sort_by_key(|p| (p.memory_mb, p.slice_count));
    // The memory that only this profile (and bigger ones) holds.
    let ask = |i: usize| -> u32 {
        let own = sorted[i].memory_mb;
        let below = if i == 0 { 0 } else { sorted[i - 1].memory_mb };
        below + (own - below).div_ceil(2)
    };
    let avoid = |mut pod: Pod| {
        pod.metadata.annotations =
            Some([("nvidia.com/nouse-gpuuuid".to_owned(), pinned.to_owned())].into());
        pod
    };
    let container = |name: &str, mem: u32| -> Container {
        serde_json::from_value(json!({
            "name": name, "image": "nvidia/cuda:12.4.0-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string()}}
        }))
        .unwrap_or_default()
    };
    let mut out: Vec<DemoPod> = Vec::new();
    for (i, p) in sorted.iter().enumerate() {
        let name = format!("mig-{}", p.name.split('.').next().unwrap_or(&p.name));
        out.push(DemoPod {
            pod: avoid(gpu_pod(
                &name,
                &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": ask(i).to_string()}),
            )),
            shows: "a pod sized to one MIG profile gets an instance of it",
            expect_unschedulable: false,
        });
    }
    if sorted.len() >= 2 {
        out.push(DemoPod {
            pod: avoid(gpu_pod(
                "mig-2gpu",
                &json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": ask(1).to_string()}),
            )),
            shows: "two instances, one on each of two GPUs",
            expect_unschedulable: false,
        });
    }
    let mut with_init = avoid(gpu_pod(
        "mig-init",
        &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": ask(sorted.len().min(2) - 1).to_string()}),
    ));
    if let Some(spec) = with_init.spec.as_mut() {
        spec.init_containers = Some(vec![container("warmup", ask(0))]);
    }
    out.push(DemoPod {
        pod: with_init,
        shows: "an init container and the app container, each with its own instance",
        expect_unschedulable: false,
    });
    let mut no_room = gpu_pod("mig-no-room", &json!({}));
    no_room.metadata.annotations =
        Some([("nvidia.com/use-gpuuuid".to_owned(), pinned.to_owned())].into());
    if let Some(spec) = no_room.spec.as_mut() {
        spec.containers = vec![
            container("small", ask(0)),
            container("whole", ask(sorted.len().saturating_sub(1))),
        ];
    }
    out.push(DemoPod {
        pod: no_room,
        shows: "the smallest and the whole-GPU instance on one GPU: memory enough, no placement (CardMigTopologyInfeasible)",
        expect_unschedulable: true,
    });
    out
}

/// `count` identical one-slice pods (`burst-0`, `burst-1`, …), each a tenth
/// of a card.
#[must_use]
pub fn burst(count: usize, gpu_memory_mib: u32) -> Vec<Pod> {
    let mem = (gpu_memory_mib / 10).max(1);
    (0..count)
        .map(|i| {
            gpu_pod(
                &format!("burst-{i}"),
                &json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem.to_string(), "nvidia.com/gpucores": "10"}),
            )
        })
        .collect()
}

/// Why an openb trace cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{path}:{line}: {why}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// The first `count` GPU pods of an openb pod list
/// (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,…`): a fractional pod
/// (`gpu_milli` m < 1000) asks for m/10 % of the cores and m/1000 of the
/// card's memory; others ask for whole cards. CPU-only pods are skipped.
///
/// # Errors
/// A [`TraceError`] naming the file and line.
pub fn openb(path: &Path, count: usize, gpu_memory_mib: u32) -> Result<Vec<Pod>, TraceError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut pods = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if pods.len() >= count {
            break;
        }
        let err = |why: String| TraceError::Line {
            path: shown.clone(),
            line: i + 1,
            why,
        };
        let f: Vec<&str> = line.split(',').collect();
        let num = |k: usize, what: &str| -> Result<u64, TraceError> {
            f.get(k)
                .ok_or_else(|| err(format!("missing {what}")))?
                .trim()
                .parse()
                .map_err(|e| err(format!("{what}: {e}")))
        };
        let (cpu, mem, gpus, milli) = (
            num(1, "cpu_milli")?,
            num(2, "memory_mib")?,
            num(3, "num_gpu")?,
            num(4, "gpu_milli")?,
        );
        if gpus == 0 {
            continue;
        }
        let (gpumem, cores) = if gpus == 1 && milli < 1000 {
            (
                (u64::from(gpu_memory_mib) * milli / 1000).max(1),
                (milli / 10).max(1),
            )
        } else {
            (u64::from(gpu_memory_mib), 100)
        };
        let name = format!(
            "openb-{}",
            f.first()
                .copied()
                .unwrap_or("pod")
                .trim()
                .to_ascii_lowercase()
        );
        let mut pod = gpu_pod(
            &name,
            &json!({"nvidia.com/gpu": gpus.to_string(), "nvidia.com/gpumem": gpumem.to_string(),
                    "nvidia.com/gpucores": cores.to_string()}),
        );
        if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
            let resources = c.resources.get_or_insert_with(Default::default);
            resources.requests = Some(
                [
                    (
                        "cpu".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(format!("{cpu}m")),
                    ),
                    (
                        "memory".to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(format!("{mem}Mi")),
                    ),
                ]
                .into(),
            );
        }
        pods.push(pod);
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pod: &Pod) -> std::collections::BTreeMap<String, String> {
        pod.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect()
    }

    #[test]
    fn the_demo_mix_has_every_kind_of_pod() {
        let demo = demo(40960);
        assert_eq!(demo.len(), 8);
        assert_eq!(demo.iter().filter(|d| d.expect_unschedulable).count(), 1);
        let init = demo
            .iter()
            .find(|d| d.pod.metadata.name.as_deref() == Some("prepare-and-train"))
            .unwrap();
        assert_eq!(
            init.pod
                .spec
                .as_ref()
                .unwrap()
                .init_containers
                .as_ref()
                .unwrap()[0]
                .name,
            "warmup"
        );
        assert_eq!(limits(&demo[7].pod)["nvidia.com/gpumem"], "81920");
    }

    #[test]
    fn the_mig_mix_asks_one_pod_per_profile_and_one_that_cannot_fit() {
        let profiles = proto::hami::mig::known_profiles("NVIDIA A100-SXM4-40GB").unwrap();
        let mix = mig(&profiles, "GPU-pinned");
        let names: Vec<&str> = mix
            .iter()
            .filter_map(|d| d.pod.metadata.name.as_deref())
            .collect();
        assert_eq!(
            names,
            [
                "mig-1g",
                "mig-2g",
                "mig-3g",
                "mig-7g",
                "mig-2gpu",
                "mig-init",
                "mig-no-room"
            ]
        );
        // Each asks more than the next smaller profile holds.
        let asked: Vec<String> = mix[..4]
            .iter()
            .map(|d| limits(&d.pod)["nvidia.com/gpumem"].clone())
            .collect();
        assert_eq!(asked, ["2560", "7680", "15360", "30720"]);
        let pending: Vec<&DemoPod> = mix.iter().filter(|d| d.expect_unschedulable).collect();
        assert_eq!(pending.len(), 1);
        let annotations = pending[0].pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["nvidia.com/use-gpuuuid"], "GPU-pinned");
        assert_eq!(pending[0].pod.spec.as_ref().unwrap().containers.len(), 2);
        let others = mix[0].pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(others["nvidia.com/nouse-gpuuuid"], "GPU-pinned");
    }

    #[test]
    fn burst_pods_are_tenth_slices() {
        let pods = burst(3, 40960);
        assert_eq!(pods.len(), 3);
        assert_eq!(limits(&pods[2])["nvidia.com/gpumem"], "4096");
        assert_eq!(pods[2].metadata.name.as_deref(), Some("burst-2"));
    }

    #[test]
    fn openb_rows_become_slices_or_whole_cards() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.csv");
        std::fs::write(
            &path,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
             openb-pod-0000,12000,16384,1,1000,\n\
             openb-pod-0001,6000,12288,1,460,\n\
             openb-pod-0002,2000,1024,0,0,\n\
             openb-pod-0003,8000,2048,2,1000,\n",
        )
        .unwrap();
        let pods = openb(&path, 10, 10000).unwrap();
        assert_eq!(pods.len(), 3);
        assert_eq!(limits(&pods[1])["nvidia.com/gpumem"], "4600");
        assert_eq!(limits(&pods[1])["nvidia.com/gpucores"], "46");
        assert_eq!(limits(&pods[2])["nvidia.com/gpu"], "2");
        assert_eq!(openb(&path, 1, 10000).unwrap().len(), 1);
        std::fs::write(&path, "h\nx,1,2,one,0\n").unwrap();
        assert!(
            openb(&path, 1, 10000)
                .unwrap_err()
                .to_string()
                .contains(":2: num_gpu")
        );
    }
}
