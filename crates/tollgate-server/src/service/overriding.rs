//! The service's side of overrides (`/v1/overrides`): each change checked
//! against the configuration in force, made in the store, logged with the
//! limit before and after and its reason, and counted.

use tokio::sync::watch;

use super::{Failure, Service, ServiceError};
use crate::config::RuleLimit;
use crate::overrides::{describe_rule, Changed, Entry, Override, OverrideError, OverrideRequest, Stored, REFRESH};

impl From<OverrideError> for ServiceError {
    fn from(error: OverrideError) -> Self {
        match error {
            OverrideError::Store(error) => Self::Library(error),
            OverrideError::NotConnected | OverrideError::Encode(_) => {
                Self::Refused(Failure::Unavailable, error.to_string())
            }
        }
    }
}

impl Service {
    /// Puts the override `request` asks for in force: what it replaced.
    ///
    /// # Errors
    ///
    /// An invalid request (nothing is written), or a store fault (nothing
    /// changed).
    pub async fn set_override(&self, request: OverrideRequest) -> Result<Changed, ServiceError> {
        let now = self.overrides.now();
        let config = self.config.load();
        let new =
            Override::from_request(request, &config, now).map_err(|error| ServiceError::invalid(error.to_string()))?;
        let configured = config
            .domains
            .get(&new.stored.domain)
            .and_then(|domain| domain.lookup(&new.entries()).map(|found| found.rule.limit.clone()));
        if let (Some(RuleLimit::Limited(was)), RuleLimit::Limited(now)) = (&configured, &new.rule.limit) {
            if std::mem::discriminant(was.spec()) != std::mem::discriminant(now.spec()) {
                tracing::warn!(
                    domain = %new.stored.domain,
                    descriptor = %crate::overrides::stat_key(&new.stored.descriptor),
                    "override: another algorithm than the rule's; what was used under the rule does not carry over"
                );
            }
        }
        let changed = self.overrides.set(new).await?;
        self.note_override(&changed, "set");
        Ok(changed)
    }

    /// Removes the override of `descriptor` in `domain`: what it was.
    ///
    /// # Errors
    ///
    /// An unknown domain or an empty descriptor, or a store fault.
    pub async fn delete_override(&self, domain: &str, descriptor: &[Entry]) -> Result<Changed, ServiceError> {
        self.known_domain(domain)?;
        if descriptor.is_empty() {
            return Err(ServiceError::invalid("descriptor: must have at least one entry"));
        }
        let changed = self.overrides.delete(domain, descriptor).await?;
        if changed.previous.is_some() {
            self.note_override(&changed, "delete");
        }
        Ok(changed)
    }

    /// The overrides in force, of `domain` or of every domain, in domain
    /// and descriptor order.
    ///
    /// # Errors
    ///
    /// An unknown domain.
    pub fn list_overrides(&self, domain: Option<&str>) -> Result<Vec<Stored>, ServiceError> {
        if let Some(domain) = domain {
            self.known_domain(domain)?;
        }
        let now = self.overrides.now();
        let all = self.overrides.all();
        let mut listed: Vec<Stored> = all
            .iter()
            .filter(|(name, _)| domain.is_none_or(|domain| domain == name.as_str()))
            .flat_map(|(_, overrides)| overrides.iter())
            .filter(|found| found.in_force(now))
            .map(|found| found.stored.clone())
            .collect();
        listed.sort_by(|a, b| (&a.domain, &a.descriptor).cmp(&(&b.domain, &b.descriptor)));
        Ok(listed)
    }

    fn known_domain(&self, domain: &str) -> Result<(), ServiceError> {
        if self.config.load().domains.contains_key(domain) {
            Ok(())
        } else {
            Err(ServiceError::invalid(format!(
                "domain: no domain \"{domain}\" is configured"
            )))
        }
    }

