//! Two Transfers that would write one destination: the later one waits.
//!
//! A receiver claims a destination only while a session writes it, so two
//! Transfers to one file (or a tree and a file inside it) used to run one
//! after the other at the receiver, the second replacing what the first
//! published, and to fail over each other's claims in between. Here a
//! Transfer that has not started waits, with a condition naming the one
//! that writes there, until that one is over; of two that have not
//! started, the one first in line goes first. Pure: fed the cache's
//! Transfers and the line, it does no I/O.

use std::collections::HashMap;

use kube::ResourceExt;
use wirerate_crds::Transfer;

use crate::scheduler::Key;

/// Where a Transfer writes: its receiving pool (`namespace/name`, or the
/// external agent's address) and the path's components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    at: Key,
    path: Vec<String>,
}

impl Destination {
    /// Where `t` writes.
    pub fn of(t: &Transfer) -> Self {
        let d = &t.spec.destination;
        let at = match (&d.external, &d.pool) {
            // Host names are not case-sensitive: `DTN1:7700` is `dtn1:7700`.
            (Some(e), _) => ("external".to_string(), e.address.to_ascii_lowercase()),
            (None, pool) => (
                d.pool_namespace
                    .clone()
                    .unwrap_or_else(|| t.namespace().unwrap_or_default()),
                pool.clone().unwrap_or_default(),
            ),
        };
        let path = d
            .path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_owned)
            .collect();
        Self { at, path }
    }

    fn shown(&self) -> String {
        format!("/{}", self.path.join("/"))
    }
}

/// The destinations of the Transfers that write, or will write first,
/// indexed so that a look-up costs the path's depth, not the number of
/// Transfers (a thousand queued against a thousand running).
#[derive(Default)]
pub struct Held {
    /// Each held destination, and who holds it.
    exact: HashMap<(Key, Vec<String>), (Destination, Key)>,
    /// Each proper ancestor of a held destination, and one holder below it.
    above: HashMap<(Key, Vec<String>), (Destination, Key)>,
}

impl Held {
    /// `who` writes (or will write) `d`.
    pub fn hold(&mut self, d: Destination, who: Key) {
        for n in 0..d.path.len() {
            let at = (d.at.clone(), d.path[..n].to_vec());
            self.above
                .entry(at)
                .or_insert_with(|| (d.clone(), who.clone()));
        }
        let at = (d.at.clone(), d.path.clone());
        self.exact.entry(at).or_insert((d, who));
    }

    /// A Transfer other than `me` that holds `d`, a directory around it or
    /// a path inside it, with what it holds.
    fn holder(&self, d: &Destination, me: &Key) -> Option<&(Destination, Key)> {
        let other = |h: &&(Destination, Key)| h.1 != *me;
        (0..=d.path.len())
            .filter_map(|n| self.exact.get(&(d.at.clone(), d.path[..n].to_vec())))
            .find(other)
            .or_else(|| {
                self.above
                    .get(&(d.at.clone(), d.path.clone()))
                    .filter(other)
            })
    }
}

/// Whether `t` may be writing its destination: it has started, and is not
/// over (one being deleted keeps its finalizer, and so stays, until its
/// agents have stopped).
pub fn writes(t: &Transfer) -> bool {
    t.status
        .as_ref()
        .is_some_and(|s| s.attempt > 0 && !s.phase.is_some_and(|p| p.is_final()))
}

