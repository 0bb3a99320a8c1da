//! `tollgate simulate --store redis://…`: the same traces through a real
//! `redis-server` and through the memory store answer the same, line by line.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Output, Stdio};

use common::redis_server::{free_port, RedisServer};
use common::{simulate_with, tollgate};

/// The answers of a successful run.
fn answers(output: Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}: {stderr}", output.status);
    assert_eq!(stderr, "");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn lines(trace: &[&str]) -> String {
    let mut text = trace.join("\n");
    text.push('\n');
    text
}

/// A limit, a `--start` and a trace to replay through both stores.
struct Case {
    name: &'static str,
    limit: &'static str,
    start: u64,
    trace: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "gcra burst, denial, recovery, a cost that never fits",
        limit: r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 0, "key": "a", "op": "check", "cost": 1}"#,
            r#"{"t_ms": 0, "key": "a"}"#,
            r#"{"t_ms": 0, "key": "a"}"#,
            r#"{"t_ms": 0, "key": "b"}"#,
            r#"{"t_ms": 100, "key": "a"}"#,
            r#"{"t_ms": 250, "key": "a"}"#,
            r#"{"t_ms": 250, "key": "a", "cost": 3}"#,
            r#"{"t_ms": 500, "key": "a", "cost": 0}"#,
            r#"{"t_ms": 500, "key": "a", "cost": 2}"#,
            r#"{"t_ms": 500.001, "key": "a"}"#,
        ],
    },
    Case {
        name: "gcra at an inexact rate, microsecond steps",
        limit: r#"{"algorithm":"gcra","rate":7,"period":"1s","burst":1}"#,
        start: 1_700_000_000,
        trace: &[
            r#"{"t_ms": 0}"#,
            r#"{"t_ms": 0.5}"#,
            r#"{"t_ms": 142.857}"#,
            r#"{"t_ms": 142.858}"#,
            r#"{"t_ms": 285.715}"#,
            r#"{"t_ms": 285.716}"#,
        ],
    },
    Case {
        name: "a policy of two limits, all-or-nothing, with check_at_most and reset",
        limit: r#"{"short":{"algorithm":"fixed_window","limit":2,"window":"1s"},
                       "sustained":{"algorithm":"sliding_log","limit":3,"window":"1m"}}"#,
        start: 1_700_000_010,
        trace: &[
            r#"{"t_ms": 0, "key": "u"}"#,
            r#"{"t_ms": 0, "key": "u"}"#,
            r#"{"t_ms": 0, "key": "u"}"#,
            r#"{"t_ms": 1000, "key": "u", "op": "check_at_most", "cost": 5}"#,
            r#"{"t_ms": 1000, "key": "u"}"#,
            r#"{"t_ms": 2000, "key": "u", "cost": 0}"#,
            r#"{"t_ms": 2000, "key": "u", "cost": 4}"#,
            r#"{"t_ms": 2500, "key": "u", "op": "reset"}"#,
            r#"{"t_ms": 2500, "key": "u", "op": "check_at_most", "cost": 5}"#,
            r#"{"t_ms": 61000, "key": "u"}"#,
        ],
    },
    Case {
        name: "reserve on a reservation, with and without max_wait",
        limit: r#"{"algorithm":"reservation","rate":10,"period":"1s","max_burst":1}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 0, "op": "reserve"}"#,
            r#"{"t_ms": 0, "op": "reserve"}"#,
            r#"{"t_ms": 0, "op": "reserve"}"#,
            r#"{"t_ms": 0, "op": "reserve", "max_wait_ms": 150}"#,
            r#"{"t_ms": 0, "op": "reserve", "max_wait_ms": 200}"#,
            r#"{"t_ms": 0, "op": "check"}"#,
            r#"{"t_ms": 350, "op": "reserve"}"#,
            r#"{"t_ms": 350, "op": "reserve", "max_wait_ms": 49.999}"#,
            r#"{"t_ms": 350, "op": "reserve", "max_wait_ms": 50}"#,
            r#"{"t_ms": 350, "op": "reserve", "cost": 3}"#,
        ],
    },
    Case {
        name: "acquire and release on a concurrency limit, leases that expire",
        limit: r#"{"algorithm":"concurrency","limit":2,"ttl":"10s"}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 0, "key": "a", "op": "acquire"}"#,
            r#"{"t_ms": 1, "key": "a", "op": "acquire"}"#,
            r#"{"t_ms": 2, "key": "a", "op": "acquire"}"#,
            r#"{"t_ms": 3, "key": "a", "op": "release", "lease": "1"}"#,
            r#"{"t_ms": 3, "key": "a", "op": "release", "lease": "1"}"#,
            r#"{"t_ms": 4, "key": "a", "op": "acquire"}"#,
            r#"{"t_ms": 5, "key": "a", "op": "acquire", "cost": 3}"#,
            r#"{"t_ms": 6, "key": "a", "op": "acquire", "lease": "2"}"#,
            r#"{"t_ms": 7, "key": "a", "op": "check"}"#,
            r#"{"t_ms": 10004, "key": "a", "op": "acquire"}"#,
            r#"{"t_ms": 10005, "key": "a", "op": "release", "lease": "2"}"#,
        ],
    },
    Case {
        name: "check_at_most on a smooth token bucket",
        limit: r#"{"algorithm":"token_bucket","capacity":5,"refill":1,"interval":"1s"}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 0, "op": "check_at_most", "cost": 3}"#,
            r#"{"t_ms": 0, "op": "check_at_most", "cost": 3}"#,
            r#"{"t_ms": 0, "op": "check_at_most", "cost": 3}"#,
            r#"{"t_ms": 1500, "op": "check_at_most", "cost": 3}"#,
            r#"{"t_ms": 1500, "cost": 6}"#,
            r#"{"t_ms": 2999.999}"#,
            r#"{"t_ms": 3000}"#,
        ],
    },
    Case {
        name: "a token bucket refilled at interval boundaries, starting half full",
        limit: r#"{"algorithm":"token_bucket","capacity":4,"refill":2,"interval":"1s","mode":"interval","initial":2}"#,
        start: 1_700_000_000,
        trace: &[
            r#"{"t_ms": 400}"#,
            r#"{"t_ms": 400}"#,
            r#"{"t_ms": 400}"#,
            r#"{"t_ms": 999.999}"#,
            r#"{"t_ms": 1400}"#,
            r#"{"t_ms": 5000, "cost": 0}"#,
        ],
    },
    Case {
        name: "fixed and sliding windows placed by --start",
        limit: r#"{"fixed":{"algorithm":"fixed_window","limit":3,"window":"1m"},
                       "sliding":{"algorithm":"sliding_window","limit":4,"window":"10s","buckets":5}}"#,
        start: 1_700_000_010,
        trace: &[
            r#"{"t_ms": 0, "key": "k"}"#,
            r#"{"t_ms": 1000, "key": "k", "cost": 2}"#,
            r#"{"t_ms": 2000, "key": "k"}"#,
            r#"{"t_ms": 12000, "key": "k"}"#,
            r#"{"t_ms": 30000, "key": "k"}"#,
            r#"{"t_ms": 31000, "key": "k", "op": "check_at_most", "cost": 9}"#,
        ],
    },
    Case {
        name: "a leaky bucket shapes with waits",
        limit: r#"{"algorithm":"leaky_bucket","rate":2,"period":"1s","capacity":3}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 0, "key": "q", "op": "reserve"}"#,
            r#"{"t_ms": 0, "key": "q", "op": "reserve"}"#,
            r#"{"t_ms": 0, "key": "q", "op": "reserve", "max_wait_ms": 100}"#,
            r#"{"t_ms": 0, "key": "q", "op": "reserve"}"#,
            r#"{"t_ms": 0, "key": "q", "op": "reserve"}"#,
            r#"{"t_ms": 0, "key": "q", "op": "check"}"#,
            r#"{"t_ms": 1200, "key": "q", "op": "reserve", "cost": 2}"#,
            r#"{"t_ms": 1200, "key": "q", "op": "reserve", "cost": 4}"#,
        ],
    },
    Case {
        name: "invalid steps are answered alike and change nothing",
        limit: r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 100}"#,
            r#"{"t_ms": 100"#,
            r#"{"t_ms": 50}"#,
            r#"{"t_ms": 100, "op": "reserve"}"#,
            r#"{"t_ms": 100, "op": "acquire"}"#,
            r#"{"t_ms": 100, "op": "release", "lease": "1"}"#,
            r#"{"t_ms": 100}"#,
            r#"{"t_ms": 100}"#,
        ],
    },
    Case {
        name: "a leased limit: blocks, the time shift, a block going back, pacing near the limit",
        limit: r#"{"algorithm":"fixed_window","limit":8,"window":"1s","lease":"100ms"}"#,
        start: 0,
        trace: &[
            r#"{"t_ms": 0}"#,
            r#"{"t_ms": 0}"#,
            r#"{"t_ms": 0}"#,
            r#"{"t_ms": 50}"#,
            r#"{"t_ms": 99.999}"#,
            r#"{"t_ms": 100}"#,
            r#"{"t_ms": 100, "key": "b"}"#,
            r#"{"t_ms": 150}"#,
            r#"{"t_ms": 150}"#,
            r#"{"t_ms": 150}"#,
            r#"{"t_ms": 150}"#,
            r#"{"t_ms": 150}"#,
            r#"{"t_ms": 500}"#,
            r#"{"t_ms": 999}"#,
            r#"{"t_ms": 1000}"#,
            r#"{"t_ms": 1000, "op": "check_at_most", "cost": 3}"#,
            r#"{"t_ms": 1050, "op": "reset"}"#,
            r#"{"t_ms": 1050}"#,
        ],
    },
    Case {
        name: "a leased gcra policy of two limits",
        limit: r#"{"fast":{"algorithm":"gcra","rate":100,"period":"1s","burst":20,"lease":"50ms"},
                       "slow":{"algorithm":"sliding_log","limit":30,"window":"1m","lease":"50ms"}}"#,
        start: 1_700_000_000,
        trace: &[
            r#"{"t_ms": 0}"#,
            r#"{"t_ms": 1}"#,
            r#"{"t_ms": 1}"#,
            r#"{"t_ms": 2}"#,
            r#"{"t_ms": 2}"#,
            r#"{"t_ms": 2}"#,
            r#"{"t_ms": 3}"#,
            r#"{"t_ms": 60}"#,
            r#"{"t_ms": 61}"#,
            r#"{"t_ms": 61, "cost": 2}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 200}"#,
            r#"{"t_ms": 210}"#,
        ],
    },
];

