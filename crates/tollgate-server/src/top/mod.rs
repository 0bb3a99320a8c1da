//! The heaviest descriptors per rule (`GET /v1/top`): by hits and by
//! refusals over the last minute, in bounded memory, merged over every
//! replica on one Redis. Descriptor values stay here and in the answer:
//! they never become metric labels.
//!
//! Each replica keeps, per rule, six buckets of ten seconds, each two
//! [`SpaceSaving`] sketches (hits, refusals) of [`COUNTERS`] counters; a
//! rule's answer merges the buckets of the last minute. Every
//! [`PUBLISH_EVERY`] a replica on Redis writes its merged summaries to a
//! shared table (`top:<domain>`, a field per replica), and an answer merges
//! every replica's fresh one with this replica's own, live. Each key comes
//! with bounds on its true weight ([`Heavy`]): `min` (its count less the
//! errors of the counters it took over) and `max` (plus what the summaries
//! not tracking it could hold), and the answer says how much a key it does
//! not list can weigh at most (`unlisted`).

mod sketch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::sketch::{Counted, Heavy, Merged, SpaceSaving};

/// Keys an answer lists per rule and kind, by default.
pub const DEFAULT_K: usize = 100;

/// Counters per sketch: twice the keys listed, so that the listed keys'
/// errors stay small.
pub const COUNTERS: usize = 2 * DEFAULT_K;

/// The length of one bucket.
const BUCKET_SECS: u64 = 10;

/// Buckets kept: the last minute.
const BUCKETS: u64 = 6;

/// How often a replica publishes its summaries.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(5);

/// A replica's summary older than this is left out (the replica stopped).
pub const STALE_AFTER_SECS: u64 = 20;

/// One bucket: its number (seconds since the epoch / [`BUCKET_SECS`]) and
/// its sketches.
struct Bucket {
    number: u64,
    hits: SpaceSaving,
    refusals: SpaceSaving,
    /// Hits past the near-limit ratio, every descriptor's.
    near: u64,
}

impl Bucket {
    fn new(number: u64) -> Self {
        Self {
            number,
            hits: SpaceSaving::new(COUNTERS),
            refusals: SpaceSaving::new(COUNTERS),
            near: 0,
        }
    }
}

/// What one descriptor of a decided request counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hit {
    /// Its hits (its cost).
    pub hits: u64,
    /// Of those, the hits past the near-limit ratio (and not over).
    pub near: u64,
    /// Refused.
    pub refused: bool,
}

/// A rule's buckets, the oldest reused.
#[derive(Default)]
struct RuleWindow {
    buckets: Vec<Bucket>,
}

impl RuleWindow {
    fn record(&mut self, key: &str, hit: Hit, now_secs: u64) {
        let number = now_secs / BUCKET_SECS;
        let at = usize::try_from(number % BUCKETS).unwrap_or(0);
        while self.buckets.len() <= at {
            self.buckets.push(Bucket::new(u64::MAX));
        }
        let bucket = &mut self.buckets[at];
        if bucket.number != number {
            *bucket = Bucket::new(number);
        }
        bucket.hits.add(key, hit.hits);
        bucket.near += hit.near;
        if hit.refused {
            bucket.refusals.add(key, hit.hits.max(1));
        }
    }

    /// The last minute's buckets, each sketch as counters and a floor.
    fn summary(&self, now_secs: u64) -> Summary {
        let newest = now_secs / BUCKET_SECS;
        let mut summary = Summary::default();
        for bucket in &self.buckets {
            if bucket.number > newest || newest - bucket.number >= BUCKETS {
                continue;
            }
            summary.hits.push((bucket.hits.heaviest(), bucket.hits.floor()));
            summary
                .refusals
                .push((bucket.refusals.heaviest(), bucket.refusals.floor()));
            summary.buckets.push(bucket.number * BUCKET_SECS);
            summary.near.push(bucket.near);
        }
        summary
    }
}

