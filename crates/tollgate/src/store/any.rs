//! A store chosen at run time (by a command-line flag or a config file).

use super::{MemoryStore, RedisStore, ResilientStore, Store};
use crate::clock::Sleep;
use crate::decision::Outcome;
use crate::error::Result;
use crate::policy::{Policy, Request};
use crate::subject::Subject;

/// Either store; decides like the store it holds. Code that knows its store
/// at compile time should use that store's type instead.
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// The embedded store.
    Memory(MemoryStore),
    /// Redis (or Valkey).
    Redis(RedisStore),
    /// Redis behind a deadline, a circuit breaker, a failure policy and a
    /// deny cache.
    Resilient(ResilientStore<RedisStore>),
}

impl Store for AnyStore {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        match self {
            Self::Memory(store) => store.decide_now(subject, policy, request),
            Self::Redis(store) => store.decide(subject, policy, request).await,
            Self::Resilient(store) => store.decide(subject, policy, request).await,
        }
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        match self {
            Self::Memory(store) => store.reset(subject, policy).await,
            Self::Redis(store) => store.reset(subject, policy).await,
            Self::Resilient(store) => store.reset(subject, policy).await,
        }
    }

    fn sleep(&self, duration: std::time::Duration) -> Sleep {
        match self {
            Self::Memory(store) => store.sleep(duration),
            Self::Redis(store) => store.sleep(duration),
            Self::Resilient(store) => store.sleep(duration),
        }
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        Self::Memory(store)
    }
}

impl From<RedisStore> for AnyStore {
    fn from(store: RedisStore) -> Self {
        Self::Redis(store)
    }
}

impl From<ResilientStore<RedisStore>> for AnyStore {
    fn from(store: ResilientStore<RedisStore>) -> Self {
        Self::Resilient(store)
    }
}
