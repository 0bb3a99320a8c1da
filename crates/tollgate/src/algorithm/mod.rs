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
//!
//! **The registry.** Everything specific to an algorithm is in its file: its
//! spec (the public struct read from JSON or YAML), its validated
//! parameters, which implement [`Algorithm`] (validation, capacity, a
//! decision for every [`Action`], the numbers its Lua twin reads and the
//! twin's id), and its state. Shared code knows the algorithms only through
//! `registry!`, one line per algorithm, `Variant(Spec) => module::Params`,
//! which builds [`LimitSpec`], [`Kind`], [`State`] and [`Change`], the table
//! of names, and the list of Lua twins the Redis library is assembled from
//! at compile time. A [`Limit`] holds a [`Kind`], a `Copy` enum of the
//! parameters, and reaches its algorithm through `dispatch!`, a `match` of
//! static calls: no trait object, no allocation.
//!
//! To add an algorithm `name`: write `name.rs` (spec, parameters, state,
//! `impl Algorithm`, with an `ID` no other algorithm uses) and `name.lua`
//! (its table, ending with `ALGORITHMS[<ID>] = name`); declare the module
//! and re-export its spec below; add its line to `registry!`. A constructor
//! on [`Limit`], a case in the property tests and one in the Rust-versus-Lua
//! differential test are then worth adding.
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
use self::gcra::Gcra;
pub use self::gcra::GcraSpec;
pub use self::leaky_bucket::LeakyBucketSpec;
use self::rate::MAX_TICKS;
pub use self::reservation::ReservationSpec;
pub use self::sliding_window::SlidingWindowSpec;
pub use self::token_bucket::{Refill, TokenBucketSpec};

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

    pub(crate) fn map<T>(self, wrap: impl FnOnce(C) -> T) -> Step<T> {
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
    /// Give back `cost` units taken at `at` (µs) and, on concurrency
    /// limits, the lease; never refused, reported as a peek after.
    Refund { at: u64, lease: Option<&'a str> },
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
    fn supports(&self, action: Action<'_>, _cost: u64) -> Result<()> {
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

impl<S> Update<S, Infallible> {
    /// The whole new state: a state of a few numbers is never edited.
    pub(crate) fn into_whole(self) -> S {
        match self {
            Self::Put(state) => state,
            Self::Edit(never) => match never {},
        }
    }
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

/// Builds, from one line per algorithm, `Variant(Spec) => module::Params`:
/// the public [`LimitSpec`], and [`Kind`], [`State`] and [`Change`] (one
/// variant each per algorithm, in registry order); the glue between those
/// and each algorithm ([`Registered`], `Change::apply`); the table of
/// [`ALGORITHMS`]; the `dispatch!` macro, which runs an expression on the
/// parameters of a [`Kind`]; and `lua_twins!`, the Lua twins' source.
macro_rules! registry {
    ($($variant:ident($spec:ty) => $module:ident::$algorithm:ident,)*) => {
        /// Parameters of one limit, as written in JSON or YAML: the
        /// `algorithm` name and its fields, durations as text like `"1.5s"`.
        #[non_exhaustive]
        #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
        #[serde(tag = "algorithm", rename_all = "snake_case")]
        pub enum LimitSpec {
            $(
                #[doc = concat!("See [`Limit::", stringify!($module), "`].")]
                $variant($spec),
            )*
        }

        /// The validated parameters of one limit: its algorithm's.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Kind {
            $($variant($module::$algorithm),)*
        }

        /// The stored state of one limit for one subject.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(crate) enum State {
            $($variant(<$module::$algorithm as Algorithm>::Stored),)*
        }

        /// What a decision does to the state it was made on: the whole new
        /// state, or an edit of one algorithm's state. `'a` is the request's
        /// lifetime (a lease's name).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(crate) enum Change<'a> {
            /// The whole new state: for the states of a few numbers, and for
            /// a log or leases started from no state.
            Put(State),
            $($variant(<$module::$algorithm as Algorithm>::Edit<'a>),)*
        }

        $(
            impl Registered for $module::$algorithm {
                #[inline]
                fn held(state: &State) -> Option<&Self::State> {
                    match state {
                        State::$variant(stored) => Some(Borrow::borrow(stored)),
                        _ => None,
                    }
                }

                #[inline]
                fn state(stored: Self::Stored) -> State {
                    State::$variant(stored)
                }

                #[inline]
                fn change(edit: Self::Edit<'_>) -> Change<'_> {
                    Change::$variant(edit)
                }
            }
        )*

        impl Change<'_> {
            /// Commits the change to `state`, the state the decision was made on
            /// (any state, when the change is a [`Change::Put`]).
            pub(crate) fn apply(self, state: &mut State) {
                match (self, state) {
                    (Change::Put(new), state) => *state = new,
                    $(
                        (Change::$variant(edit), State::$variant(stored)) => {
                            edit.apply(BorrowMut::borrow_mut(stored));
                        }
                    )*
                    // An edit is only made of a state of its own algorithm.
                    (change, state) => debug_assert!(false, "{change:?} does not apply to {state:?}"),
                }
            }
        }

        impl LimitSpec {
            /// The parameters, validated by their algorithm.
            fn validate(&self) -> Result<Kind> {
                match self {
                    $(Self::$variant(spec) => $module::$algorithm::build(spec).map(Kind::$variant),)*
                }
            }

            /// The algorithm's name.
            fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => <$module::$algorithm as Algorithm>::NAME,)*
                }
            }
        }

        /// Every algorithm, in registry order.
        const ALGORITHMS: &[Entry] = &[
            $(
                Entry {
                    name: <$module::$algorithm as Algorithm>::NAME,
                    shaping: <$module::$algorithm as Algorithm>::SHAPING,
                    parse: |fields| parse_fields(fields).map(LimitSpec::$variant),
                },
            )*
        ];

        /// Each algorithm's name and the id of its Lua twin, for tests.
        #[cfg(all(test, feature = "redis"))]
        pub(crate) const LUA_IDS: &[(&str, u8)] = &[
            $((<$module::$algorithm as Algorithm>::NAME, <$module::$algorithm as Algorithm>::ID),)*
        ];

        /// The Lua twins' source, in registry order: `concat!` of each
        /// algorithm's `.lua` file, for the Redis store's library.
        #[cfg(feature = "redis")]
        macro_rules! lua_twins {
            () => {
                concat!($(
                    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/algorithm/", stringify!($module), ".lua")),
                )*)
            };
        }
        #[cfg(feature = "redis")]
        pub(crate) use lua_twins;

        /// `$body` with `$p` bound to the parameters in `$kind` (a `&Kind`).
        macro_rules! dispatch {
            ($kind:expr, $p:ident => $body:expr) => {
                match $kind {
                    $(Kind::$variant($p) => $body,)*
                }
            };
        }
    };
}

