//! The one-word kernel: a capability an algorithm may offer beside its
//! general step, for the limits whose whole state fits one machine word.
//!
//! Every algorithm decides through its general step ([`Limit::decide`]
//! (super::Limit::decide) on a [`State`]), and every store can use that
//! alone. A limit whose state is one word may *also* offer a
//! [`WordKernel`]: the same decision on a `u64` (zero: no state), so that a
//! store can keep the state in a word of its own (an atomic, compared and
//! swapped) and skip the registry's dispatch. The kernel is found once, when
//! a [`Policy`](crate::Policy) of one limit is built, and held as this
//! concrete type: a store asks the policy whether it has one, never which
//! algorithm it runs. The property tests of the memory store and of the
//! direct limiter hold the kernel's decisions equal to the general step's.
//!
//! Today GCRA offers one, when its emission interval is whole microseconds
//! (its TAT is then an instant in µs); another algorithm whose state fits a
//! word can offer one by adding its case to [`WordKernel::of`].

use super::core::{Action, Step};
use super::gcra::Gcra;
use super::rate::Tat;
use super::registry::{Kind, State};

/// A limit's decision on a state held as one word; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordKernel(Gcra);

impl WordKernel {
    /// The kernel the algorithm of `kind` offers, if it offers one.
    pub(super) fn of(kind: &Kind) -> Option<Self> {
        match kind {
            Kind::Gcra(gcra) if gcra.whole_micros() => Some(Self(*gcra)),
            _ => None,
        }
    }

    /// A check of `cost` units on `word`: the decision, and the new word
    /// when it changed.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn check(&self, word: u64, now: u64, cost: u64) -> Step<u64> {
        self.0.check_word(word, now, cost)
    }

    /// `action` for `cost` units on `word`, as the general step decides it.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(crate) fn step(&self, word: u64, now: u64, action: Action<'_>, cost: u64) -> Step<u64> {
        self.0.step_word(word, now, action, cost)
    }

    /// Units that would be admitted now.
    pub(crate) fn available(&self, word: u64, now: u64) -> u64 {
        self.0.available_word(word, now)
    }

    /// The word a stored state holds, to read and write in place: none
    /// when the state is not one word of this kernel (a state of another
    /// algorithm, or of an earlier definition off whole microseconds: the
    /// limit was redefined), which counts as no state.
    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    #[allow(clippy::unused_self)] // the kernel's own state layout, one algorithm's today
    pub(crate) fn word_mut(self, state: &mut State) -> Option<&mut u64> {
        match state {
            State::Gcra(Tat { at, frac: 0 }) => Some(at),
            _ => None,
        }
    }

    /// The stored state of `word`, for a store that keeps every limit's
    /// state alike.
    #[inline]
    #[allow(clippy::unused_self)] // the kernel's own state layout, one algorithm's today
    pub(crate) fn state(self, word: u64) -> State {
        State::Gcra(Tat { at: word, frac: 0 })
    }

    /// When a state of `word` stops carrying information (µs since the
    /// epoch): the general step's `now + ttl` for the same change.
    #[inline]
    #[allow(clippy::unused_self)] // the kernel's own state layout, one algorithm's today
    pub(crate) fn expires(self, word: u64) -> u64 {
        word
    }
}
