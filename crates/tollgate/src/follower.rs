//! A map held in memory and kept in step with a shared table: what every
//! process following a [`SharedTable`](crate::SharedTable) does alike.
//!
//! A [`TableFollower`] holds the map in force, with the table's version it
//! is of, behind one atomic pointer: a reader takes it with one load and no
//! lock. Writers (a change made here, a refresh) take a lock, copy the map,
//! change the copy and swap it in. A change written to the table is applied
//! here at once when it follows the version held, else left to the next
//! refresh; a refresh reads the changes since that version, or the whole
//! table when there are too many. The library's
//! [`PolicyOverrides`](crate::PolicyOverrides) and the server's overrides
//! (one table per domain) are both followers; each keeps only what is its
//! own (what a field and a value read as, expiry, logging).

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;

/// A map a [`TableFollower`] holds: copied on each change, so a map with
/// many entries shards itself (the server's overrides copy a 256th).
pub trait FollowedMap: Clone + Default {
    /// What an entry is found by.
    type Key;
    /// What an entry holds.
    type Value: Clone;

    /// Puts `value` under `key`: the value it replaced.
    fn insert(&mut self, key: Self::Key, value: Self::Value) -> Option<Self::Value>;

    /// Removes `key`'s entry: the value it held.
    fn remove(&mut self, key: &Self::Key) -> Option<Self::Value>;
}

impl<K, V, S> FollowedMap for std::collections::HashMap<K, V, S>
where
    K: std::hash::Hash + Eq + Clone,
    V: Clone,
    S: std::hash::BuildHasher + Default + Clone,
{
    type Key = K;
    type Value = V;

    fn insert(&mut self, key: K, value: V) -> Option<V> {
        std::collections::HashMap::insert(self, key, value)
    }

    fn remove(&mut self, key: &K) -> Option<V> {
        std::collections::HashMap::remove(self, key)
    }
}

/// The map in force and the version of the table it is of.
#[derive(Debug, Default)]
pub struct Followed<M> {
    /// The table's version (in process: the count of changes made).
    pub version: u64,
    /// The entries.
    pub map: M,
}

impl<M> std::ops::Deref for Followed<M> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.map
    }
}

/// One change applied: what the entry held before and holds now (none:
/// no entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied<V> {
    /// Before.
    pub previous: Option<V>,
    /// Now.
    pub current: Option<V>,
}

/// A map in force, kept in step with a table; see the module docs.
pub struct TableFollower<M> {
    in_force: ArcSwap<Followed<M>>,
    /// Serialises the writers of `in_force`.
    writing: Mutex<()>,
}

impl<M: FollowedMap> Default for TableFollower<M> {
    fn default() -> Self {
        Self {
            in_force: ArcSwap::from_pointee(Followed::default()),
            writing: Mutex::new(()),
        }
    }
}

impl<M> std::fmt::Debug for TableFollower<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableFollower")
            .field("version", &self.in_force.load().version)
            .finish_non_exhaustive()
    }
}

impl<M: FollowedMap> TableFollower<M> {
    /// A follower holding nothing, at version 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The map in force: one atomic load, no lock.
    #[inline]
    pub fn load(&self) -> Guard<Arc<Followed<M>>> {
        self.in_force.load()
    }

    /// The map in force, to keep.
    pub fn load_full(&self) -> Arc<Followed<M>> {
        self.in_force.load_full()
    }

    /// Applies `changes` (a key, its value or none) that bring the map from
    /// version `from` to `to`: what each entry held and holds, or none when
    /// the map is not at `from` (another change came between: the next
    /// refresh reads them all).
    pub fn apply(
        &self,
        from: u64,
        to: u64,
        changes: Vec<(M::Key, Option<M::Value>)>,
    ) -> Option<Vec<Applied<M::Value>>> {
        let _writing = self.writing.lock();
        let held = self.in_force.load_full();
        if held.version != from {
            return None;
        }
        let mut map = held.map.clone();
        let applied = changes
            .into_iter()
            .map(|(key, current)| {
                let previous = match &current {
                    Some(value) => map.insert(key, value.clone()),
                    None => map.remove(&key),
                };
                Applied { previous, current }
            })
            .collect();
        self.in_force.store(Arc::new(Followed { version: to, map }));
        Some(applied)
    }

