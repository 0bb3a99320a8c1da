//! Shared test code: a real `redis-server` per test, and the binary.
#![allow(dead_code)]

#[path = "../../../tollgate/tests/common/redis_server.rs"]
pub mod redis_server;

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

/// The `tollgate` binary with `args`.
pub fn tollgate(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.args(args);
    command
}

/// Runs `tollgate simulate --limit <limit> <extra…>` with `trace` on stdin.
pub fn simulate_with(limit: &str, extra: &[&str], trace: &str) -> Output {
    let mut child = tollgate(&["simulate", "--limit", limit])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tollgate binary starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let trace = trace.to_owned();
    // Write from another thread so a large answer cannot block the writer.
    let writer = std::thread::spawn(move || stdin.write_all(trace.as_bytes()));
    let output = child.wait_with_output().expect("the run ends");
    writer.join().expect("the writer ends").expect("the trace is written");
    output
}

/// Runs `tollgate bench <args>` without standard input.
pub fn bench(args: &[&str]) -> Output {
    tollgate(&["bench"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the tollgate binary starts")
}
