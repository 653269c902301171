//! Server-side apply, approximated: enough of it that the fields the
//! operator relies on come out as a real API server leaves them.
//!
//! - Maps merge deeply; lists that the schema declares
//!   `x-kubernetes-list-type: map` merge item by item on their keys (a
//!   Transfer's `status.reports` by `role`, `conditions` by `type`); every
//!   other list, and every scalar, is replaced.
//! - Each apply records the fields it set, per field manager (and per
//!   subresource). A field that a manager applied last time and omits now is
//!   removed, unless another manager's last apply still sets it. This is how
//!   the operator drops `status.queuePosition` or an assignment label: it
//!   simply stops applying them. A map left empty by such a removal goes too
//!   (`status.sender` after a failover), and a list-map item the manager
//!   stops applying goes as a whole.
//!
//! Not modelled: ownership through non-apply writes (create, update, merge
//! and JSON patches own nothing here), conflicts (every apply is treated as
//! forced; the operator and the agents always force), and ownership moving
//! between appliers that set different values (both keep their claim).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Seg {
    /// A map member.
    Field(String),
    /// The item of a list-map with these key values (canonical JSON).
    Item(String),
}

/// What a path ends at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    /// A scalar or an atomic list.
    Leaf,
    /// A map; removed only once empty.
    Map,
    /// A list-map; removed only once empty.
    List,
    /// One item of a list-map; removed as a whole.
    Item,
}

/// The fields one apply set.
pub(crate) type FieldSet = BTreeMap<Vec<Seg>, Node>;

/// Lists merged by key: dotted path to key field names.
pub(crate) type ListKeys = BTreeMap<String, Vec<String>>;

fn join(dotted: &str, name: &str) -> String {
    if dotted.is_empty() {
        name.to_owned()
    } else {
        format!("{dotted}.{name}")
    }
}

/// The key of a list-map item, or None if it lacks a key field.
fn item_key(item: &Value, keys: &[String]) -> Option<String> {
    let mut m = Map::new();
    for k in keys {
        m.insert(k.clone(), item.get(k)?.clone());
    }
    Some(Value::Object(m).to_string())
}

/// Collects the fields `applied` sets beneath `path`.
pub(crate) fn fields(applied: &Value, keys: &ListKeys) -> FieldSet {
    let mut out = FieldSet::new();
    collect(applied, keys, "", &mut Vec::new(), &mut out);
    // Identity is not a field anyone can drop.
    for p in [
        vec![Seg::Field("apiVersion".into())],
        vec![Seg::Field("kind".into())],
        vec![Seg::Field("metadata".into()), Seg::Field("name".into())],
        vec![
            Seg::Field("metadata".into()),
            Seg::Field("namespace".into()),
        ],
        vec![Seg::Field("metadata".into())],
    ] {
        out.remove(&p);
    }
    out
}

fn collect(v: &Value, keys: &ListKeys, dotted: &str, path: &mut Vec<Seg>, out: &mut FieldSet) {
    match v {
        Value::Object(m) => {
            if !path.is_empty() {
                out.insert(path.clone(), Node::Map);
            }
            for (k, child) in m {
                path.push(Seg::Field(k.clone()));
                collect(child, keys, &join(dotted, k), path, out);
                path.pop();
            }
        }
        Value::Array(items) if keys.contains_key(dotted) => {
            out.insert(path.clone(), Node::List);
            for item in items {
                let Some(key) = item_key(item, &keys[dotted]) else {
                    continue;
                };
                path.push(Seg::Item(key));
                out.insert(path.clone(), Node::Item);
                if let Value::Object(m) = item {
                    for (k, child) in m {
                        path.push(Seg::Field(k.clone()));
                        collect(child, keys, &join(dotted, k), path, out);
                        path.pop();
                    }
                }
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone(), Node::Leaf);
        }
    }
}

/// Merges `applied` into `live`.
pub(crate) fn merge(live: &mut Value, applied: &Value, keys: &ListKeys) {
    merge_at(live, applied, keys, "");
}

fn merge_at(live: &mut Value, applied: &Value, keys: &ListKeys, dotted: &str) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, v) in a {
                let slot = l.entry(k.clone()).or_insert(Value::Null);
                merge_at(slot, v, keys, &join(dotted, k));
            }
        }
        (Value::Array(l), Value::Array(a)) if keys.contains_key(dotted) => {
            let ks = &keys[dotted];
            for item in a {
                let key = item_key(item, ks);
                match l
                    .iter_mut()
                    .find(|x| key.is_some() && item_key(x, ks) == key)
                {
                    Some(x) => merge_at(x, item, keys, dotted),
                    None => l.push(item.clone()),
                }
            }
        }
        (l, a) => *l = a.clone(),
    }
}

/// Removes from `obj` what `old` set and `new` does not, unless `others` set it.
pub(crate) fn drop_omitted<'a>(
    obj: &mut Value,
    old: &FieldSet,
    new: &FieldSet,
    others: impl Iterator<Item = &'a FieldSet> + Clone,
    keys: &ListKeys,
) {
    let dropped: Vec<(&Vec<Seg>, Node)> = old
        .iter()
        .filter(|(p, _)| !new.contains_key(*p))
        .filter(|(p, _)| !others.clone().any(|o| o.contains_key(*p)))
        .map(|(p, n)| (p, *n))
        .collect();
    // Leaves and whole items first; containers once they are empty,
    // deepest first, so a map emptied by its children goes too.
    for (p, n) in &dropped {
        if matches!(n, Node::Leaf | Node::Item) {
            remove(obj, p, keys, false);
        }
    }
    let mut containers: Vec<&Vec<Seg>> = dropped
        .iter()
        .filter(|(_, n)| matches!(n, Node::Map | Node::List))
        .map(|(p, _)| *p)
        .collect();
    containers.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in containers {
        remove(obj, p, keys, true);
    }
}

