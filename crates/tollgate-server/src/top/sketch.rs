//! Space-Saving (Metwally, Agrawal, El Abbadi, 2005): the heaviest keys of
//! a stream in a fixed number of counters, with a bound on each count's
//! error.
//!
//! Each counter holds a key, its count and its error. A key tracked adds
//! its weight; a key not tracked takes a free counter, or the one of least
//! count (it inherits that count as its error). So a tracked key's count
//! is at most `error` above its true weight, and a key not tracked weighs
//! at most the least count (the sketch's [`SpaceSaving::floor`]). Updates
//! are O(log counters): the counters are ordered by count in a `BTreeSet`.

use std::collections::{BTreeSet, HashMap};

/// One key's counter, as read out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counted {
    /// The key.
    pub key: String,
    /// Its weight, at most `error` above the true one.
    pub count: u64,
    /// How much of `count` may belong to keys it replaced.
    pub error: u64,
}

/// A Space-Saving sketch of at most `capacity` counters.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    /// Counter slot of each key tracked.
    slots: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    /// The counters: key, count, error.
    counters: Vec<(Box<str>, u64, u64)>,
    /// `(count, slot)` of every counter, least first.
    order: BTreeSet<(u64, usize)>,
}

impl SpaceSaving {
    /// An empty sketch of `capacity` counters (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            slots: HashMap::default(),
            counters: Vec::new(),
            order: BTreeSet::new(),
        }
    }

    /// Adds `weight` to `key`.
    pub fn add(&mut self, key: &str, weight: u64) {
        if weight == 0 {
            return;
        }
        if let Some(&slot) = self.slots.get(key) {
            let count = self.counters[slot].1;
            self.order.remove(&(count, slot));
            let count = count.saturating_add(weight);
            self.counters[slot].1 = count;
            self.order.insert((count, slot));
            return;
        }
        if self.counters.len() < self.capacity {
            let slot = self.counters.len();
            self.counters.push((Box::from(key), weight, 0));
            self.slots.insert(Box::from(key), slot);
            self.order.insert((weight, slot));
            return;
        }
        // Full: the least counter is the new key's, its count the error.
        let Some((least, slot)) = self.order.pop_first() else {
            return;
        };
        let old = std::mem::replace(
            &mut self.counters[slot],
            (Box::from(key), least.saturating_add(weight), least),
        );
        self.slots.remove(&old.0);
        self.slots.insert(Box::from(key), slot);
        self.order.insert((least.saturating_add(weight), slot));
    }

    /// The most a key not tracked can weigh: the least count when every
    /// counter is taken, else 0.
    pub fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            0
        } else {
            self.order.first().map_or(0, |&(count, _)| count)
        }
    }

    /// The counters, heaviest first (ties by key).
    pub fn heaviest(&self) -> Vec<Counted> {
        let mut counted: Vec<Counted> = self
            .counters
            .iter()
            .map(|(key, count, error)| Counted {
                key: key.to_string(),
                count: *count,
                error: *error,
            })
            .collect();
        counted.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        counted
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }
}

/// Summaries merged (buckets of time, replicas): per key, the sum of its
/// counts where tracked, and its bounds; a summary not tracking a key adds
/// nothing to its count and up to its floor to its upper bound.
#[derive(Debug, Clone, Default)]
pub struct Merged {
    keys: HashMap<String, (u64, u64, u64), foldhash::fast::RandomState>,
    floors: u64,
}

/// A key of merged summaries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Heavy {
    /// The key.
    pub key: String,
    /// The sum of its counts where tracked.
    pub count: u64,
    /// Its true weight is at least this.
    pub min: u64,
    /// And at most this.
    pub max: u64,
}

