//! Envoy's rate limit quota service (RLQS): global limits with no call on
//! the request path.
//!
//! Each Envoy holds one stream, sorts its requests into buckets, decides
//! them itself from the assignment this server last sent for the bucket,
//! and reports what it allowed and denied (about every 5 s). A bucket's id
//! is matched as an RLS request of one descriptor with the id's entries (in
//! key order) would be, so one configuration governs both protocols.
//!
//! Every `interval` (1 s), aligned to the clock, the server splits each
//! limited bucket's budget among the Envoys that ask for it (max-min fair,
//! see the `split` module) and takes each Envoy's share from the limit in
//! the store as a block ([`Op::CheckAtMost`](tollgate::Op::CheckAtMost)):
//! several replicas on one Redis split one limit, and no assignment is ever
//! made of units the store did not grant.
//! An Envoy's assignment is a token bucket that cannot admit more than its
//! blocks: a new bucket may start full with `max_tokens` (beyond the
//! capacity of the one it replaces, whose fill ratio Envoy carries over) and
//! refills at the block's rate, so its first block pays for both, and while
//! the assignment is unchanged each interval's block pays for that
//! interval's refill. Assignments live `ttl` (3 intervals): an Envoy whose server
//! stopped answering keeps its last rate that long, then falls back to its
//! own `expired_assignment_behavior`.
//!
//! The steps of an interval, for every replica at the same instants:
//! at 1/10 of it each replica adds its Envoys' demands to counters in the
//! store (one call per bucket), at 1/4 it reads every replica's sums and
//! the limit's remaining units back (one call), and at 2/5, once every
//! replica has read, it takes the blocks of its Envoys under the level (one
//! call each), and at 1/2 those of its Envoys at the level.
//! Replicas' clocks must agree within a tenth of the interval (NTP does);
//! one that reads late finds less left and under-assigns, never over.
//!
//! The module is split by concept: `settings` (what `serve` sets, and the
//! values the front end exchanges), the state here, `streams` (the
//! registry of Envoys' streams and their reports), `blocks` (an Envoy's
//! block taken from the store and the token bucket it pays for),
//! `schedule` (when each step of an interval runs), `interval` (the steps),
//! `counters` (the demand counters, kept as fixed windows in the store),
//! `split` (the max-min fair split) and `describe` (`/rlconfig`'s lines).

mod blocks;
mod counters;
mod describe;
mod interval;
mod schedule;
mod settings;
pub(crate) mod split;
mod streams;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::mpsc;

pub use self::settings::{
    Action, Blanket, BucketAction, BucketId, QuotaSettings, Strategy, StreamId, Usage, MAX_BUCKETS_PER_STREAM,
    MAX_REPORTED,
};
use crate::service::Service;

/// The RLQS service state: streams, buckets and the Envoys' shares.
pub struct Quotas {
    service: Arc<Service>,
    settings: QuotaSettings,
    state: Mutex<State>,
    next_stream: AtomicU64,
}

/// What the quota service knows, under one lock.
#[derive(Default)]
struct State {
    streams: HashMap<StreamId, Stream>,
    buckets: HashMap<BucketKey, Bucket>,
    /// Set once the server stops: no stream is opened after.
    stopped: bool,
}

/// A bucket of a domain.
type BucketKey = (String, BucketId);

/// An Envoy's stream.
struct Stream {
    /// Its domain, set by its first report.
    domain: Option<String>,
    /// The buckets it reports on.
    held: usize,
    /// How metrics name this Envoy.
    peer: String,
    /// Where its actions go.
    sender: mpsc::UnboundedSender<Vec<BucketAction>>,
}

/// A bucket some Envoy reports on: each one's part.
#[derive(Default)]
struct Bucket {
    envoys: HashMap<StreamId, Share>,
}

/// One Envoy's part of a bucket.
struct Share {
    /// Requests per second it asked for over its last report; `None`
    /// until a report covers some time (Envoy's first report of a bucket
    /// counts one request over no time).
    demand: Option<f64>,
    /// Its last report on the bucket.
    reported: Instant,
    /// The last report that had requests in it.
    busy: Instant,
    /// Its token bucket, while it has one.
    current: Option<Current>,
}

/// An assigned token bucket and what the store granted for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Current {
    /// Units it gains per interval: the block each interval takes.
    per_interval: u64,
    /// Its capacity.
    burst: u64,
}

impl Quotas {
    /// The RLQS service over `service`'s configuration and store.
    pub fn new(service: Arc<Service>, settings: QuotaSettings) -> Self {
        Self {
            service,
            settings,
            state: Mutex::new(State::default()),
            next_stream: AtomicU64::new(1),
        }
    }

    /// The state, locked.
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