/// Replays `trace` through the memory store and through Redis at `url` and
/// asserts the answers are the same, line by line.
fn assert_same_answers(name: &str, limit: &str, start: u64, trace: &str, url: &str) {
    let start = start.to_string();
    let memory = answers(simulate_with(limit, &["--start", &start], trace));
    let redis = answers(simulate_with(limit, &["--start", &start, "--store", url], trace));
    let steps: Vec<&str> = trace.lines().filter(|line| !line.trim().is_empty()).collect();
    assert_eq!(memory.len(), steps.len(), "{name}: one answer per step");
    assert_eq!(redis.len(), memory.len(), "{name}: one answer per step");
    for (at, (memory, redis)) in memory.iter().zip(&redis).enumerate() {
        assert_eq!(redis, memory, "{name}: step {} ({}) differs", at + 1, steps[at]);
    }
    // The trace means something: both admissions and denials.
    assert!(
        memory.iter().any(|line| line.starts_with(r#"{"allowed":true"#)),
        "{name}"
    );
    assert!(
        memory.iter().any(|line| line.starts_with(r#"{"allowed":false"#)),
        "{name}"
    );
}

#[test]
fn redis_answers_every_trace_like_the_memory_store() {
    let server = RedisServer::start();
    for case in CASES {
        assert_same_answers(case.name, case.limit, case.start, &lines(case.trace), &server.url());
    }
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/burst.jsonl")).unwrap();
    let limit = r#"{"algorithm":"gcra","rate":5,"period":"1s","burst":3}"#;
    assert_same_answers("the bundled example", limit, 0, &example, &server.url());
    // Each run had a fresh prefix and reset the keys it wrote.
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[test]
fn keys_live_under_the_prefix_and_are_kept_when_asked() {
    let server = RedisServer::start();
    let limit = r#"{"per_second":{"algorithm":"gcra","rate":10,"period":"1s","burst":2},
                    "per_minute":{"algorithm":"fixed_window","limit":100,"window":"1m"}}"#;
    let trace = lines(&[r#"{"t_ms": 0, "key": "a"}"#, r#"{"t_ms": 0, "key": "b"}"#]);
    let kept = answers(simulate_with(
        limit,
        &["--store", &server.url(), "--prefix", "replay", "--keep-keys"],
        &trace,
    ));
    assert_eq!(kept.len(), 2);
    let mut keys: Vec<String> = server.cli(&["KEYS", "*"]).lines().map(str::to_owned).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "replay:{a}:per_minute",
            "replay:{a}:per_second",
            "replay:{b}:per_minute",
            "replay:{b}:per_second"
        ]
    );
    // Without --keep-keys the same prefix is cleaned up, old keys included.
    answers(simulate_with(
        limit,
        &["--store", &server.url(), "--prefix", "replay"],
        &trace,
    ));
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[test]
fn subjects_that_need_encoding_leave_no_keys_behind() {
    let server = RedisServer::start();
    let limit = r#"{"per_second":{"algorithm":"gcra","rate":10,"period":"1s","burst":2},
                    "per_minute":{"algorithm":"sliding_log","limit":100,"window":"1m"}}"#;
    let long = "x".repeat(300);
    let subjects = ["a:b", "{tag}", "50%", "with space", "ü", long.as_str()];
    let steps: Vec<String> = subjects
        .iter()
        .map(|key| serde_json::json!({"t_ms": 0, "key": key}).to_string())
        .collect();
    let trace = lines(&steps.iter().map(String::as_str).collect::<Vec<_>>());
    let kept = answers(simulate_with(
        limit,
        &["--store", &server.url(), "--prefix", "p", "--keep-keys"],
        &trace,
    ));
    assert_eq!(kept.len(), subjects.len());
    assert!(
        kept.iter().all(|line| line.starts_with(r#"{"allowed":true"#)),
        "{kept:?}"
    );
    let keys = server.cli(&["KEYS", "*"]);
    assert_eq!(keys.lines().count(), 2 * subjects.len(), "{keys}");
    assert!(keys.contains("p:{a%3Ab}:per_second"), "{keys}");
    assert!(keys.contains("p:{#"), "the 300-byte subject is hashed: {keys}");

    // The same trace without --keep-keys resets every key it wrote.
    answers(simulate_with(
        limit,
        &["--store", &server.url(), "--prefix", "p"],
        &trace,
    ));
    assert_eq!(server.cli(&["KEYS", "*"]), "");
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[test]
fn several_limits_replay_side_by_side_in_redis_as_in_memory() {
    let server = RedisServer::start();
    let (gcra, slow) = (
        r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#,
        r#"{"algorithm":"gcra","rate":1,"period":"1s","burst":1}"#,
    );
    let trace = lines(&[
        r#"{"t_ms": 0, "key": "a:b"}"#,
        r#"{"t_ms": 0, "key": "a:b"}"#,
        r#"{"t_ms": 150, "key": "a:b"}"#,
    ]);
    let memory = answers(simulate_with(gcra, &["--limit", slow], &trace));
    let kept = answers(simulate_with(
        gcra,
        &[
            "--limit",
            slow,
            "--store",
            &server.url(),
            "--prefix",
            "cmp",
            "--keep-keys",
        ],
        &trace,
    ));
    assert_eq!(kept, memory);
    assert!(
        memory[1].starts_with(r#"[{"allowed":true"#) && memory[1].contains(r#"},{"allowed":false"#),
        "{}",
        memory[1]
    );
    // Two limits of one algorithm: each has its own prefix, so no key is shared.
    let mut keys: Vec<String> = server.cli(&["KEYS", "*"]).lines().map(str::to_owned).collect();
    keys.sort();
    assert_eq!(keys, ["cmp-1:{a%3Ab}:gcra", "cmp-2:{a%3Ab}:gcra"]);
    answers(simulate_with(
        gcra,
        &["--limit", slow, "--store", &server.url(), "--prefix", "cmp"],
        &trace,
    ));
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[test]
fn unreachable_redis_exits_1_with_a_clear_message() {
    let port = free_port();
    let url = format!("redis://default:hunter2@127.0.0.1:{port}");
    let output = tollgate(&[
        "simulate",
        "--limit",
        r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#,
        "--store",
        &url,
    ])
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    assert!(
        stderr.starts_with(&format!(
            "error: cannot use the store at redis://default:***@127.0.0.1:{port}: "
        )),
        "{stderr}"
    );
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn store_options_are_checked() {
    let limit = r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#;
    let output = simulate_with(limit, &["--prefix", "p"], "");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("apply only to a Redis store"));

    let server = RedisServer::start();
    let output = simulate_with(limit, &["--store", &server.url(), "--prefix", "a b"], "");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("key prefix \"a b\""), "{stderr}");
}

#[test]
fn redis_going_away_mid_replay_ends_with_exit_code_1() {
    let mut server = RedisServer::start();
    let mut child = tollgate(&[
        "simulate",
        "--limit",
        r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":2}"#,
        "--store",
        &server.url(),
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, r#"{{"t_ms": 0}}"#).unwrap();
    stdin.flush().unwrap();
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with(r#"{"allowed":true"#), "{first}");

    server.stop();
    writeln!(stdin, r#"{{"t_ms": 1}}"#).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    // No answer is made up for the step that failed.
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    assert!(stderr.starts_with("error: simulate: redis: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