registry! {
    FixedWindow(WindowSpec) => fixed_window::FixedWindow,
    SlidingWindow(SlidingWindowSpec) => sliding_window::SlidingWindow,
    SlidingLog(WindowSpec) => sliding_log::SlidingLog,
    TokenBucket(TokenBucketSpec) => token_bucket::TokenBucket,
    Reservation(ReservationSpec) => reservation::Reservation,
    LeakyBucket(LeakyBucketSpec) => leaky_bucket::LeakyBucket,
    Gcra(GcraSpec) => gcra::Gcra,
    Concurrency(ConcurrencySpec) => concurrency::Concurrency,
}

/// How the registry's enums hold one algorithm.
pub(crate) trait Registered: Algorithm {
    /// The state of this algorithm in `state`, if it is one.
    fn held(state: &State) -> Option<&Self::State>;
    /// A state of this algorithm, as stored.
    fn state(stored: Self::Stored) -> State;
    /// An edit of a state of this algorithm.
    fn change(edit: Self::Edit<'_>) -> Change<'_>;
}

/// What the registry knows of one algorithm apart from its parameters.
struct Entry {
    /// Its name, as written in `"algorithm"`.
    name: &'static str,
    /// Whether it borrows or shapes.
    shaping: bool,
    /// Reads its spec from the fields of a JSON object.
    parse: fn(serde_json::Value) -> Result<LimitSpec>,
}

impl Change<'_> {
    /// The new state of a limit that had none: only a [`Change::Put`] is
    /// made of no state.
    pub(crate) fn into_state(self) -> Option<State> {
        match self {
            Change::Put(state) => Some(state),
            _ => None,
        }
    }
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
    /// The limit as the Redis library reads it, written once.
    #[cfg(feature = "redis")]
    script_params: std::sync::Arc<str>,
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
        let kind = self.validate()?;
        Ok(Limit {
            #[cfg(feature = "redis")]
            script_params: dispatch!(&kind, p => script_params(p)).into(),
            spec: self,
            kind,
        })
    }

    /// The algorithm's name, as written in `"algorithm"`.
    pub fn algorithm(&self) -> &'static str {
        self.name()
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
        match ALGORITHMS.iter().find(|entry| entry.name == algorithm) {
            Some(entry) => (entry.parse)(fields),
            None => Err(Error::invalid_limit(format!(
                "unknown algorithm \"{algorithm}\" (expected {})",
                listed(ALGORITHMS.iter().map(|entry| entry.name), " or ")
            ))),
        }
    }
}

