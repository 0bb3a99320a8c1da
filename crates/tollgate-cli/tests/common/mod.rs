//! Shared test code: a real `redis-server` (or Cluster) per test, and the binary.
// Each test binary uses a part of it (the kit's modules re-exported too).
#![allow(dead_code, unused_imports)]

pub use tollgate_testkit::{envoy, python_venv, redis_cluster, redis_server, tcp_proxy};

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
    match writer.join().expect("the writer ends") {
        Ok(()) => {}
        // A run that refuses its arguments may exit before reading the trace.
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(error) => panic!("the trace is not written: {error}"),
    }
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

/// Runs `tollgate bench <args>`; it must fail with `code` and print nothing on
/// stdout; returns stderr.
pub fn bench_failure(args: &[&str], code: i32) -> String {
    let output = bench(args);
    let stderr = String::from_utf8(output.stderr).expect("utf-8 stderr");
    assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// A `tollgate serve` process on ports the system chose; killed (by its pid)
/// when dropped.
pub struct Serve {
    child: Child,
    /// `host:port` of the HTTP listener.
    pub http: String,
    /// `host:port` of the gRPC listener.
    pub grpc: String,
    /// `host:port` of the metrics listener, or empty.
    pub metrics: String,
    /// The "ready" log line.
    pub ready: String,
    /// Its log after the "ready" line, read as it comes so the pipe never fills.
    logs: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

/// The Prometheus text a server's `/metrics` answers at `address`.
pub async fn metrics_at(address: &str) -> String {
    text_at(address, "/metrics").await
}

/// The `/rlconfig` a server answers at `address`.
pub async fn rlconfig_at(address: &str) -> String {
    text_at(address, "/rlconfig").await
}

/// The body a server answers `GET path` with at `address`.
async fn text_at(address: &str, path: &str) -> String {
    reqwest::get(format!("http://{address}{path}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

impl Serve {
    /// Starts `tollgate serve --config <config>` on port 0 and returns once it
    /// says it is ready, with the addresses it bound (no polling).
    pub fn start(config: &Path) -> Self {
        Self::start_with(config, &[])
    }

    /// As [`Serve::start`], with more arguments.
    pub fn start_with(config: &Path, extra: &[&str]) -> Self {
        let mut command = tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--config"]);
        command.arg(config).args(extra);
        Self::start_command(command)
    }

    /// Starts `command` (a `tollgate serve`) and returns once it says it is
    /// ready.
    pub fn start_command(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tollgate binary starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|line| line.contains("tollgate serve is ready"))
            .expect("the server never said it was ready");
        let address = |name: &str| {
            ready
                .split_whitespace()
                .find_map(|field| field.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {ready}"))
                .to_owned()
        };
        let (http, grpc, metrics) = (address("http="), address("grpc="), address("metrics="));
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        let reader = std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().expect("log lock").push(line);
            }
        });
        Self {
            child,
            http,
            grpc,
            metrics,
            ready,
            logs,
            reader: Some(reader),
        }
    }

    /// Sends SIGTERM (by pid), waits for the exit, and returns whether it
    /// succeeded and the log lines written after "ready".
    pub fn terminate(mut self) -> (bool, Vec<String>) {
        let signal = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(signal.success());
        let exit = self.child.wait().expect("the server exits");
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the log reader ends");
        }
        let logs = std::mem::take(&mut *self.logs.lock().expect("log lock"));
        (exit.success(), logs)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
