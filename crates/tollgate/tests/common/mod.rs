//! Shared test code: the conformance suite every store must pass.
#![allow(dead_code)]

pub mod conformance;
pub mod redis_server;
