//! kube-rs watchers over nodes, pods and resource quotas, forwarded to the
//! model's owner.
//!
//! Thin: each watcher event becomes one [`Command`]. Errors are logged and
//! the watcher retries with backoff; a relist is bracketed by
//! `RelistStarted`/`RelistDone` so objects deleted while disconnected are
//! dropped from the model.

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tracing::warn;

use super::owner::{Command, Kind, ModelHandle};

/// Runs the three watchers until the model's owner stops.
pub async fn run(client: Client, model: ModelHandle) {
    let nodes = forward(
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
        model.clone(),
        Kind::Nodes,
        |n: Node| Command::ApplyNode(Box::new(n)),
        |n: &Node| n.meta().name.clone().map(Command::DeleteNode),
    );
    let pods = forward(
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
        model.clone(),
        Kind::Pods,
        |p: Pod| Command::ApplyPod(Box::new(p)),
        |p: &Pod| p.meta().uid.clone().map(Command::DeletePod),
    );
    let quotas = forward(
        watcher(
            Api::<ResourceQuota>::all(client),
            watcher::Config::default(),
        ),
        model,
        Kind::Quotas,
        |q: ResourceQuota| Command::ApplyQuota(Box::new(q)),
        |q: &ResourceQuota| {
            let meta = q.meta();
            Some(Command::DeleteQuota {
                namespace: meta.namespace.clone()?,
                name: meta.name.clone()?,
            })
        },
    );
    tokio::join!(nodes, pods, quotas);
}

async fn forward<K, S>(
    stream: S,
    model: ModelHandle,
    kind: Kind,
    apply: impl Fn(K) -> Command,
    delete: impl Fn(&K) -> Option<Command>,
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut stream = std::pin::pin!(stream.default_backoff());
    while let Some(event) = stream.next().await {
        let command = match event {
            Ok(watcher::Event::Init) => Some(Command::RelistStarted(kind)),
            Ok(watcher::Event::InitApply(obj) | watcher::Event::Apply(obj)) => Some(apply(obj)),
            Ok(watcher::Event::InitDone) => Some(Command::RelistDone(kind)),
            Ok(watcher::Event::Delete(obj)) => delete(&obj),
            Err(error) => {
                warn!(?kind, %error, "watch failed; retrying with backoff");
                None
            }
        };
        if let Some(command) = command
            && model.send(command).await.is_err()
        {
            return;
        }
    }
}
