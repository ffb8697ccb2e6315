//! Label and field selectors as the apiserver parses and applies them
//! (`labelSelector=app=a,tier!=db,env in (x,y),!legacy`,
//! `fieldSelector=spec.nodeName=n1,status.phase!=Failed`).
//!
//! Owns parsing and matching only; which field labels a resource accepts is
//! in `resources`.

use serde_json::Value;

use super::resources::ResourceDef;

/// A selector string that does not parse, or a field label the resource
/// does not support. Both are answered with 400 BadRequest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The label selector is malformed.
    #[error("unable to parse requirement: {0}")]
    Label(String),
    /// The field selector is malformed.
    #[error("invalid selector: '{0}'; can't understand '{1}'")]
    Field(String, String),
    /// The field label is not registered for the resource.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<(String, LabelOp)>,
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// `(label, wanted value, true for '=' / false for '!=')`.
    terms: Vec<(String, String, bool)>,
}

/// Splits at commas outside parentheses.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn valid_label_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(term: &str, rest: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Label(term.to_string()))?;
    let values: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        return Err(SelectorError::Label(term.to_string()));
    }
    Ok(values)
}

fn parse_label_term(term: &str) -> Result<(String, LabelOp), SelectorError> {
    let bad = || SelectorError::Label(term.to_string());
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        return valid_label_key(key)
            .then(|| (key.to_string(), LabelOp::DoesNotExist))
            .ok_or_else(bad);
    }
    if let Some(open) = term.find('(') {
        let head: Vec<&str> = term[..open].split_whitespace().collect();
        let [key, op] = head.as_slice() else {
            return Err(bad());
        };
        if !valid_label_key(key) {
            return Err(bad());
        }
        let values = parse_set(term, &term[open..])?;
        return match *op {
            "in" => Ok((key.to_string(), LabelOp::In(values))),
            "notin" => Ok((key.to_string(), LabelOp::NotIn(values))),
            _ => Err(bad()),
        };
    }
    let (key, op) = if let Some((k, v)) = term.split_once("!=") {
        (k, LabelOp::NotEquals(v.trim().to_string()))
    } else if let Some((k, v)) = term.split_once("==") {
        (k, LabelOp::Equals(v.trim().to_string()))
    } else if let Some((k, v)) = term.split_once('=') {
        (k, LabelOp::Equals(v.trim().to_string()))
    } else {
        (term, LabelOp::Exists)
    };
    let key = key.trim();
    if !valid_label_key(key) {
        return Err(bad());
    }
    Ok((key.to_string(), op))
}

impl LabelSelector {
    /// Parses the `labelSelector` query value.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in split_top_level(input) {
            let term = term.trim();
            if term.is_empty() {
                return Err(SelectorError::Label(input.to_string()));
            }
            requirements.push(parse_label_term(term)?);
        }
        Ok(Self { requirements })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.requirements.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                LabelOp::Equals(want) => value == Some(want.as_str()),
                LabelOp::NotEquals(want) => value != Some(want.as_str()),
                LabelOp::In(set) => value.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::NotIn(set) => value.is_none_or(|v| set.iter().all(|s| s != v)),
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
            }
        })
    }
}

/// Splits at commas not escaped with a backslash and unescapes `\,`, `\=`,
/// `\\` in each part.
fn split_escaped(input: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = input.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    current.push('\\');
                    current.push(next);
                }
            }
            ',' => parts.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
}

fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Finds the first operator not preceded by a backslash.
fn find_unescaped(term: &str, op: &str) -> Option<usize> {
    let mut search_from = 0;
    while let Some(pos) = term[search_from..].find(op) {
        let at = search_from + pos;
        if !term[..at].ends_with('\\') {
            return Some(at);
        }
        search_from = at + op.len();
    }
    None
}

/// The JSON path a field label reads (`source` is `source.component`).
fn field_path(label: &str) -> &str {
    match label {
        "source" => "source.component",
        other => other,
    }
}

