//! Where a limit holds: in the store it is decided on (a region's), or
//! across every region that shares one home store ([`Scope::Global`]).

use std::fmt;

use crate::error::{Error, Result};

/// Where a limit holds ([`Limit::with_scope`](crate::Limit::with_scope)).
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
