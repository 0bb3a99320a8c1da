//! `tollgate bench --target`: load against a `tollgate serve` process started
//! on port 0, over gRPC and each kind of HTTP request.

mod common;

use common::{bench, bench_failure, Serve};
use serde_json::Value;

/// Nothing is denied on `client`; `small` allows 5 in any hour (a sliding
/// log: no window boundary can pass during a test and refill it).
const CONFIG: &str = "
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: once
    rate_limit:
      unit: hour
      requests_per_unit: 1
      algorithm: {algorithm: sliding_log, limit: 1, window: 1h}
  - key: small
    rate_limit:
      unit: hour
      requests_per_unit: 5
      algorithm: {algorithm: sliding_log, limit: 5, window: 1h}
";

const FIELDS: [&str; 16] = [
    "target",
    "request",
    "connections",
    "keys",
    "requests",
    "ok",
    "over_limit",
    "errors",
    "elapsed_s",
    "decisions_per_s",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "warmup_requests",
    "limit_applied",
];

/// `tollgate serve` with this file's config, and its targets as URLs.
struct Server {
    /// Kept for its lifetime: dropping it stops the server.
    _serve: Serve,
    http: String,
    grpc: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("bench.yaml");
        std::fs::write(&config, CONFIG).unwrap();
        let serve = Serve::start(&config);
        Self {
            http: format!("http://{}", serve.http),
            grpc: format!("grpc://{}", serve.grpc),
            _serve: serve,
            _dir: dir,
        }
    }
}

/// Runs `bench <args> --json`; it must succeed silently; returns the summary.
fn bench_json(args: &[&str]) -> Value {
    let output = bench(&[args, &["--json"]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}: {stderr}", output.status);
    assert_eq!(stderr, "");
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    let keys: Vec<&str> = summary.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, FIELDS);
    summary
}

fn count(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {summary}"))
}

/// A one-second run with 4 connections: answers, none refused, no error.
fn one_second(target: &str, extra: &[&str]) -> Value {
    let summary = bench_json(&[&["--target", target, "--connections", "4", "--duration", "1s"], extra].concat());
    assert!(count(&summary, "requests") > 0, "{summary}");
    assert!(count(&summary, "decisions_per_s") > 0, "{summary}");
    assert_eq!(count(&summary, "errors"), 0, "{summary}");
    assert_eq!(count(&summary, "over_limit"), 0, "{summary}");
    assert_eq!(count(&summary, "ok"), count(&summary, "requests"), "{summary}");
    assert_eq!(count(&summary, "connections"), 4, "{summary}");
    assert_eq!(count(&summary, "warmup_requests"), 4, "{summary}");
    // The run lasts its duration (how much longer depends on the machine).
    assert!(summary["elapsed_s"].as_f64().unwrap() >= 1.0, "{summary}");
    summary
}

const DESCRIBED: [&str; 6] = ["--domain", "bench", "--descriptor", "client=c", "--keys", "100"];

#[test]
fn grpc_should_rate_limit_for_one_second() {
    let server = Server::start();
    let summary = one_second(&server.grpc, &DESCRIBED);
    assert_eq!(summary["request"], "ShouldRateLimit");
    assert_eq!(summary["target"], server.grpc);
    assert_eq!(count(&summary, "keys"), 100);
    assert_eq!(summary["limit_applied"], true);
}

#[test]
fn http_json_for_one_second() {
    let server = Server::start();
    let summary = one_second(&server.http, &[&["--request", "json"][..], &DESCRIBED].concat());
    assert_eq!(summary["request"], "POST /json");
    assert_eq!(summary["limit_applied"], true);
}

#[test]
fn http_check_for_one_second() {
    let server = Server::start();
    // --request check is the default.
    let summary = one_second(&server.http, &DESCRIBED);
    assert_eq!(summary["request"], "POST /v1/check");
    assert_eq!(summary["limit_applied"], true);
}

#[test]
fn http_healthz_for_one_second() {
    let server = Server::start();
    let summary = one_second(&server.http, &["--request", "healthz"]);
    assert_eq!(summary["request"], "GET /healthz");
    assert_eq!(summary["limit_applied"], Value::Null);
}

#[test]
fn over_limit_answers_are_counted_for_every_protocol() {
    let server = Server::start();
    for (target, request) in [
        (&server.grpc, None),
        (&server.http, Some("json")),
        (&server.http, Some("check")),
    ] {
        // Each protocol its own value, so each has its own 5 an hour.
        let value = format!("small={}", request.unwrap_or("grpc"));
        let mut args = vec![
            "--target",
            target,
            "--domain",
            "bench",
            "--descriptor",
            &value,
            "--requests",
            "10",
        ];
        if let Some(request) = request {
            args.extend(["--request", request]);
        }
        let summary = bench_json(&args);
        // The warm-up took the first of the 5.
        assert_eq!(count(&summary, "requests"), 10, "{summary}");
        assert_eq!(count(&summary, "ok"), 4, "{summary}");
        assert_eq!(count(&summary, "over_limit"), 6, "{summary}");
        assert_eq!(count(&summary, "errors"), 0, "{summary}");
    }
}

