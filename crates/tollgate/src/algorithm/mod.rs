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
//! decision for every [`Action`], the numbers its Lua version reads and
//! that version's id), and its state. Shared code knows the algorithms only through
//! `registry!`, one line per algorithm, `Variant(Spec) => module::Params`,
//! which builds [`LimitSpec`], [`Kind`], [`State`] and [`Change`], the table
//! of names, and the list of Lua versions the Redis library is assembled from
//! at compile time. A [`Limit`] holds a [`Kind`], a `Copy` enum of the
//! parameters, and reaches its algorithm through `dispatch!`, a `match` of
//! static calls: no trait object, no allocation.
//!
//! **Layers.** `core` holds the [`Algorithm`] trait and the helpers the
//! algorithm files share; each algorithm file imports `core` (and the
//! exact-rate arithmetic of [`rate`], and for windows the calendar periods of
//! [`calendar`]) and nothing else. `registry` imports
//! the algorithm files and builds the enums and the table; `limit` builds
//! [`Limit`] on the registry. The arrows run one way.
//!
//! To add an algorithm `name`: write `name.rs` (spec, parameters, state,
//! `impl Algorithm`, with an `ID` no other algorithm uses) and `name.lua`
//! (its table, ending with `ALGORITHMS[<ID>] = name`); declare the module
//! and re-export its spec below; add its line to `registry!` in
//! `registry.rs`. A constructor
//! on [`Limit`], a case in the property tests and one in the Rust-versus-Lua
//! differential test are then worth adding.
#![deny(clippy::float_arithmetic)]

// The trait and its helpers; the registry (whose `dispatch!` the limits
// use, hence first); the limits. Arrows run one way: the algorithm files
// import `core` only.
pub(crate) mod calendar;
pub(crate) mod core;
#[cfg(feature = "engine")]
pub(crate) mod encoding;
#[macro_use]
pub(crate) mod registry;
mod durability;
mod kernel;
mod lifetime;
mod limit;
mod scope;

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
pub(crate) mod leasable;
#[cfg(test)]
pub(crate) mod properties;
#[cfg(all(test, feature = "engine"))]
pub(crate) mod testing;

pub use self::calendar::Period;
pub use self::concurrency::ConcurrencySpec;
pub use self::core::WindowSpec;
pub(crate) use self::core::{Action, Step};
pub use self::durability::Durability;
#[cfg(feature = "engine")]
pub(crate) use self::encoding::{number, Encoded, Loaded, DERIVED};
#[cfg(feature = "engine")]
pub use self::encoding::{Members, Scores, SortedSet, Value, Visit};
pub use self::fixed_window::FixedWindowSpec;
pub use self::gcra::GcraSpec;
pub(crate) use self::kernel::WordKernel;
pub use self::leaky_bucket::LeakyBucketSpec;
pub use self::limit::{Limit, MOST_ALERTS};
#[cfg(feature = "redis")]
pub(crate) use self::registry::lua_sources;
pub use self::registry::LimitSpec;
#[cfg(all(test, feature = "redis"))]
pub(crate) use self::registry::LUA_IDS;
pub(crate) use self::registry::{Change, State};
pub use self::reservation::ReservationSpec;
pub use self::scope::Scope;
pub use self::sliding_window::SlidingWindowSpec;
pub use self::token_bucket::{Refill, TokenBucketSpec};
