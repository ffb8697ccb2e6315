//! Pod events (`FilteringSucceed`, `FilteringFailed`, `BindingSucceed`,
//! `BindingFailed`, as HAMi emits them), written off the request path.
//!
//! Handlers hand an [`PodEvent`] to an [`EventSink`] and return at once; one
//! background task creates core/v1 Events, so the filter path never waits
//! on the API server (and a slow API server drops events, not decisions).

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tracing::debug;

/// Reporting component name on every event.
pub const COMPONENT: &str = "gpuslice-scheduler";

/// One event about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// `Normal` or `Warning`.
    pub warning: bool,
    /// CamelCase reason, e.g. `FilteringFailed`.
    pub reason: &'static str,
    /// Human message.
    pub message: String,
}

/// Where handlers drop events.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: Option<mpsc::Sender<PodEvent>>,
}

impl EventSink {
    /// A sink that drops everything (tests, dry runs).
    #[must_use]
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    /// Starts the writer task; events beyond `capacity` waiting are dropped.
    #[must_use]
    pub fn spawn(client: Client, capacity: usize) -> Self {
        let (tx, mut rx) = mpsc::channel::<PodEvent>(capacity);
        tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                let api: Api<Event> = Api::namespaced(client.clone(), &event.namespace);
                if let Err(error) = api.create(&PostParams::default(), &to_event(&event)).await {
                    debug!(pod = %event.name, reason = event.reason, %error, "event not written");
                }
            }
        });
        Self { tx: Some(tx) }
    }

    /// Queues an event; never waits.
    pub fn emit(&self, event: PodEvent) {
        if let Some(tx) = &self.tx
            && tx.try_send(event).is_err()
        {
            debug!("event queue full; event dropped");
        }
    }
}

fn to_event(e: &PodEvent) -> Event {
    let now = k8s_openapi::jiff::Timestamp::now();
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", e.name)),
            namespace: Some(e.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(e.name.clone()),
            namespace: Some(e.namespace.clone()),
            uid: Some(e.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(e.reason.to_owned()),
        message: Some(e.message.clone()),
        type_: Some(if e.warning { "Warning" } else { "Normal" }.to_owned()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        reporting_component: Some(COMPONENT.to_owned()),
        reporting_instance: Some(COMPONENT.to_owned()),
        action: Some(
            if e.reason.starts_with("Binding") {
                "Binding"
            } else {
                "Scheduling"
            }
            .to_owned(),
        ),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some(COMPONENT.to_owned()),
            host: None,
        }),
        ..Event::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_the_pod_and_carry_the_reason() {
        let e = to_event(&PodEvent {
            namespace: "ns".into(),
            name: "train-0".into(),
            uid: "u1".into(),
            warning: true,
            reason: "FilteringFailed",
            message: "0/2 nodes fit: n1: 1/1 CardInsufficientMemory".into(),
        });
        assert_eq!(e.involved_object.name.as_deref(), Some("train-0"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("FilteringFailed"));
        assert_eq!(e.metadata.generate_name.as_deref(), Some("train-0."));
    }

    #[test]
    fn a_disabled_sink_drops_without_panicking() {
        EventSink::disabled().emit(PodEvent {
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
            warning: false,
            reason: "BindingSucceed",
            message: String::new(),
        });
    }
}
