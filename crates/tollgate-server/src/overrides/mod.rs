//! Overrides: a limit set for one exact descriptor while the service runs
//! (`/v1/overrides`), in the place of the rule that descriptor matches.
//!
//! On Redis, the overrides of a domain live in the store as one shared
//! table ([`tollgate::SharedTable`], `<prefix>:table:{overrides:<domain>}`),
//! so every replica on that Redis applies a change and a restart keeps it.
//! On the memory store they live in this process. Either way a decision
//! never waits for them: each replica keeps the overrides in force in
//! memory ([`Overrides::domain`], two atomic loads), each domain's with a
//! [`TableFollower`] of its table, and follows the store every
//! [`REFRESH`], reading only what changed since the version it holds.
//! An expired override stops applying at its instant, whoever looks; the
//! first replica to notice removes it from the store.

mod model;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use hashbrown::HashTable;
use tollgate::{AnyStore, Clock, Followed, FollowedMap, SystemClock, TableFollower};

pub use self::model::{
    describe_rule, format_instant, stat_key, Entry, InstantError, InvalidOverride, Override, OverrideRequest, Stored,
};

/// How often each replica asks the store whether overrides changed: a change
/// made through another replica applies here within this, plus a round trip.
pub const REFRESH: Duration = Duration::from_millis(200);

/// Each domain's follower of its overrides.
type Domains = HashMap<String, Arc<TableFollower<Table>>, foldhash::fast::RandomState>;

/// A descriptor's entries, outermost first.
type Entries = Vec<(String, String)>;

/// The overrides of one domain in force, and the version of the domain's
/// table they are of.
pub type DomainOverrides = Followed<Table>;

/// Shards of a domain's overrides: a change copies one shard (a 256th of the
/// domain) rather than the whole domain, so that a domain of 100 000
/// overrides takes a change in tens of microseconds while decisions read without
/// a lock.
const SHARDS: usize = 256;

/// One shard: descriptors' entries and their overrides.
type Shard = HashTable<(Entries, Arc<Override>)>;

/// Overrides by their descriptor's entries, in 256 shards. One hash
/// of the entries picks the shard (its top bits) and the slot in it.
#[derive(Debug, Clone)]
pub struct Table {
    shards: Vec<Arc<Shard>>,
    len: usize,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Arc::default()).collect(),
            len: 0,
        }
    }
}

impl Table {
    fn hash(entries: &[(String, String)]) -> u64 {
        use std::hash::BuildHasher as _;
        // A fixed seed: a descriptor's shard and slot never change.
        foldhash::fast::FixedState::with_seed(0x746f_6c6c).hash_one(entries)
    }

    /// Bits of the hash the tables do not use: a table finds a slot by the
    /// low bits and tells slots apart by the top seven, which must differ
    /// within one shard.
    fn shard(hash: u64) -> usize {
        (hash >> 32) as usize % SHARDS
    }

    fn find(&self, entries: &[(String, String)]) -> Option<&Arc<Override>> {
        let hash = Self::hash(entries);
        self.shards[Self::shard(hash)]
            .find(hash, |(held, _)| held.as_slice() == entries)
            .map(|(_, found)| found)
    }

    fn insert(&mut self, entries: Entries, found: Arc<Override>) -> Option<Arc<Override>> {
        let hash = Self::hash(&entries);
        let shard = Arc::make_mut(&mut self.shards[Self::shard(hash)]);
        match shard.entry(hash, |(held, _)| *held == entries, |(held, _)| Self::hash(held)) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => Some(std::mem::replace(&mut slot.get_mut().1, found)),
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert((entries, found));
                self.len += 1;
                None
            }
        }
    }

    fn remove(&mut self, entries: &[(String, String)]) -> Option<Arc<Override>> {
        let hash = Self::hash(entries);
        let index = Self::shard(hash);
        self.shards[index].find(hash, |(held, _)| held.as_slice() == entries)?;
        let shard = Arc::make_mut(&mut self.shards[index]);
        let (removed, _) = shard
            .find_entry(hash, |(held, _)| held.as_slice() == entries)
            .ok()?
            .remove();
        self.len -= 1;
        Some(removed.1)
    }

    fn entries(&self) -> impl Iterator<Item = (&Entries, &Arc<Override>)> {
        self.shards
            .iter()
            .flat_map(|shard| shard.iter().map(|(entries, found)| (entries, found)))
    }

    /// The override in force at `now` (µs since the Unix epoch, read only
    /// when an override with an end is found) for exactly these entries.
    pub fn get(&self, entries: &[(String, String)], now: impl FnOnce() -> u64) -> Option<&Override> {
        self.find(entries)
            .map(AsRef::as_ref)
            .filter(|found| found.expires_at.is_none() || found.in_force(now()))
    }

    /// How many it holds (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every one, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Override>> {
        self.entries().map(|(_, found)| found)
    }
}

