//! Fixed window counter: at most `limit` units per window.
//!
//! Windows are aligned to multiples of `window` since the Unix epoch, so every
//! instance agrees on where a window starts and `reset_after` is exact. The
//! price is the boundary burst. Or they follow the calendar: days, weeks,
//! months or years in a named time zone (see [`calendar`](super::calendar)),
//! a billing month's token budget; in Redis the client sends the periods'
//! boundaries around its clock and the server picks the one holding its own
//! time (the state is the same counter either way).
//!
//! **Bound:** within one window the admitted cost is at most `limit`;
//! any interval spanning `k` windows admits at most `k · limit` (so up
//! to `2 · limit` in an interval of length `window`).

use std::convert::Infallible;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::calendar::{end_among, Calendar, Period};
use super::core::{at_least_one, positive, record_whole, refund_whole, Action, Algorithm, Step, Update};
#[cfg(feature = "engine")]
use super::encoding::{numbers, other_state, Encoded, Loaded, Value};
use crate::decision::Decision;
use crate::duration::serde_text_option;
use crate::error::{Error, Result};

/// `limit` units per window: `window` long and aligned on the Unix epoch,
/// or a `calendar` period (`day`, `week`, `month`, `year`) in `time_zone`
/// (an IANA name; UTC when absent).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedWindowSpec {
    /// Units admitted per window.
    pub limit: u64,
    /// The window's length, for windows aligned on the epoch.
    #[serde(default, with = "serde_text_option", skip_serializing_if = "Option::is_none")]
    pub window: Option<Duration>,
    /// The calendar period, for windows that follow the calendar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<Period>,
    /// The calendar's time zone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The starts of consecutive periods, as the Redis library is sent a
    /// calendar window (the native engine's limit).
    #[serde(skip)]
    bounds: Option<[u64; 4]>,
}

impl FixedWindowSpec {
    /// `limit` units per `window`, aligned on the epoch.
    pub fn new(limit: u64, window: Duration) -> Self {
        Self {
            limit,
            window: Some(window),
            calendar: None,
            time_zone: None,
            bounds: None,
        }
    }

    /// `limit` units per calendar `period` in `time_zone` (`None`: UTC).
    pub fn calendar(limit: u64, period: Period, time_zone: Option<&str>) -> Self {
        Self {
            limit,
            window: None,
            calendar: Some(period),
            time_zone: time_zone.map(str::to_owned),
            bounds: None,
        }
    }
}

/// Where the windows of a fixed window counter lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Windows {
    /// This many µs long, aligned on multiples of it since the Unix epoch.
    Epoch(u64),
    /// A calendar period in a time zone.
    Calendar(Calendar),
    /// The periods between these rising starts: a calendar window as the
    /// Redis library is sent it.
    Bounds([u64; 4]),
}

impl Windows {
    /// The end of the window holding `at`: `None` beyond the calendar, or
    /// outside the bounds sent.
    fn end_of(&self, at: u64) -> Option<u64> {
        match self {
            Self::Epoch(window) => Some(at - at % window + window),
            Self::Calendar(calendar) => calendar.end_of(at),
            Self::Bounds(bounds) => end_among(bounds, at),
        }
    }
}

/// Parameters of a fixed window counter, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    pub(crate) limit: u64,
    pub(crate) windows: Windows,
}

/// The count of the window that holds it.
///
/// The window is kept by its end, so a count says nothing once its own
/// window has ended, whatever the limit's definition is by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// End of the counted window, µs since the epoch.
    pub end: u64,
    /// Units admitted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// End of the window holding `now` (or of a counted one that has not
    /// ended), and its count so far.
    fn current(&self, state: Option<&FixedWindowState>, now: u64) -> (u64, u64) {
        match state {
            // A newer window than now's (the clock went back) still counts.
            Some(state) if state.end > now => (state.end, state.count),
            // Outside the bounds sent (the engine refuses that first): a
            // window of one microsecond.
            _ => (self.windows.end_of(now).unwrap_or(now.saturating_add(1)), 0),
        }
    }

    /// Admits `cost` units if the current window has room.
    pub(crate) fn check(&self, state: Option<&FixedWindowState>, now: u64, cost: u64) -> Step<FixedWindowState> {
        let (end, count) = self.current(state, now);
        let reset_after = |count: u64| if count > 0 { end - now } else { 0 };
        let remaining = self.limit.saturating_sub(count);
        if cost > self.limit {
            return Step::unchanged(Decision::deny(self.limit, remaining, None, reset_after(count)));
        }
        // Over when count + cost > limit: a peek too, once usage recorded
        // above the limit has left nothing (as envoyproxy/ratelimit counts).
        if count.saturating_add(cost) > self.limit {
            return Step::unchanged(Decision::deny(
                self.limit,
                remaining,
                Some(end - now),
                reset_after(count),
            ));
        }
        // A count above this limit (one kept from a larger definition of it)
        // leaves nothing, and only a peek gets here.
        let count = count + cost;
        let decision = Decision::allow(self.limit, remaining - cost, reset_after(count), 0);
        if cost == 0 {
            return Step::unchanged(decision);
        }
        Step::changed(decision, FixedWindowState { end, count })
    }

    /// Gives back units taken at `at` from the count of the window holding
    /// `at`, when that window is still the one counted. The new state, or
    /// `None` when nothing changes.
    pub(crate) fn refunded(
        &self,
        state: Option<&FixedWindowState>,
        now: u64,
        at: u64,
        cost: u64,
    ) -> Option<FixedWindowState> {
        let state = state.filter(|state| state.end > now && cost > 0)?;
        // Taken in the window still counted.
        let counted = self.windows.end_of(at) == Some(state.end);
        counted.then(|| FixedWindowState {
            end: state.end,
            count: state.count.saturating_sub(cost),
        })
    }
}

