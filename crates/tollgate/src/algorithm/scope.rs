//! Where a limit holds: in the store it is decided on (a region's), or
//! across every region that shares one home store ([`Scope::Global`]).

use std::fmt;

use super::Limit;
use crate::error::{Error, Result};

/// Where a limit holds ([`Limit::with_scope`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Scope {
    /// In the store that decides it: each region that decides it on its
    /// own store admits up to the limit (the default).
    #[default]
    Regional,
    /// Across every region: a [`RegionalStore`](crate::RegionalStore) takes
    /// the region's share of it from the home store in blocks and decides
    /// on that share in the region, so that the regions together never
    /// admit more than the limit.
    Global,
}

impl Scope {
    /// Its name in JSON and configuration files: `regional` or `global`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Regional => "regional",
            Self::Global => "global",
        }
    }

    /// Reads `"scope"` as JSON gives it.
    pub(super) fn from_json(value: &serde_json::Value) -> Result<Self> {
        match value.as_str() {
            Some("regional") => Ok(Self::Regional),
            Some("global") => Ok(Self::Global),
            _ => Err(Error::invalid_limit(
                "scope: expected \"global\" (one limit across regions) or \"regional\"",
            )),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Limit {
    /// This limit, holding across regions when `scope` is
    /// [`Scope::Global`]: decided by a [`RegionalStore`](crate::RegionalStore)
    /// on the region's share, taken from the home store in blocks (any
    /// other store decides it as a regional limit).
    ///
    /// # Errors
    ///
    /// A global limit must be leasable (its share is taken as a block, as a
    /// lease's is) and cannot alert (a region hands out its share without
    /// the home store); the message names `scope`.
    pub fn with_scope(mut self, scope: Scope) -> Result<Self> {
        if scope == Scope::Global {
            if !self.is_leasable() {
                return Err(Error::invalid_limit(format!(
                    "scope: a {} limit cannot be global (its share is taken in blocks, as a lease's)",
                    self.algorithm()
                )));
            }
            if !self.alerts().is_empty() {
                return Err(Error::invalid_limit(
                    "scope: a global limit cannot alert (a region hands out its share without the home store)",
                ));
            }
        }
        self.scope = scope;
        Ok(self)
    }

    /// Where this limit holds ([`Limit::with_scope`]).
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// True for a limit that holds across regions.
    pub fn is_global(&self) -> bool {
        self.scope == Scope::Global
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_global_limit_reads_back_and_refuses_what_it_cannot_be() {
        let limit =
            Limit::from_json(r#"{"algorithm": "fixed_window", "limit": 1000, "window": "1m", "scope": "global"}"#)
                .unwrap();
        assert!(limit.is_global());
        assert_eq!(Limit::from_value(limit.to_value()).unwrap(), limit);
        let regional =
            Limit::from_json(r#"{"algorithm": "gcra", "rate": 1, "period": "1s", "burst": 1, "scope": "regional"}"#)
                .unwrap();
        assert_eq!(regional.scope(), Scope::Regional);
        assert!(regional.to_value().get("scope").is_none());
        let wrong =
            Limit::from_json(r#"{"algorithm": "gcra", "rate": 1, "period": "1s", "burst": 1, "scope": "world"}"#)
                .unwrap_err();
        assert_eq!(
            wrong.to_string(),
            "scope: expected \"global\" (one limit across regions) or \"regional\""
        );
        let concurrency = Limit::concurrency(10, Duration::from_secs(1)).unwrap();
        assert!(concurrency
            .with_scope(Scope::Global)
            .unwrap_err()
            .to_string()
            .contains("scope: a concurrency limit cannot be global"));
        let alerting = Limit::fixed_window(10, Duration::from_secs(1))
            .unwrap()
            .alerting([80])
            .unwrap();
        assert!(alerting
            .clone()
            .with_scope(Scope::Global)
            .unwrap_err()
            .to_string()
            .contains("scope:"));
        let global = Limit::fixed_window(10, Duration::from_secs(1))
            .unwrap()
            .with_scope(Scope::Global)
            .unwrap();
        assert!(global
            .alerting([80])
            .unwrap_err()
            .to_string()
            .contains("alerts: a global limit"));
    }
}
