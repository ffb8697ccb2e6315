//! The command line, and the only I/O: reading nodes, pods and events
//! through the user's kubeconfig (read-only).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use proto::hami::keys;

use crate::inventory::Inventory;
use crate::render::{self, Output};
use crate::why::explain;

/// Who holds which slice of which GPU, and why a GPU pod is Pending.
///
/// Works on clusters scheduled by gpuslice or by HAMi (the same
/// annotations). Needs read access to nodes, pods and events only.
#[derive(Debug, Parser)]
#[command(name = "kubectl-gpuslice", bin_name = "kubectl gpuslice", version)]
pub struct Cli {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value = "table")]
    pub output: Output,
    /// The GPU count resource pods ask for.
    #[arg(long, global = true, default_value = "nvidia.com/gpu")]
    pub resource_name: String,
    /// What to show.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Allocation per node, per GPU or per pod.
    Top {
        /// What to list.
        #[command(subcommand)]
        what: Top,
    },
    /// Why a pod is Pending (the scheduler's reasons, by reason), or which
    /// GPUs it got and why that node.
    Why {
        /// The pod's name.
        pod: String,
        /// Its namespace (default: the context's).
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

/// `top` targets.
#[derive(Debug, Subcommand)]
pub enum Top {
    /// Per node: GPUs, memory, cores and slots allocated, unhealthy GPUs.
    Nodes,
    /// Per GPU: model, memory and cores bars, the pods holding it.
    Gpus {
        /// Only this node's GPUs.
        #[arg(long)]
        node: Option<String>,
    },
    /// Per GPU pod: node, GPUs, memory, cores, bind phase, time allocating.
    Pods {
        /// Only this namespace (default: the context's).
        #[arg(short, long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
}

async fn client(cli: &Cli) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options).await?
        }
        None => Config::from_kubeconfig(&options)
            .await
            .context("no kubeconfig found (set --kubeconfig or $KUBECONFIG)")?,
    };
    Ok(Client::try_from(config)?)
}

fn colour(output: Output) -> bool {
    matches!(output, Output::Table | Output::Wide)
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none()
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Runs one command and returns what to print.
///
/// # Errors
/// The cluster cannot be read, has no gpuslice/HAMi node, or the pod does
/// not exist.
pub async fn run(cli: Cli) -> anyhow::Result<String> {
    let client = client(&cli).await?;
    let default_ns = client.default_namespace().to_owned();
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items;
    if !nodes.iter().any(|n| {
        n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(keys::NODE_NVIDIA_REGISTER))
    }) {
        bail!(
            "no node in this cluster carries {}: gpuslice (or HAMi) is not installed here, or its node daemons have not registered any GPU yet",
            keys::NODE_NVIDIA_REGISTER
        );
    }
    let output = cli.output;
    match &cli.command {
        Command::Top { what } => {
            let namespace = match what {
                Top::Pods {
                    namespace,
                    all_namespaces: false,
                } => Some(namespace.clone().unwrap_or(default_ns)),
                _ => None,
            };
            let pods_api: Api<Pod> = match &namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            let pods = pods_api
                .list(&ListParams::default())
                .await
                .context("listing pods")?
                .items;
            let inventory = Inventory::build(&nodes, &pods, &cli.resource_name, now_unix());
            Ok(match what {
                Top::Nodes => match output {
                    Output::Json | Output::Yaml => render::structured(&inventory.nodes, output)?,
                    _ => render::nodes(&inventory.nodes, output, colour(output)),
                },
                Top::Gpus { node } => {
                    let gpus: Vec<_> = inventory
                        .gpus
                        .into_iter()
                        .filter(|g| node.as_ref().is_none_or(|n| &g.node == n))
                        .collect();
                    if let Some(n) = node
                        && gpus.is_empty()
                    {
                        bail!("node {n} has no GPU registered");
                    }
                    match output {
                        Output::Json | Output::Yaml => render::structured(&gpus, output)?,
                        _ => render::gpus(&gpus, output, colour(output)),
                    }
                }
                Top::Pods { .. } => match output {
                    Output::Json | Output::Yaml => render::structured(&inventory.pods, output)?,
                    _ => render::pods(&inventory.pods, output),
                },
            })
        }
        Command::Why { pod, namespace } => {
            let ns = namespace.clone().unwrap_or(default_ns);
            let found = Api::<Pod>::namespaced(client.clone(), &ns)
                .get_opt(pod)
                .await
                .with_context(|| format!("reading pod {ns}/{pod}"))?
                .with_context(|| format!("pod {ns}/{pod} not found"))?;
            let fields = format!("involvedObject.kind=Pod,involvedObject.name={pod}");
            let events: Vec<Event> = Api::<Event>::namespaced(client, &ns)
                .list(&ListParams::default().fields(&fields))
                .await
                .context("listing the pod's events")?
                .items
                .into_iter()
                // A pod of the same name before this one left events too.
                .filter(|e| {
                    e.involved_object.uid.is_none() || e.involved_object.uid == found.metadata.uid
                })
                .collect();
            let why = explain(&found, &events);
            Ok(match output {
                Output::Json | Output::Yaml => render::structured(&why, output)?,
                _ => render::why(&ns, pod, &why),
            })
        }
    }
}
