//! Shared test code: the conformance suite every store must pass, and real
//! Redis servers, Clusters and Sentinel sets to run it on.
// Each test binary uses a part of it (the kit's modules re-exported too).
#![allow(dead_code, unused_imports)]

pub mod conformance;
pub mod differential;
pub use tollgate_testkit::{redis_cluster, redis_server};

/// A single-threaded runtime, for tests that run their own async blocks
/// (the property tests, which are not async themselves).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
