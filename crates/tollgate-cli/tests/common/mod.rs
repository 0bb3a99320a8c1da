//! Shared test code: a real `redis-server` per test, and the binary.
#![allow(dead_code)]

#[path = "../../../tollgate/tests/common/redis_server.rs"]
pub mod redis_server;

use std::process::Command;

/// The `tollgate` binary with `args`.
pub fn tollgate(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.args(args);
    command
}
