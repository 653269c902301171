//! A table of a session's files by their id, sized exactly.
//!
//! A session's file ids are fixed by its plan, and a manifest may list a
//! million files. A hash map rounds its buckets up to a power of two over
//! 7/8 of them, so it holds up to 2.3 slots a file; this holds one, sorted
//! by id, and finds an id by binary search. Nothing is inserted or removed
//! once it is built: a value that can go is an `Option`, taken out in
//! place, so that a session publishing its files one by one does not move
//! the rest each time.
#![forbid(unsafe_code)]

/// Values by `u32` id, built once.
#[derive(Debug, Clone)]
pub struct ById<T> {
    slots: Box<[(u32, T)]>,
}

impl<T> Default for ById<T> {
    fn default() -> Self {
        Self {
            slots: Box::new([]),
        }
    }
}

impl<T> FromIterator<(u32, T)> for ById<T> {
    /// Of several values with one id, the last is kept.
    fn from_iter<I: IntoIterator<Item = (u32, T)>>(iter: I) -> Self {
        let mut v: Vec<(u32, T)> = iter.into_iter().collect();
        // Stable: equal ids keep their order, so the last comes last.
        v.sort_by_key(|&(id, _)| id);
        v.reverse();
        v.dedup_by_key(|(id, _)| *id);
        v.reverse();
        Self {
            slots: v.into_boxed_slice(),
        }
    }
}

impl<T> ById<T> {
    fn index(&self, id: u32) -> Option<usize> {
        self.slots.binary_search_by_key(&id, |&(i, _)| i).ok()
    }

    /// The value of `id`.
    pub fn get(&self, id: u32) -> Option<&T> {
        self.index(id).map(|i| &self.slots[i].1)
    }

    /// The value of `id`, to change it.
    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        let i = self.index(id)?;
        Some(&mut self.slots[i].1)
    }

    /// How many ids it holds.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The ids with their values, by id.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().map(|(id, t)| (*id, t))
    }

    /// The same, to change the values.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.slots.iter_mut().map(|(id, t)| (*id, t))
    }
}

impl<T> ById<Option<T>> {
    /// Takes the value of `id` out, leaving its slot empty.
    pub fn take(&mut self, id: u32) -> Option<T> {
        self.get_mut(id).and_then(Option::take)
    }

    /// The ids still holding a value, with their values.
    pub fn present_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.iter_mut()
            .filter_map(|(id, t)| t.as_mut().map(|t| (id, t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn ids_are_found_in_any_order_and_taken_once() {
        let mut t: ById<Option<&str>> = [(7, Some("g")), (2, Some("b")), (9, Some("i"))]
            .into_iter()
            .collect();
        assert_eq!(t.get(2), Some(&Some("b")));
        assert_eq!(t.get(3), None);
        assert_eq!(t.take(7), Some("g"));
        assert_eq!(t.take(7), None, "taken once");
        assert_eq!(
            t.present_mut().map(|(id, _)| id).collect::<Vec<_>>(),
            vec![2, 9]
        );
        *t.get_mut(9).unwrap() = Some("nine");
        assert_eq!(t.get(9), Some(&Some("nine")));
        assert_eq!(t.len(), 3, "a taken slot stays, empty");
    }

    #[test]
    fn the_last_of_a_repeated_id_is_kept() {
        let t: ById<u8> = [(1, 10), (1, 11), (0, 0), (1, 12)].into_iter().collect();
        assert_eq!((t.get(1), t.len()), (Some(&12), 2));
    }

    proptest! {
        #[test]
        fn it_agrees_with_a_hash_map(
            ids in proptest::collection::vec(any::<u32>(), 0..200),
            removals in proptest::collection::vec(any::<u32>(), 0..50),
        ) {
            let mut t: ById<Option<usize>> =
                ids.iter().enumerate().map(|(i, &id)| (id, Some(i))).collect();
            let mut m: HashMap<u32, usize> =
                ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
            for r in removals {
                let id = ids.get(r as usize % ids.len().max(1)).copied().unwrap_or(r);
                prop_assert_eq!(t.take(id), m.remove(&id));
            }
            prop_assert_eq!(t.present_mut().count(), m.len());
            for (&id, v) in &m {
                prop_assert_eq!(t.get(id), Some(&Some(*v)));
            }
        }
    }
}
