//! Shared test code: the conformance suite every store must pass, and real
//! Redis servers, Clusters and Sentinel sets to run it on.
#![allow(dead_code)]

pub mod conformance;
pub mod differential;
pub mod redis_cluster;
pub mod redis_server;

/// A single-threaded runtime, for tests that run their own async blocks
/// (the property tests, which are not async themselves).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