impl Algorithm for FixedWindow {
    type Spec = FixedWindowSpec;
    type State = FixedWindowState;
    type Stored = FixedWindowState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "fixed_window";
    #[cfg(feature = "engine")]
    const ID: u8 = 1;
    const LEASABLE: bool = true;

    fn build(spec: &FixedWindowSpec) -> Result<Self> {
        let limit = at_least_one(spec.limit, "limit")?;
        if spec.time_zone.is_some() && spec.calendar.is_none() {
            return Err(Error::invalid_limit(
                "time_zone: only a window that follows the calendar has one",
            ));
        }
        let windows = match (spec.window, spec.calendar, spec.bounds) {
            (_, _, Some(bounds)) if bounds.windows(2).all(|pair| pair[0] < pair[1]) => Windows::Bounds(bounds),
            (_, _, Some(_)) => return Err(Error::invalid_limit("the bounds of a calendar window must rise")),
            (Some(window), None, None) => Windows::Epoch(positive(window, "window")?),
            (None, Some(period), None) => Windows::Calendar(Calendar::new(period, spec.time_zone.as_deref())?),
            (Some(_), Some(_), None) => {
                return Err(Error::invalid_limit(
                    "window: give a window (aligned on the epoch) or a calendar period, not both",
                ))
            }
            (None, None, None) => {
                return Err(Error::invalid_limit(
                    "missing field \"window\" (or \"calendar\": day, week, month or year)",
                ))
            }
        };
        Ok(Self { limit, windows })
    }

    /// Refunds give back to the count of the window holding `at`, and add up.
    fn refund_key(&self, at: u64) -> Option<u64> {
        self.windows.end_of(at)
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn window(&self) -> Option<Duration> {
        match self.windows {
            Windows::Epoch(window) => Some(Duration::from_micros(window)),
            Windows::Calendar(_) | Windows::Bounds(_) => None,
        }
    }

    fn decides_at(&self, now: u64) -> bool {
        self.windows.end_of(now).is_some()
    }

    fn available(&self, state: Option<&FixedWindowState>, now: u64) -> u64 {
        let (_, count) = self.current(state, now);
        self.limit.saturating_sub(count)
    }

    #[inline]
    fn decide(
        &self,
        state: Option<&FixedWindowState>,
        now: u64,
        action: Action<'_>,
        cost: u64,
    ) -> Step<Update<FixedWindowState, Infallible>> {
        match action {
            Action::Refund { at, .. } => refund_whole(self, state, now, self.refunded(state, now, at, cost)),
            Action::Record => record_whole(
                |state, cost| self.check(state, now, cost),
                state,
                cost,
                || {
                    let (end, count) = self.current(state, now);
                    FixedWindowState {
                        end,
                        count: count.saturating_add(cost),
                    }
                },
            ),
            _ => self.check(state, now, action.check_cost(cost)),
        }
        .map(Update::Put)
    }

    /// `[limit, window]`; a calendar window, `[limit, 0, <bounds>]` (see
    /// [`params_near`](Algorithm::params_near)).
    #[cfg(feature = "engine")]
    fn params(&self) -> impl IntoIterator<Item = u64> {
        match self.windows {
            Windows::Epoch(window) => vec![self.limit, window],
            Windows::Bounds(bounds) => [[self.limit, 0].as_slice(), &bounds].concat(),
            Windows::Calendar(_) => vec![self.limit, 0],
        }
    }

    /// A calendar window: the starts of the periods around `now` (the
    /// previous one, now's, the next, and the one after).
    #[cfg(feature = "engine")]
    fn params_near(&self, now: impl FnOnce() -> u64) -> Option<Vec<u64>> {
        let Windows::Calendar(calendar) = self.windows else {
            return None;
        };
        let bounds = calendar.bounds_around(now())?;
        Some([[self.limit, 0].as_slice(), &bounds].concat())
    }

    #[cfg(feature = "engine")]
    fn spec_of(params: &[u64]) -> Option<Self::Spec> {
        match *params {
            [limit, window] => Some(FixedWindowSpec::new(limit, Duration::from_micros(window))),
            [limit, 0, b0, b1, b2, b3] => Some(FixedWindowSpec {
                bounds: Some([b0, b1, b2, b3]),
                ..FixedWindowSpec::calendar(limit, Period::Day, None)
            }),
            _ => None,
        }
    }

    /// `f<end>:<count>`, which says nothing once its window has ended.
    #[cfg(feature = "engine")]
    fn load(&self, value: &Value, now: u64) -> Loaded<FixedWindowState> {
        let Some(value) = value.as_string() else {
            return Loaded::None;
        };
        match value.strip_prefix(b"f").and_then(numbers::<2>) {
            Some([end, _]) if end <= now => Loaded::None,
            Some([end, count]) => Loaded::State(FixedWindowState { end, count }),
            None => other_state(value),
        }
    }

    #[cfg(feature = "engine")]
    fn encode(&self, state: &FixedWindowState, _: u64) -> Encoded {
        let mut digits = itoa::Buffer::new();
        let mut out = b"f".to_vec();
        out.extend_from_slice(digits.format(state.end).as_bytes());
        out.push(b':');
        out.extend_from_slice(digits.format(state.count).as_bytes());
        Encoded::String(out)
    }
}
