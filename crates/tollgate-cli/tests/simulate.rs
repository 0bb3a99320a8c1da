//! `tollgate simulate`, run as a process: a trace in, exact JSON Lines out
//! (DESIGN §6).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{simulate_with, tollgate};

const GCRA_10_PER_S_BURST_2: &str = r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#;

/// Replays `trace` and returns its answers, checking the run succeeded.
fn simulate(limit: &str, trace: &str) -> Vec<String> {
    let output = simulate_with(limit, &[], trace);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}: {stderr}", output.status);
    assert_eq!(stderr, "");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A decision line, without the extras.
fn decision(allowed: bool, limit: u64, remaining: u64, retry_after: &str, reset_after: &str, wait: &str) -> String {
    format!(
        r#"{{"allowed":{allowed},"limit":{limit},"remaining":{remaining},"retry_after_ms":{retry_after},"reset_after_ms":{reset_after},"wait_ms":{wait}}}"#
    )
}

/// A decision line with `extra` (`"granted":1` …) before the closing brace.
fn with(line: &str, extra: &str) -> String {
    format!("{},{extra}}}", line.strip_suffix('}').unwrap())
}

fn lines(trace: &[&str]) -> String {
    let mut text = trace.join("\n");
    text.push('\n');
    text
}

#[test]
fn gcra_burst_then_denial_then_recovery() {
    // Emission interval 100 ms, burst 2: the TAT may run at most 200 ms ahead.
    let trace = lines(&[
        r#"{"t_ms": 0, "key": "a", "op": "check", "cost": 1}"#,
        r#"{"t_ms": 0, "key": "a"}"#,
        r#"{"t_ms": 0, "key": "a"}"#,
        r#"{"t_ms": 0, "key": "b"}"#,
        r#"{"t_ms": 100, "key": "a"}"#,
        r#"{"t_ms": 250, "key": "a"}"#,
        r#"{"t_ms": 250, "key": "a", "cost": 3}"#,
        r#"{"t_ms": 500, "key": "a", "cost": 0}"#,
        r#"{"t_ms": 500, "key": "a", "cost": 2}"#,
    ]);
    assert_eq!(
        simulate(GCRA_10_PER_S_BURST_2, &trace),
        [
            decision(true, 2, 1, "0", "100", "0"),
            decision(true, 2, 0, "0", "200", "0"),
            decision(false, 2, 0, "100", "200", "0"),
            // Another key has its own state.
            decision(true, 2, 1, "0", "100", "0"),
            // One emission interval later, one more fits.
            decision(true, 2, 0, "0", "200", "0"),
            // TAT is 300 ms: 50 ms ahead of now, room for one more.
            decision(true, 2, 0, "0", "150", "0"),
            // More than the burst can never be admitted.
            decision(false, 2, 0, "null", "150", "0"),
            // A peek once the TAT (400 ms) has passed: full again.
            decision(true, 2, 2, "0", "0", "0"),
            decision(true, 2, 0, "0", "200", "0"),
        ]
    );
}

#[test]
fn fractional_t_ms_counts_microseconds() {
    // 7 per second: cells are 142 857.142… µs apart, kept exact in ticks.
    let limit = r#"{"algorithm":"gcra","rate":7,"period":"1s","burst":1}"#;
    let trace = lines(&[
        r#"{"t_ms": 0}"#,
        r#"{"t_ms": 0.5}"#,
        r#"{"t_ms": 142.857}"#,
        r#"{"t_ms": 142.858}"#,
        r#"{"t_ms": 142.8585}"#,
        r#"{"t_ms": 285.7155}"#,
    ]);
    assert_eq!(
        simulate(limit, &trace),
        [
            decision(true, 1, 0, "0", "142.858", "0"),
            decision(false, 1, 0, "142.358", "142.358", "0"),
            // One seventh of a microsecond short of the TAT.
            decision(false, 1, 0, "0.001", "0.001", "0"),
            decision(true, 1, 0, "0", "142.858", "0"),
            r#"{"error":"t_ms (142.8585) is finer than a microsecond (0.001 ms)"}"#.to_owned(),
            r#"{"error":"t_ms (285.7155) is finer than a microsecond (0.001 ms)"}"#.to_owned(),
        ]
    );
}