impl FollowedMap for Table {
    type Key = Entries;
    type Value = Arc<Override>;

    fn insert(&mut self, key: Entries, value: Arc<Override>) -> Option<Arc<Override>> {
        Table::insert(self, key, value)
    }

    fn remove(&mut self, key: &Entries) -> Option<Arc<Override>> {
        Table::remove(self, key)
    }
}

impl FromIterator<(Entries, Arc<Override>)> for Table {
    fn from_iter<I: IntoIterator<Item = (Entries, Arc<Override>)>>(iter: I) -> Self {
        let mut table = Self::default();
        for (entries, found) in iter {
            table.insert(entries, found);
        }
        table
    }
}

/// One change made or seen, to log and count.
#[derive(Debug)]
pub struct Changed {
    /// The domain.
    pub domain: String,
    /// What it was before (none: it had no override).
    pub previous: Option<Arc<Override>>,
    /// What it is now (none: removed).
    pub current: Option<Arc<Override>>,
    /// An expired override this replica removed.
    pub expired_here: bool,
}

/// Where overrides are kept.
enum Backend {
    /// In this process (the memory store).
    Local,
    /// In the store, shared by every replica on it.
    Shared(AnyStore),
}

/// The overrides in force, and where they are kept.
pub struct Overrides {
    backend: Backend,
    /// By domain: what decisions read.
    in_force: ArcSwap<Domains>,
    /// Serialises the writers of `in_force` (a domain added or dropped);
    /// each domain's follower serialises its own.
    writing: Mutex<()>,
    clock: Arc<dyn Clock>,
}

/// A fault of the store holding overrides, or an override it holds that no
/// longer reads.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// The store failed or did not answer.
    #[error("{0}")]
    Store(#[from] tollgate::Error),
    /// No Redis connection yet (a resilient store still connecting).
    #[error("the store is not connected yet")]
    NotConnected,
    /// An override could not be written as JSON for the store.
    #[error("an override could not be written: {0}")]
    Encode(serde_json::Error),
}

impl Overrides {
    /// Overrides kept beside `store`'s state: in it when it is Redis, in
    /// this process otherwise.
    pub fn new(store: &AnyStore) -> Self {
        let backend = if store.is_redis() {
            Backend::Shared(store.clone())
        } else {
            Backend::Local
        };
        Self {
            backend,
            in_force: ArcSwap::from_pointee(Domains::default()),
            writing: Mutex::new(()),
            clock: Arc::new(SystemClock),
        }
    }

