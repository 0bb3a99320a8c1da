//! The eight algorithms, as pure functions of `(params, state, now, cost)`.
//!
//! Each file holds one algorithm and mirrors the Lua file of the same name
//! beside it, which the Redis store runs: same names, same steps, same
//! integer units (microseconds, and ticks
//! for exact rates — see [`rate`]). Nothing here reads a clock, allocates a
//! key or touches a store; a store loads the state, calls `decide`, and
//! commits the [`Change`] it returns, all in one atomic step. Most states are
//! a few numbers and a change is the whole new state; the sliding log and the
//! leases of a concurrency limit grow with traffic, so their changes are
//! small edits the store makes in place, and no decision copies them.
//!
//! Invalid parameters are refused when a [`Limit`] is built, with a message
//! that names the field. A denied request returns its state unchanged.
#![deny(clippy::float_arithmetic)]

pub(crate) mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod rate;
pub(crate) mod reservation;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;

#[cfg(test)]
mod properties;

use std::borrow::{Borrow, BorrowMut};
use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::micros;
use crate::decision::Decision;
use crate::duration::{serde_text, MAX_MICROS};
use crate::error::{Error, Result};

pub use self::concurrency::ConcurrencySpec;
use self::concurrency::{Concurrency, ConcurrencyState, LeaseChange};
use self::fixed_window::{FixedWindow, FixedWindowState};
pub use self::gcra::GcraSpec;
use self::gcra::{Gcra, GcraState};
pub use self::leaky_bucket::LeakyBucketSpec;
use self::leaky_bucket::{LeakyBucket, LeakyBucketState};
use self::rate::MAX_TICKS;
pub use self::reservation::ReservationSpec;
use self::reservation::{Reservation, ReservationState};
use self::sliding_log::{LogChange, SlidingLog, SlidingLogState};
pub use self::sliding_window::SlidingWindowSpec;
use self::sliding_window::{SlidingWindow, SlidingWindowState};
pub use self::token_bucket::{Refill, TokenBucketSpec};
use self::token_bucket::{TokenBucket, TokenBucketState};

/// What an algorithm returns: its decision, and the change to its state when
/// it changed (for most algorithms, the whole new state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step<C> {
    pub decision: Decision,
    pub change: Option<C>,
}

impl<C> Step<C> {
    pub(crate) fn unchanged(decision: Decision) -> Self {
        Self { decision, change: None }
    }

    pub(crate) fn changed(decision: Decision, change: C) -> Self {
        Self {
            decision,
            change: Some(change),
        }
    }

    fn map<T>(self, wrap: impl FnOnce(C) -> T) -> Step<T> {
        Step {
            decision: self.decision,
            change: self.change.map(wrap),
        }
    }
}

/// What a request asks of one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action<'a> {
    /// Decide at once, consuming when allowed.
    Check,
    /// Borrowing or shaping: accept a wait of at most this many µs (`None`: any).
    Reserve(Option<u64>),
    /// Take a lease (concurrency) or, on rate limits, a reservation within
    /// `max_wait` / a check.
    Acquire {
        lease: Option<&'a str>,
        max_wait: Option<u64>,
    },
    /// Give a lease back; other limits only report.
    Release(&'a str),
}

impl Action<'_> {
    /// The cost a limit that neither queues nor leases checks: a release
    /// only reports, as a peek.
    #[inline]
    pub(crate) fn check_cost(self, cost: u64) -> u64 {
        if matches!(self, Action::Release(_)) {
            0
        } else {
            cost
        }
    }
}

/// One algorithm, implemented by its validated parameters in its own file:
/// its spec, its state, its decision and its encoding for its Lua twin.
///
/// Every function is pure: the state is read, never written; a decision
/// returns the [`Update`] a store commits.
pub(crate) trait Algorithm: Copy {
    /// The parameters as written in JSON or YAML, before validation.
    type Spec;
    /// The state of one subject.
    type State;
    /// How a store holds the state: the state itself, or boxed when it grows
    /// with traffic, so that the states of a few numbers stay small.
    type Stored: Borrow<Self::State> + BorrowMut<Self::State>;
    /// An edit of the state made in place, for a state that grows with
    /// traffic; [`Infallible`] for a state replaced whole.
    type Edit<'a>: Edit<Self::State>;

