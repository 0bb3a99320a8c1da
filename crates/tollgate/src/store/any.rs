//! A store chosen at run time (by a command-line flag or a config file).

use super::{MemoryStore, Spread, Store, SubjectPage};
#[cfg(feature = "redis")]
use super::{RedisStore, RegionalStore, ResilientStore};
use crate::clock::Sleep;
use crate::decision::Outcome;
use crate::error::Result;
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::{Subject, SubjectPattern};

/// Either store; decides like the store it holds. Code that knows its store
/// at compile time should use that store's type instead.
///
/// Non-exhaustive: the `Redis` variant exists with the `redis` feature (on
/// by default), and a crate elsewhere in the build may turn that on.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// The embedded store.
    Memory(MemoryStore),
    /// Redis (or Valkey).
    #[cfg(feature = "redis")]
    Redis(RedisStore),
    /// Redis behind a deadline, a circuit breaker, a failure policy and a
    /// deny cache.
    #[cfg(feature = "redis")]
    Resilient(ResilientStore<RedisStore>),
    /// A region's Redis behind a failure policy, with global limits shared
    /// with other regions through a home Redis.
    #[cfg(feature = "redis")]
    Regional(RegionalStore<ResilientStore<RedisStore>>),
}

impl Store for AnyStore {
    fn in_process(&self) -> bool {
        matches!(self, Self::Memory(_))
    }

    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        match self {
            Self::Memory(store) => store.decide_now(subject, policy, request),
            #[cfg(feature = "redis")]
            Self::Redis(store) => store.decide(subject, policy, request).await,
            #[cfg(feature = "redis")]
            Self::Resilient(store) => store.decide(subject, policy, request).await,
            #[cfg(feature = "redis")]
            Self::Regional(store) => store.decide(subject, policy, request).await,
        }
    }

    async fn decide_spread(&self, spread: &Spread, op: Op) -> Result<Outcome> {
        match self {
            Self::Memory(store) => store.decide_spread(spread, op).await,
            #[cfg(feature = "redis")]
            Self::Redis(store) => store.decide_spread(spread, op).await,
            #[cfg(feature = "redis")]
            Self::Resilient(store) => store.decide_spread(spread, op).await,
            #[cfg(feature = "redis")]
            Self::Regional(store) => store.decide_spread(spread, op).await,
        }
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        match self {
            Self::Memory(store) => store.reset(subject, policy).await,
            #[cfg(feature = "redis")]
            Self::Redis(store) => store.reset(subject, policy).await,
            #[cfg(feature = "redis")]
            Self::Resilient(store) => store.reset(subject, policy).await,
            #[cfg(feature = "redis")]
            Self::Regional(store) => store.reset(subject, policy).await,
        }
    }

    async fn ping(&self) -> Result<()> {
        match self {
            Self::Memory(store) => store.ping().await,
            #[cfg(feature = "redis")]
            Self::Redis(store) => store.ping().await,
            #[cfg(feature = "redis")]
            Self::Resilient(store) => store.ping().await,
            #[cfg(feature = "redis")]
            Self::Regional(store) => store.ping().await,
        }
    }

    fn sleep(&self, duration: std::time::Duration) -> Sleep {
        match self {
            Self::Memory(store) => store.sleep(duration),
            #[cfg(feature = "redis")]
            Self::Redis(store) => store.sleep(duration),
            #[cfg(feature = "redis")]
            Self::Resilient(store) => store.sleep(duration),
            #[cfg(feature = "redis")]
            Self::Regional(store) => store.sleep(duration),
        }
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        Self::Memory(store)
    }
}

#[cfg(feature = "redis")]
impl From<RedisStore> for AnyStore {
    fn from(store: RedisStore) -> Self {
        Self::Redis(store)
    }
}

#[cfg(feature = "redis")]
impl From<ResilientStore<RedisStore>> for AnyStore {
    fn from(store: ResilientStore<RedisStore>) -> Self {
        Self::Resilient(store)
    }
}

#[cfg(feature = "redis")]
impl From<RegionalStore<ResilientStore<RedisStore>>> for AnyStore {
    fn from(store: RegionalStore<ResilientStore<RedisStore>>) -> Self {
        Self::Regional(store)
    }
}

impl AnyStore {
    /// The Redis store behind it: the store itself, the one a failure
    /// policy guards (once connected), or a region's own Redis; `None` in
    /// memory.
    #[cfg(feature = "redis")]
    pub fn redis(&self) -> Option<&RedisStore> {
        match self {
            Self::Memory(_) => None,
            Self::Redis(store) => Some(store),
            Self::Resilient(store) => store.store(),
            Self::Regional(store) => Some(store.regional()),
        }
    }

    /// True for a Redis store, connected yet or not.
    pub fn is_redis(&self) -> bool {
        !matches!(self, Self::Memory(_))
    }

    /// The subjects that fit `pattern` the store holds state for under the
    /// limit `name`, a page at a time: [`MemoryStore::subjects`],
    /// [`RedisStore::subjects`].
    ///
    /// # Errors
    ///
    /// As the store's; Redis behind a failure policy that has not connected
    /// yet is a store fault.
    #[cfg_attr(not(feature = "redis"), allow(clippy::unused_async))] // Redis is awaited
    pub async fn subjects(
        &self,
        pattern: &SubjectPattern,
        name: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<SubjectPage> {
        match self {
            Self::Memory(store) => store.subjects(pattern, name, cursor, limit),
            #[cfg(feature = "redis")]
            Self::Redis(store) => store.subjects(pattern, name, cursor, limit).await,
            #[cfg(feature = "redis")]
            Self::Resilient(store) => match store.store() {
                Some(redis) => redis.subjects(pattern, name, cursor, limit).await,
                None => Err(crate::Error::new(crate::ErrorKind::Store, "redis: not connected yet")),
            },
            #[cfg(feature = "redis")]
            Self::Regional(store) => store.regional().subjects(pattern, name, cursor, limit).await,
        }
    }
}