/// `a, b, c<last>d`: the names joined by commas, the last two by `last`.
fn listed<'a>(names: impl Iterator<Item = &'a str>, last: &str) -> String {
    let names: Vec<&str> = names.collect();
    match names.split_last() {
        Some((final_name, [])) => (*final_name).to_owned(),
        Some((final_name, rest)) => format!("{}{last}{final_name}", rest.join(", ")),
        None => String::new(),
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
        dispatch!(&self.kind, p => p.capacity())
    }

    /// True for the shaping and borrowing limits (reservation, leaky bucket),
    /// which grant a request at a later moment (`Decision::wait`) rather
    /// than refusing it.
    pub fn is_shaping(&self) -> bool {
        fn shaping<A: Algorithm>(_: &A) -> bool {
            A::SHAPING
        }
        dispatch!(&self.kind, p => shaping(p))
    }

    /// The window a count-per-window limit counts over (fixed window,
    /// sliding window, sliding log); `None` for the others.
    pub fn window(&self) -> Option<Duration> {
        dispatch!(&self.kind, p => p.window())
    }

    /// True for the concurrency limiter, which is taken with leases.
    pub fn is_concurrency(&self) -> bool {
        fn leases<A: Algorithm>(_: &A) -> bool {
            A::LEASES
        }
        dispatch!(&self.kind, p => leases(p))
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
        dispatch!(&self.kind, p => available(p, state, now))
    }

    /// Whether this limit can run `action` for `cost` units.
    ///
    /// # Errors
    ///
    /// `reserve` on a limit that neither borrows nor shapes; `check` (or
    /// `acquire` without a lease) of a positive cost on a concurrency limit.
    pub(crate) fn supports(&self, action: Action<'_>, cost: u64) -> Result<()> {
        dispatch!(&self.kind, p => p.supports(action, cost))
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
        dispatch!(&self.kind, p => decide(p, state, now, action, cost))
    }

    /// The limit as the Redis library reads it: its algorithm's id, then
    /// the numbers its Lua twin's `params` reads, joined by ':'.
    #[cfg(feature = "redis")]
    pub(crate) fn script_params(&self) -> &str {
        &self.script_params
    }
}

/// `A`'s limit in `state` (a state of another algorithm counts as none:
/// the limit was redefined): units that would be admitted now.
#[inline]
fn available<A: Registered>(algorithm: &A, state: Option<&State>, now: u64) -> u64 {
    algorithm.available(state.and_then(A::held), now)
}

