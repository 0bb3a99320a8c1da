//! Whether the budgets last: the Redis store is asked what it keeps across
//! a restart (at start, then every [`PERSISTENCE_CHECK`], so a Redis that
//! restarted with other settings is seen), and the rules whose state
//! matters for a day or longer are named in a warning when it keeps
//! nothing; `/rlconfig` and `/metrics` say the same.

use std::time::Duration;

use tokio::sync::watch;
use tollgate::Persistence;

use super::Service;
use crate::config::RuleLimit;

/// How often the store is asked again.
pub const PERSISTENCE_CHECK: Duration = Duration::from_secs(30);

/// State that matters this long is worth keeping across a restart.
const LONG_LIVED: Duration = Duration::from_secs(86_400);

/// What the store keeps, and the rules a restart would cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lasting {
    /// What the store keeps across a restart.
    pub persistence: Persistence,
    /// `domain.rule` of every rule whose state lasts a day or longer.
    pub long_lived: Vec<String>,
}

impl Lasting {
    /// The rules a restart of the store would reset (none when it persists).
    pub fn lost_on_restart(&self) -> &[String] {
        if self.persistence.forgets_on_restart() {
            &self.long_lived
        } else {
            &[]
        }
    }

    /// One line for `/rlconfig`.
    pub fn describe(&self) -> String {
        let lost = self.lost_on_restart();
        if lost.is_empty() {
            format!("# store: redis {}\n", self.persistence)
        } else {
            format!(
                "# store: redis {}; these rules keep state for a day or longer and lose it then: {}\n",
                self.persistence,
                lost.join(", ")
            )
        }
    }
}

impl Service {
    /// `domain.rule` of every configured rule whose state lasts a day or
    /// longer.
    pub fn long_lived_rules(&self) -> Vec<String> {
        let config = self.config.load();
        config
            .rules()
            .into_iter()
            .filter_map(|(domain, rule)| match &rule.limit {
                RuleLimit::Limited(limit) if limit.spec().state_lasts() >= LONG_LIVED => {
                    Some(format!("{domain}.{}", rule.path))
                }
                _ => None,
            })
            .collect()
    }

    /// Asks the store what it keeps across a restart; `None` on the memory
    /// store (nothing outlives the process) or before Redis has connected.
    /// Logs a warning, naming the rules, when it changed to keeping nothing
    /// while some rule's state lasts a day or longer.
    pub async fn check_persistence(&self) -> Option<Lasting> {
        let redis = self.store().redis()?.clone();
        let persistence = match redis.persistence().await {
            Ok(persistence) => persistence,
            Err(error) => {
                tracing::debug!("persistence: the store did not answer: {error}");
                return None;
            }
        };
        let lasting = Lasting {
            persistence,
            long_lived: self.long_lived_rules(),
        };
        let previous = self
            .lasting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(lasting.clone());
        if previous.as_ref() != Some(&lasting) {
            let lost = lasting.lost_on_restart();
            if !lost.is_empty() {
                tracing::warn!(
                    rules = %lost.join(", "),
                    "the Redis store persists nothing (appendonly no, save \"\"): these rules keep state for a day \
                     or longer and a restart of Redis resets them; turn on appendonly (or snapshots) to keep budgets"
                );
            } else if let Persistence::Unknown(why) = &lasting.persistence {
                tracing::info!("cannot tell whether the Redis store persists: {why}");
            } else {
                tracing::info!("the Redis store {}", lasting.persistence);
            }
        }
        self.metrics
            .store_persistence(lasting.persistence.label(), lasting.lost_on_restart().len());
        Some(lasting)
    }

    /// What the store was last found to keep.
    pub fn lasting(&self) -> Option<Lasting> {
        self.lasting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Checks persistence at once, then every [`PERSISTENCE_CHECK`] and
    /// after each configuration change, until `stopped`.
    pub async fn follow_persistence(&self, mut stopped: watch::Receiver<bool>) {
        if !self.store().is_redis() {
            return;
        }
        let mut changes = self.config_changes();
        let mut ticks = tokio::time::interval(PERSISTENCE_CHECK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = changes.changed() => {}
                _ = stopped.wait_for(|stop| *stop) => return,
            }
            self.check_persistence().await;
        }
    }
}
