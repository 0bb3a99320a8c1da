//! The heaviest descriptors per rule, kept on the decision path and
//! answered from this replica and the others on its Redis (see
//! [`crate::top`]).

use std::time::Duration;

use tokio::sync::watch;

use super::answer::unix_now;
use super::matching::Item;
use super::{Service, ServiceError};
use crate::metrics::Usage;
use crate::top::{descriptor_of, merge, Hit, Published, RuleTop, PUBLISH_EVERY};

impl Service {
    /// Counts each limited descriptor of a decided request under its rule.
    pub(super) fn track_top(&self, domain: &str, items: &[Item<'_>], now: u64) {
        let now_secs = now / 1_000_000;
        for item in items {
            let (Some(limited), Some(rule)) = (item.limited(), item.status.rule.as_deref()) else {
                continue;
            };
            let near = item.decision.as_ref().map_or(0, |decision| {
                Usage::of(decision, item.cost, item.shadow)
                    .split(item.cost, self.options.near_limit_ratio)
                    .near
            });
            let hit = Hit {
                hits: item.cost,
                near,
                refused: item.is_over(),
            };
            self.top.record(domain, rule, limited.subject.as_key(), hit, now_secs);
        }
    }

    /// The shared table of `domain`'s summaries, on Redis.
    fn top_table(&self, domain: &str) -> Option<tollgate::SharedTable> {
        let redis = self.store().redis()?.clone();
        Some(redis.table(&format!("top:{domain}")))
    }

    /// The `k` heaviest descriptors of each of `domain`'s rules (of `rule`
    /// alone when given) over the last minute, merged over this replica
    /// and every other that published to the store lately.
    ///
    /// # Errors
    ///
    /// A `k` of 0 or above 1 000 ([`super::Failure::InvalidArgument`]); a
    /// store fault reading the others' summaries.
    pub async fn top(&self, domain: &str, rule: Option<&str>, k: usize) -> Result<Vec<RuleTop>, ServiceError> {
        if k == 0 || k > 1_000 {
            return Err(ServiceError::invalid("k must be from 1 to 1000"));
        }
        if !self.config().domains.contains_key(domain) {
            return Err(ServiceError::invalid(format!("domain \"{domain}\" is not configured")));
        }
        let now_secs = unix_now() / 1_000_000;
        let mut published = vec![self.top.local(domain, now_secs)];
        if let Some(table) = self.top_table(domain) {
            let (_, fields) = table.load().await.map_err(ServiceError::from)?;
            for (replica, value) in fields {
                if replica == self.top.replica() {
                    continue;
                }
                // A replica of another version may write another shape.
                if let Ok(theirs) = serde_json::from_str::<Published>(&value) {
                    published.push(theirs);
                }
            }
        }
        let mut tops = merge(&published, rule, k, now_secs);
        for top in &mut tops {
            for heavy in top.hits.iter_mut().chain(top.refusals.iter_mut()) {
                heavy.key = descriptor_of(&heavy.key);
            }
        }
        Ok(tops)
    }

    /// The replicas that published summaries of any domain lately, this one
    /// included (on the memory store, this one).
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn replicas_seen(&self) -> Result<usize, ServiceError> {
        let now_secs = unix_now() / 1_000_000;
        let mut seen = std::collections::HashSet::new();
        seen.insert(self.top.replica().to_owned());
        for domain in self.config().domains.keys() {
            let Some(table) = self.top_table(domain) else { break };
            let (_, fields) = table.load().await.map_err(ServiceError::from)?;
            for (replica, value) in fields {
                let fresh = serde_json::from_str::<Published>(&value)
                    .is_ok_and(|theirs| now_secs.saturating_sub(theirs.at) <= crate::top::STALE_AFTER_SECS);
                if fresh {
                    seen.insert(replica);
                }
            }
        }
        Ok(seen.len())
    }

    /// Publishes this replica's summaries of every domain to the store now
    /// (on Redis; nothing elsewhere).
    ///
    /// # Errors
    ///
    /// A store fault.
    pub async fn publish_top_now(&self) -> Result<(), ServiceError> {
        let now_secs = unix_now() / 1_000_000;
        for domain in self.top.domains() {
            let Some(table) = self.top_table(&domain) else { continue };
            let published = self.top.local(&domain, now_secs);
            let value = serde_json::to_string(&published)
                .map_err(|error| ServiceError::invalid(format!("top: cannot write the summaries: {error}")))?;
            table
                .set(self.top.replica(), &value)
                .await
                .map_err(ServiceError::from)?;
        }
        Ok(())
    }

    /// Publishes this replica's summaries to the store every
    /// [`PUBLISH_EVERY`] until `stopped`, then takes them back.
    pub async fn publish_top(&self, mut stopped: watch::Receiver<bool>) {
        if !self.options.track_top || self.top_table("").is_none() {
            return;
        }
        let mut every = tokio::time::interval(PUBLISH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stopped.wait_for(|stop| *stop) => break,
            }
            if let Err(error) = self.publish_top_now().await {
                tracing::debug!(%error, "top: publishing this replica's summaries failed");
            }
        }
        for domain in self.top.domains() {
            if let Some(table) = self.top_table(&domain) {
                let _ = tokio::time::timeout(Duration::from_secs(1), table.delete(self.top.replica())).await;
            }
        }
    }
}