    /// Decides expiry by `clock` rather than the system's (tests).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Now, µs since the Unix epoch, by the overrides' clock.
    pub fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// True when every replica on the store shares them.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Shared(_))
    }

    /// The overrides in force in `domain`, if it has any: two atomic
    /// loads (the domain's follower, its map).
    pub fn domain(&self, domain: &str) -> Option<Arc<DomainOverrides>> {
        let in_force = self.in_force.load();
        let held = in_force.get(domain)?.load_full();
        (!held.is_empty()).then_some(held)
    }

    /// Every domain's overrides in force.
    pub fn all(&self) -> Vec<(String, Arc<DomainOverrides>)> {
        self.in_force
            .load()
            .iter()
            .map(|(domain, follower)| (domain.clone(), follower.load_full()))
            .collect()
    }

    /// `domain`'s follower, added when it has none.
    fn follower(&self, domain: &str) -> Arc<TableFollower<Table>> {
        if let Some(follower) = self.in_force.load().get(domain) {
            return Arc::clone(follower);
        }
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.in_force.load_full();
        if let Some(follower) = current.get(domain) {
            return Arc::clone(follower);
        }
        let follower = Arc::new(TableFollower::new());
        let mut next = Domains::clone(&current);
        next.insert(domain.to_owned(), Arc::clone(&follower));
        self.in_force.store(Arc::new(next));
        follower
    }

    fn table(&self, domain: &str) -> Result<Option<tollgate::SharedTable>, OverrideError> {
        let Backend::Shared(store) = &self.backend else {
            return Ok(None);
        };
        let redis = store.redis().cloned().ok_or(OverrideError::NotConnected)?;
        Ok(Some(redis.table(&format!("overrides:{domain}"))))
    }

    /// Puts `new` in force for its descriptor, in the store first.
    ///
    /// # Errors
    ///
    /// The store failed: nothing changed.
    pub async fn set(&self, new: Override) -> Result<Changed, OverrideError> {
        let domain = new.stored.domain.clone();
        let field = Override::field(&new.stored.descriptor);
        let new = Arc::new(new);
        let entries = new.entries();
        let follower = self.follower(&domain);
        let previous = if let Some(table) = self.table(&domain)? {
            let text = serde_json::to_string(&new.stored).map_err(OverrideError::Encode)?;
            let change = table.set(&field, &text).await?;
            follower.apply(
                change.version - 1,
                change.version,
                vec![(entries, Some(Arc::clone(&new)))],
            );
            read_stored(change.previous.as_deref())
        } else {
            follower
                .edit(|map| Some(map.insert(entries, Arc::clone(&new))))
                .flatten()
        };
        Ok(Changed {
            domain,
            previous,
            current: Some(new),
            expired_here: false,
        })
    }

    /// Removes the override of `descriptor` in `domain`: what it was, if
    /// there was one.
    ///
    /// # Errors
    ///
    /// The store failed: nothing changed.
    pub async fn delete(&self, domain: &str, descriptor: &[Entry]) -> Result<Changed, OverrideError> {
        let entries: Vec<(String, String)> = descriptor
            .iter()
            .map(|entry| (entry.key.clone(), entry.value.clone()))
            .collect();
        let follower = self.follower(domain);
        let previous = if let Some(table) = self.table(domain)? {
            let change = table.delete(&Override::field(descriptor)).await?;
            if change.previous.is_some() {
                follower.apply(change.version - 1, change.version, vec![(entries, None)]);
            }
            read_stored(change.previous.as_deref())
        } else {
            follower.edit(|map| map.remove(&entries))
        };
        Ok(Changed {
            domain: domain.to_owned(),
            previous,
            current: None,
            expired_here: false,
        })
    }

    /// Brings the overrides of `domains` up to date with the store, drops
    /// those of other domains, and removes expired ones (from the store
    /// too); answers what changed, to log and count.
    ///
    /// # Errors
    ///
    /// The store failed: what is in force stays, and the next refresh
    /// tries again.
    pub async fn refresh<'a>(&self, domains: impl Iterator<Item = &'a str>) -> Result<Vec<Changed>, OverrideError> {
        let mut changed = Vec::new();
        let now = self.now();
        let domains: Vec<&str> = domains.collect();
        for &domain in &domains {
            let Some(table) = self.table(domain)? else {
                changed.extend(self.expire_local(domain, now));
                continue;
            };
            let follower = self.follower(domain);
            // A field that does not read as a descriptor is left out; a
            // value that does not read as an override counts as none.
            let read = |field: &str, text: Option<&str>| {
                let current = text.and_then(|text| read_override(domain, text));
                Some((entries_of_field(field)?, current))
            };
            for applied in follower.refresh(&table, read).await? {
                changed.push(Changed {
                    domain: domain.to_owned(),
                    previous: applied.previous,
                    current: applied.current,
                    expired_here: false,
                });
            }
            // Expired ones leave the store (only if nobody replaced them).
            let expired: Vec<Arc<Override>> = follower
                .load()
                .iter()
                .filter(|found| !found.in_force(now))
                .cloned()
                .collect();
            for found in expired {
                let text = serde_json::to_string(&found.stored).map_err(OverrideError::Encode)?;
                let field = Override::field(&found.stored.descriptor);
                if let Some(change) = table.delete_if(&field, &text).await? {
                    follower.apply(change.version - 1, change.version, vec![(found.entries(), None)]);
                    changed.push(Changed {
                        domain: domain.to_owned(),
                        previous: Some(found),
                        current: None,
                        expired_here: true,
                    });
                }
            }
        }
        let stale = self
            .in_force
            .load()
            .keys()
            .any(|domain| !domains.contains(&domain.as_str()));
        if stale {
            let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
            let mut next = Domains::clone(&self.in_force.load_full());
            next.retain(|domain, _| domains.contains(&domain.as_str()));
            self.in_force.store(Arc::new(next));
        }
        Ok(changed)
    }

    /// Drops the expired overrides of `domain` kept in this process.
    fn expire_local(&self, domain: &str, now: u64) -> Vec<Changed> {
        let follower = self.follower(domain);
        follower
            .edit(|map| {
                let expired: Vec<Entries> = map
                    .entries()
                    .filter(|(_, found)| !found.in_force(now))
                    .map(|(entries, _)| entries.clone())
                    .collect();
                if expired.is_empty() {
                    return None;
                }
                let changed = expired
                    .into_iter()
                    .map(|entries| Changed {
                        domain: domain.to_owned(),
                        previous: map.remove(&entries),
                        current: None,
                        expired_here: true,
                    })
                    .collect();
                Some(changed)
            })
            .unwrap_or_default()
    }
}

