//! # Tollgate
//!
//! A rate limiter for services with several replicas: the classic algorithms
//! (fixed window, sliding window, sliding log, token bucket, token bucket
//! with reservation, leaky bucket, GCRA, concurrency), each with a per-request
//! cost, keyed by any subject, decided atomically in one step per call.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limit, Limiter, Subject};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! // 10 requests per second per client and route, bursts of 5.
//! let limit = Limit::gcra(10, Duration::from_secs(1), 5)?;
//! let limiter = Limiter::in_memory(limit);
//! let subject = Subject::new("203.0.113.7").and("/login");
//!
//! let decision = limiter.check(&subject).await?;
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 4);
//! # Ok::<(), tollgate::Error>(())
//! # }).unwrap();
//! ```
//!
//! Time is integer microseconds everywhere; rates such as 7 per second are
//! kept exact (see the GCRA and token bucket docs), so nothing drifts. A
//! [`Clock`] is the only thing that reads the time: tests use a
//! [`ManualClock`].
//!
//! A [`Policy`] holds several named limits for one subject ("10 per second and
//! 1000 per hour") and is decided all-or-nothing: when any limit denies, none
//! consumes.
//!
//! Each constructor of [`Limit`] states its algorithm's parameters and the
//! exact bound it keeps.
//!
//! ## Features
//!
//! - `redis` (default): the Redis store, `RedisStore` (Redis 6.2+ and
//!   Valkey; standalone, Cluster, Sentinel; TLS). Without it the crate
//!   compiles no Redis client and no TLS stack.
//! - `tower`: `tollgate::tower::RateLimitLayer`, for tower and axum
//!   services: 429 with `RateLimit` headers, shaping limits delay instead.

mod algorithm;
mod clock;
mod decision;
mod direct;
pub mod duration;
#[cfg(feature = "engine")]
pub mod engine;
mod error;
mod follower;
mod limiter;
mod overrides;
mod policy;
mod request;
mod settling;
mod store;
mod subject;
#[cfg(feature = "tower")]
pub mod tower;
pub mod wire;

pub use algorithm::{
    ConcurrencySpec, Durability, FixedWindowSpec, GcraSpec, LeakyBucketSpec, Limit, LimitSpec, Period, Refill,
    ReservationSpec, Scope, SlidingWindowSpec, TokenBucketSpec, WindowSpec, MOST_ALERTS,
};
pub use clock::{Clock, ManualClock, Sleep, SystemClock, Timestamp};
pub use decision::{Crossing, Decision, Outcome, Path, Restrictiveness};
pub use direct::DirectLimiter;
pub use error::{Error, ErrorKind, Result};
pub use follower::{Applied, Followed, FollowedMap, TableFollower};
pub use limiter::{Acquired, Estimated, Limiter, Permit, Settlement};
pub use overrides::PolicyOverrides;
pub use policy::Policy;
pub use request::{Cost, Op, Request};
pub use store::{
    AnyStore, LeaseStats, LeasedStore, MemoryStore, MemoryStoreBuilder, OnStoreError, ResilienceStats, ResilientStore,
    ResilientStoreBuilder, Spread, SpreadBuilder, Store, StoreConnector, SubjectPage,
};
/// The README's Rust blocks, compiled and run as doc tests.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The Rust blocks of the library's guide, compiled and run as doc tests.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryDoctests;

/// The Rust blocks of the overrides' guide, compiled and run as doc tests.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/overrides.md")]
pub struct OverridesDoctests;

/// The Rust blocks of the regions' guide, compiled and run as doc tests.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/regions.md")]
pub struct RegionsDoctests;

#[cfg(feature = "redis")]
pub use store::{
    EngineChoice, EngineKind, Outbox, OutboxEntry, Persistence, RedisStore, RedisStoreBuilder, RegionStats,
    RegionalStore, RegionalStoreBuilder, RuleStats, Share, SharedTable, TableChange, TableChanges, DEFAULT_PREFIX,
};
pub use subject::{subject_parts, Subject, SubjectPattern, MAX_KEY_LEN};