/// One replica's summaries of a rule: per bucket, its counters (heaviest
/// first) and floor.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    /// By hits.
    pub hits: Vec<(Vec<Counted>, u64)>,
    /// By refusals.
    pub refusals: Vec<(Vec<Counted>, u64)>,
    /// When each bucket began (seconds since the epoch).
    #[serde(default)]
    pub buckets: Vec<u64>,
    /// Each bucket's hits past the near-limit ratio.
    #[serde(default)]
    pub near: Vec<u64>,
}

/// What a replica publishes: when, and its summaries by rule.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Published {
    /// Seconds since the epoch, when written.
    pub at: u64,
    /// By rule path.
    pub rules: HashMap<String, Summary>,
}

/// The heaviest of one rule.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RuleTop {
    /// The rule's path.
    pub rule: String,
    /// The heaviest descriptors by hits, heaviest first.
    pub hits: Vec<Heavy>,
    /// The most hits a descriptor not listed can have had.
    pub hits_unlisted: u64,
    /// The heaviest by refusals.
    pub refusals: Vec<Heavy>,
    /// The most refusals a descriptor not listed can have had.
    pub refusals_unlisted: u64,
    /// Hits, refusals and hits near the limit (past the near-limit ratio)
    /// of every descriptor, per ten seconds, oldest first: `(start, hits,
    /// refusals, near)` (a sketch's counts add up to exactly what it was
    /// given).
    pub series: Vec<(u64, u64, u64, u64)>,
}

/// Rules' windows by domain, then rule path.
type Windows = HashMap<String, HashMap<String, Arc<Mutex<RuleWindow>>>>;

/// Every rule's windows on this replica.
pub struct Top {
    /// By domain, then rule path.
    rules: RwLock<Windows>,
    /// This replica's name in the shared table.
    replica: String,
}

impl Default for Top {
    fn default() -> Self {
        Self {
            rules: RwLock::new(HashMap::new()),
            replica: format!("{:016x}", fastrand::u64(..)),
        }
    }
}

impl Top {
    /// This replica's field in the shared table.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Counts `hit` of descriptor `key` under `domain`'s `rule`.
    pub fn record(&self, domain: &str, rule: &str, key: &str, hit: Hit, now_secs: u64) {
        let found = {
            let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
            rules.get(domain).and_then(|rules| rules.get(rule)).cloned()
        };
        let window = if let Some(window) = found {
            window
        } else {
            let mut rules = self.rules.write().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(
                rules
                    .entry(domain.to_owned())
                    .or_default()
                    .entry(rule.to_owned())
                    .or_default(),
            )
        };
        window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(key, hit, now_secs);
    }

