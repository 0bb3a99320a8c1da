//! [`Limit`]: a validated limit and its constructors, one per algorithm,
//! reaching its algorithm through the registry's `dispatch!`.

use std::fmt;
use std::time::Duration;

use super::calendar::Period;
use super::core::{Action, Algorithm, Step, Update, WindowSpec};
use super::durability::Durability;
#[cfg(feature = "engine")]
use super::encoding::{Encoded, Loaded, Members, SortedSet, Value};
use super::fixed_window::FixedWindowSpec;
use super::kernel::WordKernel;
use super::registry::{Change, Kind, LimitSpec, Registered, State, ALGORITHMS};
use super::scope::Scope;
use super::{ConcurrencySpec, GcraSpec, LeakyBucketSpec, Refill, ReservationSpec, SlidingWindowSpec, TokenBucketSpec};
use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// A validated limit: one algorithm with its parameters.
///
/// Build one with a constructor ([`Limit::gcra`], …), from a [`LimitSpec`],
/// or from JSON ([`Limit::from_json`]). Each refuses invalid parameters with
/// an error naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    spec: LimitSpec,
    kind: Kind,
    /// [`Limit::with_lease`]: blocks of units a process takes at once.
    lease: Option<Duration>,
    /// [`Limit::recording_overage`]: a check it refuses still counts.
    records_overage: bool,
    /// [`Limit::durable`]: what it counts is made durable before the answer.
    durability: Option<Durability>,
    /// [`Limit::alerting`]: thresholds (percent of the limit, rising) whose
    /// crossing a decision reports.
    alerts: Thresholds,
    /// [`Limit::with_scope`]: where the limit holds.
    pub(super) scope: Scope,
}

/// The most thresholds one limit alerts at.
pub const MOST_ALERTS: usize = 8;

/// A limit's alert thresholds, held inline: a limit is cloned per
/// decision in places, and this costs no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Thresholds {
    len: u8,
    at: [u8; MOST_ALERTS],
}