    /// The algorithm's name, as written in `"algorithm"`.
    const NAME: &'static str;
    /// The id of the Lua twin in the Redis library (`ALGORITHMS[ID]`).
    #[cfg(feature = "redis")]
    const ID: u8;
    /// True for the shaping and borrowing limits, which grant a request at a
    /// later moment rather than refusing it, and take `reserve`.
    const SHAPING: bool = false;
    /// True for a limit taken with leases.
    const LEASES: bool = false;

    /// Validates `spec`.
    ///
    /// # Errors
    ///
    /// An invalid limit, naming the field at fault.
    fn build(spec: &Self::Spec) -> Result<Self>;

    /// The most unit-cost requests admitted at once.
    fn capacity(&self) -> u64;

    /// The window a count-per-window limit counts over.
    fn window(&self) -> Option<Duration> {
        None
    }

    /// Units that would be admitted now (`u64::MAX`: any cost).
    fn available(&self, state: Option<&Self::State>, now: u64) -> u64;

    /// Whether this limit can run `action` for `cost` units: by default,
    /// anything but `reserve` on a limit that neither borrows nor shapes.
    ///
    /// # Errors
    ///
    /// An invalid argument, saying why.
    fn supports(&self, action: Action<'_>, cost: u64) -> Result<()> {
        let _ = cost;
        if matches!(action, Action::Reserve(_)) && !Self::SHAPING {
            return Err(unsupported_reserve(Self::NAME));
        }
        Ok(())
    }

    /// Runs `action` for `cost` units against `state` (none: a subject never
    /// seen, or whose state has lapsed) at `now`.
    fn decide<'a>(
        &self,
        state: Option<&Self::State>,
        now: u64,
        action: Action<'a>,
        cost: u64,
    ) -> Step<Update<Self::Stored, Self::Edit<'a>>>;

    /// The numbers the Lua twin's `params` reads, in order (after the id).
    #[cfg(feature = "redis")]
    fn script_params(&self) -> impl IntoIterator<Item = u64>;
}

/// What a decision does to one algorithm's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Update<S, E> {
    /// The whole new state.
    Put(S),
    /// An edit of the state the decision was made on.
    Edit(E),
}

/// An edit of a state of type `S`, made in place.
pub(crate) trait Edit<S> {
    /// Commits the edit to `state`, the state it was decided on.
    fn apply(self, state: &mut S);
}

/// A state of a few numbers is replaced whole, never edited.
impl<S> Edit<S> for Infallible {
    fn apply(self, _: &mut S) {
        match self {}
    }
}

/// An edit made of `state` is committed in place, later; made of no state,
/// it is committed at once to an empty state, which becomes the whole new one.
fn edit<S: Default, E: Edit<S>>(state: Option<&S>, step: Step<E>) -> Step<Update<Box<S>, E>> {
    step.map(|change| {
        if state.is_some() {
            Update::Edit(change)
        } else {
            let mut new = Box::<S>::default();
            change.apply(&mut new);
            Update::Put(new)
        }
    })
}

/// The state `A` holds in `stored`.
fn held<A: Algorithm>(stored: &A::Stored) -> &A::State {
    stored.borrow()
}

/// The stored state of one limit for one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow(FixedWindowState),
    SlidingWindow(SlidingWindowState),
    SlidingLog(Box<SlidingLogState>),
    TokenBucket(TokenBucketState),
    Reservation(ReservationState),
    LeakyBucket(LeakyBucketState),
    Gcra(GcraState),
    Concurrency(Box<ConcurrencyState>),
}

/// What a decision does to the state it was made on. `'a` is the request's
/// lifetime (a lease's name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change<'a> {
    /// The whole new state: for the states of a few numbers, and for a log
    /// or leases started from no state.
    Put(State),
    /// An edit of the sliding log the decision was made on.
    SlidingLog(LogChange),
    /// An edit of the leases the decision was made on.
    Concurrency(LeaseChange<'a>),
}

impl Change<'_> {
    /// Commits the change to `state`, the state the decision was made on
    /// (any state, when the change is a [`Change::Put`]).
    pub(crate) fn apply(self, state: &mut State) {
        match (self, state) {
            (Change::Put(new), state) => *state = new,
            (Change::SlidingLog(change), State::SlidingLog(log)) => change.apply(&mut **log),
            (Change::Concurrency(change), State::Concurrency(leases)) => change.apply(&mut **leases),
            // An edit is only made of a state of its own algorithm.
            (change, state) => debug_assert!(false, "{change:?} does not apply to {state:?}"),
        }
    }

    /// The new state of a limit that had none: only a [`Change::Put`] is
    /// made of no state.
    pub(crate) fn into_state(self) -> Option<State> {
        match self {
            Change::Put(state) => Some(state),
            Change::SlidingLog(_) | Change::Concurrency(_) => None,
        }
    }
}

