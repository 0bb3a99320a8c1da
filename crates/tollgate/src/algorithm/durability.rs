//! Durable records: a limit may ask that what it counts survive a Redis
//! failover (acknowledged by a replica) or a crash (fsynced to the
//! append-only file) before the call answers.

use crate::error::{Error, Result};

/// What a durable limit's counts must reach before a call that counted
/// answers ([`Limit::durable`](super::Limit::durable)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Durability {
    /// At least one replica has it (`WAIT 1`): a failover to that replica
    /// keeps it.
    Replicated,
    /// The server's append-only file has it on disk (`WAITAOF 1 0`, Redis
    /// 7.2+ and Valkey): a crash and restart keeps it.
    Fsynced,
}

impl Durability {
    /// What `"durable"` accepts, for its error.
    pub(crate) const EXPECTED: &'static str =
        "durable: expected \"replicated\" (a replica has it) or \"fsynced\" (the append-only file has it)";

    /// `replicated` or `fsynced`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Replicated => "replicated",
            Self::Fsynced => "fsynced",
        }
    }

    /// Reads `replicated` or `fsynced`.
    ///
    /// # Errors
    ///
    /// Any other text; the message names `durable`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "replicated" => Ok(Self::Replicated),
            "fsynced" => Ok(Self::Fsynced),
            _ => Err(Error::invalid_limit(Self::EXPECTED)),
        }
    }
}