impl std::ops::Deref for Thresholds {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.at[..usize::from(self.len)]
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
            spec: self,
            kind,
            lease: None,
            records_overage: false,
            durability: None,
            alerts: Thresholds::default(),
            scope: Scope::Regional,
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
        LimitSpec::FixedWindow(FixedWindowSpec::new(limit, window)).build()
    }

    /// A fixed window counter that follows the calendar: at most `limit`
    /// units per `period` (day, ISO week, month, year) in the time zone
    /// named `time_zone` (an IANA name such as `"Europe/Paris"`; `"UTC"`),
    /// with DST and month lengths exact — a monthly token budget that
    /// resets with the billing month. JSON: `{"algorithm": "fixed_window",
    /// "limit": 1000000, "calendar": "month", "time_zone": "Europe/Paris"}`.
    ///
    /// **Bound:** within one period the admitted cost is at most `limit`.
    ///
    /// # Errors
    ///
    /// When `limit` is zero or the time zone is unknown (naming `time_zone`).
    pub fn calendar_window(limit: u64, period: Period, time_zone: &str) -> Result<Self> {
        LimitSpec::FixedWindow(FixedWindowSpec::calendar(limit, period, Some(time_zone))).build()
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
            max_debt: None,
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
        LimitSpec::Gcra(GcraSpec {
            rate,
            period,
            burst,
            max_debt: None,
        })
        .build()
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
        Self::from_value(value)
    }

    /// Like [`Limit::from_json`], from a parsed value: the algorithm's fields
    /// and, optionally, `"lease": "<duration>"` ([`Limit::with_lease`]),
    /// `"overage": "record"` ([`Limit::recording_overage`]; `"refuse"`, the
    /// default, keeps a refused check from counting), `"durable":
    /// "replicated"` or `"fsynced"` ([`Limit::durable`]) and `"alerts": [50,
    /// 80, 100]` ([`Limit::alerting`]).
    ///
    /// # Errors
    ///
    /// As [`Limit::from_json`].
    pub fn from_value(mut value: serde_json::Value) -> Result<Self> {
        let records_overage = match value.as_object_mut().and_then(|fields| fields.remove("overage")) {
            None => false,
            Some(serde_json::Value::String(text)) if text == "record" => true,
            Some(serde_json::Value::String(text)) if text == "refuse" => false,
            Some(_) => {
                return Err(Error::invalid_limit(
                    "overage: expected \"record\" (a refused check still counts its cost) or \"refuse\"",
                ))
            }
        };
        let lease = match value.as_object_mut().and_then(|fields| fields.remove("lease")) {
            None => None,
            Some(serde_json::Value::String(text)) => Some(
                crate::duration::parse_duration(&text)
                    .map_err(|error| Error::invalid_limit(format!("lease: {error}")))?,
            ),
            Some(_) => {
                return Err(Error::invalid_limit(
                    "lease: expected a duration as text, such as \"50ms\"",
                ))
            }
        };
        let scope = match value.as_object_mut().and_then(|fields| fields.remove("scope")) {
            None => Scope::Regional,
            Some(scope) => Scope::from_json(&scope)?,
        };
        let durability = match value.as_object_mut().and_then(|fields| fields.remove("durable")) {
            None => None,
            Some(serde_json::Value::String(text)) => Some(Durability::parse(&text)?),
            Some(_) => return Err(Error::invalid_limit(Durability::EXPECTED)),
        };
        let alerts = match value.as_object_mut().and_then(|fields| fields.remove("alerts")) {
            None => None,
            Some(serde_json::Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|item| {
                        item.as_u64()
                            .and_then(|n| u8::try_from(n).ok())
                            .ok_or_else(alerts_expected)
                    })
                    .collect::<Result<Vec<u8>>>()?,
            ),
            Some(_) => return Err(alerts_expected()),
        };
        let mut limit = LimitSpec::from_value(value)?.build()?;
        limit.durability = durability;
        if let Some(alerts) = alerts {
            limit = limit.alerting(alerts)?;
        }
        if records_overage {
            limit = limit.recording_overage()?;
        }
        limit = limit.with_scope(scope)?;
        match lease {
            Some(lease) => limit.with_lease(lease),
            None => Ok(limit),
        }
    }

    /// This limit, counting what a check it refuses asked for: usage that
    /// already happened, as envoyproxy/ratelimit counts a descriptor that
    /// goes over (a gateway's check and its report of tokens spent look
    /// alike). A check this limit refuses is still refused, and the other
    /// limits of the policy still count nothing; this one records the cost
    /// as [`Op::Record`](crate::Op::Record) does (windows above the limit,
    /// buckets and TATs in debt). Other operations are unchanged.
    ///
    /// # Errors
    ///
    /// On a concurrency limit (it counts requests in flight, not usage), or
    /// on a leased one (a block's local denial would count nothing); the
    /// message names `overage`.
    pub fn recording_overage(mut self) -> Result<Self> {
        if self.is_concurrency() || self.lease.is_some() {
            return Err(Error::invalid_limit(format!(
                "overage: a {} limit cannot record overage",
                if self.lease.is_some() {
                    "leased"
                } else {
                    self.algorithm()
                }
            )));
        }
        self.records_overage = true;
        Ok(self)
    }

    /// This limit, reporting the thresholds a decision crosses: each is a
    /// percent of the limit (1 to 100), and a decision that takes the
    /// limit's use (the limit less what remains) from below one to at or
    /// above it reports it in [`Outcome::crossed`](crate::Outcome::crossed),
    /// decided in the same atomic step as the decision itself, so that each
    /// crossing is reported once however many processes share the store.
    /// A limit's use rises within a window and falls when it resets (or, for
    /// a bucket, as it refills): each rise through a threshold is one
    /// crossing. Given in any order; at most [`MOST_ALERTS`]; none clears them.
    ///
    /// # Errors
    ///
    /// A threshold outside 1 to 100, more than [`MOST_ALERTS`], or a leased
    /// limit (its blocks are handed out without the store); the message
    /// names `alerts`.
    pub fn alerting(mut self, thresholds: impl IntoIterator<Item = u8>) -> Result<Self> {
        let mut alerts: Vec<u8> = thresholds.into_iter().collect();
        if let Some(wrong) = alerts.iter().find(|&&threshold| threshold == 0 || threshold > 100) {
            return Err(Error::invalid_limit(format!(
                "alerts: {wrong} is not a percent of the limit from 1 to 100"
            )));
        }
        alerts.sort_unstable();
        alerts.dedup();
        if alerts.len() > MOST_ALERTS {
            return Err(Error::invalid_limit(format!(
                "alerts: at most {MOST_ALERTS} thresholds, not {}",
                alerts.len()
            )));
        }
        if self.is_global() && !alerts.is_empty() {
            return Err(Error::invalid_limit(
                "alerts: a global limit cannot alert (a region hands out its share without the home store)",
            ));
        }
        if self.lease.is_some() && !alerts.is_empty() {
            return Err(Error::invalid_limit(
                "alerts: a leased limit hands out its blocks without the store, so it cannot report crossings",
            ));
        }
        let mut at = [0; MOST_ALERTS];
        at[..alerts.len()].copy_from_slice(&alerts);
        self.alerts = Thresholds {
            len: u8::try_from(alerts.len()).unwrap_or(0),
            at,
        };
        Ok(self)
    }

    /// This limit, made durable: on a Redis store, a call that counts units
    /// of it (a check that consumes, a record, a settlement) answers only
    /// once what it counted is replicated or fsynced, as `durability` says,
    /// within the store's timeout; past it the call is an error
    /// ([`ErrorKind::NotDurable`](crate::ErrorKind::NotDurable)), and what it
    /// counted stays counted on the master. Peeks never wait; the memory
    /// store has nothing to wait for.
    #[must_use]
    pub fn durable(mut self, durability: Durability) -> Self {
        self.durability = Some(durability);
        self
    }

    /// The durability of [`Limit::durable`], if any.
    pub fn durability(&self) -> Option<Durability> {
        self.durability
    }

    /// The thresholds this limit alerts at, rising ([`Limit::alerting`]).
    pub fn alerts(&self) -> &[u8] {
        &self.alerts
    }

    /// This limit, refusing its overage again: a check it refuses counts
    /// nothing (the default).
    #[must_use]
    pub fn refusing_overage(mut self) -> Self {
        self.records_overage = false;
        self
    }

    /// Whether a check this limit refuses still counts
    /// ([`Limit::recording_overage`]).
    pub fn records_overage(&self) -> bool {
        self.records_overage
    }

    /// This limit, taken in leases of `lease`: a process takes a block of
    /// units from the shared limit in one atomic call, hands them out to its
    /// own requests, and gives back what it did not use when the lease ends
    /// (see [`LeasedStore`](crate::LeasedStore)). The shared limit is never
    /// over-admitted; a unit may be used up to `lease` after the store
    /// counted it, so every bound stated for the algorithm holds over any
    /// interval stretched by `lease`.
    ///
    /// Leasable: fixed window, sliding window, sliding log, token bucket and
    /// GCRA (the limits [`Op::CheckAtMost`](crate::Op::CheckAtMost) takes
    /// from).
    ///
    /// # Errors
    ///
    /// When the algorithm cannot be leased, or `lease` is not a positive
    /// whole number of microseconds; the message names `lease`.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        if self.records_overage {
            return Err(Error::invalid_limit(
                "lease: a limit recording its overage cannot be leased",
            ));
        }
        if !self.alerts.is_empty() {
            return Err(Error::invalid_limit(
                "lease: a limit with alerts cannot be leased (its blocks are handed out without the store)",
            ));
        }
        if !self.is_leasable() {
            let leasable = ALGORITHMS.iter().filter(|entry| entry.leasable).map(|entry| entry.name);
            return Err(Error::invalid_limit(format!(
                "lease: a {} limit cannot be leased (leasable: {})",
                self.algorithm(),
                listed(leasable, ", ")
            )));
        }
        if lease.is_zero() || !lease.subsec_nanos().is_multiple_of(1_000) {
            return Err(Error::invalid_limit(
                "lease: must be a positive whole number of microseconds",
            ));
        }
        self.lease = Some(lease);
        Ok(self)
    }

    /// The lease of [`Limit::with_lease`], if any.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// The most of `units` taken `elapsed` ago whose effect may have lapsed
    /// since: what a bucket or a TAT may have refilled meanwhile, which a
    /// refund must not give back again (windows give back only what still
    /// counts by themselves: none).
    pub(crate) fn lapsed(&self, units: u64, elapsed: Duration) -> u64 {
        let elapsed = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        dispatch!(&self.kind, p => p.lapsed(units, elapsed))
    }

    /// What a refund of units taken at `at` depends on besides its cost,
    /// when refunds add up ([`Algorithm::refund_key`]).
    pub(crate) fn refund_key(&self, at: Timestamp) -> Option<u64> {
        dispatch!(&self.kind, p => p.refund_key(at.as_micros()))
    }

    /// True when the limit may be leased ([`Limit::with_lease`]).
    pub fn is_leasable(&self) -> bool {
        fn leasable<A: Algorithm>(_: &A) -> bool {
            A::LEASABLE
        }
        dispatch!(&self.kind, p => leasable(p))
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
    #[inline]
    pub fn is_concurrency(&self) -> bool {
        fn leases<A: Algorithm>(_: &A) -> bool {
            A::LEASES
        }
        dispatch!(&self.kind, p => leases(p))
    }

    /// The one-word kernel its algorithm offers ([`WordKernel`]): none when
    /// it alerts (crossings are found on the general step).
    pub(crate) fn word_kernel(&self) -> Option<WordKernel> {
        WordKernel::of(&self.kind).filter(|_| self.alerts.is_empty())
    }

    #[cfg(test)]
    pub(crate) fn kind(&self) -> &Kind {
        &self.kind
    }

    /// Whether the limit can decide at `now` (see [`Algorithm::decides_at`]).
    #[cfg(feature = "engine")]
    pub(crate) fn decides_at(&self, now: u64) -> bool {
        dispatch!(&self.kind, p => p.decides_at(now))
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
        if matches!(action, Action::Reserve(_)) && !self.is_shaping() {
            return Err(unsupported_reserve(self.algorithm()));
        }
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

    /// The state in a key's `value` at `now`, as this limit's Lua version reads it.
    #[cfg(feature = "engine")]
    pub(crate) fn load(&self, value: &Value, now: u64) -> Loaded<State> {
        dispatch!(&self.kind, p => load(p, value, now))
    }

    /// What a decision of `action` for `cost` units at `now` reads of `key`
    /// (see [`Algorithm::fetch`]): `None` for the whole value.
    #[cfg(feature = "engine")]
    pub(crate) fn fetch(
        &self,
        set: &mut dyn SortedSet,
        key: &[u8],
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Option<Members> {
        dispatch!(&self.kind, p => p.fetch(set, key, now, action, cost))
    }

    /// The key's value for `state` (`None`: another algorithm's state), which
    /// says something until `expires` (µs).
    #[cfg(feature = "engine")]
    pub(crate) fn encode(&self, state: &State, expires: u64) -> Option<Encoded> {
        dispatch!(&self.kind, p => encode(p, state, expires))
    }

    /// µs a key read in part is kept for ended entries of `state` not yet
    /// trimmed when a decision leaves it saying nothing more (see
    /// [`Algorithm::backlog`]; 0: none).
    #[cfg(feature = "engine")]
    pub(crate) fn backlog(&self, state: &State, now: u64) -> u64 {
        dispatch!(&self.kind, p => backlog(p, state, now))
    }

    /// Its algorithm's id in the Redis library (`ALGORITHMS[ID]`).
    #[cfg(feature = "engine")]
    pub(crate) fn id(&self) -> u8 {
        fn id_of<A: Algorithm>(_: &A) -> u8 {
            A::ID
        }
        dispatch!(&self.kind, p => id_of(p))
    }

    /// Hands `each` the numbers the Redis library reads of this limit, in
    /// order, for a decision near `now` (µs; asked only of a calendar
    /// window, whose periods are the ones around it).
    #[cfg(feature = "engine")]
    pub(crate) fn each_param(&self, now: impl FnOnce() -> u64, each: impl FnMut(u64)) {
        dispatch!(&self.kind, p => match p.params_near(now) {
            Some(params) => params.into_iter().for_each(each),
            None => p.params().into_iter().for_each(each),
        });
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

/// `A`'s state in `value`.
#[cfg(feature = "engine")]
fn load<A: Registered>(algorithm: &A, value: &Value, now: u64) -> Loaded<State> {
    algorithm.load(value, now).map(A::state)
}

/// `A`'s encoding of `state`, if it is a state of `A`.
#[cfg(feature = "engine")]
fn encode<A: Registered>(algorithm: &A, state: &State, expires: u64) -> Option<Encoded> {
    A::held(state).map(|state| algorithm.encode(state, expires))
}

/// `A`'s backlog kept in `state`, if it is a state of `A`.
#[cfg(feature = "engine")]
fn backlog<A: Registered>(algorithm: &A, state: &State, now: u64) -> u64 {
    A::held(state).map_or(0, |state| algorithm.backlog(state, now))
}

fn alerts_expected() -> Error {
    Error::invalid_limit("alerts: expected a list of percents of the limit, such as [50, 80, 100]")
}

/// The refusal of `reserve` on a limit of `algorithm`, which neither
/// borrows nor shapes.
fn unsupported_reserve(algorithm: &str) -> Error {
    let shaping = ALGORITHMS.iter().filter(|entry| entry.shaping).map(|entry| entry.name);
    Error::invalid_argument(format!(
        "reserve needs a borrowing or shaping limit ({}), not {algorithm}",
        listed(shaping, ", ")
    ))
}

impl Limit {
    /// The limit as the JSON [`Limit::from_value`] reads back as it: its
    /// spec, and its lease, overage and durability when set.
    pub fn to_value(&self) -> serde_json::Value {
        let mut json = serde_json::to_value(&self.spec).unwrap_or_default();
        if let Some(fields) = json.as_object_mut() {
            if let Some(lease) = self.lease {
                fields.insert("lease".to_owned(), crate::duration::format_duration(lease).into());
            }
            if self.records_overage {
                fields.insert("overage".to_owned(), "record".into());
            }
            if let Some(durability) = self.durability {
                fields.insert("durable".to_owned(), durability.name().into());
            }
            if !self.alerts.is_empty() {
                fields.insert("alerts".to_owned(), self.alerts.to_vec().into());
            }
            if self.is_global() {
                fields.insert("scope".to_owned(), self.scope.as_str().into());
            }
        }
        json
    }
}

impl Limit {
    /// This limit, holding across regions when `scope` is
    /// [`Scope::Global`]: decided by a [`RegionalStore`](crate::RegionalStore)
    /// on the region's share, taken from the home store in blocks (any
    /// other store decides it as a regional limit).
    ///
    /// # Errors
    ///
    /// A global limit must be leasable (its share is taken as a block, as a
    /// lease's is) and cannot alert (a region hands out its share without
    /// the home store); the message names `scope`.
    pub fn with_scope(mut self, scope: Scope) -> Result<Self> {
        if scope == Scope::Global {
            if !self.is_leasable() {
                return Err(Error::invalid_limit(format!(
                    "scope: a {} limit cannot be global (its share is taken in blocks, as a lease's)",
                    self.algorithm()
                )));
            }
            if !self.alerts().is_empty() {
                return Err(Error::invalid_limit(
                    "scope: a global limit cannot alert (a region hands out its share without the home store)",
                ));
            }
        }
        self.scope = scope;
        Ok(self)
    }

    /// Where this limit holds ([`Limit::with_scope`]).
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// True for a limit that holds across regions.
    pub fn is_global(&self) -> bool {
        self.scope == Scope::Global
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_value().to_string())
    }
}

impl TryFrom<LimitSpec> for Limit {
    type Error = Error;

    fn try_from(spec: LimitSpec) -> Result<Self> {
        spec.build()
    }
}

#[cfg(test)]
mod tests;
