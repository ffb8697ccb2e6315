//! The mutating admission webhook (`POST /webhook`).
//!
//! [`mutate`] decides for one pod (pure; in DRA mode it asks [`dra`] for
//! the claim shape of each GPU container); [`review`] decodes an
//! `AdmissionReview` (v1 or v1beta1) and encodes the answer in the same
//! version with a base64 JSONPatch (pure); [`handler`] is the thin actix-web
//! route around them, and the one place that asks the model for the
//! namespace's quota room (§4 step 6, no API call) and, in DRA mode, the
//! one place that creates the ResourceClaimTemplates a pod names.

pub mod dra;
pub mod handler;
pub mod mutate;
pub mod review;

use proto::hami::resources::ResourceNames;

use crate::settings::{Mode, Settings};

/// What the webhook needs to know from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Device-plugin mode (route to the extender) or DRA mode (claims).
    pub mode: Mode,
    /// Scheduler name GPU pods are routed to.
    pub scheduler_name: String,
    /// Extended resource names.
    pub resources: ResourceNames,
    /// MiB per GPU when a container asks for no memory (0 = whole card).
    pub default_memory: u32,
    /// Cores when a container asks for none.
    pub default_cores: u32,
    /// GPUs added to a container that asks only for memory or cores.
    pub default_gpu_num: u32,
    /// Multiplier applied to memory requests.
    pub memory_factor: u32,
}

impl WebhookConfig {
    /// How the scheduler reads requests with these names and defaults (the
    /// quota check counts a pod exactly as the filter will).
    #[must_use]
    pub fn request_config(&self) -> crate::core::request::RequestConfig {
        crate::core::request::RequestConfig {
            names: self.resources.clone(),
            default_memory: u64::from(self.default_memory),
            default_cores: self.default_cores,
            memory_factor: self.memory_factor,
        }
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self::from(&Settings::default())
    }
}

impl From<&Settings> for WebhookConfig {
    fn from(s: &Settings) -> Self {
        Self {
            mode: s.mode,
            scheduler_name: s.scheduler_name.clone(),
            resources: s.resources.clone(),
            default_memory: s.default_memory,
            default_cores: s.default_cores,
            default_gpu_num: s.default_gpu_num,
            memory_factor: s.memory_factor,
        }
    }
}