/// `A`'s limit runs `action` on its state in `state` (a state of another
/// algorithm counts as none).
#[inline]
fn decide<'a, A: Registered>(
    algorithm: &A,
    state: Option<&State>,
    now: u64,
    action: Action<'a>,
    cost: u64,
) -> Step<Change<'a>> {
    let step = algorithm.decide(state.and_then(A::held), now, action, cost);
    step.map(|update| match update {
        Update::Put(new) => Change::Put(A::state(new)),
        Update::Edit(edit) => A::change(edit),
    })
}

/// `id:param:param:…`: the Lua id, then what the Lua twin's `params` reads.
#[cfg(feature = "redis")]
fn script_params<A: Algorithm>(algorithm: &A) -> String {
    use std::fmt::Write as _;
    let mut text = A::ID.to_string();
    for param in algorithm.script_params() {
        let _ = write!(text, ":{param}");
    }
    text
}

/// A refund of a state replaced whole: `refunded` is the state it leaves
/// (`None`: nothing given back). Every limit reports after it as a release
/// does (what is left, no wait).
fn refund_whole<A: Algorithm>(
    algorithm: &A,
    state: Option<&A::State>,
    now: u64,
    refunded: Option<A::State>,
) -> Step<A::State> {
    let report = |state| algorithm.decide(state, now, Action::Release(""), 0).decision;
    match refunded {
        Some(new) => Step::changed(report(Some(&new)), new),
        None => Step::unchanged(report(state)),
    }
}

/// A step that only reports: no wait asked of the caller.
fn report<C>(mut step: Step<C>) -> Step<C> {
    step.decision.wait = Duration::ZERO;
    step
}

fn unsupported_reserve(algorithm: &str) -> Error {
    let shaping = ALGORITHMS.iter().filter(|entry| entry.shaping).map(|entry| entry.name);
    Error::invalid_argument(format!(
        "reserve needs a borrowing or shaping limit ({}), not {algorithm}",
        listed(shaping, ", ")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One limit of each algorithm.
    fn one_of_each() -> Vec<Limit> {
        let second = Duration::from_secs(1);
        [
            Limit::fixed_window(10, second),
            Limit::sliding_window(10, second, 10),
            Limit::sliding_log(10, second),
            Limit::token_bucket(10, 1, second),
            Limit::reservation(10, second, 5),
            Limit::leaky_bucket(10, second, 5),
            Limit::gcra(10, second, 5),
            Limit::concurrency(10, second),
        ]
        .into_iter()
        .map(|limit| limit.expect("valid limit"))
        .collect()
    }

    #[test]
    fn every_algorithm_in_the_registry_reads_back_by_its_name() {
        let limits = one_of_each();
        let names: Vec<&str> = limits.iter().map(Limit::algorithm).collect();
        let registered: Vec<&str> = ALGORITHMS.iter().map(|entry| entry.name).collect();
        assert_eq!(names, registered, "one limit of each algorithm, in registry order");
        for limit in limits {
            let value = serde_json::to_value(limit.spec()).expect("a spec serializes");
            assert_eq!(value["algorithm"], limit.algorithm());
            assert_eq!(LimitSpec::from_value(value).expect("reads back"), *limit.spec());
        }
        let unknown = LimitSpec::from_value(serde_json::json!({"algorithm": "leaky"})).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "unknown algorithm \"leaky\" (expected fixed_window, sliding_window, sliding_log, \
             token_bucket, reservation, leaky_bucket, gcra or concurrency)"
        );
        let gcra = Limit::gcra(1, Duration::from_secs(1), 1).expect("valid limit");
        assert_eq!(
            gcra.supports(Action::Reserve(None), 1).unwrap_err().to_string(),
            "reserve needs a borrowing or shaping limit (reservation, leaky_bucket), not gcra"
        );
    }
}