/// Removes the node at `path`; with `if_empty`, only an empty map or list.
fn remove(obj: &mut Value, path: &[Seg], keys: &ListKeys, if_empty: bool) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut dotted = String::new();
    let mut cur = obj;
    for seg in parent_path {
        cur = match (seg, cur) {
            (Seg::Field(k), Value::Object(m)) => {
                dotted = join(&dotted, k);
                match m.get_mut(k) {
                    Some(v) => v,
                    None => return,
                }
            }
            (Seg::Item(key), Value::Array(items)) => {
                let Some(ks) = keys.get(&dotted) else { return };
                match items
                    .iter_mut()
                    .find(|x| item_key(x, ks).as_deref() == Some(key))
                {
                    Some(v) => v,
                    None => return,
                }
            }
            _ => return,
        };
    }
    let empty = |v: &Value| match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    match (last, cur) {
        (Seg::Field(k), Value::Object(m)) if !if_empty || m.get(k).is_some_and(empty) => {
            m.remove(k);
        }
        (Seg::Item(key), Value::Array(items)) => {
            if let Some(ks) = keys.get(&dotted) {
                items.retain(|x| item_key(x, ks).as_deref() != Some(key.as_str()));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys() -> ListKeys {
        BTreeMap::from([
            ("status.reports".to_owned(), vec!["role".to_owned()]),
            ("status.conditions".to_owned(), vec!["type".to_owned()]),
        ])
    }

    /// One manager's apply onto `live`, as the store runs it.
    fn apply(live: &mut Value, applied: &Value, old: &FieldSet, others: &[&FieldSet]) -> FieldSet {
        let k = keys();
        let new = fields(applied, &k);
        merge(live, applied, &k);
        drop_omitted(live, old, &new, others.iter().copied(), &k);
        new
    }

    #[test]
    fn list_maps_merge_by_key_and_other_lists_are_replaced() {
        let mut live = json!({"status": {"reports": [{"role": "Sender", "state": "Running"}], "failovers": [1, 2]}});
        let applied = json!({"status": {"reports": [{"role": "Receiver", "state": "Running"}, {"role": "Sender", "state": "Succeeded"}], "failovers": [3]}});
        merge(&mut live, &applied, &keys());
        assert_eq!(
            live["status"]["reports"],
            json!([{"role": "Sender", "state": "Succeeded"}, {"role": "Receiver", "state": "Running"}])
        );
        assert_eq!(live["status"]["failovers"], json!([3]));
    }

    #[test]
    fn a_field_the_manager_stops_applying_is_removed_unless_another_applies_it() {
        let mut live = json!({});
        let op1 = apply(
            &mut live,
            &json!({"status": {"phase": "Queued", "queuePosition": 3, "conditions": [{"type": "Valid", "status": "True"}, {"type": "Scheduled", "status": "False"}]}}),
            &FieldSet::new(),
            &[],
        );
        let agent = apply(
            &mut live,
            &json!({"status": {"reports": [{"role": "Receiver", "state": "Running"}]}}),
            &FieldSet::new(),
            &[&op1],
        );
        let _op2 = apply(
            &mut live,
            &json!({"status": {"phase": "Running", "sender": {"name": "a"}, "conditions": [{"type": "Valid", "status": "True"}]}}),
            &op1,
            &[&agent],
        );
        assert_eq!(
            live,
            json!({"status": {"phase": "Running", "sender": {"name": "a"},
                "conditions": [{"type": "Valid", "status": "True"}],
                "reports": [{"role": "Receiver", "state": "Running"}]}})
        );
    }

    #[test]
    fn a_map_emptied_by_removal_goes_and_labels_set_by_others_stay() {
        let mut live = json!({"metadata": {"labels": {"app": "x"}}, "status": {}});
        let op1 = apply(
            &mut live,
            &json!({"metadata": {"labels": {"wirerate.io/sender": "a"}}, "status": {"sender": {"name": "a", "pool": "p"}, "attempt": 1}}),
            &FieldSet::new(),
            &[],
        );
        apply(
            &mut live,
            &json!({"metadata": {"labels": {}}, "status": {"attempt": 2}}),
            &op1,
            &[],
        );
        assert_eq!(
            live,
            json!({"metadata": {"labels": {"app": "x"}}, "status": {"attempt": 2}})
        );
    }

    #[test]
    fn an_item_the_manager_stops_applying_goes_as_a_whole() {
        let mut live = json!({});
        let a = apply(
            &mut live,
            &json!({"status": {"conditions": [{"type": "Valid"}, {"type": "Failed", "reason": "x"}]}}),
            &FieldSet::new(),
            &[],
        );
        apply(
            &mut live,
            &json!({"status": {"conditions": [{"type": "Valid"}]}}),
            &a,
            &[],
        );
        assert_eq!(live, json!({"status": {"conditions": [{"type": "Valid"}]}}));
    }
}
