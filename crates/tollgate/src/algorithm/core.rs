//! The trait every algorithm implements, and the helpers its files share:
//! a decision's [`Step`] and [`Update`], the [`Action`] a request asks, the
//! validation of parameters, refunds of states replaced whole. Algorithm
//! files import this module only: it knows none of them.

use std::borrow::{Borrow, BorrowMut};
use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "engine")]
pub(crate) use super::encoding::{in_set_order, Encoded, Loaded, Members, Scores, SortedSet, Value};
use super::rate::MAX_TICKS;
use crate::clock::micros;
use crate::decision::Decision;
use crate::duration::{serde_text, MAX_MICROS};
use crate::error::{Error, Result};

/// The most ended entries (a sliding log's entries, a concurrency
/// limiter's leases) one call trims from a key: the others stay, known to
/// have ended, for later calls, so a call's work inside Redis is bounded
/// whatever the backlog. The Lua library's `TRIM_STEP` (prelude.lua) is the
/// same number (store/redis/mod.rs's tests hold them equal).
pub(crate) const TRIM_STEP: usize = 250;

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
    /// Count `cost` units that were already spent, whether or not they fit:
    /// windows go above their limit, buckets and TATs into debt. Decided as
    /// a check when they fit; otherwise denied (they did not fit), with the
    /// state as it stands after them. Concurrency limits refuse it.
    Record,
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
/// its spec, its state, its decision and its encoding for its Lua version.
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
    /// The id of the Lua version in the Redis library (`ALGORITHMS[ID]`).
    #[cfg(feature = "engine")]
    const ID: u8;
    /// True for the shaping and borrowing limits, which grant a request at a
    /// later moment rather than refusing it, and take `reserve`.
    const SHAPING: bool = false;
    /// True for a limit taken with leases.
    const LEASES: bool = false;
    /// True when a process may take blocks of the limit in one call and hand
    /// them out itself ([`Limit::with_lease`](super::Limit::with_lease)):
    /// the limits `check_at_most` takes from.
    const LEASABLE: bool = false;
    /// True when refunds give back to one count whenever the units were
    /// taken, and add up (buckets and TATs): see [`Algorithm::refund_key`].
    const REFUNDS_ADD_UP: bool = false;

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

    /// The most of `units` taken `elapsed` µs ago whose effect may have
    /// lapsed since: what a bucket or a TAT may have refilled meanwhile,
    /// which a refund must not give back again. Windows give back only what
    /// still counts by themselves (none lapses); a limit that cannot be
    /// leased gives nothing back (all of it).
    fn lapsed(&self, units: u64, _elapsed: u64) -> u64 {
        if Self::LEASABLE {
            0
        } else {
            units
        }
    }

    /// What a refund of units taken at `at` depends on besides its cost,
    /// when refunds add up: two refunds of one state with the same key,
    /// applied at one moment, do what one refund of their summed cost does
    /// (so concurrent settlements of a subject may go to the store as one).
    /// `None`: they do not add up (each takes back entries of its own). By
    /// default, one key for all when [`Algorithm::REFUNDS_ADD_UP`]; windows
    /// key it by the window holding `at`.
    fn refund_key(&self, _at: u64) -> Option<u64> {
        Self::REFUNDS_ADD_UP.then_some(0)
    }

    /// Units that would be admitted now (`u64::MAX`: any cost).
    fn available(&self, state: Option<&Self::State>, now: u64) -> u64;

    /// Whether the limit can decide at `now`: false only for a calendar
    /// window sent to the engine with bounds that do not hold `now` (the
    /// client's clock a whole period away from the server's).
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    fn decides_at(&self, _now: u64) -> bool {
        true
    }

    /// Whether this limit can run `action` for `cost` units, beyond what
    /// every limit checks ([`Limit`](super::Limit) refuses `reserve` on a
    /// limit that neither borrows nor shapes): by default, anything.
    ///
    /// # Errors
    ///
    /// An invalid argument, saying why.
    fn supports(&self, _action: Action<'_>, _cost: u64) -> Result<()> {
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

    /// The numbers the Lua version's `params` reads, in order (after the id).
    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64>;

    /// The numbers the Lua version's `params` reads for a decision near
    /// `now` (the client's time, asked only when needed), when they depend
    /// on the time (a calendar window's periods); `None`:
    /// [`params`](Self::params) hold at any time.
    #[cfg(feature = "engine")]
    fn params_near(&self, _now: impl FnOnce() -> u64) -> Option<Vec<u64>> {
        None
    }

    /// The spec whose parameters give these numbers of
    /// [`params`](Self::params) (`None`: not as many as this
    /// algorithm's), for the native engine, which builds and validates it.
    /// An exact rate comes back reduced (7 per 1 s as 7 per 1 000 000 µs),
    /// which decides the same.
    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<Self::Spec>;

    /// What a decision of `action` for `cost` units at `now` reads of
    /// `key`: `None` for the whole value, as most states are read. A state
    /// kept as a sorted set that grows with traffic reads only the members
    /// the decision needs, in the set's order: [`load`](Self::load) reads
    /// them as it reads the whole set, and decides the same. A write then
    /// changes only members it read.
    #[cfg(feature = "engine")]
    fn fetch(
        &self,
        _set: &mut dyn SortedSet,
        _key: &[u8],
        _now: u64,
        _action: Action<'_>,
        _cost: u64,
    ) -> Option<Members> {
        None
    }

    /// The state held in a key's `value` at `now`, read as the Lua version's
    /// `load` reads it: none when it has lapsed or is another algorithm's.
    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<Self::Stored>;

    /// The key's value for `state`, which says something until `expires`
    /// (µs), written as the Lua version's `store` writes it.
    #[cfg(feature = "engine")]
    fn encode(&self, state: &Self::State, expires: u64) -> Encoded;

    /// µs a key read in part must still be kept when a decision leaves
    /// `state` saying nothing more (a write whose `ttl` is zero) while it
    /// holds ended entries no call has trimmed yet (0: none, the key goes
    /// whole). The set then stays, counting them, so that the calls that
    /// come trim it in steps; after this long it expires whole (freed off
    /// the main thread with `lazyfree-lazy-expire yes`), as the Lua
    /// version's `backlog` keeps it.
    #[cfg(feature = "engine")]
    fn backlog(&self, _state: &Self::State, _now: u64) -> u64 {
        0
    }
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
pub(crate) fn edit<S: Default, E: Edit<S>>(state: Option<&S>, step: Step<E>) -> Step<Update<Box<S>, E>> {
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

/// Units `per` each `every` µs refill in `elapsed` µs, rounded up.
pub(crate) fn refilled(elapsed: u64, per: u64, every: u64) -> u64 {
    let refilled = (u128::from(elapsed) * u128::from(per)).div_ceil(u128::from(every.max(1)));
    u64::try_from(refilled).unwrap_or(u64::MAX)
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

#[cfg(feature = "engine")]
impl WindowSpec {
    /// The spec of a window limit's script parameters, `[limit, window in
    /// µs]` (not yet validated).
    pub(crate) fn from_params(params: &[u64]) -> Option<Self> {
        let &[limit, window] = params else {
            return None;
        };
        Some(Self {
            limit,
            window: Duration::from_micros(window),
        })
    }
}

pub(crate) fn at_least_one(value: u64, field: &str) -> Result<u64> {
    if value == 0 {
        return Err(Error::invalid_limit(format!("{field} must be at least 1")));
    }
    if value > MAX_TICKS {
        return Err(Error::invalid_limit(format!("{field} must be at most {MAX_TICKS}")));
    }
    Ok(value)
}

pub(crate) fn positive(duration: Duration, field: &str) -> Result<u64> {
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

/// A cap on debt of `cells` units (`None`: as much as exact arithmetic
/// allows), in ticks of `rate`.
pub(crate) fn max_debt(cells: Option<u64>, rate: super::rate::Rate) -> Result<u64> {
    match cells {
        None => Ok(MAX_TICKS),
        Some(cells) => rate
            .ticks(cells)
            .filter(|&ticks| ticks <= MAX_TICKS)
            .ok_or_else(|| Error::invalid_limit(format!("max_debt must be at most {}", MAX_TICKS / rate.unit))),
    }
}

/// The cap on debt that `ticks` (ticks of `unit` per unit) write, as the
/// spec says it (`None`: no cap but exact arithmetic's).
#[cfg(feature = "engine")]
pub(crate) fn debt_cells(ticks: u64, unit: u64) -> Option<u64> {
    (ticks < MAX_TICKS).then(|| ticks / unit.max(1))
}

pub(crate) fn at_most(value: Option<u64>, ceiling: u64, field: &str, ceiling_field: &str) -> Result<u64> {
    match value {
        Some(value) if value > ceiling => Err(Error::invalid_limit(format!(
            "{field} ({value}) must be at most {ceiling_field} ({ceiling})"
        ))),
        Some(value) => Ok(value),
        None => Ok(ceiling),
    }
}

/// A refund of a state replaced whole: `refunded` is the state it leaves
/// (`None`: nothing given back). Every limit reports after it as a release
/// does (what is left, no wait).
pub(crate) fn refund_whole<A: Algorithm>(
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

/// A record ([`Action::Record`]) of a state replaced whole: `check(state,
/// cost)` when the units fit (or there are none); otherwise the state `forced()` holds with them
/// counted anyway, and the decision a check of the same cost would get on
/// it (denied: they did not fit; its `retry_after` counts the overspend).
pub(crate) fn record_whole<S>(
    check: impl Fn(Option<&S>, u64) -> Step<S>,
    state: Option<&S>,
    cost: u64,
    forced: impl FnOnce() -> S,
) -> Step<S> {
    let step = check(state, cost);
    // A record of nothing is a peek.
    if step.decision.allowed || cost == 0 {
        return step;
    }
    let after = forced();
    let decision = check(Some(&after), cost).decision;
    Step::changed(decision, after)
}

/// A step that only reports: no wait asked of the caller.
pub(crate) fn report<C>(mut step: Step<C>) -> Step<C> {
    step.decision.wait = Duration::ZERO;
    step
}