/// Parameters of one limit, as written in JSON or YAML: the
/// `algorithm` name and its fields, durations as text like `"1.5s"`.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum LimitSpec {
    /// See [`Limit::fixed_window`].
    FixedWindow(WindowSpec),
    /// See [`Limit::sliding_window`].
    SlidingWindow(SlidingWindowSpec),
    /// See [`Limit::sliding_log`].
    SlidingLog(WindowSpec),
    /// See [`Limit::token_bucket`].
    TokenBucket(TokenBucketSpec),
    /// See [`Limit::reservation`].
    Reservation(ReservationSpec),
    /// See [`Limit::leaky_bucket`].
    LeakyBucket(LeakyBucketSpec),
    /// See [`Limit::gcra`].
    Gcra(GcraSpec),
    /// See [`Limit::concurrency`].
    Concurrency(ConcurrencySpec),
}

/// `limit` units per `window` (fixed window, sliding log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSpec {
    /// Units admitted per window.
    pub limit: u64,
    /// The window's length.
    #[serde(with = "serde_text")]
    pub window: Duration,
}

/// A validated limit: one algorithm with its parameters.
///
/// Build one with a constructor ([`Limit::gcra`], …), from a [`LimitSpec`],
/// or from JSON ([`Limit::from_json`]). Each refuses invalid parameters with
/// an error naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    spec: LimitSpec,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    SlidingLog(SlidingLog),
    TokenBucket(TokenBucket),
    Reservation(Reservation),
    LeakyBucket(LeakyBucket),
    Gcra(Gcra),
    Concurrency(Concurrency),
}

fn at_least_one(value: u64, field: &str) -> Result<u64> {
    if value == 0 {
        return Err(Error::invalid_limit(format!("{field} must be at least 1")));
    }
    if value > MAX_TICKS {
        return Err(Error::invalid_limit(format!("{field} must be at most {MAX_TICKS}")));
    }
    Ok(value)
}

fn positive(duration: Duration, field: &str) -> Result<u64> {
    let value = micros(duration);
    if value == 0 {
        return Err(Error::invalid_limit(format!("{field} must be positive")));
    }
    if value > MAX_MICROS {
        return Err(Error::invalid_limit(format!(
            "{field} is too long (at most {MAX_MICROS} us)"
        )));
    }
    if !duration.subsec_nanos().is_multiple_of(1_000) {
        return Err(Error::invalid_limit(format!("{field} is finer than a microsecond")));
    }
    Ok(value)
}

fn at_most(value: Option<u64>, ceiling: u64, field: &str, ceiling_field: &str) -> Result<u64> {
    match value {
        Some(value) if value > ceiling => Err(Error::invalid_limit(format!(
            "{field} ({value}) must be at most {ceiling_field} ({ceiling})"
        ))),
        Some(value) => Ok(value),
        None => Ok(ceiling),
    }
}