    /// A change made in this process alone (no table): `edit` changes a copy
    /// of the map, which goes in force one version on unless `edit` answers
    /// none. Answers what `edit` answered.
    pub fn edit<T>(&self, edit: impl FnOnce(&mut M) -> Option<T>) -> Option<T> {
        let _writing = self.writing.lock();
        let held = self.in_force.load_full();
        let mut map = held.map.clone();
        let answer = edit(&mut map)?;
        self.in_force.store(Arc::new(Followed {
            version: held.version + 1,
            map,
        }));
        Some(answer)
    }

    /// Replaces the map in force whole, at `version`.
    pub fn replace(&self, version: u64, map: M) {
        let _writing = self.writing.lock();
        self.in_force.store(Arc::new(Followed { version, map }));
    }

    /// Brings the map up to date with `table`: the changes since the
    /// version held, or the table whole when they are too many. `read`
    /// reads a field and its value (none: deleted) as a key and the value
    /// it holds now (none: no entry, also for a value that does not read,
    /// written by hand); a field it cannot read at all is left out.
    /// Answers the changes read one by one (none after a whole reload).
    ///
    /// # Errors
    ///
    /// A store fault: the map in force stays.
    #[cfg(feature = "redis")]
    pub async fn refresh(
        &self,
        table: &crate::SharedTable,
        read: impl Fn(&str, Option<&str>) -> Option<(M::Key, Option<M::Value>)>,
    ) -> crate::Result<Vec<Applied<M::Value>>> {
        use crate::TableChanges;
        let held = self.in_force.load().version;
        match table.changes_since(held).await? {
            TableChanges::None => Ok(Vec::new()),
            TableChanges::Some { version, fields } => {
                let changes = fields
                    .iter()
                    .filter_map(|(field, value)| read(field, value.as_deref()))
                    .collect();
                Ok(self.apply(held, version, changes).unwrap_or_default())
            }
            TableChanges::Reload => {
                let (version, fields) = table.load().await?;
                let mut map = M::default();
                for (key, value) in fields.iter().filter_map(|(field, value)| read(field, Some(value))) {
                    if let Some(value) = value {
                        map.insert(key, value);
                    }
                }
                self.replace(version, map);
                Ok(Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    type Map = HashMap<String, u32>;

    #[test]
    fn a_change_applies_only_on_the_version_it_follows() {
        let follower: TableFollower<Map> = TableFollower::new();
        let applied = follower.apply(0, 1, vec![("a".into(), Some(1)), ("b".into(), Some(2))]);
        assert_eq!(applied.map(|applied| applied.len()), Some(2));
        // A change from version 3 while 1 is held: another came between.
        assert_eq!(follower.apply(3, 4, vec![("a".into(), None)]), None);
        let held = follower.load_full();
        assert_eq!((held.version, held.get("a")), (1, Some(&1)));
        let applied = follower.apply(1, 2, vec![("a".into(), Some(5)), ("b".into(), None)]);
        let expected = vec![
            Applied {
                previous: Some(1),
                current: Some(5),
            },
            Applied {
                previous: Some(2),
                current: None,
            },
        ];
        assert_eq!(applied, Some(expected));
        // A reader's copy is its own: the write swapped in a new map.
        assert_eq!((held.version, held.len()), (1, 2));
        assert_eq!((follower.load().version, follower.load().len()), (2, 1));
    }

    #[test]
    fn an_edit_goes_in_force_one_version_on_unless_it_answers_none() {
        let follower: TableFollower<Map> = TableFollower::new();
        assert_eq!(follower.edit(|map| map.insert("a".into(), 1).or(Some(0))), Some(0));
        assert_eq!(follower.load().version, 1);
        assert_eq!(follower.edit(|map| map.remove("missing")), None);
        assert_eq!(follower.load().version, 1);
        follower.replace(9, Map::from([("z".into(), 26)]));
        let held = follower.load();
        assert_eq!((held.version, held.get("z"), held.get("a")), (9, Some(&26), None));
    }
}
