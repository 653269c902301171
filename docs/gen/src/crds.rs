//! The CRD reference, written from the OpenAPI schemas the API server
//! enforces: every field with its type, default, bounds and description,
//! and every admission rule with its message.

use std::fmt::Write as _;

use serde_json::Value;

use crate::markdown::{cell, code};

/// Fields of Kubernetes' own types, documented by Kubernetes: listed with
/// their type, not field by field.
const KUBERNETES_TYPES: &[(&str, &str)] = &[
    ("spec.affinity", "core/v1 Affinity"),
    ("spec.tolerations", "list of core/v1 Toleration"),
    ("spec.resources", "core/v1 ResourceRequirements"),
    ("status.conditions", "list of meta/v1 Condition"),
];

/// One row of a kind's field table.
struct Field {
    path: String,
    kind: String,
    default: Option<String>,
    meaning: String,
}

/// One admission rule: where it sits and what it says when it refuses.
struct Rule {
    path: String,
    message: String,
}

/// The whole page, from the CRDs as JSON.
pub fn page(crds: &[Value]) -> String {
    let mut out = format!(
        "# DtnPool, Transfer, DtnPoolBinding\n\n{}\n\nThe fields of wirerate's kinds \
         (API group `wirerate.io`, version `v1alpha1`), as the CRDs' schemas \
         declare them. Kubernetes refuses an object that breaks a bound or a \
         rule at `kubectl apply`, with the message shown. How they are used \
         is in [Transfers](../user/transfers.md) and [DtnPools](../admin/dtnpools.md).\n",
        crate::GENERATED
    );
    for crd in crds {
        kind_section(&mut out, crd);
    }
    out
}

fn kind_section(out: &mut String, crd: &Value) {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let version = &spec["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let kind = names["kind"].as_str().unwrap_or_default();
    let _ = write!(out, "\n## {kind}\n\n");
    if let Some(d) = schema["description"].as_str() {
        let _ = write!(out, "{}\n\n", cell(d));
    }
    let short: Vec<String> = strings(&names["shortNames"])
        .iter()
        .map(|s| code(s))
        .collect();
    let _ = writeln!(
        out,
        "`kubectl get {}`{}; {}.",
        names["plural"].as_str().unwrap_or_default(),
        if short.is_empty() {
            String::new()
        } else {
            format!(" (or {})", short.join(", "))
        },
        spec["scope"].as_str().unwrap_or_default().to_lowercase()
    );
    columns(out, &version["additionalPrinterColumns"]);

    let (mut fields, mut rules) = (Vec::new(), Vec::new());
    walk(schema, "", false, &mut fields, &mut rules);
    let _ = write!(
        out,
        "\n### {kind} fields\n\n| field | type | default | meaning |\n|---|---|---|---|\n"
    );
    for f in fields.iter().filter(|f| !f.path.is_empty()) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            code(&f.path),
            cell(&f.kind),
            f.default.as_deref().map(code).unwrap_or_default(),
            cell(&f.meaning)
        );
    }
    if !rules.is_empty() {
        let _ = write!(
            out,
            "\n### {kind} rules\n\n| on | refused with |\n|---|---|\n"
        );
        for r in &rules {
            let on = if r.path.is_empty() {
                "the object".to_string()
            } else {
                code(&r.path)
            };
            let _ = writeln!(out, "| {on} | {} |", cell(&r.message));
        }
    }
}

/// The columns `kubectl get` prints beyond the name.
fn columns(out: &mut String, cols: &Value) {
    let Some(cols) = cols.as_array() else { return };
    let named: Vec<String> = cols
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or_default();
            match c["description"].as_str() {
                Some(d) => format!("{name} ({})", d.to_lowercase()),
                None => name.to_string(),
            }
        })
        .collect();
    if !named.is_empty() {
        let _ = writeln!(out, "Its columns: {}.", cell(&named.join(", ")));
    }
}