impl LimitSpec {
    /// Validates the parameters into a [`Limit`].
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidLimit`](crate::ErrorKind::InvalidLimit) error
    /// naming the field at fault.
    pub fn build(self) -> Result<Limit> {
        let kind = match &self {
            Self::FixedWindow(spec) => Kind::FixedWindow(FixedWindow::build(spec)?),
            Self::SlidingWindow(spec) => Kind::SlidingWindow(SlidingWindow::build(spec)?),
            Self::SlidingLog(spec) => Kind::SlidingLog(SlidingLog::build(spec)?),
            Self::TokenBucket(spec) => Kind::TokenBucket(TokenBucket::build(spec)?),
            Self::Reservation(spec) => Kind::Reservation(Reservation::build(spec)?),
            Self::LeakyBucket(spec) => Kind::LeakyBucket(LeakyBucket::build(spec)?),
            Self::Gcra(spec) => Kind::Gcra(Gcra::build(spec)?),
            Self::Concurrency(spec) => Kind::Concurrency(Concurrency::build(spec)?),
        };
        Ok(Limit { spec: self, kind })
    }

    /// The algorithm's name, as written in `"algorithm"`.
    pub fn algorithm(&self) -> &'static str {
        match self {
            Self::FixedWindow(_) => "fixed_window",
            Self::SlidingWindow(_) => "sliding_window",
            Self::SlidingLog(_) => "sliding_log",
            Self::TokenBucket(_) => "token_bucket",
            Self::Reservation(_) => "reservation",
            Self::LeakyBucket(_) => "leaky_bucket",
            Self::Gcra(_) => "gcra",
            Self::Concurrency(_) => "concurrency",
        }
    }

    /// Reads a spec from a JSON object such as
    /// `{"algorithm":"gcra","rate":10,"period":"1s","burst":5}`.
    ///
    /// # Errors
    ///
    /// When the object has no known `algorithm`, an unknown or missing field,
    /// or a value of the wrong type; the message names the field.
    pub fn from_value(value: serde_json::Value) -> Result<Self> {
        let serde_json::Value::Object(mut fields) = value else {
            return Err(Error::invalid_limit(
                "a limit must be a JSON object with an \"algorithm\" field",
            ));
        };
        let algorithm = match fields.remove("algorithm") {
            Some(serde_json::Value::String(name)) => name,
            Some(_) => return Err(Error::invalid_limit("algorithm must be a string")),
            None => return Err(Error::invalid_limit("missing field \"algorithm\"")),
        };
        let fields = serde_json::Value::Object(fields);
        match algorithm.as_str() {
            "fixed_window" => parse_fields(fields).map(Self::FixedWindow),
            "sliding_window" => parse_fields(fields).map(Self::SlidingWindow),
            "sliding_log" => parse_fields(fields).map(Self::SlidingLog),
            "token_bucket" => parse_fields(fields).map(Self::TokenBucket),
            "reservation" => parse_fields(fields).map(Self::Reservation),
            "leaky_bucket" => parse_fields(fields).map(Self::LeakyBucket),
            "gcra" => parse_fields(fields).map(Self::Gcra),
            "concurrency" => parse_fields(fields).map(Self::Concurrency),
            other => Err(Error::invalid_limit(format!(
                "unknown algorithm \"{other}\" (expected fixed_window, sliding_window, sliding_log, \
                 token_bucket, reservation, leaky_bucket, gcra or concurrency)"
            ))),
        }
    }
}

/// Deserializes an algorithm's fields, naming the field in any error.
fn parse_fields<T: serde::de::DeserializeOwned>(fields: serde_json::Value) -> Result<T> {
    serde_path_to_error::deserialize(fields).map_err(|error| {
        let path = error.path().to_string();
        let message = error.inner().to_string().replace('`', "\"");
        if path == "." {
            Error::invalid_limit(message)
        } else {
            Error::invalid_limit(format!("{path}: {message}"))
        }
    })
}

/// The state of algorithm `$variant` in a stored state (a state of another
/// algorithm counts as none: the limit was redefined).
macro_rules! state {
    ($state:ident, $variant:ident) => {
        match $state {
            Some(State::$variant(stored)) => Some(held::<$variant>(stored)),
            _ => None,
        }
    };
}