#[test]
fn keys_spread_the_requests_over_values() {
    let server = Server::start();
    let run = |target: &str, request: &[&str], value: &str| {
        let args = [
            &["--target", target, "--domain", "bench", "--descriptor", value],
            request,
            &["--keys", "3", "--requests", "15"],
        ]
        .concat();
        bench_json(&args)
    };
    // small=g-0, small=g-1, small=g-2 five times each, after a warm-up on g-0.
    let summary = run(&server.grpc, &[], "small=g");
    assert_eq!(
        (count(&summary, "ok"), count(&summary, "over_limit")),
        (14, 1),
        "{summary}"
    );
    let summary = run(&server.http, &["--request", "json"], "small=h");
    assert_eq!(
        (count(&summary, "ok"), count(&summary, "over_limit")),
        (14, 1),
        "{summary}"
    );
}

/// The connections take the `--keys` values in turn between them: 40
/// requests over 4 connections visit 40 distinct values. Each value admits
/// one request an hour, so only the 4 values the warm-ups took refuse.
#[test]
fn many_connections_visit_every_key() {
    let server = Server::start();
    for (target, request, value) in [
        (&server.grpc, &[][..], "once=g"),
        (&server.http, &["--request", "json"][..], "once=h"),
    ] {
        let args = [
            &["--target", target.as_str(), "--domain", "bench", "--descriptor", value],
            request,
            &["--connections", "4", "--keys", "40", "--requests", "40"],
        ]
        .concat();
        let summary = bench_json(&args);
        assert_eq!(
            (count(&summary, "ok"), count(&summary, "over_limit")),
            (36, 4),
            "{summary}"
        );
    }
}

#[test]
fn text_summary_and_unmatched_descriptors() {
    let server = Server::start();
    let output = bench(&[
        "--target",
        &server.grpc,
        "--domain",
        "bench",
        "--descriptor",
        "unknown=x",
        "--requests",
        "3",
        "--connections",
        "2",
    ]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("target       {} (ShouldRateLimit, 2 connections, 1 key)", server.grpc)
    );
    assert!(lines[1].starts_with("requests     3 in "), "{stdout}");
    assert_eq!(lines[2], "ok           3", "{stdout}");
    assert_eq!(lines[3], "over_limit   0", "{stdout}");
    assert_eq!(lines[4], "errors       0", "{stdout}");
    assert!(lines[5].starts_with("latency      p50 "), "{stdout}");
    assert_eq!(lines[6], "warm-up      2 requests before the clock, NO limit applied");
    // No rule matched: the server decided nothing, and the user is told.
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("warning: no limit applied to the warm-up request: no rule of domain \"bench\""),
        "{stderr}"
    );
}

#[test]
fn unreachable_servers_and_invalid_arguments() {
    let port = common::redis_server::free_port();
    let grpc = format!("grpc://127.0.0.1:{port}");
    let stderr = bench_failure(&["--target", &grpc, "--domain", "d", "--descriptor", "a=b"], 1);
    assert!(
        stderr.starts_with(&format!("error: cannot use the server at {grpc}: ")),
        "{stderr}"
    );
    assert!(stderr.contains("Connection refused"), "{stderr}");
    let http = format!("http://127.0.0.1:{port}");
    let stderr = bench_failure(&["--target", &http, "--request", "healthz"], 1);
    assert!(stderr.contains("Connection refused"), "{stderr}");

    let stderr = bench_failure(&["--target", "https://h:1", "--request", "healthz"], 2);
    assert!(stderr.contains("TLS is not supported"), "{stderr}");
    let stderr = bench_failure(&["--target", &grpc, "--descriptor", "a=b"], 2);
    assert!(stderr.contains("--domain is required"), "{stderr}");
    let stderr = bench_failure(&["--target", &grpc, "--domain", "d"], 2);
    assert!(stderr.contains("at least one --descriptor"), "{stderr}");
    let stderr = bench_failure(&["--target", &grpc, "--domain", "d", "--descriptor", "novalue"], 2);
    assert!(stderr.contains("key=value"), "{stderr}");
    let stderr = bench_failure(
        &[
            "--target",
            &grpc,
            "--request",
            "json",
            "--domain",
            "d",
            "--descriptor",
            "a=b",
        ],
        2,
    );
    assert!(
        stderr.contains("--request applies only to an http:// target"),
        "{stderr}"
    );
    let stderr = bench_failure(&["--target", &http, "--request", "healthz", "--domain", "d"], 2);
    assert!(stderr.contains("decides nothing"), "{stderr}");
    // Store options do not mix with a target, nor target options with a store.
    bench_failure(&["--target", &http, "--tasks", "2"], 2);
    bench_failure(&["--target", &http, "--store", "memory"], 2);
    bench_failure(&["--connections", "2", "--requests", "5"], 2);
    bench_failure(&["--request", "json", "--requests", "5"], 2);
}