/// Adds `schema`'s field at `path`, then its children, in the schema's
/// (alphabetical) order.
fn walk(
    schema: &Value,
    path: &str,
    required: bool,
    fields: &mut Vec<Field>,
    rules: &mut Vec<Rule>,
) {
    for r in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let message = r["message"]
            .as_str()
            .or(r["rule"].as_str())
            .unwrap_or_default();
        rules.push(Rule {
            path: path.to_string(),
            message: message.to_string(),
        });
    }
    let kubernetes = KUBERNETES_TYPES.iter().find(|(p, _)| *p == path);
    fields.push(Field {
        path: path.to_string(),
        kind: kubernetes
            .map(|(_, t)| t.to_string())
            .unwrap_or_else(|| type_of(schema)),
        default: (!schema["default"].is_null()).then(|| plain(&schema["default"])),
        meaning: meaning(schema, required),
    });
    if kubernetes.is_some() {
        return;
    }
    let required_here = strings(&schema["required"]);
    if let Some(props) = schema["properties"].as_object() {
        for (name, child) in props {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            walk(child, &p, required_here.contains(name), fields, rules);
        }
    } else if let Some(items) = schema.get("items").filter(|i| i["properties"].is_object()) {
        for (name, child) in items["properties"].as_object().into_iter().flatten() {
            let req = strings(&items["required"]).contains(name);
            walk(child, &format!("{path}[].{name}"), req, fields, rules);
        }
        for r in items["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            rules.push(Rule {
                path: format!("{path}[]"),
                message: r["message"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
}

/// The field's type as a reader names it.
fn type_of(s: &Value) -> String {
    if s["x-kubernetes-int-or-string"] == Value::Bool(true) {
        return "integer or string".into();
    }
    match s["type"].as_str().unwrap_or("any") {
        "array" => match s["items"]["properties"].is_object() {
            true => "list of objects".into(),
            false => format!("list of {}", type_of(&s["items"])),
        },
        "object" if s["additionalProperties"].is_object() => {
            format!("map of {}", type_of(&s["additionalProperties"]))
        }
        t => match s["format"].as_str() {
            Some(f) if f != "int32" && f != "int64" && f != "double" => format!("{t} ({f})"),
            _ => t.to_string(),
        },
    }
}

/// The description, then what it does not say: the values allowed, the
/// bounds, and whether the field is required.
fn meaning(s: &Value, required: bool) -> String {
    let mut text = s["description"].as_str().unwrap_or_default().to_string();
    let mut add = |t: String| {
        if !text.is_empty() && !text.ends_with('.') {
            text.push('.');
        }
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&t);
    };
    if let Some(values) = s["enum"].as_array() {
        let v: Vec<String> = values.iter().map(|v| code(&plain(v))).collect();
        add(format!("One of {}.", v.join(", ")));
    }
    let bound = |k: &str| s[k].as_f64().map(number);
    match (bound("minimum"), bound("maximum")) {
        (Some(lo), Some(hi)) => add(format!("From {lo} to {hi}.")),
        (Some(lo), None) => add(format!("At least {lo}.")),
        (None, Some(hi)) => add(format!("At most {hi}.")),
        (None, None) => {}
    }
    for (key, what) in [
        ("maxLength", "character"),
        ("maxItems", "item"),
        ("maxProperties", "entry"),
    ] {
        if let Some(n) = bound(key) {
            add(format!("At most {}.", count(&n, what)));
        }
    }
    if let Some(n) = bound("minItems") {
        add(format!("At least {}.", count(&n, "item")));
    }
    match bound("minLength").as_deref() {
        None | Some("0") => {}
        Some("1") => add("Not empty.".into()),
        Some(n) => add(format!("At least {n} characters.")),
    }
    if let Some(p) = s["pattern"].as_str() {
        add(format!("Matches {}.", code(p)));
    }
    if required {
        add("Required.".into());
    }
    text
}

/// "1 item", "16 items", "8 entries".
fn count(n: &str, what: &str) -> String {
    match (n, what.strip_suffix('y')) {
        ("1", _) => format!("1 {what}"),
        (_, Some(stem)) => format!("{n} {stem}ies"),
        (_, None) => format!("{n} {what}s"),
    }
}

/// A bound as people write it: 256, not 256.0.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        v.to_string()
    }
}

/// A JSON scalar without its quotes.
fn plain(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crds() -> Vec<Value> {
        wirerate_crds::crds()
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect()
    }

    /// Every field path of `schema` outside Kubernetes' own types, and
    /// every rule message.
    fn paths(schema: &Value, path: &str, out: &mut Vec<String>, messages: &mut Vec<String>) {
        for r in schema["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            messages.push(r["message"].as_str().unwrap_or_default().to_string());
        }
        if !path.is_empty() {
            out.push(path.to_string());
        }
        if KUBERNETES_TYPES.iter().any(|(p, _)| *p == path) {
            return;
        }
        for (name, child) in schema["properties"].as_object().into_iter().flatten() {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            paths(child, &p, out, messages);
        }
        for (name, child) in schema["items"]["properties"]
            .as_object()
            .into_iter()
            .flatten()
        {
            paths(child, &format!("{path}[].{name}"), out, messages);
        }
        for r in schema["items"]["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            messages.push(r["message"].as_str().unwrap_or_default().to_string());
        }
    }

    #[test]
    fn every_field_and_every_rule_message_is_on_the_page() {
        let crds = crds();
        let text = page(&crds);
        let (mut all, mut messages) = (Vec::new(), Vec::new());
        for crd in &crds {
            paths(
                &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
                "",
                &mut all,
                &mut messages,
            );
        }
        assert!(all.len() > 150, "only {} fields", all.len());
        assert!(messages.len() > 20, "only {} rules", messages.len());
        for p in all {
            assert!(text.contains(&format!("| `{p}` |")), "{p} is missing");
        }
        for m in messages {
            assert!(text.contains(&cell(&m)), "rule message {m:?} is missing");
        }
    }

    #[test]
    fn kubernetes_types_are_named_not_expanded_and_each_still_exists() {
        let text = page(&crds());
        for (path, kind) in KUBERNETES_TYPES {
            assert!(
                text.contains(&format!("| `{path}` | {kind} |")),
                "{path} is not shown as {kind}: was the field removed or renamed?"
            );
            assert!(!text.contains(&format!("`{path}.")), "{path} is expanded");
            assert!(!text.contains(&format!("`{path}[].")), "{path} is expanded");
        }
    }

    #[test]
    fn bounds_defaults_and_required_fields_are_said() {
        let text = page(&crds());
        let streams = text
            .lines()
            .find(|l| l.starts_with("| `spec.tuning.streams` |"))
            .unwrap();
        assert!(streams.contains("From 1 to 256."), "{streams}");
        let source = text
            .lines()
            .find(|l| l.starts_with("| `spec.source` |"))
            .unwrap();
        assert!(source.contains("Required."), "{source}");
    }
}
