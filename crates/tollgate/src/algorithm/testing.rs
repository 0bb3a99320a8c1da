//! What the algorithms' engine tests share: building a limit from its Lua
//! parameters, reading back what an encoding writes, and running a decision
//! as a store commits it.

use std::borrow::BorrowMut as _;

use crate::algorithm::core::{Action, Algorithm, Edit as _, Update};
use crate::algorithm::encoding::{Encoded, Loaded, Value};
use crate::decision::Decision;

/// The limit of these script parameters, validated as the engine does.
pub(crate) fn from_params<A: Algorithm>(params: &[u64]) -> Option<A> {
    A::spec_of(params).and_then(|spec| A::build(&spec).ok())
}

/// The sorted set Redis holds once `encoded` is written, lowest score first.
pub(crate) fn written_zset(encoded: Encoded) -> Value {
    let Encoded::Zset(mut members) = encoded else {
        panic!("not a sorted set: {encoded:?}");
    };
    members.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    Value::Zset(members)
}

/// What a load gave: a state or none (another type's value fails the test).
pub(crate) fn known<S>(loaded: Loaded<S>) -> Option<S> {
    match loaded {
        Loaded::State(state) => Some(state),
        Loaded::None => None,
        Loaded::Foreign => panic!("foreign"),
    }
}

/// A window limit's decisions of every kind on `state` at `now`
/// (checks of several costs, a refund of `refund` units taken at
/// `taken_at`) and the units available: what a state read back must
/// answer as the state written did.
pub(crate) fn window_probes<A: Algorithm>(
    limit: &A,
    state: Option<&A::State>,
    now: u64,
    (taken_at, refund): (u64, u64),
) -> (Vec<Decision>, u64) {
    let mut decisions: Vec<Decision> = [0, 1, 3, 10, 11]
        .into_iter()
        .map(|cost| limit.decide(state, now, Action::Check, cost).decision)
        .collect();
    let action = Action::Refund {
        at: taken_at,
        lease: None,
    };
    decisions.push(limit.decide(state, now, action, refund).decision);
    (decisions, limit.available(state, now))
}

/// Runs `action` on `limit` and commits it to `state`, as a store does.
pub(crate) fn run<A: Algorithm>(
    limit: &A,
    state: &mut Option<A::Stored>,
    now: u64,
    action: Action<'_>,
    cost: u64,
) -> Decision {
    let step = limit.decide(state.as_ref().map(std::borrow::Borrow::borrow), now, action, cost);
    match step.change {
        Some(Update::Put(new)) => *state = Some(new),
        Some(Update::Edit(change)) => {
            if let Some(stored) = state.as_mut() {
                change.apply(stored.borrow_mut());
            }
        }
        None => {}
    }
    step.decision
}