impl Merged {
    /// Adds one summary: its counters and its floor.
    pub fn add(&mut self, counters: &[Counted], floor: u64) {
        for counted in counters {
            let entry = self.keys.entry(counted.key.clone()).or_insert((0, 0, 0));
            entry.0 = entry.0.saturating_add(counted.count);
            entry.1 = entry.1.saturating_add(counted.error);
            // This summary's floor is not this key's: taken back below.
            entry.2 = entry.2.saturating_add(floor);
        }
        self.floors = self.floors.saturating_add(floor);
    }

    /// The `k` heaviest keys, with their bounds; and the most a key not
    /// listed can weigh.
    pub fn heaviest(&self, k: usize) -> (Vec<Heavy>, u64) {
        let mut heavy: Vec<Heavy> = self
            .keys
            .iter()
            .map(|(key, &(count, error, own_floors))| Heavy {
                key: key.clone(),
                count,
                min: count.saturating_sub(error),
                max: count.saturating_add(self.floors.saturating_sub(own_floors)),
            })
            .collect();
        heavy.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        let unlisted = heavy
            .iter()
            .skip(k)
            .map(|rest| rest.max)
            .max()
            .unwrap_or(0)
            .max(self.floors);
        heavy.truncate(k);
        (heavy, unlisted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_full_sketch_hands_the_least_counter_on() {
        let mut sketch = SpaceSaving::new(2);
        sketch.add("a", 5);
        sketch.add("b", 2);
        sketch.add("c", 1);
        assert_eq!(sketch.floor(), 3);
        let heaviest = sketch.heaviest();
        assert_eq!(
            heaviest[0],
            Counted {
                key: "a".into(),
                count: 5,
                error: 0
            }
        );
        assert_eq!(
            heaviest[1],
            Counted {
                key: "c".into(),
                count: 3,
                error: 2
            }
        );
    }

    proptest! {
        /// Every count is within its error of the truth, a key not tracked
        /// weighs at most the floor, and every key heavier than the total
        /// over the capacity is tracked.
        #[test]
        fn counts_stay_within_their_bounds(stream in prop::collection::vec((0u8..40, 1u64..5), 0..600), capacity in 1usize..20) {
            let mut sketch = SpaceSaving::new(capacity);
            let mut truth: HashMap<String, u64> = HashMap::new();
            for (key, weight) in &stream {
                let key = format!("k{key}");
                sketch.add(&key, *weight);
                *truth.entry(key).or_default() += weight;
            }
            let total: u64 = truth.values().sum();
            let tracked = sketch.heaviest();
            for counted in &tracked {
                let real = truth.get(&counted.key).copied().unwrap_or(0);
                prop_assert!(counted.count >= real && counted.count - counted.error <= real, "{counted:?} real {real}");
            }
            for (key, real) in &truth {
                if !tracked.iter().any(|counted| &counted.key == key) {
                    prop_assert!(*real <= sketch.floor(), "{key} {real} over the floor {}", sketch.floor());
                    prop_assert!(*real <= total / capacity as u64, "{key} {real} heavy yet untracked");
                }
            }
        }

        /// Merged summaries bound every key's true weight.
        #[test]
        fn merged_summaries_bound_the_truth(parts in prop::collection::vec(prop::collection::vec((0u8..30, 1u64..4), 0..200), 1..4)) {
            let mut merged = Merged::default();
            let mut truth: HashMap<String, u64> = HashMap::new();
            for part in &parts {
                let mut sketch = SpaceSaving::new(8);
                for (key, weight) in part {
                    let key = format!("k{key}");
                    sketch.add(&key, *weight);
                    *truth.entry(key).or_default() += weight;
                }
                merged.add(&sketch.heaviest(), sketch.floor());
            }
            let (heavy, unlisted) = merged.heaviest(5);
            for listed in &heavy {
                let real = truth.get(&listed.key).copied().unwrap_or(0);
                prop_assert!(listed.min <= real && real <= listed.max, "{listed:?} real {real}");
            }
            for (key, real) in &truth {
                if !heavy.iter().any(|listed| &listed.key == key) {
                    prop_assert!(*real <= unlisted, "{key} {real} over {unlisted}");
                }
            }
        }
    }
}
