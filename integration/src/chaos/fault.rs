//! The kinds of fault the chaos soak injects.

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// The next 1–3 writes to a path answered 409 Conflict.
    Api409,
    /// The next 1–3 requests to a path answered 500.
    Api500,
    /// Every open watch cut.
    WatchCut,
    /// A node-daemon killed, started again 1–6 s later.
    KillNodeDaemon,
    /// The scheduler-webhook killed, started again 1–6 s later.
    KillSchedulerWebhook,
    /// A kubelet killed, started again 1–6 s later.
    KillKubelet,
    /// A GPU reported unhealthy, healthy again 3–15 s later.
    GpuUnhealthy,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [Self; 7] = [
        Self::Api409,
        Self::Api500,
        Self::WatchCut,
        Self::KillNodeDaemon,
        Self::KillSchedulerWebhook,
        Self::KillKubelet,
        Self::GpuUnhealthy,
    ];

    /// Its name in reports.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api409 => "API 409",
            Self::Api500 => "API 500",
            Self::WatchCut => "watches cut",
            Self::KillNodeDaemon => "node-daemon killed",
            Self::KillSchedulerWebhook => "scheduler-webhook killed",
            Self::KillKubelet => "kubelet killed",
            Self::GpuUnhealthy => "GPU unhealthy",
        }
    }

    /// Whether only the fake apiserver can inject it.
    #[must_use]
    pub fn needs_fake_apiserver(self) -> bool {
        matches!(self, Self::Api409 | Self::Api500 | Self::WatchCut)
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
