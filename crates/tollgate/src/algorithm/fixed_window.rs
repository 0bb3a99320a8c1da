//! Fixed window counter: at most `limit` units per window.
//!
//! Windows are aligned to multiples of `window` since the Unix epoch, so every
//! instance agrees on where a window starts and `reset_after` is exact. The
//! price is the boundary burst.
//!
//! **Bound:** within one aligned window the admitted cost is at most `limit`;
//! any interval spanning `k` aligned windows admits at most `k · limit` (so up
//! to `2 · limit` in an interval of length `window`).

use std::convert::Infallible;
use std::time::Duration;

use super::core::{at_least_one, positive, record_whole, refund_whole, Action, Algorithm, Step, Update, WindowSpec};
#[cfg(feature = "engine")]
use super::encoding::{numbers, other_state, Encoded, Loaded, Value};
use crate::decision::Decision;
use crate::error::Result;

/// Parameters of a fixed window counter, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    pub(crate) limit: u64,
    pub(crate) window: u64,
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
            _ => (now - now % self.window + self.window, 0),
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
        let counted = at < state.end && at + self.window >= state.end;
        counted.then(|| FixedWindowState {
            end: state.end,
            count: state.count.saturating_sub(cost),
        })
    }
}

impl Algorithm for FixedWindow {
    type Spec = WindowSpec;
    type State = FixedWindowState;
    type Stored = FixedWindowState;
    type Edit<'a> = Infallible;

    const NAME: &'static str = "fixed_window";
    #[cfg(feature = "engine")]
    const ID: u8 = 1;

    fn build(spec: &WindowSpec) -> Result<Self> {
        Ok(Self {
            limit: at_least_one(spec.limit, "limit")?,
            window: positive(spec.window, "window")?,
        })
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn window(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.window))
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

    #[cfg(feature = "engine")]
    fn script_params(&self) -> impl IntoIterator<Item = u64> {
        [self.limit, self.window]
    }

    #[cfg(feature = "engine")]
    fn script_spec(params: &[u64]) -> Option<Self::Spec> {
        WindowSpec::from_script(params)
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
