//! Shared test code: the conformance suite every store must pass, and real
//! Redis servers, Clusters and Sentinel sets to run it on.
#![allow(dead_code)]

pub mod conformance;
pub mod differential;
pub mod redis_cluster;
pub mod redis_server;
