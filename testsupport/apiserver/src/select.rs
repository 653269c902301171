//! Label and field selectors, as list and watch requests carry them.

use serde_json::Value;

/// One label requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Label {
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// One field requirement: a dotted path equal (or not) to a value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Field {
    path: Vec<String>,
    value: String,
    equal: bool,
}

/// What a list or watch asks for: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    labels: Vec<Label>,
    fields: Vec<Field>,
}

/// Splits on commas outside parentheses (`k in (a,b),x` is two terms).
fn terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn set(values: &str) -> Option<Vec<String>> {
    let inner = values.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

fn label(term: &str) -> Result<Label, String> {
    let bad = || format!("unable to parse requirement: {term:?}");
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Label::NotIn(k.trim().into(), vec![v.trim().into()]));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Label::In(k.trim().into(), vec![v.trim().into()]));
    }
    if let Some((k, v)) = term.split_once(" notin ") {
        return Ok(Label::NotIn(k.trim().into(), set(v).ok_or_else(bad)?));
    }
    if let Some((k, v)) = term.split_once(" in ") {
        return Ok(Label::In(k.trim().into(), set(v).ok_or_else(bad)?));
    }
    if let Some(k) = term.strip_prefix('!') {
        return Ok(Label::Absent(k.trim().into()));
    }
    if term.contains(char::is_whitespace) {
        return Err(bad());
    }
    Ok(Label::Exists(term.into()))
}

fn field(term: &str) -> Result<Field, String> {
    let (path, value, equal) = if let Some((k, v)) = term.split_once("!=") {
        (k, v, false)
    } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        (k, v, true)
    } else {
        return Err(format!("invalid field selector: {term:?}"));
    };
    Ok(Field {
        path: path.trim().split('.').map(str::to_owned).collect(),
        value: value.trim().to_owned(),
        equal,
    })
}

impl Selector {
    /// Parses `labelSelector` and `fieldSelector` (already percent-decoded).
    pub(crate) fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, String> {
        Ok(Self {
            labels: terms(labels.unwrap_or(""))
                .into_iter()
                .map(label)
                .collect::<Result<_, _>>()?,
            fields: terms(fields.unwrap_or(""))
                .into_iter()
                .map(field)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `obj` satisfies every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let label_ok = self.labels.iter().all(|l| match l {
            Label::Exists(k) => labels.get(k).is_some(),
            Label::Absent(k) => labels.get(k).is_none(),
            Label::In(k, vs) => labels
                .get(k)
                .and_then(Value::as_str)
                .is_some_and(|v| vs.iter().any(|x| x == v)),
            Label::NotIn(k, vs) => labels
                .get(k)
                .and_then(Value::as_str)
                .is_none_or(|v| vs.iter().all(|x| x != v)),
        });
        label_ok
            && self.fields.iter().all(|f| {
                let found = f.path.iter().try_fold(obj, |v, k| v.get(k));
                let text = match found {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Null) | None => String::new(),
                    Some(other) => other.to_string(),
                };
                (text == f.value) == f.equal
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}, "involvedObject": {"kind": "StatefulSet", "name": "p"}, "reason": "FailedCreate"})
    }

    #[test]
    fn label_terms_of_every_form() {
        let o = obj(json!({"wirerate.io/pool": "p", "tier": "x"}));
        let m = |s: &str| Selector::parse(Some(s), None).unwrap().matches(&o);
        assert!(m("wirerate.io/pool"));
        assert!(m("wirerate.io/pool=p,tier==x"));
        assert!(!m("wirerate.io/pool=q"));
        assert!(m("tier!=y"));
        assert!(!m("!tier"));
        assert!(m("!other"));
        assert!(m("tier in (a, x),wirerate.io/pool"));
        assert!(!m("tier notin (x)"));
        assert!(m(""));
        assert!(Selector::parse(Some("a b"), None).is_err());
    }

    #[test]
    fn field_terms_read_dotted_paths() {
        let o = obj(json!({}));
        let m = |s: &str| Selector::parse(None, Some(s)).unwrap().matches(&o);
        assert!(m(
            "involvedObject.kind=StatefulSet,involvedObject.name=p,reason=FailedCreate"
        ));
        assert!(!m("involvedObject.name=q"));
        assert!(m("metadata.name!=b"));
    }
}