/// String form of a field as the real server's field set renders it: a
/// missing string is `""`, a missing boolean is `"false"`.
fn field_value(object: &Value, label: &str) -> String {
    let mut node = object;
    for part in field_path(label).split('.') {
        match node.get(part) {
            Some(next) => node = next,
            None => {
                return match label {
                    "spec.hostNetwork" | "spec.unschedulable" => "false".to_string(),
                    _ => String::new(),
                };
            }
        }
    }
    match node {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl FieldSelector {
    /// Parses the `fieldSelector` query value and checks every label
    /// against the resource.
    pub fn parse(input: &str, def: &ResourceDef) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        if input.trim().is_empty() {
            return Ok(Self { terms });
        }
        for term in split_escaped(input) {
            let bad = || SelectorError::Field(input.to_string(), term.clone());
            let (label, value, equal) = if let Some(at) = find_unescaped(&term, "!=") {
                (&term[..at], &term[at + 2..], false)
            } else if let Some(at) = find_unescaped(&term, "==") {
                (&term[..at], &term[at + 2..], true)
            } else if let Some(at) = find_unescaped(&term, "=") {
                (&term[..at], &term[at + 1..], true)
            } else {
                return Err(bad());
            };
            let label = label.trim();
            if label.is_empty() {
                return Err(bad());
            }
            if !def.supports_field_label(label) {
                return Err(SelectorError::UnsupportedField(label.to_string()));
            }
            terms.push((label.to_string(), unescape(value), equal));
        }
        Ok(Self { terms })
    }

    /// The value an `=` (or `==`) term asks of `label`, if one does.
    #[must_use]
    pub fn required(&self, label: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|(l, _, equal)| *equal && l == label)
            .map(|(_, want, _)| want.as_str())
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|(label, want, equal)| (field_value(object, label) == *want) == *equal)
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether the object passes both.
    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value, node: Option<&str>, phase: &str) -> Value {
        let mut p = json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": labels},
            "spec": {"schedulerName": "s"},
            "status": {"phase": phase},
        });
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    fn pods() -> &'static ResourceDef {
        ResourceDef::find("", "v1", "pods").unwrap()
    }

    #[test]
    fn label_operators_behave_like_kubernetes() {
        let p = pod(json!({"app": "a", "tier": "web"}), None, "Pending");
        let cases = [
            ("", true),
            ("app=a", true),
            ("app==a", true),
            ("app=b", false),
            ("app!=b", true),
            ("missing!=x", true),
            ("tier in (web, db)", true),
            ("tier in (db)", false),
            ("tier notin (db)", true),
            ("missing notin (db)", true),
            ("missing in (db)", false),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=a,tier in (web),!missing", true),
            ("app=a,tier=db", false),
        ];
        for (selector, want) in cases {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(&p), want, "selector {selector:?}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_rejected() {
        for bad in ["app in web", "=x", "a,,b", "!", "x in ()", "a b (c)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn field_selectors_read_spec_and_status() {
        let bound = pod(json!({}), Some("n1"), "Running");
        let pending = pod(json!({}), None, "Pending");
        let unbound = FieldSelector::parse("spec.nodeName=", pods()).unwrap();
        assert!(unbound.matches(&pending));
        assert!(!unbound.matches(&bound));
        let on_n1 = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", pods()).unwrap();
        assert!(on_n1.matches(&bound));
        assert!(!on_n1.matches(&pending));
        let by_name =
            FieldSelector::parse("metadata.name==p,metadata.namespace=ns", pods()).unwrap();
        assert!(by_name.matches(&bound));
        let by_scheduler = FieldSelector::parse("spec.schedulerName!=s", pods()).unwrap();
        assert!(!by_scheduler.matches(&bound));
    }

    #[test]
    fn unsupported_field_labels_are_rejected() {
        assert_eq!(
            FieldSelector::parse("spec.containers=x", pods()),
            Err(SelectorError::UnsupportedField("spec.containers".into()))
        );
        assert!(FieldSelector::parse("spec.nodeName", pods()).is_err());
    }

    #[test]
    fn escaped_commas_stay_in_the_value() {
        let sel = FieldSelector::parse(r"metadata.name=a\,b", pods()).unwrap();
        let mut p = pod(json!({}), None, "Pending");
        p["metadata"]["name"] = json!("a,b");
        assert!(sel.matches(&p));
    }
}
