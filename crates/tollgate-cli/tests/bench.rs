//! `tollgate bench`, run as a process: counts, the JSON summary, the text
//! summary and argument errors, on the memory store and a real Redis.

mod common;

use common::redis_server::{free_port, RedisServer};
use common::{bench, bench_failure};
use serde_json::Value;

const FIELDS: [&str; 19] = [
    "store",
    "op",
    "tasks",
    "keys",
    "requests",
    "allowed",
    "denied",
    "units",
    "errors",
    "elapsed_s",
    "decisions_per_s",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "server_time_start_us",
    "server_time_end_us",
    "store_calls",
    "store_calls_per_decision",
];

/// Runs `bench <args> --json` and returns its summary.
fn bench_json(args: &[&str]) -> Value {
    let output = bench(&[args, &["--json"]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}: {stderr}", output.status);
    // stderr is not a terminal: no progress bar, nothing else either.
    assert_eq!(stderr, "");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    // Against Redis the summary also names the engine; every run gives the
    // process's CPU per decision, last.
    let keys: Vec<&str> = summary
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|key| *key != "engine")
        .collect();
    assert_eq!(keys, [&FIELDS[..], &["cpu_us_per_decision"]].concat());
    summary
}

fn count(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {summary}"))
}

fn number(summary: &Value, field: &str) -> f64 {
    summary[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {summary}"))
}

/// The figures every summary must satisfy.
fn assert_consistent(summary: &Value) {
    assert_eq!(
        count(summary, "allowed") + count(summary, "denied") + count(summary, "errors"),
        count(summary, "requests"),
        "{summary}"
    );
    assert!(number(summary, "p50_us") <= number(summary, "p99_us"), "{summary}");
    assert!(number(summary, "p99_us") <= number(summary, "p999_us"), "{summary}");
    assert!(number(summary, "p999_us") <= number(summary, "max_us"), "{summary}");
    assert!(
        count(summary, "server_time_start_us") <= count(summary, "server_time_end_us"),
        "{summary}"
    );
    assert!(number(summary, "elapsed_s") > 0.0, "{summary}");
}

#[test]
fn memory_bench_sends_exactly_the_requests_asked_for() {
    let summary = bench_json(&["--requests", "2000", "--tasks", "4", "--keys", "3", "--quiet"]);
    assert_consistent(&summary);
    assert_eq!(summary["store"], "memory");
    assert_eq!(summary["op"], "check");
    assert_eq!(count(&summary, "tasks"), 4);
    assert_eq!(count(&summary, "keys"), 3);
    assert_eq!(count(&summary, "requests"), 2000);
    // The default limit admits nearly everything.
    assert_eq!(count(&summary, "allowed"), 2000);
    assert!(number(&summary, "decisions_per_s") > 0.0);
}

/// The token budget's operations: a record counts every unit, fitting or
/// not; check-then-record stops recording once the budget is spent;
/// settle keeps half of each estimate.
#[test]
fn budget_operations_count_their_units() {
    let limit = r#"{"algorithm":"fixed_window","limit":100,"window":"3650d"}"#;
    let run = |op: &str| {
        bench_json(&[
            "--limit",
            limit,
            "--requests",
            "50",
            "--tasks",
            "1",
            "--op",
            op,
            "--cost",
            "4",
        ])
    };
    let record = run("record");
    assert_consistent(&record);
    assert_eq!(count(&record, "units"), 200, "{record}");
    assert_eq!(
        (count(&record, "allowed"), count(&record, "denied")),
        (25, 25),
        "{record}"
    );
    let reported = run("check-then-record");
    // Checks of 0 pass while no more than 100 are spent (at 100 too): 26
    // reports of 4, the last one past the budget.
    assert_eq!(count(&reported, "units"), 104, "{reported}");
    assert_eq!(count(&reported, "allowed"), 26, "{reported}");
    let settled = run("settle");
    // Estimates of 4 settled at 2: 49 fit (98 spent), and a 50th estimate
    // of 4 would go past 100.
    assert_eq!(count(&settled, "units"), 98, "{settled}");
    assert_eq!(
        (count(&settled, "allowed"), count(&settled, "denied")),
        (49, 1),
        "{settled}"
    );
    let error = bench(&["--limit", limit, "--requests", "5", "--cost", "5", "--cost-max", "4"]);
    assert!(!error.status.success());
    assert!(String::from_utf8_lossy(&error.stderr).contains("--cost-max"));
}

#[test]
fn denials_are_counted_and_keys_are_separate() {
    // 10 at once per key, then one an hour: the run is far shorter.
    let limit = r#"{"algorithm":"gcra","rate":1,"period":"1h","burst":10}"#;
    let summary = bench_json(&["--limit", limit, "--requests", "100", "--tasks", "3", "--keys", "4"]);
    assert_consistent(&summary);
    assert_eq!(count(&summary, "allowed"), 40);
    assert_eq!(count(&summary, "denied"), 60);
}

#[test]
fn a_duration_bounds_the_run() {
    let summary = bench_json(&["--duration", "300ms", "--tasks", "2"]);
    assert_consistent(&summary);
    // The run lasts its duration (how much longer depends on the machine).
    assert!(number(&summary, "elapsed_s") >= 0.3, "{summary}");
    let span = count(&summary, "server_time_end_us") - count(&summary, "server_time_start_us");
    assert!(span >= 300_000, "{summary}");
    assert!(count(&summary, "requests") > 0);
}

#[test]
fn acquire_takes_and_releases_leases() {
    let limit = r#"{"algorithm":"concurrency","limit":1,"ttl":"10s"}"#;
    // One task: each lease is released before the next acquire.
    let summary = bench_json(&["--limit", limit, "--op", "acquire", "--requests", "50"]);
    assert_consistent(&summary);
    assert_eq!(summary["op"], "acquire");
    assert_eq!(count(&summary, "allowed"), 50);

    // Leases held 100 ms by 4 tasks against a limit of 1: the others are denied.
    let summary = bench_json(&[
        "--limit",
        limit,
        "--op",
        "acquire",
        "--hold-ms",
        "100",
        "--tasks",
        "4",
        "--duration",
        "250ms",
    ]);
    assert_consistent(&summary);
    let allowed = count(&summary, "allowed");
    assert!((1..=4).contains(&allowed), "{summary}");
    assert!(count(&summary, "denied") > 0, "{summary}");
}

#[test]
fn text_summary_shows_the_same_figures() {
    let output = bench(&["--requests", "500", "--keys", "2"]);
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "store        memory (1 task, 2 keys, op check)", "{stdout}");
    assert!(lines[1].starts_with("requests     500 in "), "{stdout}");
    assert!(lines[1].ends_with(" decisions/s"), "{stdout}");
    assert_eq!(lines[2], "allowed      500", "{stdout}");
    assert_eq!(lines[3], "denied       0", "{stdout}");
    assert_eq!(lines[4], "errors       0", "{stdout}");
    assert!(lines[5].starts_with("latency      p50 "), "{stdout}");
    // No lease: every decision is a store call.
    assert_eq!(lines[6], "store calls  500 (1.0000 per decision)", "{stdout}");
    assert!(lines[7].starts_with("cpu          "), "{stdout}");
    assert!(lines[8].starts_with("store time   "), "{stdout}");
}