    /// This replica's summaries of `domain`'s rules.
    pub fn local(&self, domain: &str, now_secs: u64) -> Published {
        let windows: Vec<(String, Arc<Mutex<RuleWindow>>)> = {
            let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
            rules
                .get(domain)
                .map(|rules| {
                    rules
                        .iter()
                        .map(|(rule, window)| (rule.clone(), Arc::clone(window)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let rules = windows
            .into_iter()
            .map(|(rule, window)| {
                let summary = window.lock().unwrap_or_else(PoisonError::into_inner).summary(now_secs);
                (rule, summary)
            })
            .collect();
        Published { at: now_secs, rules }
    }

    /// The domains seen.
    pub fn domains(&self) -> Vec<String> {
        let rules = self.rules.read().unwrap_or_else(PoisonError::into_inner);
        rules.keys().cloned().collect()
    }
}

/// Merges replicas' summaries (the fresh ones, at `now_secs`) into each
/// rule's `k` heaviest, for `rule` alone when given.
pub fn merge(published: &[Published], rule: Option<&str>, k: usize, now_secs: u64) -> Vec<RuleTop> {
    let mut by_rule: HashMap<&str, (Merged, Merged)> = HashMap::new();
    let mut series: HashMap<&str, std::collections::BTreeMap<u64, (u64, u64, u64)>> = HashMap::new();
    for replica in published {
        if now_secs.saturating_sub(replica.at) > STALE_AFTER_SECS {
            continue;
        }
        for (path, summary) in &replica.rules {
            if rule.is_some_and(|rule| rule != path) {
                continue;
            }
            let (hits, refusals) = by_rule.entry(path).or_default();
            for (counters, floor) in &summary.hits {
                hits.add(counters, *floor);
            }
            for (counters, floor) in &summary.refusals {
                refusals.add(counters, *floor);
            }
            let sum = |counters: &[Counted]| counters.iter().map(|counted| counted.count).sum::<u64>();
            let rule_series = series.entry(path).or_default();
            for (at, start) in summary.buckets.iter().enumerate() {
                let totals = rule_series.entry(*start).or_default();
                totals.0 += summary.hits.get(at).map_or(0, |(counters, _)| sum(counters));
                totals.1 += summary.refusals.get(at).map_or(0, |(counters, _)| sum(counters));
                totals.2 += summary.near.get(at).copied().unwrap_or(0);
            }
        }
    }
    let mut tops: Vec<RuleTop> = by_rule
        .into_iter()
        .map(|(path, (hits, refusals))| {
            let (hits, hits_unlisted) = hits.heaviest(k);
            let (refusals, refusals_unlisted) = refusals.heaviest(k);
            RuleTop {
                rule: path.to_owned(),
                hits,
                hits_unlisted,
                refusals,
                refusals_unlisted,
                series: series
                    .get(path)
                    .map(|buckets| {
                        buckets
                            .iter()
                            .map(|(start, (hits, refused, near))| (*start, *hits, *refused, *near))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    tops.sort_by(|a, b| a.rule.cmp(&b.rule));
    tops
}

/// A descriptor as the answer shows it, from its subject's key
/// (`domain:key:value:…`, each part percent-encoded): `key=value, …`; a
/// long subject's hash as it is.
pub fn descriptor_of(subject_key: &str) -> String {
    let Some(parts) = tollgate::subject_parts(subject_key) else {
        return subject_key.to_owned();
    };
    parts[1..]
        .chunks(2)
        .map(|pair| match pair {
            [key, value] => format!("{key}={value}"),
            [key] => key.clone(),
            _ => String::new(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_reads_back_as_its_entries() {
        let subject = tollgate::Subject::from_parts(["llm", "tenant", "a:b c", "model", "gpt-4"]);
        assert_eq!(descriptor_of(subject.as_key()), "tenant=a:b c, model=gpt-4");
    }

    #[test]
    fn the_last_minute_is_six_buckets_of_ten_seconds() {
        let top = Top::default();
        for second in 0..70 {
            let hit = Hit {
                hits: 1,
                near: u64::from(second % 5 == 0),
                refused: second % 2 == 0,
            };
            top.record("d", "r", "a", hit, 1_000 + second);
        }
        let hit = Hit {
            hits: 3,
            near: 2,
            refused: false,
        };
        top.record("d", "r", "b", hit, 1_069);
        let merged = merge(&[top.local("d", 1_069)], None, 10, 1_069);
        assert_eq!(merged.len(), 1);
        // Buckets 1 060.., 1 050.. … 1 010..: seconds 1 010 to 1 069 (60).
        assert_eq!(merged[0].hits[0].key, "a");
        assert_eq!(merged[0].hits[0].count, 60);
        assert_eq!(merged[0].hits[1].count, 3);
        assert_eq!(merged[0].refusals[0].count, 30);
        // Ten seconds a bucket, every hit counted once.
        let hits: Vec<u64> = merged[0].series.iter().map(|&(_, hits, _, _)| hits).collect();
        assert_eq!(hits, [10, 10, 10, 10, 10, 13]);
        let near: Vec<u64> = merged[0].series.iter().map(|&(_, _, _, near)| near).collect();
        assert_eq!(near, [2, 2, 2, 2, 2, 4]);
        assert_eq!(merged[0].series[0].0, 1_010);
        // A summary gone stale is left out.
        assert!(merge(&[top.local("d", 1_069)], None, 10, 1_100).is_empty());
    }
}
