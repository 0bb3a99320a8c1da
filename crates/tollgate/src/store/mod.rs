//! Where limit state lives.
//!
//! A [`Store`] runs a whole decision — every limit of a policy, all or
//! nothing — in one atomic step: a shard lock in memory, one script call in
//! Redis. There is never a read-compare-write from the caller.

mod any;
mod lease;
mod listing;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod resilient;
pub(crate) mod spread;

use std::future::Future;
use std::time::Duration;

pub use self::any::AnyStore;
pub use self::lease::{LeaseStats, LeasedStore};
pub use self::listing::SubjectPage;
pub use self::memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "redis")]
pub use self::redis::{
    EngineChoice, EngineKind, Outbox, OutboxEntry, Persistence, RedisStore, RedisStoreBuilder, RegionStats,
    RegionalStore, RegionalStoreBuilder, RuleStats, Share, SharedTable, TableChange, TableChanges, DEFAULT_PREFIX,
};
pub use self::resilient::{OnStoreError, ResilienceStats, ResilientStore, ResilientStoreBuilder, StoreConnector};
pub use self::spread::{Spread, SpreadBuilder};
use crate::clock::Sleep;
use crate::decision::Outcome;
use crate::error::Result;
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::Subject;

/// A place that keeps limit state and decides atomically.
///
/// Used through generics (`Limiter<S: Store>`), so a call costs no dynamic
/// dispatch.
pub trait Store: Clone + Send + Sync + 'static {
    /// Decides `request` for `subject` over every limit of `policy`, storing
    /// the new state when allowed.
    ///
    /// # Errors
    ///
    /// An invalid argument (an operation the policy's limits do not support),
    /// or a store fault.
    fn decide(
        &self,
        subject: &Subject,
        policy: &Policy,
        request: &Request,
    ) -> impl Future<Output = Result<Outcome>> + Send;

    /// Decides `op` over every row of `spread` (a limit kept under its own
    /// subject, asked its own cost: a gateway's descriptors, each its own
    /// subject, so that they spread over a Redis Cluster). All-or-nothing: limits one
    /// atomic step reaches — one subject in memory; on Redis every key of
    /// one server, or of one Cluster hash slot — are decided together;
    /// across steps each consumes and, when any denies, the others give
    /// their units back ([`Op::Refund`](crate::Op::Refund)). For the time of
    /// that refund another request can see the units taken and be denied by
    /// them; none is admitted beyond a limit.
    ///
    /// # Errors
    ///
    /// As [`Store::decide`]; `check_at_most` over more than one step.
    fn decide_spread(&self, spread: &Spread, op: Op) -> impl Future<Output = Result<Outcome>> + Send {
        spread::by_subject(self, spread, op)
    }

    /// Forgets the state of every limit of `policy` for `subject`.
    ///
    /// # Errors
    ///
    /// A store fault.
    fn reset(&self, subject: &Subject, policy: &Policy) -> impl Future<Output = Result<()>> + Send;

    /// Checks that the store answers (a health check): always, in memory;
    /// a `TIME` round trip on Redis.
    ///
    /// # Errors
    ///
    /// A store fault, or no answer in time.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Waits for `duration` on the store's notion of time.
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }

    /// True when the state lives in this process (the memory store): no
    /// other process shares it, so a [`LeasedStore`] over it does not lease.
    fn in_process(&self) -> bool {
        false
    }
}