    /// Logs and counts one change.
    fn note_override(&self, changed: &Changed, how: &'static str) {
        let which = changed.current.as_ref().or(changed.previous.as_ref());
        let descriptor = which
            .map(|found| crate::overrides::stat_key(&found.stored.descriptor))
            .unwrap_or_default();
        let configured = || {
            let config = self.config.load();
            let rule = which.and_then(|found| {
                let entries = found.entries();
                let domain = config.domains.get(&changed.domain)?;
                domain.lookup(&entries).map(|found| describe_rule(found.rule))
            });
            format!("the configured rule ({})", rule.as_deref().unwrap_or("none"))
        };
        let before = changed
            .previous
            .as_ref()
            .map_or_else(configured, |found| found.describe());
        let after = changed
            .current
            .as_ref()
            .map_or_else(configured, |found| found.describe());
        let reason = changed
            .current
            .as_ref()
            .or(changed.previous.as_ref())
            .and_then(|found| found.stored.reason.clone())
            .unwrap_or_default();
        let until = changed
            .current
            .as_ref()
            .and_then(|found| found.stored.expires_at.clone())
            .unwrap_or_default();
        tracing::info!(
            domain = %changed.domain,
            descriptor = %descriptor,
            before = %before,
            after = %after,
            until = %until,
            reason = %reason,
            "override {how}"
        );
        self.metrics.override_change(&changed.domain, how);
        let until = if until.is_empty() {
            String::new()
        } else {
            format!(" until {until}")
        };
        let reason = if reason.is_empty() {
            String::new()
        } else {
            format!(" ({reason})")
        };
        let done = match how {
            "set" => "set",
            "delete" => "deleted",
            _ => "expired",
        };
        self.override_event(format!(
            "override {done}: {} {descriptor}: {before} → {after}{until}{reason}",
            changed.domain
        ));
        self.count_overrides();
    }

    /// Publishes how many overrides each domain has in force.
    fn count_overrides(&self) {
        for (domain, overrides) in &self.overrides.all() {
            self.metrics.overrides_in_force(domain, overrides.len());
        }
    }

    /// Reads the overrides in the store once, before the service answers:
    /// a replica that starts (or restarts) applies them from its first
    /// decision. A store that does not answer within `patience` is left to
    /// [`Service::follow_overrides`].
    pub async fn load_overrides(&self, patience: std::time::Duration) {
        let config = self.config.load_full();
        let domains = config.domains.keys().map(String::as_str);
        match tokio::time::timeout(patience, self.overrides.refresh(domains)).await {
            Ok(Ok(_)) => self.count_overrides(),
            Ok(Err(OverrideError::NotConnected)) => {}
            Ok(Err(error)) => tracing::warn!("overrides: cannot read the store yet: {error}"),
            Err(_) => tracing::warn!("overrides: the store did not answer within {patience:?}; read later"),
        }
    }

    /// Follows the overrides in the store (every [`REFRESH`]) until
    /// `stopped`: changes made through other replicas, and expiries.
    pub async fn follow_overrides(&self, mut stopped: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(REFRESH);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stopped.wait_for(|stop| *stop) => return,
            }
            let config = self.config.load_full();
            match self.overrides.refresh(config.domains.keys().map(String::as_str)).await {
                Ok(changes) => {
                    if failing {
                        tracing::info!("overrides: the store answers again");
                        failing = false;
                    }
                    for changed in &changes {
                        self.note_seen(changed);
                    }
                    self.count_overrides();
                }
                Err(OverrideError::NotConnected) => {}
                Err(error) => {
                    if !failing {
                        tracing::warn!("overrides: cannot read the store, the overrides in force stay: {error}");
                    }
                    failing = true;
                }
            }
        }
    }

    /// Logs a change seen in the store: an expiry this replica removed is
    /// logged and counted as a change; one made through another replica is
    /// logged and counted there.
    fn note_seen(&self, changed: &Changed) {
        if changed.expired_here {
            self.note_override(changed, "expire");
            return;
        }
        let which = changed.current.as_ref().or(changed.previous.as_ref());
        let descriptor = which
            .map(|found| crate::overrides::stat_key(&found.stored.descriptor))
            .unwrap_or_default();
        let after = changed
            .current
            .as_ref()
            .map_or_else(|| "the configured rule".to_owned(), |found| describe_rule(&found.rule));
        tracing::debug!(domain = %changed.domain, descriptor = %descriptor, after = %after, "override seen");
    }
}
