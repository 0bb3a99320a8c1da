//! The registry: one line per algorithm, from which `registry!` builds
//! everything shared code knows of the algorithms (see the module docs of
//! `algorithm`). It imports the algorithm files and the trait; nothing in
//! an algorithm file imports it.

use std::borrow::{Borrow, BorrowMut};

use serde::Serialize;

use super::core::{Algorithm, Edit as _, WindowSpec};
use super::fixed_window::FixedWindowSpec;
use super::{concurrency, fixed_window, gcra, leaky_bucket, reservation, sliding_log, sliding_window, token_bucket};
use super::{ConcurrencySpec, GcraSpec, LeakyBucketSpec, ReservationSpec, SlidingWindowSpec, TokenBucketSpec};
use crate::error::{Error, Result};

/// Builds, from one line per algorithm, `Variant(Spec) => module::Params`:
/// the public [`LimitSpec`], and [`Kind`], [`State`] and [`Change`] (one
/// variant each per algorithm, in registry order); the glue between those
/// and each algorithm ([`Registered`], `Change::apply`); the table of
/// [`ALGORITHMS`]; the `dispatch!` macro, which runs an expression on the
/// parameters of a [`Kind`]; and `lua_sources!`, the Lua files' source.
macro_rules! registry {
    ($($variant:ident($spec:ty) => $module:ident::$algorithm:ident,)*) => {
        /// Parameters of one limit, as written in JSON or YAML: the
        /// `algorithm` name and its fields, durations as text like `"1.5s"`.
        #[non_exhaustive]
        #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
        #[serde(tag = "algorithm", rename_all = "snake_case")]
        pub enum LimitSpec {
            $(
                #[doc = concat!("See [`Limit::", stringify!($module), "`](super::Limit::", stringify!($module), ").")]
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
            pub(super) fn validate(&self) -> Result<Kind> {
                match self {
                    $(Self::$variant(spec) => $module::$algorithm::build(spec).map(Kind::$variant),)*
                }
            }

            /// The algorithm's name.
            pub(super) fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => <$module::$algorithm as Algorithm>::NAME,)*
                }
            }
        }

        #[cfg(feature = "engine")]
        impl LimitSpec {
            /// The spec of the algorithm whose Lua id is `id`, from the
            /// numbers its `params` gives (not yet validated).
            pub(crate) fn from_params(id: u64, params: &[u64]) -> Option<LimitSpec> {
                $(
                    if id == u64::from(<$module::$algorithm as Algorithm>::ID) {
                        return <$module::$algorithm as Algorithm>::spec_of(params).map(LimitSpec::$variant);
                    }
                )*
                None
            }
        }

        /// Every algorithm, in registry order.
        pub(crate) const ALGORITHMS: &[Entry] = &[
            $(
                Entry {
                    name: <$module::$algorithm as Algorithm>::NAME,
                    shaping: <$module::$algorithm as Algorithm>::SHAPING,
                    leasable: <$module::$algorithm as Algorithm>::LEASABLE,
                    parse: |fields| parse_fields(fields).map(LimitSpec::$variant),
                },
            )*
        ];

        /// Each algorithm's name and the id of its Lua version, for tests.
        #[cfg(all(test, feature = "redis"))]
        pub(crate) const LUA_IDS: &[(&str, u8)] = &[
            $((<$module::$algorithm as Algorithm>::NAME, <$module::$algorithm as Algorithm>::ID),)*
        ];

        /// The Lua files' source, in registry order: `concat!` of each
        /// algorithm's `.lua` file, for the Redis store's library.
        #[cfg(feature = "redis")]
        macro_rules! lua_sources {
            () => {
                concat!($(
                    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/algorithm/", stringify!($module), ".lua")),
                )*)
            };
        }
        #[cfg(feature = "redis")]
        pub(crate) use lua_sources;

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
    FixedWindow(FixedWindowSpec) => fixed_window::FixedWindow,
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
pub(crate) struct Entry {
    /// Its name, as written in `"algorithm"`.
    pub(crate) name: &'static str,
    /// Whether it borrows or shapes.
    pub(crate) shaping: bool,
    /// Whether it can be leased.
    pub(crate) leasable: bool,
    /// Reads its spec from the fields of a JSON object.
    pub(crate) parse: fn(serde_json::Value) -> Result<LimitSpec>,
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
