//! Errors of the fake kube-apiserver and their wire form, a `metav1.Status`
//! object with the `code`, `reason`, `message` and `details` the real
//! server sends for the same failure.

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// Result alias of the fake apiserver's core.
pub type Result<T, E = ApiError> = std::result::Result<T, E>;

/// A failed API request, as the real apiserver would classify it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 404: the object (or its namespace) does not exist.
    #[error("{qualified} \"{name}\" not found")]
    NotFound {
        /// `plural[.group]`.
        qualified: String,
        /// Group of the resource (`""` for core).
        group: String,
        /// Plural resource name.
        plural: String,
        /// Object name.
        name: String,
    },
    /// 409: create of a name that is taken.
    #[error("{qualified} \"{name}\" already exists")]
    AlreadyExists {
        /// `plural[.group]`.
        qualified: String,
        /// Group of the resource.
        group: String,
        /// Plural resource name.
        plural: String,
        /// Object name.
        name: String,
    },
    /// 409: optimistic-concurrency or state conflict.
    #[error("Operation cannot be fulfilled on {qualified} \"{name}\": {why}")]
    Conflict {
        /// `plural[.group]` (or `pods/binding`).
        qualified: String,
        /// Group of the resource.
        group: String,
        /// Plural resource name.
        plural: String,
        /// Object name.
        name: String,
        /// What conflicted.
        why: String,
    },
    /// 422: the request was understood but the result is invalid.
    #[error("{message}")]
    Invalid {
        /// Message as the real server words it.
        message: String,
        /// Kind the error is about (may be empty).
        kind: String,
        /// Object name (may be empty).
        name: String,
        /// `field: message` causes.
        causes: Vec<(String, String)>,
    },
    /// 400: malformed request (bad selector, bad body, namespace mismatch).
    #[error("{0}")]
    BadRequest(String),
    /// 404 for a path the server does not serve at all.
    #[error("the server could not find the requested resource")]
    NoRoute,
    /// 405: the verb is not served on that path.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// 410: a watch asked for history that is no longer retained.
    #[error("too old resource version: {requested} ({oldest})")]
    Expired {
        /// The resourceVersion the client asked for.
        requested: u64,
        /// The oldest resourceVersion still served.
        oldest: u64,
    },
    /// 413: the body exceeds the server's limit (bytes).
    #[error("Request entity too large: limit is {0}")]
    RequestEntityTooLarge(usize),
    /// 415: unknown patch or body content type.
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(String),
    /// Any status chosen by a test through fault injection.
    #[error("{message}")]
    Injected {
        /// HTTP status code to answer with.
        code: u16,
        /// Message put into the Status.
        message: String,
    },
}

/// Reason the real server uses for an arbitrary HTTP code (used by fault
/// injection so that an injected 500 looks like a real one).
fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

impl ApiError {
    /// 404 for an object of `def`.
    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::NotFound {
            qualified: def.qualified_name(),
            group: def.group.to_string(),
            plural: def.plural.to_string(),
            name: name.to_string(),
        }
    }

    /// 409 AlreadyExists for an object of `def`.
    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::AlreadyExists {
            qualified: def.qualified_name(),
            group: def.group.to_string(),
            plural: def.plural.to_string(),
            name: name.to_string(),
        }
    }

    /// 409 Conflict: the object changed since the client read it.
    pub fn stale(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            def.qualified_name(),
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 Conflict with a custom reason text.
    pub fn conflict(def: &ResourceDef, qualified: String, name: &str, why: &str) -> Self {
        Self::Conflict {
            qualified,
            group: def.group.to_string(),
            plural: def.plural.to_string(),
            name: name.to_string(),
            why: why.to_string(),
        }
    }

    /// 422 as `errors.NewInvalid` words it.
    pub fn invalid(def: &ResourceDef, name: &str, field: &str, detail: &str) -> Self {
        Self::Invalid {
            message: format!(
                "{} \"{}\" is invalid: {}: {}",
                def.kind, name, field, detail
            ),
            kind: def.kind.to_string(),
            name: name.to_string(),
            causes: vec![(field.to_string(), detail.to_string())],
        }
    }

    /// HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound { .. } | Self::NoRoute => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } => 409,
            Self::Invalid { .. } => 422,
            Self::BadRequest(_) => 400,
            Self::MethodNotAllowed => 405,
            Self::Expired { .. } => 410,
            Self::RequestEntityTooLarge(_) => 413,
            Self::UnsupportedMediaType(_) => 415,
            Self::Injected { code, .. } => *code,
        }
    }

    /// `metav1.StatusReason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::NoRoute => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Conflict { .. } => "Conflict",
            Self::Invalid { .. } => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::Expired { .. } => "Expired",
            Self::RequestEntityTooLarge(_) => "RequestEntityTooLarge",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::Injected { code, .. } => reason_for_code(*code),
        }
    }

    /// The `metav1.Status` object sent on the wire.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let details = match self {
            Self::NotFound {
                group,
                plural,
                name,
                ..
            }
            | Self::AlreadyExists {
                group,
                plural,
                name,
                ..
            }
            | Self::Conflict {
                group,
                plural,
                name,
                ..
            } => {
                let mut d = json!({"name": name, "kind": plural});
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                Some(d)
            }
            Self::Invalid {
                kind, name, causes, ..
            } => {
                let causes: Vec<Value> = causes
                    .iter()
                    .map(|(field, message)| {
                        json!({"reason": "FieldValueInvalid", "message": message, "field": field})
                    })
                    .collect();
                let mut d = json!({});
                if !name.is_empty() {
                    d["name"] = json!(name);
                }
                if !kind.is_empty() {
                    d["kind"] = json!(kind);
                }
                if !causes.is_empty() {
                    d["causes"] = json!(causes);
                }
                Some(d)
            }
            Self::NoRoute => Some(json!({})),
            _ => None,
        };
        if let Some(details) = details {
            status["details"] = details;
        }
        status
    }
}

/// `metav1.Status` with `status: Success`, as returned by a binding create.
pub fn success(code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_status_matches_the_real_server() {
        let pods = ResourceDef::find("", "v1", "pods").unwrap();
        let status = ApiError::not_found(pods, "p1").to_status();
        assert_eq!(
            status,
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "pods \"p1\" not found", "reason": "NotFound",
                "details": {"name": "p1", "kind": "pods"}, "code": 404
            })
        );
    }

    #[test]
    fn conflict_names_the_group_of_a_lease() {
        let leases = ResourceDef::find("coordination.k8s.io", "v1", "leases").unwrap();
        let status = ApiError::stale(leases, "l").to_status();
        assert_eq!(status["code"], 409);
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["details"]["group"], "coordination.k8s.io");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .starts_with("Operation cannot be fulfilled on leases.coordination.k8s.io \"l\"")
        );
    }

    #[test]
    fn expired_carries_code_410() {
        let status = ApiError::Expired {
            requested: 3,
            oldest: 9,
        }
        .to_status();
        assert_eq!(status["code"], 410);
        assert_eq!(status["reason"], "Expired");
        assert_eq!(status["message"], "too old resource version: 3 (9)");
    }
}