#[test]
fn invalid_arguments_exit_2() {
    let concurrency = r#"{"algorithm":"concurrency","limit":1,"ttl":"10s"}"#;
    let stderr = bench_failure(&["--limit", concurrency, "--requests", "5"], 2);
    assert!(stderr.starts_with("error: --op check: "), "{stderr}");
    assert!(stderr.contains("acquire"), "{stderr}");

    let stderr = bench_failure(&["--hold-ms", "5", "--requests", "5"], 2);
    assert!(stderr.contains("--hold-ms applies only to --op acquire"), "{stderr}");

    let stderr = bench_failure(
        &["--limit", r#"{"algorithm":"gcra","rate":0,"period":"1s","burst":1}"#],
        2,
    );
    assert!(stderr.starts_with("error: invalid --limit: "), "{stderr}");

    let stderr = bench_failure(&["--duration", "0s"], 2);
    assert!(stderr.contains("more than zero"), "{stderr}");
    let stderr = bench_failure(&["--duration", "5"], 2);
    assert!(stderr.contains("needs a unit"), "{stderr}");
    bench_failure(&["--duration", "1s", "--requests", "5"], 2);
    bench_failure(&["--tasks", "0"], 2);
    bench_failure(&["--prefix", "p", "--requests", "5"], 2);
}

#[test]
fn unreachable_redis_exits_1_with_a_clear_message() {
    let port = free_port();
    let url = format!("redis://user:hunter2@127.0.0.1:{port}");
    let stderr = bench_failure(&["--store", &url, "--requests", "5"], 1);
    assert!(
        stderr.starts_with(&format!(
            "error: cannot use the store at redis://user:***@127.0.0.1:{port}: "
        )),
        "{stderr}"
    );
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// The server's clock in µs, read with redis-cli.
fn server_time(server: &RedisServer) -> u64 {
    let time = server.cli(&["TIME"]);
    let parts: Vec<u64> = time.lines().map(|part| part.trim().parse().unwrap()).collect();
    parts[0] * 1_000_000 + parts[1]
}

#[test]
fn redis_bench_shares_one_limit_and_reads_the_server_clock() {
    let server = RedisServer::start();
    let limit = r#"{"algorithm":"gcra","rate":1,"period":"1h","burst":25}"#;
    let before = server_time(&server);
    let summary = bench_json(&[
        "--store",
        &server.url(),
        "--limit",
        limit,
        "--tasks",
        "8",
        "--requests",
        "300",
        "--prefix",
        "bench-test",
    ]);
    let after = server_time(&server);
    assert_consistent(&summary);
    assert_eq!(summary["store"], server.url());
    assert_eq!(count(&summary, "requests"), 300);
    assert_eq!(count(&summary, "allowed"), 25);
    assert_eq!(count(&summary, "errors"), 0);
    let (start, end) = (
        count(&summary, "server_time_start_us"),
        count(&summary, "server_time_end_us"),
    );
    assert!(before <= start && end <= after, "{before} {start} {end} {after}");
    assert_eq!(server.cli(&["KEYS", "*"]), "bench-test:{bench-0}:gcra");

    // A second process on the same prefix shares the limit: all spent.
    let summary = bench_json(&[
        "--store",
        &server.url(),
        "--limit",
        limit,
        "--requests",
        "10",
        "--prefix",
        "bench-test",
    ]);
    assert_eq!(count(&summary, "allowed"), 0);
    assert_eq!(count(&summary, "denied"), 10);
}

/// With a lease, one process's decisions take far fewer store calls, and
/// what it did not use goes back when it ends: another process then finds
/// the limit less exactly what the first admitted.
#[test]
fn a_leased_limit_takes_blocks_and_gives_back_what_is_left() {
    let server = RedisServer::start();
    let limit = r#"{"algorithm":"fixed_window","limit":100000,"window":"1h","lease":"1s"}"#;
    let args = |requests: &'static str| {
        [
            "--store",
            &server.url(),
            "--limit",
            limit,
            "--tasks",
            "4",
            "--requests",
            requests,
            "--prefix",
            "leased",
        ]
        .map(str::to_owned)
    };
    let first = bench_json(&args("2000").each_ref().map(String::as_str));
    assert_eq!(count(&first, "allowed"), 2_000, "{first}");
    assert!(number(&first, "store_calls_per_decision") < 0.05, "{first}");
    // What the first process held went back when it ended: the window
    // counts exactly what the two processes admitted (its value is
    // "f<window end>:<count>").
    let second = bench_json(&args("1").each_ref().map(String::as_str));
    assert_eq!(count(&second, "allowed"), 1, "{second}");
    let value = server.cli(&["GET", "leased:{bench-0}:fixed_window"]);
    assert_eq!(
        value.trim().rsplit_once(':').map(|(_, count)| count),
        Some("2001"),
        "{value}"
    );
}