#[test]
fn start_places_epoch_aligned_windows() {
    let limit = r#"{"algorithm":"fixed_window","limit":1,"window":"1m"}"#;
    let trace = lines(&[r#"{"t_ms": 0}"#, r#"{"t_ms": 29999.5}"#, r#"{"t_ms": 30000}"#]);
    let output = simulate_with(limit, &["--start", "1700000010"], &trace);
    assert!(output.status.success());
    // 1 700 000 010 s is 30 s into a minute.
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        lines(&[
            &decision(true, 1, 0, "0", "30000", "0"),
            &decision(false, 1, 0, "0.5", "0.5", "0"),
            &decision(true, 1, 0, "0", "60000", "0"),
        ])
    );
}

#[test]
fn policy_of_named_limits_lists_each_limit() {
    // Names in alphabetical order, which is also the order written.
    let limit = r#"{"short":{"algorithm":"fixed_window","limit":2,"window":"1s"},
                    "sustained":{"algorithm":"fixed_window","limit":3,"window":"1m"}}"#;
    let trace = lines(&[
        r#"{"t_ms": 0, "key": "u"}"#,
        r#"{"t_ms": 0, "key": "u"}"#,
        r#"{"t_ms": 0, "key": "u"}"#,
        r#"{"t_ms": 1000, "key": "u"}"#,
        r#"{"t_ms": 1000, "key": "u"}"#,
    ]);
    let limits = |short: &str, sustained: &str| format!(r#""limits":{{"short":{short},"sustained":{sustained}}}"#);
    assert_eq!(
        simulate(limit, &trace),
        [
            // All allowed: the decision of the limit with the least remaining.
            with(
                &decision(true, 2, 1, "0", "1000", "0"),
                &limits(
                    &decision(true, 2, 1, "0", "1000", "0"),
                    &decision(true, 3, 2, "0", "60000", "0")
                )
            ),
            with(
                &decision(true, 2, 0, "0", "1000", "0"),
                &limits(
                    &decision(true, 2, 0, "0", "1000", "0"),
                    &decision(true, 3, 1, "0", "60000", "0")
                )
            ),
            // Denied by one, so the other consumes nothing.
            with(
                &decision(false, 2, 0, "1000", "1000", "0"),
                &limits(
                    &decision(false, 2, 0, "1000", "1000", "0"),
                    &decision(true, 3, 1, "0", "60000", "0")
                )
            ),
            with(
                &decision(true, 3, 0, "0", "59000", "0"),
                &limits(
                    &decision(true, 2, 1, "0", "1000", "0"),
                    &decision(true, 3, 0, "0", "59000", "0")
                )
            ),
            with(
                &decision(false, 3, 0, "59000", "59000", "0"),
                &limits(
                    &decision(true, 2, 1, "0", "1000", "0"),
                    &decision(false, 3, 0, "59000", "59000", "0")
                )
            ),
        ]
    );
}

#[test]
fn check_at_most_reports_granted() {
    // 5 tokens, one more per second.
    let limit = r#"{"algorithm":"token_bucket","capacity":5,"refill":1,"interval":"1s"}"#;
    let trace = lines(&[
        r#"{"t_ms": 0, "op": "check_at_most", "cost": 3}"#,
        r#"{"t_ms": 0, "op": "check_at_most", "cost": 3}"#,
        r#"{"t_ms": 0, "op": "check_at_most", "cost": 3}"#,
        r#"{"t_ms": 1500, "op": "check_at_most", "cost": 3}"#,
    ]);
    assert_eq!(
        simulate(limit, &trace),
        [
            with(&decision(true, 5, 2, "0", "3000", "0"), r#""granted":3"#),
            with(&decision(true, 5, 0, "0", "5000", "0"), r#""granted":2"#),
            with(&decision(false, 5, 0, "1000", "5000", "0"), r#""granted":0"#),
            with(&decision(true, 5, 0, "0", "4500", "0"), r#""granted":1"#),
        ]
    );
}

#[test]
fn reserve_waits_and_respects_max_wait() {
    // 10 per second, one permit stored: the third caller waits 100 ms.
    let limit = r#"{"algorithm":"reservation","rate":10,"period":"1s","max_burst":1}"#;
    let trace = lines(&[
        r#"{"t_ms": 0, "op": "reserve"}"#,
        r#"{"t_ms": 0, "op": "reserve"}"#,
        r#"{"t_ms": 0, "op": "reserve"}"#,
        r#"{"t_ms": 0, "op": "reserve", "max_wait_ms": 150}"#,
        r#"{"t_ms": 0, "op": "reserve", "max_wait_ms": 200}"#,
        r#"{"t_ms": 0, "op": "check"}"#,
        r#"{"t_ms": 350, "op": "reserve"}"#,
        r#"{"t_ms": 350, "op": "reserve", "max_wait_ms": 49.999}"#,
        r#"{"t_ms": 350, "op": "reserve", "max_wait_ms": 50}"#,
    ]);
    assert_eq!(
        simulate(limit, &trace),
        [
            decision(true, 2, 1, "0", "100", "0"),
            decision(true, 2, 0, "0", "200", "0"),
            decision(true, 2, 0, "0", "300", "100"),
            decision(false, 2, 0, "50", "300", "0"),
            decision(true, 2, 0, "0", "400", "200"),
            // check is reserve without waiting.
            decision(false, 2, 0, "300", "400", "0"),
            // Paid off by 350 ms but for 50 ms: the stored permit is half refilled.
            decision(true, 2, 0, "0", "150", "0"),
            decision(false, 2, 0, "0.001", "150", "0"),
            decision(true, 2, 0, "0", "250", "50"),
        ]
    );
}

#[test]
fn acquire_and_release_use_deterministic_leases() {
    let limit = r#"{"algorithm":"concurrency","limit":2,"ttl":"10s"}"#;
    let trace = lines(&[
        r#"{"t_ms": 0, "key": "a", "op": "acquire"}"#,
        r#"{"t_ms": 1, "key": "a", "op": "acquire"}"#,
        r#"{"t_ms": 2, "key": "a", "op": "acquire"}"#,
        r#"{"t_ms": 3, "key": "a", "op": "release", "lease": "1"}"#,
        r#"{"t_ms": 4, "key": "a", "op": "acquire"}"#,
        r#"{"t_ms": 5, "key": "a", "op": "acquire", "cost": 3}"#,
        r#"{"t_ms": 10004, "key": "a", "op": "acquire"}"#,
    ]);
    assert_eq!(
        simulate(limit, &trace),
        [
            with(&decision(true, 2, 1, "0", "10000", "0"), r#""lease":"1""#),
            with(&decision(true, 2, 0, "0", "10000", "0"), r#""lease":"2""#),
            // Lease 1 ends by itself at 10 000 ms.
            decision(false, 2, 0, "9998", "9999", "0"),
            decision(true, 2, 1, "0", "9998", "0"),
            // Denied acquires take no name: the next lease is "3".
            with(&decision(true, 2, 0, "0", "10000", "0"), r#""lease":"3""#),
            decision(false, 2, 0, "null", "9999", "0"),
            // Leases 2 and 3 have expired.
            with(&decision(true, 2, 1, "0", "10000", "0"), r#""lease":"4""#),
        ]
    );
}

/// `record`: tokens spent already count past the limit; a fixed window then
/// refuses even a peek until it ends.
#[test]
fn record_counts_usage_past_the_limit() {
    let trace = lines(&[
        r#"{"t_ms": 0, "op": "check", "cost": 0}"#,
        r#"{"t_ms": 1, "op": "record", "cost": 800}"#,
        r#"{"t_ms": 2, "op": "record", "cost": 800}"#,
        r#"{"t_ms": 3, "op": "check", "cost": 0}"#,
        r#"{"t_ms": 60000, "op": "check", "cost": 0}"#,
    ]);
    assert_eq!(
        simulate(r#"{"algorithm":"fixed_window","limit":1000,"window":"1m"}"#, &trace),
        [
            decision(true, 1000, 1000, "0", "0", "0"),
            decision(true, 1000, 200, "0", "59999", "0"),
            // Did not fit: counted all the same.
            decision(false, 1000, 0, "59998", "59998", "0"),
            decision(false, 1000, 0, "59997", "59997", "0"),
            decision(true, 1000, 1000, "0", "0", "0"),
        ]
    );
}

#[test]
fn reset_forgets_the_key() {
    let trace = lines(&[
        r#"{"t_ms": 0, "key": "a"}"#,
        r#"{"t_ms": 0, "key": "a"}"#,
        r#"{"t_ms": 0, "key": "b"}"#,
        r#"{"t_ms": 10, "key": "a", "op": "reset"}"#,
        r#"{"t_ms": 10, "key": "a"}"#,
        r#"{"t_ms": 10, "key": "b", "cost": 0}"#,
    ]);
    assert_eq!(
        simulate(GCRA_10_PER_S_BURST_2, &trace),
        [
            decision(true, 2, 1, "0", "100", "0"),
            decision(true, 2, 0, "0", "200", "0"),
            decision(true, 2, 1, "0", "100", "0"),
            // The answer to a reset is a peek after it.
            decision(true, 2, 2, "0", "0", "0"),
            decision(true, 2, 1, "0", "100", "0"),
            // Other keys keep their state.
            decision(true, 2, 1, "0", "90", "0"),
        ]
    );
}

#[test]
fn invalid_steps_are_answered_and_the_replay_goes_on() {
    let trace = lines(&[
        r#"{"t_ms": 100}"#,
        r#"{"t_ms": 100"#,
        r#"{"t_ms": 100, "op": "burn"}"#,
        r#"{"t_ms": 50}"#,
        r#"{"t_ms": 100, "op": "release"}"#,
        r#"{"t_ms": 100, "op": "reserve"}"#,
        r#"{"t_ms": 100, "cots": 1}"#,
        r#"{"t_ms": -1}"#,
        r#"{"key": "a"}"#,
        r#"{"t_ms": 100}"#,
    ]);
    let answers = simulate(GCRA_10_PER_S_BURST_2, &trace);
    assert_eq!(answers.len(), 10);
    assert_eq!(answers[0], decision(true, 2, 1, "0", "100", "0"));
    assert!(answers[1].starts_with(r#"{"error":"invalid JSON: "#), "{}", answers[1]);
    assert!(
        answers[2].starts_with(r#"{"error":"op: unknown variant \"burn\""#),
        "{}",
        answers[2]
    );
    assert_eq!(answers[3], r#"{"error":"t_ms must not decrease (50 after 100)"}"#);
    assert_eq!(
        answers[4],
        r#"{"error":"release needs a \"lease\" (the one its acquire answered with)"}"#
    );
    assert_eq!(
        answers[5],
        r#"{"error":"reserve needs a borrowing or shaping limit (reservation, leaky_bucket), not gcra"}"#
    );
    assert!(answers[6].contains(r#"unknown field \"cots\""#), "{}", answers[6]);
    assert_eq!(answers[7], r#"{"error":"t_ms must not be negative"}"#);
    assert!(answers[8].contains(r#"missing field \"t_ms\""#), "{}", answers[8]);
    // None of the invalid steps consumed anything.
    assert_eq!(answers[9], decision(true, 2, 0, "0", "200", "0"));
}

/// Runs `tollgate simulate` with `args` and an empty stdin; it must fail.
fn failure(args: &[&str]) -> String {
    let output = tollgate(&["simulate"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success(), "{args:?} succeeded");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn invalid_limit_exits_with_a_message_naming_the_field() {
    let stderr = failure(&["--limit", r#"{"algorithm":"gcra","rate":10,"period":"1s","bursts":5}"#]);
    assert!(stderr.starts_with("error: invalid --limit: "), "{stderr}");
    assert!(stderr.contains("bursts"), "{stderr}");

    let stderr = failure(&["--limit", r#"{"algorithm":"gcra","rate":10,"period":"10","burst":5}"#]);
    assert!(stderr.contains("period"), "{stderr}");
    assert!(stderr.contains("needs a unit"), "{stderr}");

    let stderr = failure(&[
        "--limit",
        r#"{"per_hour":{"algorithm":"fixed_window","limit":0,"window":"1h"}}"#,
    ]);
    assert!(stderr.contains("per_hour: limit must be at least 1"), "{stderr}");

    let stderr = failure(&["--limit", "{not json"]);
    assert!(stderr.contains("invalid JSON"), "{stderr}");

    let output = tollgate(&["simulate", "--limit", "[]"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn unknown_stores_are_refused() {
    // Redis is tested against a real server in tests/simulate_redis.rs.
    let stderr = failure(&[
        "--limit",
        GCRA_10_PER_S_BURST_2,
        "--store",
        "etcd://root:secret@127.0.0.1",
    ]);
    assert!(stderr.contains("unknown store \"etcd://\""), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");

    let output = simulate_with(GCRA_10_PER_S_BURST_2, &["--store", "memory"], "{\"t_ms\":0}\n");
    assert!(output.status.success());
}

/// A running `simulate` whose answers arrive on a channel.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    answers: mpsc::Receiver<String>,
}

impl Driver {
    fn start(limit: &str) -> Self {
        let mut child = tollgate(&["simulate", "--limit", limit])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, answers) = mpsc::channel();
        thread::spawn(move || {
            for line in stdout.lines() {
                if send.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        Self { child, stdin, answers }
    }

    /// Writes one step (keeping stdin open) and waits for its answer.
    fn ask(&mut self, step: &str) -> String {
        writeln!(self.stdin, "{step}").unwrap();
        self.stdin.flush().unwrap();
        self.answers
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no answer to {step} while the trace was still open"))
    }
}

#[test]
fn each_step_is_answered_before_the_next_is_written() {
    let limit = r#"{"algorithm":"concurrency","limit":1,"ttl":"30s"}"#;
    let mut driver = Driver::start(limit);
    let first = driver.ask(r#"{"t_ms": 0, "key": "job", "op": "acquire"}"#);
    assert_eq!(first, with(&decision(true, 1, 0, "0", "30000", "0"), r#""lease":"1""#));
    let denied = driver.ask(r#"{"t_ms": 10, "key": "job", "op": "acquire"}"#);
    assert_eq!(denied, decision(false, 1, 0, "29990", "29990", "0"));
    assert_eq!(
        driver.ask(r#"{"t_ms": 20, "key": "job", "op": "nope"}"#),
        r#"{"error":"op: unknown variant \"nope\", expected one of \"check\", \"check_at_most\", \"reserve\", \"acquire\", \"release\", \"reset\", \"record\""}"#
    );
    // Use the lease from the first answer in the next step.
    let lease: serde_json::Value = serde_json::from_str(&first).unwrap();
    let lease = lease["lease"].as_str().unwrap();
    let released = driver.ask(&format!(
        r#"{{"t_ms": 30, "key": "job", "op": "release", "lease": "{lease}"}}"#
    ));
    assert_eq!(released, decision(true, 1, 1, "0", "0", "0"));
    let again = driver.ask(r#"{"t_ms": 40, "key": "job", "op": "acquire"}"#);
    assert_eq!(again, with(&decision(true, 1, 0, "0", "30000", "0"), r#""lease":"2""#));

    let Driver { mut child, stdin, .. } = driver;
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn table_format_is_aligned() {
    let trace = lines(&[
        r#"{"t_ms": 0, "key": "a"}"#,
        r#"{"t_ms": 0, "key": "a", "cost": 3}"#,
        r#"{"t_ms": 0.5, "key": "a", "op": "check_at_most", "cost": 5}"#,
        r#"{"t_ms": 1, "key": "a", "op": "reserve"}"#,
        "oops",
    ]);
    let output = simulate_with(GCRA_10_PER_S_BURST_2, &["--format", "table"], &trace);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    let header = rows[0];
    for column in [
        "t_ms",
        "key",
        "op",
        "cost",
        "allowed",
        "remaining",
        "retry_after_ms",
        "reset_after_ms",
        "wait_ms",
    ] {
        assert!(header.contains(column), "{header}");
    }
    // Every value ends under its header: right-aligned columns line up.
    let end_of = |row: &str, column: &str| {
        let end = header.find(column).unwrap() + column.len();
        let row = row.as_bytes();
        row[end - 1] != b' ' && row.get(end).is_none_or(|&byte| byte == b' ')
    };
    for row in &rows[1..3] {
        for column in [
            "t_ms",
            "cost",
            "remaining",
            "retry_after_ms",
            "reset_after_ms",
            "wait_ms",
        ] {
            assert!(end_of(row, column), "{column} misaligned in\n{header}\n{row}");
        }
    }
    assert!(rows[1].contains(" yes "), "{}", rows[1]);
    assert!(rows[2].contains(" no ") && rows[2].contains("never"), "{}", rows[2]);
    assert!(rows[3].contains("granted 1"), "{}", rows[3]);
    assert!(rows[4].contains("error: reserve needs"), "{}", rows[4]);
    assert!(rows[5].contains("error: invalid JSON"), "{}", rows[5]);
}

#[test]
fn bundled_example_runs() {
    let trace = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/burst.jsonl")).unwrap();
    let limit = r#"{"algorithm":"gcra","rate":5,"period":"1s","burst":3}"#;
    let answers = simulate(limit, &trace);
    let allowed: Vec<bool> = answers
        .iter()
        .map(|answer| answer.starts_with(r#"{"allowed":true"#))
        .collect();
    assert_eq!(
        allowed,
        [true, true, true, false, true, false, true, false, true, true, true, false]
    );
    assert_eq!(answers[11], decision(false, 3, 0, "null", "600", "0"));
}