impl Limit {
    /// A fixed window counter: at most `limit` units per epoch-aligned `window`.
    ///
    /// - `limit`: units admitted per window (the decision's `limit`);
    /// - `window`: the window's length; windows start at multiples of it since
    ///   the Unix epoch, so every instance agrees where a window starts and
    ///   `reset_after` is exact.
    ///
    /// **Bound:** within one aligned window the admitted cost is at most
    /// `limit`; any interval spanning `k` aligned windows admits at most
    /// `k · limit` — up to `2 · limit` in an interval of length `window` that
    /// straddles a boundary (use [`Limit::sliding_window`] or
    /// [`Limit::sliding_log`] where that burst matters). State: one counter.
    ///
    /// # Errors
    ///
    /// When `limit` is zero or `window` is not a positive whole number of microseconds.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self> {
        LimitSpec::FixedWindow(WindowSpec { limit, window }).build()
    }

    /// A sliding window counter of `limit` units per `window`, in `buckets` sub-intervals.
    ///
    /// - `limit`: units admitted in any `window`;
    /// - `window`: the window's length;
    /// - `buckets`: epoch-aligned sub-intervals the window is counted in (10
    ///   in JSON when absent, at most 1000); `window` must divide into them
    ///   in whole microseconds.
    ///
    /// The count is the sum over every sub-interval that overlaps the last
    /// `window`, the oldest one included even when it overlaps only in part:
    /// admitted units count for up to one sub-interval longer than `window`,
    /// which keeps the bound exact (a refused client may wait up to
    /// `window + window / buckets`).
    ///
    /// **Bound:** any interval of length `window` (both ends included) admits
    /// at most `limit` units. State: at most `buckets + 1` counters.
    ///
    /// # Errors
    ///
    /// When a value is zero, or `window` is not a whole number of microseconds per bucket.
    pub fn sliding_window(limit: u64, window: Duration, buckets: u64) -> Result<Self> {
        LimitSpec::SlidingWindow(SlidingWindowSpec { limit, window, buckets }).build()
    }

    /// A sliding log: exactly `limit` units in any `window`.
    ///
    /// - `limit`: units admitted in any `window`;
    /// - `window`: the window's length.
    ///
    /// Exact, at O(`limit`) memory: one entry per admitted instant (units
    /// admitted at the same microsecond share one); a decision costs
    /// O(log n) in the entries held. A refused request's `retry_after` is
    /// when enough of the oldest units leave the window.
    ///
    /// **Bound:** any half-open interval `[t, t + window)` admits at most
    /// `limit` units.
    ///
    /// # Errors
    ///
    /// When `limit` is zero or `window` is not positive.
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Self> {
        LimitSpec::SlidingLog(WindowSpec { limit, window }).build()
    }

    /// A smooth token bucket, full at the start; see [`TokenBucketSpec`] for
    /// `interval` refill and `initial`.
    ///
    /// - `capacity`: the most tokens the bucket holds (the decision's `limit`);
    /// - `refill`: tokens gained per `interval`;
    /// - `interval`: the refill period;
    /// - in a [`TokenBucketSpec`]: `mode` ([`Refill::Smooth`], continuous and
    ///   exact, or [`Refill::Interval`], whole `refill` amounts at
    ///   epoch-aligned interval boundaries) and `initial` (tokens of a key
    ///   with no state; default `capacity`).
    ///
    /// No borrowing: a request takes `cost` tokens or is refused, and a
    /// refused request changes nothing.
    ///
    /// **Bound:** over any interval `[a, b]` the admitted cost is at most
    /// `capacity + refill · (b − a) / interval` (smooth), or
    /// `capacity + refill · (interval boundaries in (a, b])` (interval).
    ///
    /// # Errors
    ///
    /// When a value is zero or the rate cannot be computed exactly.
    pub fn token_bucket(capacity: u64, refill: u64, interval: Duration) -> Result<Self> {
        LimitSpec::TokenBucket(TokenBucketSpec {
            capacity,
            refill,
            interval,
            mode: Refill::Smooth,
            initial: None,
        })
        .build()
    }

    /// A token bucket with reservation (borrowing), storing up to `max_burst` permits.
    ///
    /// - `rate` permits per `period`: the steady rate;
    /// - `max_burst`: permits stored while idle (the decision's `limit` is
    ///   `max_burst + 1`: with no debt, one more request always fits);
    /// - in a [`ReservationSpec`]: `initial` stored permits (default `max_burst`).
    ///
    /// Borrow now, the next caller waits (Guava's `SmoothBursty`): a request
    /// is granted at the next free moment — at once when nothing is owed —
    /// taking stored permits and borrowing what is missing, so the *next*
    /// caller pays. [`Limiter::reserve`](crate::Limiter::reserve) returns the
    /// `wait` until the request's moment, or refuses (booking nothing) when
    /// it would exceed `max_wait`; `check` is `reserve` with `max_wait = 0`.
    ///
    /// **Bound:** over any interval `[a, b]`, requests granted without
    /// waiting carry at most `max_burst + rate · (b − a) / period` units plus
    /// the cost of the last one. State: one instant.
    ///
    /// # Errors
    ///
    /// When `rate` or `period` is zero or the rate cannot be computed exactly.
    pub fn reservation(rate: u64, period: Duration, max_burst: u64) -> Result<Self> {
        LimitSpec::Reservation(ReservationSpec {
            rate,
            period,
            max_burst,
            initial: None,
        })
        .build()
    }

    /// A leaky bucket shaping to `rate` per `period`, holding `capacity` units.
    ///
    /// - `rate` units per `period`: the outlet's rate;
    /// - `capacity`: the most units in the bucket, queued or leaving (the
    ///   decision's `limit`); with `capacity = 1` nothing ever queues.
    ///
    /// A shaping queue: each admitted request departs at `max(now, drained)`,
    /// where `drained` is when the requests ahead of it have left, then
    /// occupies the outlet for `cost · period / rate`; the decision's `wait`
    /// is its departure minus now. A request that would overfill the bucket
    /// is refused.
    ///
    /// **Bound:** over any interval `[a, b]` the admitted cost is at most
    /// `capacity + rate · (b − a) / period`; departures in `[a, b]` carry at
    /// most `rate · (b − a) / period` units plus one request's cost. State:
    /// one instant.
    ///
    /// # Errors
    ///
    /// When a value is zero or the rate cannot be computed exactly.
    pub fn leaky_bucket(rate: u64, period: Duration, capacity: u64) -> Result<Self> {
        LimitSpec::LeakyBucket(LeakyBucketSpec { rate, period, capacity }).build()
    }

    /// GCRA: `rate` per `period`, `burst` at once.
    ///
    /// - `rate` cells per `period`: the steady rate (cells are spaced by the
    ///   emission interval `T = period / rate`, kept exact: 7 per second
    ///   admits exactly 7 cells per second forever);
    /// - `burst`: cells admitted at once (the decision's `limit`; the
    ///   tolerance is `(burst − 1) · T`).
    ///
    /// The Generic Cell Rate Algorithm: one theoretical arrival time per key.
    ///
    /// **Bound:** over any interval `[a, b]` the admitted cost is at most
    /// `burst + rate · (b − a) / period`. State: one instant.
    ///
    /// # Errors
    ///
    /// When a value is zero or the rate cannot be computed exactly.
    pub fn gcra(rate: u64, period: Duration, burst: u64) -> Result<Self> {
        LimitSpec::Gcra(GcraSpec { rate, period, burst }).build()
    }

    /// At most `limit` units in flight; leases end by themselves after `ttl`.
    ///
    /// - `limit`: units held at once by live leases;
    /// - `ttl`: how long a lease lives unless released (so a holder that
    ///   crashed cannot leak capacity); acquiring with the name of a live
    ///   lease renews it.
    ///
    /// Taken with [`Limiter::acquire`](crate::Limiter::acquire) (a lease
    /// released when its [`Permit`](crate::Permit) drops), not `check`.
    /// Acquire, release and renewal cost O(log n) in the leases held.
    ///
    /// **Bound:** at every instant, the leases neither released nor expired
    /// hold at most `limit` units.
    ///
    /// # Errors
    ///
    /// When `limit` is zero or `ttl` is not positive.
    pub fn concurrency(limit: u64, ttl: Duration) -> Result<Self> {
        LimitSpec::Concurrency(ConcurrencySpec { limit, ttl }).build()
    }

    /// Reads and validates a limit written as JSON:
    /// `{"algorithm":"gcra","rate":10,"period":"1s","burst":5}`, with the
    /// constructors' parameter names and durations as text (`us`, `ms`, `s`,
    /// `m`, `h`, `d`; `"1.5s"` allowed).
    ///
    /// # Errors
    ///
    /// When the text is not JSON, or the limit is invalid; the message names the field.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| Error::invalid_limit(format!("invalid JSON: {error}")))?;
        LimitSpec::from_value(value)?.build()
    }

    /// The parameters this limit was built from.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// The algorithm's name (`"gcra"`, `"fixed_window"`, …).
    pub fn algorithm(&self) -> &'static str {
        self.spec.algorithm()
    }

    /// The most unit-cost requests admitted at once (the decision's `limit`).
    pub fn capacity(&self) -> u64 {
        match &self.kind {
            Kind::FixedWindow(p) => p.capacity(),
            Kind::SlidingWindow(p) => p.capacity(),
            Kind::SlidingLog(p) => p.capacity(),
            Kind::TokenBucket(p) => p.capacity(),
            Kind::Reservation(p) => p.capacity(),
            Kind::LeakyBucket(p) => p.capacity(),
            Kind::Gcra(p) => p.capacity(),
            Kind::Concurrency(p) => p.capacity(),
        }
    }

    /// True for the shaping and borrowing limits (reservation, leaky bucket),
    /// which grant a request at a later moment (`Decision::wait`) rather
    /// than refusing it.
    pub fn is_shaping(&self) -> bool {
        match &self.kind {
            Kind::FixedWindow(_) => FixedWindow::SHAPING,
            Kind::SlidingWindow(_) => SlidingWindow::SHAPING,
            Kind::SlidingLog(_) => SlidingLog::SHAPING,
            Kind::TokenBucket(_) => TokenBucket::SHAPING,
            Kind::Reservation(_) => Reservation::SHAPING,
            Kind::LeakyBucket(_) => LeakyBucket::SHAPING,
            Kind::Gcra(_) => Gcra::SHAPING,
            Kind::Concurrency(_) => Concurrency::SHAPING,
        }
    }

    /// The window a count-per-window limit counts over (fixed window,
    /// sliding window, sliding log); `None` for the others.
    pub fn window(&self) -> Option<Duration> {
        match &self.kind {
            Kind::FixedWindow(p) => p.window(),
            Kind::SlidingWindow(p) => p.window(),
            Kind::SlidingLog(p) => p.window(),
            Kind::TokenBucket(p) => p.window(),
            Kind::Reservation(p) => p.window(),
            Kind::LeakyBucket(p) => p.window(),
            Kind::Gcra(p) => p.window(),
            Kind::Concurrency(p) => p.window(),
        }
    }

    /// True for the concurrency limiter, which is taken with leases.
    pub fn is_concurrency(&self) -> bool {
        match &self.kind {
            Kind::FixedWindow(_) => FixedWindow::LEASES,
            Kind::SlidingWindow(_) => SlidingWindow::LEASES,
            Kind::SlidingLog(_) => SlidingLog::LEASES,
            Kind::TokenBucket(_) => TokenBucket::LEASES,
            Kind::Reservation(_) => Reservation::LEASES,
            Kind::LeakyBucket(_) => LeakyBucket::LEASES,
            Kind::Gcra(_) => Gcra::LEASES,
            Kind::Concurrency(_) => Concurrency::LEASES,
        }
    }

    /// The parameters of a GCRA limit, whose whole state is one instant (the
    /// memory store keeps those instants in a table of small slots).
    pub(crate) fn as_gcra(&self) -> Option<&Gcra> {
        match &self.kind {
            Kind::Gcra(gcra) => Some(gcra),
            _ => None,
        }
    }

    #[cfg(test)]
    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// Units that would be admitted now (`u64::MAX`: any cost).
    pub(crate) fn available(&self, state: Option<&State>, now: u64) -> u64 {
        match &self.kind {
            Kind::FixedWindow(p) => p.available(state!(state, FixedWindow), now),
            Kind::SlidingWindow(p) => p.available(state!(state, SlidingWindow), now),
            Kind::SlidingLog(p) => p.available(state!(state, SlidingLog), now),
            Kind::TokenBucket(p) => p.available(state!(state, TokenBucket), now),
            Kind::Reservation(p) => p.available(state!(state, Reservation), now),
            Kind::LeakyBucket(p) => p.available(state!(state, LeakyBucket), now),
            Kind::Gcra(p) => p.available(state!(state, Gcra), now),
            Kind::Concurrency(p) => p.available(state!(state, Concurrency), now),
        }
    }

    /// Whether this limit can run `action` for `cost` units.
    ///
    /// # Errors
    ///
    /// `reserve` on a limit that neither borrows nor shapes; `check` (or
    /// `acquire` without a lease) of a positive cost on a concurrency limit.
    pub(crate) fn supports(&self, action: Action<'_>, cost: u64) -> Result<()> {
        match &self.kind {
            Kind::FixedWindow(p) => p.supports(action, cost),
            Kind::SlidingWindow(p) => p.supports(action, cost),
            Kind::SlidingLog(p) => p.supports(action, cost),
            Kind::TokenBucket(p) => p.supports(action, cost),
            Kind::Reservation(p) => p.supports(action, cost),
            Kind::LeakyBucket(p) => p.supports(action, cost),
            Kind::Gcra(p) => p.supports(action, cost),
            Kind::Concurrency(p) => p.supports(action, cost),
        }
    }

    /// Runs `action` for `cost` units against `state` at `now`.
    ///
    /// A state of another algorithm (the limit was redefined) counts as none.
    /// Limits that do not queue see `release` as a peek; limits that do not
    /// borrow or shape see `acquire` as `check`.
    ///
    /// Callers check [`Limit::supports`] first (a policy does, once per
    /// request); an unsupported action is decided as the nearest supported one.
    #[inline]
    pub(crate) fn decide<'a>(
        &self,
        state: Option<&State>,
        now: u64,
        action: Action<'a>,
        cost: u64,
    ) -> Step<Change<'a>> {
        match &self.kind {
            Kind::FixedWindow(p) => {
                p.decide(state!(state, FixedWindow), now, action, cost)
                    .map(|update| match update {
                        Update::Put(new) => Change::Put(State::FixedWindow(new)),
                        Update::Edit(edit) => match edit {},
                    })
            }
            Kind::SlidingWindow(p) => {
                p.decide(state!(state, SlidingWindow), now, action, cost)
                    .map(|update| match update {
                        Update::Put(new) => Change::Put(State::SlidingWindow(new)),
                        Update::Edit(edit) => match edit {},
                    })
            }
            Kind::SlidingLog(p) => p
                .decide(state!(state, SlidingLog), now, action, cost)
                .map(|update| match update {
                    Update::Put(new) => Change::Put(State::SlidingLog(new)),
                    Update::Edit(edit) => Change::SlidingLog(edit),
                }),
            Kind::TokenBucket(p) => {
                p.decide(state!(state, TokenBucket), now, action, cost)
                    .map(|update| match update {
                        Update::Put(new) => Change::Put(State::TokenBucket(new)),
                        Update::Edit(edit) => match edit {},
                    })
            }
            Kind::Reservation(p) => {
                p.decide(state!(state, Reservation), now, action, cost)
                    .map(|update| match update {
                        Update::Put(new) => Change::Put(State::Reservation(new)),
                        Update::Edit(edit) => match edit {},
                    })
            }
            Kind::LeakyBucket(p) => {
                p.decide(state!(state, LeakyBucket), now, action, cost)
                    .map(|update| match update {
                        Update::Put(new) => Change::Put(State::LeakyBucket(new)),
                        Update::Edit(edit) => match edit {},
                    })
            }
            Kind::Gcra(p) => p
                .decide(state!(state, Gcra), now, action, cost)
                .map(|update| match update {
                    Update::Put(new) => Change::Put(State::Gcra(new)),
                    Update::Edit(edit) => match edit {},
                }),
            Kind::Concurrency(p) => {
                p.decide(state!(state, Concurrency), now, action, cost)
                    .map(|update| match update {
                        Update::Put(new) => Change::Put(State::Concurrency(new)),
                        Update::Edit(edit) => Change::Concurrency(edit),
                    })
            }
        }
    }

    /// The limit as the Redis library reads it: its algorithm's id, then
    /// the numbers its Lua twin's `params` reads, joined by ':'.
    #[cfg(feature = "redis")]
    pub(crate) fn script_params(&self) -> String {
        match &self.kind {
            Kind::FixedWindow(p) => script_params(FixedWindow::ID, p.script_params()),
            Kind::SlidingWindow(p) => script_params(SlidingWindow::ID, p.script_params()),
            Kind::SlidingLog(p) => script_params(SlidingLog::ID, p.script_params()),
            Kind::TokenBucket(p) => script_params(TokenBucket::ID, p.script_params()),
            Kind::Reservation(p) => script_params(Reservation::ID, p.script_params()),
            Kind::LeakyBucket(p) => script_params(LeakyBucket::ID, p.script_params()),
            Kind::Gcra(p) => script_params(Gcra::ID, p.script_params()),
            Kind::Concurrency(p) => script_params(Concurrency::ID, p.script_params()),
        }
    }
}

/// `id:param:param:…`.
#[cfg(feature = "redis")]
fn script_params(id: u8, params: impl IntoIterator<Item = u64>) -> String {
    use std::fmt::Write as _;
    let mut text = id.to_string();
    for param in params {
        let _ = write!(text, ":{param}");
    }
    text
}

/// A step that only reports: no wait asked of the caller.
fn report<C>(mut step: Step<C>) -> Step<C> {
    step.decision.wait = Duration::ZERO;
    step
}

fn unsupported_reserve(algorithm: &str) -> Error {
    Error::invalid_argument(format!(
        "reserve needs a borrowing or shaping limit (reservation, leaky_bucket), not {algorithm}"
    ))
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let json = serde_json::to_string(&self.spec).map_err(|_| fmt::Error)?;
        f.write_str(&json)
    }
}

impl TryFrom<LimitSpec> for Limit {
    type Error = Error;

    fn try_from(spec: LimitSpec) -> Result<Self> {
        spec.build()
    }
}
