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
use self::rate::{Rate, MAX_TICKS};
pub use self::reservation::ReservationSpec;
use self::reservation::{Reservation, ReservationState};
use self::sliding_log::{LogChange, SlidingLog, SlidingLogState};
pub use self::sliding_window::SlidingWindowSpec;
use self::sliding_window::{SlidingWindow, SlidingWindowState, MAX_BUCKETS};
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
            (Change::SlidingLog(change), State::SlidingLog(log)) => log.apply(change),
            (Change::Concurrency(change), State::Concurrency(leases)) => leases.apply(change),
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

/// An edit made of `state` is committed in place, later; made of no state,
/// it is committed at once to an empty state, which becomes the whole new one.
fn edit<'a, S: Default, C>(
    state: Option<&S>,
    step: Step<C>,
    apply: impl FnOnce(&mut S, C),
    put: impl FnOnce(Box<S>) -> State,
    edit: impl FnOnce(C) -> Change<'a>,
) -> Step<Change<'a>> {
    step.map(|change| {
        if state.is_some() {
            edit(change)
        } else {
            let mut new = Box::<S>::default();
            apply(&mut new, change);
            Change::Put(put(new))
        }
    })
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
        let kind = match self {
            Self::FixedWindow(spec) => Kind::FixedWindow(FixedWindow {
                limit: at_least_one(spec.limit, "limit")?,
                window: positive(spec.window, "window")?,
            }),
            Self::SlidingWindow(spec) => {
                let limit = at_least_one(spec.limit, "limit")?;
                let window = positive(spec.window, "window")?;
                let buckets = at_least_one(spec.buckets, "buckets")?;
                if buckets > MAX_BUCKETS {
                    return Err(Error::invalid_limit(format!("buckets must be at most {MAX_BUCKETS}")));
                }
                if window % buckets != 0 {
                    return Err(Error::invalid_limit(format!(
                        "window ({window} us) must be a whole number of microseconds per bucket ({buckets} buckets)"
                    )));
                }
                Kind::SlidingWindow(SlidingWindow { limit, window, buckets })
            }
            Self::SlidingLog(spec) => Kind::SlidingLog(SlidingLog {
                limit: at_least_one(spec.limit, "limit")?,
                window: positive(spec.window, "window")?,
            }),
            Self::TokenBucket(spec) => {
                let capacity = at_least_one(spec.capacity, "capacity")?;
                let refill = at_least_one(spec.refill, "refill")?;
                let interval = positive(spec.interval, "interval")?;
                let initial = at_most(spec.initial, capacity, "initial", "capacity")?;
                let rate = Rate::new(refill, interval, capacity, ["refill", "interval", "capacity"])?;
                Kind::TokenBucket(TokenBucket {
                    capacity,
                    refill,
                    interval,
                    mode: spec.mode,
                    initial,
                    rate,
                })
            }
            Self::Reservation(spec) => {
                let rate = at_least_one(spec.rate, "rate")?;
                let period = positive(spec.period, "period")?;
                if spec.max_burst > MAX_TICKS {
                    return Err(Error::invalid_limit(format!("max_burst must be at most {MAX_TICKS}")));
                }
                let initial = at_most(spec.initial, spec.max_burst, "initial", "max_burst")?;
                let ticks = Rate::new(rate, period, spec.max_burst, ["rate", "period", "max_burst"])?;
                Kind::Reservation(Reservation {
                    rate,
                    period,
                    max_burst: spec.max_burst,
                    initial,
                    ticks,
                })
            }
            Self::LeakyBucket(spec) => {
                let rate = at_least_one(spec.rate, "rate")?;
                let period = positive(spec.period, "period")?;
                let capacity = at_least_one(spec.capacity, "capacity")?;
                let ticks = Rate::new(rate, period, capacity, ["rate", "period", "capacity"])?;
                Kind::LeakyBucket(LeakyBucket {
                    rate,
                    period,
                    capacity,
                    ticks,
                })
            }
            Self::Gcra(spec) => {
                let rate = at_least_one(spec.rate, "rate")?;
                let period = positive(spec.period, "period")?;
                let burst = at_least_one(spec.burst, "burst")?;
                let ticks = Rate::new(rate, period, burst, ["rate", "period", "burst"])?;
                Kind::Gcra(Gcra {
                    rate,
                    period,
                    burst,
                    ticks,
                })
            }
            Self::Concurrency(spec) => Kind::Concurrency(Concurrency {
                limit: at_least_one(spec.limit, "limit")?,
                ttl: positive(spec.ttl, "ttl")?,
            }),
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
        match self.kind {
            Kind::FixedWindow(p) => p.limit,
            Kind::SlidingWindow(p) => p.limit,
            Kind::SlidingLog(p) => p.limit,
            Kind::TokenBucket(p) => p.capacity,
            Kind::Reservation(p) => p.max_burst + 1,
            Kind::LeakyBucket(p) => p.capacity,
            Kind::Gcra(p) => p.burst,
            Kind::Concurrency(p) => p.limit,
        }
    }

    /// True for the shaping and borrowing limits (reservation, leaky bucket),
    /// which grant a request at a later moment (`Decision::wait`) rather
    /// than refusing it.
    pub fn is_shaping(&self) -> bool {
        matches!(self.kind, Kind::Reservation(_) | Kind::LeakyBucket(_))
    }

    /// The window a count-per-window limit counts over (fixed window,
    /// sliding window, sliding log); `None` for the others.
    pub fn window(&self) -> Option<Duration> {
        match &self.spec {
            LimitSpec::FixedWindow(spec) | LimitSpec::SlidingLog(spec) => Some(spec.window),
            LimitSpec::SlidingWindow(spec) => Some(spec.window),
            _ => None,
        }
    }

    /// True for the concurrency limiter, which is taken with leases.
    pub fn is_concurrency(&self) -> bool {
        matches!(self.kind, Kind::Concurrency(_))
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
        match (&self.kind, state) {
            (Kind::FixedWindow(p), Some(State::FixedWindow(s))) => p.available(Some(s), now),
            (Kind::FixedWindow(p), _) => p.available(None, now),
            (Kind::SlidingWindow(p), Some(State::SlidingWindow(s))) => p.available(Some(s), now),
            (Kind::SlidingWindow(p), _) => p.available(None, now),
            (Kind::SlidingLog(p), Some(State::SlidingLog(s))) => p.available(Some(&**s), now),
            (Kind::SlidingLog(p), _) => p.available(None, now),
            (Kind::TokenBucket(p), Some(State::TokenBucket(s))) => p.available(Some(s), now),
            (Kind::TokenBucket(p), _) => p.available(None, now),
            (Kind::Reservation(p), Some(State::Reservation(s))) => p.available(Some(s), now),
            (Kind::Reservation(p), _) => p.available(None, now),
            (Kind::LeakyBucket(p), Some(State::LeakyBucket(s))) => p.available(Some(s), now),
            (Kind::LeakyBucket(p), _) => p.available(None, now),
            (Kind::Gcra(p), Some(State::Gcra(s))) => p.available(Some(s), now),
            (Kind::Gcra(p), _) => p.available(None, now),
            (Kind::Concurrency(p), Some(State::Concurrency(s))) => p.available(Some(&**s), now),
            (Kind::Concurrency(p), _) => p.available(None, now),
        }
    }

    /// Whether this limit can run `action` for `cost` units.
    ///
    /// # Errors
    ///
    /// `reserve` on a limit that neither borrows nor shapes; `check` (or
    /// `acquire` without a lease) of a positive cost on a concurrency limit.
    pub(crate) fn supports(&self, action: Action<'_>, cost: u64) -> Result<()> {
        match (&self.kind, action) {
            (Kind::Concurrency(_), Action::Reserve(_)) => Err(unsupported_reserve("concurrency")),
            (Kind::Concurrency(_), Action::Check | Action::Acquire { lease: None, .. }) if cost > 0 => {
                Err(Error::invalid_argument(
                    "a concurrency limit is taken with acquire (and given back with release), not check",
                ))
            }
            (Kind::Reservation(_) | Kind::LeakyBucket(_) | Kind::Concurrency(_), _) => Ok(()),
            (_, Action::Reserve(_)) => Err(unsupported_reserve(self.algorithm())),
            _ => Ok(()),
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
        macro_rules! state {
            ($variant:ident) => {
                match state {
                    Some(State::$variant(state)) => Some(state),
                    _ => None,
                }
            };
        }
        let cost = action.check_cost(cost);
        let (max_wait, lease) = match action {
            Action::Check | Action::Release(_) => (None, None),
            Action::Reserve(max_wait) => (max_wait, None),
            Action::Acquire { lease, max_wait } => (max_wait, lease),
        };
        // The states of a few numbers are replaced whole; the log and the
        // leases are edited.
        let step = match &self.kind {
            Kind::FixedWindow(p) => p.check(state!(FixedWindow), now, cost).map(State::FixedWindow),
            Kind::SlidingWindow(p) => p.check(state!(SlidingWindow), now, cost).map(State::SlidingWindow),
            Kind::SlidingLog(p) => {
                let state = state!(SlidingLog).map(|log| &**log);
                let step = p.check(state, now, cost);
                return edit(
                    state,
                    step,
                    SlidingLogState::apply,
                    State::SlidingLog,
                    Change::SlidingLog,
                );
            }
            Kind::TokenBucket(p) => p.check(state!(TokenBucket), now, cost).map(State::TokenBucket),
            Kind::Gcra(p) => p.check(state!(Gcra), now, cost).map(State::Gcra),
            // A release only reports: it is never denied and never waits.
            Kind::Reservation(p) if matches!(action, Action::Release(_)) => {
                report(p.reserve(state!(Reservation), now, 0, None)).map(State::Reservation)
            }
            Kind::LeakyBucket(p) if matches!(action, Action::Release(_)) => {
                report(p.reserve(state!(LeakyBucket), now, 0, None)).map(State::LeakyBucket)
            }
            // `check` on a borrowing limit waits for nothing; on a shaping one, for anything.
            Kind::Reservation(p) => {
                let max_wait = if action == Action::Check { Some(0) } else { max_wait };
                p.reserve(state!(Reservation), now, cost, max_wait)
                    .map(State::Reservation)
            }
            Kind::LeakyBucket(p) => p
                .reserve(state!(LeakyBucket), now, cost, max_wait)
                .map(State::LeakyBucket),
            Kind::Concurrency(p) => {
                let state = state!(Concurrency).map(|leases| &**leases);
                let step = match action {
                    Action::Release(lease) => p.release(state, now, lease),
                    _ => p.acquire(state, now, cost, lease),
                };
                return edit(
                    state,
                    step,
                    ConcurrencyState::apply,
                    State::Concurrency,
                    Change::Concurrency,
                );
            }
        };
        step.map(Change::Put)
    }

    /// The algorithm's numeric parameters as the Lua script reads them:
    /// seven integers, of which the Redis store sends each Lua twin's
    /// `params` the ones it reads.
    #[cfg(feature = "redis")]
    pub(crate) fn script_params(&self) -> [u64; 7] {
        match self.kind {
            Kind::FixedWindow(p) => [p.limit, p.window, 0, 0, 0, 0, 0],
            Kind::SlidingWindow(p) => [p.limit, p.window, p.buckets, 0, 0, 0, 0],
            Kind::SlidingLog(p) => [p.limit, p.window, 0, 0, 0, 0, 0],
            Kind::TokenBucket(p) => [
                p.capacity,
                p.refill,
                p.interval,
                u64::from(p.mode == Refill::Interval),
                p.initial,
                p.rate.unit,
                p.rate.per_micro,
            ],
            Kind::Reservation(p) => [p.max_burst, p.initial, 0, 0, 0, p.ticks.unit, p.ticks.per_micro],
            Kind::LeakyBucket(p) => [p.capacity, 0, 0, 0, 0, p.ticks.unit, p.ticks.per_micro],
            Kind::Gcra(p) => [p.burst, 0, 0, 0, 0, p.ticks.unit, p.ticks.per_micro],
            Kind::Concurrency(p) => [p.limit, p.ttl, 0, 0, 0, 0, 0],
        }
    }
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