impl Overrides {
    /// The overrides in force, for `/rlconfig`: one line each, as a rule's
    /// (`<domain>.<descriptor>: unit=… requests_per_unit=…`), then its end
    /// and reason.
    pub fn dump(&self) -> String {
        use std::fmt::Write as _;
        let now = self.now();
        let all = self.all();
        let mut lines: Vec<String> = Vec::new();
        for (domain, overrides) in &all {
            for found in overrides.iter().filter(|found| found.in_force(now)) {
                let mut line = found.rule.dump_line(domain);
                line.push_str(", override");
                if let Some(until) = &found.stored.expires_at {
                    let _ = write!(line, " until {until}");
                }
                if let Some(reason) = &found.stored.reason {
                    let _ = write!(line, " ({reason})");
                }
                lines.push(line);
            }
        }
        lines.sort();
        if lines.is_empty() {
            return String::new();
        }
        let mut text = format!(
            "# overrides ({})\n",
            if self.is_shared() {
                "shared in the store"
            } else {
                "this process"
            }
        );
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
        text
    }
}

/// A descriptor's entries from the store's field.
fn entries_of_field(field: &str) -> Option<Vec<(String, String)>> {
    let pairs: Vec<[String; 2]> = serde_json::from_str(field).ok()?;
    Some(pairs.into_iter().map(|[key, value]| (key, value)).collect())
}

fn read_stored(text: Option<&str>) -> Option<Arc<Override>> {
    let stored: Stored = serde_json::from_str(text?).ok()?;
    Override::from_stored(stored).ok().map(Arc::new)
}

/// An override of `domain` read from the store; one that does not read
/// (written by hand) is logged and left out.
fn read_override(domain: &str, text: &str) -> Option<Arc<Override>> {
    let read = match serde_json::from_str::<Stored>(text) {
        Ok(stored) => Override::from_stored(stored).map_err(|error| error.to_string()),
        Err(error) => Err(error.to_string()),
    };
    match read {
        Ok(found) => Some(Arc::new(found)),
        Err(error) => {
            tracing::warn!(
                domain,
                "overrides: an override in the store does not read, left out: {error}"
            );
            None
        }
    }
}
