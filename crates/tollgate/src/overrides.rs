//! Policies set per subject while a service runs: a tenant's plan changes
//! now, without a deploy.
//!
//! A [`Limiter`](crate::Limiter) given [`PolicyOverrides`]
//! ([`Limiter::with_overrides`](crate::Limiter::with_overrides)) decides a
//! subject that has an override by the override's policy instead of its own,
//! in the same keys: limits of the same names and algorithms keep what the
//! subject used. Kept in the process, or in a Redis store's
//! [`SharedTable`](crate::SharedTable) so that every process on that Redis
//! applies a change: each holds the overrides in memory (a decision never
//! reads Redis for them) and follows the table with
//! [`PolicyOverrides::refresh`] (or [`PolicyOverrides::follow`]), reading
//! only what changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::follower::TableFollower;
use crate::policy::Policy;
use crate::subject::Subject;

type BySubject = HashMap<String, Arc<Policy>, foldhash::fast::RandomState>;

/// Policies by subject, in place of a limiter's own.
pub struct PolicyOverrides {
    #[cfg(feature = "redis")]
    table: Option<crate::store::SharedTable>,
    in_force: TableFollower<BySubject>,
}

impl std::fmt::Debug for PolicyOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyOverrides")
            .field("overrides", &self.len())
            .finish_non_exhaustive()
    }
}

impl PolicyOverrides {
    /// Overrides of this process alone.
    pub fn in_process() -> Self {
        Self {
            #[cfg(feature = "redis")]
            table: None,
            in_force: TableFollower::new(),
        }
    }

    /// Overrides kept in `table` (`RedisStore::table("…")`), shared by
    /// every process that follows it.
    #[cfg(feature = "redis")]
    pub fn shared(table: crate::store::SharedTable) -> Self {
        Self {
            table: Some(table),
            ..Self::in_process()
        }
    }

    /// The policy in force for `subject`, if it has an override.
    pub fn get(&self, subject: &Subject) -> Option<Arc<Policy>> {
        let held = self.in_force.load();
        if held.is_empty() {
            return None;
        }
        held.get(subject.as_key()).cloned()
    }

    /// How many subjects have an override.
    pub fn len(&self) -> usize {
        self.in_force.load().len()
    }

    /// True when no subject has one.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides `subject` by `policy` from now on; answers the override it
    /// replaced. Shared: written to the store first (every process applies
    /// it at its next refresh), in force here at once.
    ///
    /// # Errors
    ///
    /// A store fault: nothing changed.
    #[cfg_attr(not(feature = "redis"), allow(clippy::unused_async))] // the store is awaited when shared
    pub async fn set(&self, subject: &Subject, policy: Policy) -> Result<Option<Arc<Policy>>> {
        let key = subject.as_key().to_owned();
        let policy = Arc::new(policy);
        #[cfg(feature = "redis")]
        if let Some(table) = &self.table {
            let change = table.set(&key, &policy.to_value().to_string()).await?;
            self.in_force
                .apply(change.version - 1, change.version, vec![(key, Some(policy))]);
            return Ok(change
                .previous
                .and_then(|text| Policy::from_json(&text).ok())
                .map(Arc::new));
        }
        Ok(self
            .in_force
            .edit(|by_subject| Some(by_subject.insert(key, policy)))
            .flatten())
    }

    /// Removes `subject`'s override (its limiter's own policy applies
    /// again); answers it, if there was one.
    ///
    /// # Errors
    ///
    /// A store fault: nothing changed.
    #[cfg_attr(not(feature = "redis"), allow(clippy::unused_async))] // the store is awaited when shared
    pub async fn remove(&self, subject: &Subject) -> Result<Option<Arc<Policy>>> {
        let key = subject.as_key().to_owned();
        #[cfg(feature = "redis")]
        if let Some(table) = &self.table {
            let change = table.delete(&key).await?;
            if change.previous.is_some() {
                self.in_force
                    .apply(change.version - 1, change.version, vec![(key, None)]);
            }
            return Ok(change
                .previous
                .and_then(|text| Policy::from_json(&text).ok())
                .map(Arc::new));
        }
        Ok(self.in_force.edit(|by_subject| by_subject.remove(&key)))
    }

    /// Brings the overrides up to date with the store (nothing to do in
    /// process): the changes since the version held, or the table whole
    /// when they are too many. An override that does not read as a policy
    /// (written by hand) is left out.
    ///
    /// # Errors
    ///
    /// A store fault: the overrides in force stay.
    #[cfg_attr(not(feature = "redis"), allow(clippy::unused_async))] // the store is awaited when shared
    pub async fn refresh(&self) -> Result<()> {
        #[cfg(feature = "redis")]
        if let Some(table) = &self.table {
            // A value that does not read as a policy counts as none.
            let read = |key: &str, text: Option<&str>| {
                let policy = text.and_then(|text| Policy::from_json(text).ok()).map(Arc::new);
                Some((key.to_owned(), policy))
            };
            self.in_force.refresh(table, read).await?;
        }
        Ok(())
    }

    /// Refreshes every `every`, for as long as the future runs (spawn it);
    /// a store fault is logged and tried again at the next turn.
    pub async fn follow(&self, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = self.refresh().await {
                tracing::warn!("policy overrides: cannot read the store, the overrides in force stay: {error}");
            }
        }
    }
}
