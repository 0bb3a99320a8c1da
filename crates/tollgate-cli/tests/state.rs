//! `tollgate check | inspect | reset` on the memory store and on a real
//! `redis-server`.
//!
//! The limits here are relative (GCRA, a smooth token bucket, a sliding
//! log), never windows aligned to the wall clock, and slow enough that a
//! test run cannot see them refill: the answers do not depend on when the
//! test runs.

mod common;

use std::process::Output;

use common::redis_server::RedisServer;
use common::tollgate;
use serde_json::Value;

const GCRA: &str = r#"{"algorithm":"gcra","rate":1,"period":"1h","burst":2}"#;
const POLICY: &str = r#"{"burst":{"algorithm":"token_bucket","capacity":3,"refill":1,"interval":"1h"},
                         "daily":{"algorithm":"sliding_log","limit":2,"window":"1d"}}"#;

/// Runs `tollgate <command> --limit <limit> <extra…>`.
fn run(command: &str, limit: &str, extra: &[&str]) -> Output {
    tollgate(&[command, "--limit", limit])
        .args(extra)
        .output()
        .expect("the tollgate binary starts")
}

/// The one JSON line a run printed; asserts its exit code and a quiet stderr.
fn answer(output: Output, code: i32) -> Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert_eq!(stderr, "");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    serde_json::from_str(&stdout).unwrap()
}

/// `(allowed, remaining)` of an answer.
fn state(answer: &Value) -> (bool, u64) {
    (
        answer["allowed"].as_bool().unwrap(),
        answer["remaining"].as_u64().unwrap(),
    )
}

#[test]
fn the_memory_store_starts_fresh_in_every_command() {
    let check = answer(run("check", GCRA, &["a"]), 0);
    assert_eq!(
        serde_json::to_string(&check).unwrap(),
        r#"{"allowed":true,"limit":2,"remaining":1,"retry_after_ms":0,"reset_after_ms":3600000,"wait_ms":0}"#
    );
    // A second process does not see the first one's request.
    assert_eq!(answer(run("check", GCRA, &["a"]), 0), check);
    assert_eq!(state(&answer(run("inspect", GCRA, &["a"]), 0)), (true, 2));
    assert_eq!(state(&answer(run("reset", GCRA, &["a"]), 0)), (true, 2));
    // A cost that can never fit is denied (exit code 3) with a null retry_after.
    let denied = answer(run("check", GCRA, &["--cost", "3", "a"]), 3);
    assert_eq!(state(&denied), (false, 2));
    assert!(denied["retry_after_ms"].is_null(), "{denied}");
}

#[test]
fn check_inspect_and_reset_share_state_in_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let store = ["--store", url.as_str()];
    let with = |extra: &[&'static str]| -> Vec<&str> { store.iter().copied().chain(extra.iter().copied()).collect() };

    assert_eq!(state(&answer(run("check", GCRA, &with(&["a:b"])), 0)), (true, 1));
    assert_eq!(state(&answer(run("check", GCRA, &with(&["a:b"])), 0)), (true, 0));
    let denied = answer(run("check", GCRA, &with(&["a:b"])), 3);
    assert_eq!(state(&denied), (false, 0));
    assert!(denied["retry_after_ms"].as_f64().unwrap() > 0.0, "{denied}");
    // Another subject is untouched.
    assert_eq!(state(&answer(run("inspect", GCRA, &with(&["a"])), 0)), (true, 2));

    // inspect consumes nothing, however often, and writes no key.
    assert_eq!(state(&answer(run("inspect", GCRA, &with(&["a:b"])), 0)), (true, 0));
    for _ in 0..3 {
        assert_eq!(state(&answer(run("inspect", GCRA, &with(&["c"])), 0)), (true, 2));
    }
    assert_eq!(state(&answer(run("check", GCRA, &with(&["c"])), 0)), (true, 1));
    assert_eq!(state(&answer(run("check", GCRA, &with(&["a:b"])), 3)), (false, 0));
    let mut keys: Vec<String> = server.cli(&["KEYS", "*"]).lines().map(str::to_owned).collect();
    keys.sort();
    assert_eq!(keys, ["tollgate:{a%3Ab}:gcra", "tollgate:{c}:gcra"]);

    // reset forgets the subject: no key is left, the next check is a first one.
    assert_eq!(state(&answer(run("reset", GCRA, &with(&["a:b"])), 0)), (true, 2));
    assert_eq!(server.cli(&["KEYS", "*"]), "tollgate:{c}:gcra");
    assert_eq!(state(&answer(run("check", GCRA, &with(&["a:b"])), 0)), (true, 1));
}

#[test]
fn a_policy_decides_all_or_nothing_and_names_each_limit() {
    let server = RedisServer::start();
    let url = server.url();
    let args = |extra: &[&'static str]| -> Vec<&str> {
        ["--store", url.as_str(), "--prefix", "ops"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect()
    };
    let first = answer(run("check", POLICY, &args(&["user", "42"])), 0);
    assert_eq!(state(&first), (true, 1), "the daily limit is the most restrictive");
    assert_eq!(state(&first["limits"]["burst"]), (true, 2));
    assert_eq!(state(&first["limits"]["daily"]), (true, 1));
    assert_eq!(
        state(&answer(run("check", POLICY, &args(&["user", "42"])), 0)),
        (true, 0)
    );
    // Denied by the daily limit: the token bucket is not charged.
    let denied = answer(run("check", POLICY, &args(&["user", "42"])), 3);
    assert_eq!(denied["limits"]["burst"]["remaining"], 1, "{denied}");
    let mut keys: Vec<String> = server.cli(&["KEYS", "*"]).lines().map(str::to_owned).collect();
    keys.sort();
    assert_eq!(keys, ["ops:{user:42}:burst", "ops:{user:42}:daily"]);

    let reset = answer(run("reset", POLICY, &args(&["user", "42"])), 0);
    assert_eq!(state(&reset["limits"]["burst"]), (true, 3));
    assert_eq!(state(&reset["limits"]["daily"]), (true, 2));
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[test]
fn bad_arguments_exit_2_naming_what_is_wrong() {
    let cases: &[(&str, &str, &[&str], &str)] = &[
        (
            "check",
            r#"{"algorithm":"gcra","rate":0,"period":"1s","burst":1}"#,
            &["a"],
            "rate",
        ),
        ("inspect", "{", &["a"], "invalid --limit"),
        ("reset", GCRA, &["--store", "etcd://x", "a"], "unknown store"),
        (
            "check",
            GCRA,
            &["--prefix", "p", "a"],
            "--prefix applies only to a Redis store",
        ),
        ("check", GCRA, &[], "SUBJECT"),
        ("check", GCRA, &["--cost", "-1", "a"], "unexpected argument '-1'"),
        ("check", GCRA, &["--cost", "x", "a"], "--cost"),
    ];
    for (command, limit, extra, expected) in cases {
        let output = run(command, limit, extra);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command} {extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{command} {extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    }
}

#[test]
fn help_says_what_the_memory_store_means() {
    for command in ["check", "inspect", "reset"] {
        let output = tollgate(&[command, "--help"]).output().unwrap();
        let help = String::from_utf8(output.stdout).unwrap();
        assert!(output.status.success());
        assert!(help.contains("every command starts from an untouched limit"), "{help}");
    }
}