/// Of the Transfers waiting to start, in line `order` (each with its
/// destination in `waiting`), those that must wait for another one
/// writing where they would, with why. Each that `could_run` holds its
/// destination against the ones behind it, held back or not, so that a
/// stream of Transfers into a tree cannot keep one of the whole tree
/// waiting for ever; one that could not run holds nothing back. The
/// message is the same whoever holds the destination, so that a queue
/// behind one destination is not rewritten each time its holder changes
/// (and names no Transfer of another namespace).
pub fn held_back(
    order: &[Key],
    waiting: &HashMap<Key, Destination>,
    mut held: Held,
    could_run: impl Fn(&Key) -> bool,
) -> HashMap<Key, String> {
    let mut out = HashMap::new();
    for key in order {
        let Some(d) = waiting.get(key) else {
            continue;
        };
        if held.holder(d, key).is_some() {
            let message = format!(
                "spec.destination.path {} is, or lies in or around, the destination of a Transfer that writes there first: it starts once that one is over",
                d.shown()
            );
            out.insert(key.clone(), message);
        }
        if could_run(key) {
            held.hold(d.clone(), key.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(pool: &str, path: &str) -> Destination {
        Destination {
            at: ("ns".into(), pool.into()),
            path: path
                .split('/')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }

    fn key(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    #[test]
    fn an_external_agent_is_known_whatever_the_case_of_its_name() {
        let external = |address: &str| {
            let mut t = crate::validate::tests::transfer("x", "/in/a", "/b");
            t.spec.destination.pool = None;
            t.spec.destination.external = Some(wirerate_crds::transfer::External {
                address: address.into(),
                token_secret: "t".into(),
            });
            Destination::of(&t)
        };
        assert_eq!(
            external("DTN1.example.org:7700"),
            external("dtn1.example.org:7700")
        );
    }

    #[test]
    fn a_file_a_tree_around_it_and_the_same_path_overlap_and_siblings_do_not() {
        let mut held = Held::default();
        held.hold(dest("p", "/out/run1"), key("a"));
        let me = key("me");
        let overlaps = |pool, path| held.holder(&dest(pool, path), &me).is_some();
        assert!(overlaps("p", "/out/run1"));
        assert!(overlaps("p", "/out/run1/x.h5"));
        assert!(overlaps("p", "/out"));
        assert!(overlaps("p", "/"));
        assert!(overlaps("p", "/out/run1/"));
        assert!(!overlaps("p", "/out/run10"));
        assert!(!overlaps("p", "/out/run2"));
        assert!(!overlaps("p", "/elsewhere/run1"));
        assert!(!overlaps("q", "/out/run1"));
        // Its own destination holds no Transfer back.
        assert!(held.holder(&dest("p", "/out/run1"), &key("a")).is_none());
    }

    #[test]
    fn the_later_of_two_waits_for_a_started_one_and_the_first_in_line_goes_first() {
        let mut held = Held::default();
        held.hold(dest("p", "/out/a"), key("running"));
        let waiting: HashMap<Key, Destination> = [
            (key("into-running"), dest("p", "/out/a/f")),
            (key("first"), dest("p", "/out/b")),
            (key("second"), dest("p", "/out/b")),
            (key("elsewhere"), dest("q", "/out/b")),
        ]
        .into_iter()
        .collect();
        let order = ["into-running", "second", "first", "elsewhere"].map(key);
        let back = held_back(&order, &waiting, held, |_| true);
        let mut keys: Vec<&str> = back.keys().map(|k| k.1.as_str()).collect();
        keys.sort();
        // In line, "second" came first.
        assert_eq!(keys, ["first", "into-running"]);
        assert!(back[&key("first")].contains("spec.destination.path /out/b"));
    }

    /// One held back still holds its destination against those behind it
    /// (a tree is not kept waiting by a stream of Transfers into it), unless
    /// it could not run at all.
    #[test]
    fn one_held_back_still_holds_unless_it_could_not_run() {
        let held = || {
            let mut h = Held::default();
            h.hold(dest("p", "/out/a"), key("running"));
            h
        };
        let waiting: HashMap<Key, Destination> = [
            (key("tree"), dest("p", "/out")),
            (key("inside"), dest("p", "/out/b")),
        ]
        .into_iter()
        .collect();
        let order = ["tree", "inside"].map(key);
        let back = held_back(&order, &waiting, held(), |_| true);
        assert!(back.contains_key(&key("tree")) && back.contains_key(&key("inside")));
        let back = held_back(&order, &waiting, held(), |k| k.1 != "tree");
        assert!(back.contains_key(&key("tree")) && !back.contains_key(&key("inside")));
    }
}
