//! Several `tollgate bench` processes loading one limit in one Redis at once:
//! the admissions of all of them together never exceed what the limit allows
//! over the span of the run, and come close to it.
//!
//! Each process reports the server's `TIME` just before its first request
//! and just after its last answer; every decision of every process was taken
//! at a server instant inside `[S, E]`, the earliest start to the latest end.
//! Each algorithm's exact bound over `[S, E]` (µs) is the one its module
//! documents:
//!
//! - fixed window: `limit` per aligned window touched,
//!   `limit · (⌊E/window⌋ − ⌊S/window⌋ + 1)`;
//! - sliding log: any `[t, t + window)` admits `limit`, and `[S, E]` is
//!   covered by `⌈(E − S + 1)/window⌉` of them;
//! - token bucket (smooth): `capacity + ⌊refill · (E − S)/interval⌋`;
//! - GCRA: `burst + ⌊rate · (E − S)/period⌋`;
//! - concurrency, each lease held `H` before its release: at every moment at
//!   most `limit` leases are in flight, so the leases split into `limit`
//!   chains of leases that do not overlap (interval graphs are perfect); in a
//!   chain consecutive admissions are at least `H` apart, so a chain holds at
//!   most `⌊(E − S)/H⌋ + 1` admissions, and all of them `limit` times that.
//!
//! The tests also require at least half of the bound, so a limiter that
//! admitted nothing would fail too. The counts are printed (`--nocapture`).
//!
//! With `TOLLGATE_LOAD_MODULE=1` every server loads Tollgate's module and the
//! processes demand it (`?engine=module`), so the module decides every
//! algorithm; otherwise the Lua library does. Each process reports the
//! engine that decided, and the tests check it.

mod common;

use std::process::{Child, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use common::redis_cluster::RedisCluster;
use common::redis_server::{module_everywhere, RedisServer};
use common::tollgate;
use serde_json::Value;

const PROCESSES: usize = 4;
const TASKS: &str = "64";
const DURATION: &str = "2s";

/// How a limit's bound over `[start, end]` (server µs) is computed.
#[derive(Debug, Clone, Copy)]
enum Bound {
    FixedWindow { limit: u64, window: u64 },
    SlidingWindow { limit: u64, window: u64 },
    SlidingLog { limit: u64, window: u64 },
    TokenBucket { capacity: u64, refill: u64, interval: u64 },
    Gcra { burst: u64, rate: u64, period: u64 },
    Concurrency { limit: u64, hold: u64 },
}

impl Bound {
    fn over(self, start: u64, end: u64) -> u64 {
        let span = end - start;
        match self {
            Self::FixedWindow { limit, window } => limit * (end / window - start / window + 1),
            // Any `[t, t + window]` counts at most `limit` (the oldest
            // bucket is counted whole).
            Self::SlidingWindow { limit, window } => limit * (span + 1).div_ceil(window + 1),
            Self::SlidingLog { limit, window } => limit * (span + 1).div_ceil(window),
            Self::TokenBucket {
                capacity,
                refill,
                interval,
            } => capacity + refill * span / interval,
            Self::Gcra { burst, rate, period } => burst + rate * span / period,
            Self::Concurrency { limit, hold } => limit * (span / hold + 1),
        }
    }
}

/// The engine the processes must report, which the store URL's `?engine=`
/// demands: the module when the harness loads it into every server
/// (`TOLLGATE_LOAD_MODULE=1`), the Lua library otherwise. `auto` would not
/// do: beside the module, the library still decides sliding logs and
/// concurrency limits.
fn engine() -> &'static str {
    if module_everywhere() {
        "module"
    } else {
        "lua"
    }
}

/// `url` with the query that demands [`engine`].
fn with_engine(url: &str) -> String {
    format!("{url}?engine={}", engine())
}

/// What the processes of one scenario reported.
struct Run {
    allowed: Vec<u64>,
    requests: u64,
    /// Decisions (allowed and denied) and the store calls they took.
    decisions: u64,
    calls: u64,
    start: u64,
    end: u64,
}

/// Starts the processes together, waits for all, and adds up their reports.
fn run(url: &str, prefix: &str, limit: &str, extra: &[&str]) -> Run {
    let mut args = vec!["--tasks", TASKS, "--duration", DURATION];
    args.extend_from_slice(extra);
    let mut run = Run {
        allowed: Vec::new(),
        requests: 0,
        decisions: 0,
        calls: 0,
        start: u64::MAX,
        end: 0,
    };
    for summary in bench_together(url, prefix, limit, &args) {
        let field = |name: &str| summary[name].as_u64().unwrap_or_else(|| panic!("{name} in {summary}"));
        run.allowed.push(field("allowed"));
        run.requests += field("requests");
        run.decisions += field("allowed") + field("denied");
        run.calls += field("store_calls");
        run.start = run.start.min(field("server_time_start_us"));
        run.end = run.end.max(field("server_time_end_us"));
    }
    run
}

/// Runs [`PROCESSES`] `tollgate bench` processes at once on one key of
/// `limit` at `url`, with `args`; their JSON summaries, each checked for
/// no errors and the engine [`engine`] demands.
fn bench_together(url: &str, prefix: &str, limit: &str, args: &[&str]) -> Vec<Value> {
    let children: Vec<Child> = (0..PROCESSES)
        .map(|_| {
            tollgate(&["bench", "--store", url, "--prefix", prefix, "--limit", limit])
                .args(["--keys", "1", "--json", "--quiet"])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the tollgate binary starts")
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(output.status.success(), "exit {:?}: {stderr}", output.status);
            let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(summary["errors"], 0, "{summary}");
            assert_eq!(summary["engine"], engine(), "{summary}");
            summary
        })
        .collect()
}

/// Runs one scenario and checks `bound/2 <= Σ allowed <= bound`.
fn scenario(url: &str, name: &str, limit: &str, bound: Bound, extra: &[&str]) {
    let run = run(url, &format!("concurrency-{name}"), limit, extra);
    let allowed: u64 = run.allowed.iter().sum();
    let bound = bound.over(run.start, run.end);
    println!(
        "{name}: allowed {allowed} = {:?} of {} requests, over {} us; bound {bound} ({:.1}%)",
        run.allowed,
        run.requests,
        run.end - run.start,
        100.0 * allowed as f64 / bound as f64
    );
    assert!(
        allowed <= bound,
        "{name}: {allowed} admitted over [{}, {}], more than the bound {bound}",
        run.start,
        run.end
    );
    assert!(
        allowed * 2 >= bound,
        "{name}: only {allowed} admitted over [{}, {}], less than half the bound {bound}",
        run.start,
        run.end
    );
}

/// Runs one scenario of a leased limit and checks that the processes
/// together admit at most the bound over `[S − lease, E]` (a unit may be
/// used up to one lease after the store counted it), at least half the
/// bound over `[S, E]`, and that they took far fewer store calls than
/// decisions.
fn leased_scenario(url: &str, name: &str, limit: &str, bound: Bound, lease: u64) {
    let run = run(url, &format!("leased-{name}"), limit, &[]);
    let allowed: u64 = run.allowed.iter().sum();
    let stretched = bound.over(run.start - lease, run.end);
    let unstretched = bound.over(run.start, run.end);
    println!(
        "leased {name}: allowed {allowed} = {:?} of {} requests, over {} us; bound {unstretched}, stretched by the lease {stretched}",
        run.allowed,
        run.requests,
        run.end - run.start,
    );
    assert!(
        allowed <= stretched,
        "{name}: {allowed} admitted over [{}, {}], more than the bound stretched by the lease, {stretched}",
        run.start,
        run.end
    );
    assert!(
        allowed * 2 >= unstretched,
        "{name}: only {allowed} admitted, bound {unstretched}"
    );
    assert!(
        run.calls * 10 <= run.decisions,
        "{name}: {} store calls for {} decisions",
        run.calls,
        run.decisions
    );
}

/// One test at a time: both load the machine fully, and the Cluster's
/// failure detection must not mistake a busy node for a dead one.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn processes_sharing_a_limit_never_exceed_its_bound() {
    let _serial = one_at_a_time();
    let began = Instant::now();
    let redis = RedisServer::start();
    let server = &with_engine(&redis.url());
    scenario(
        server,
        "fixed_window",
        r#"{"algorithm":"fixed_window","limit":50,"window":"500ms"}"#,
        Bound::FixedWindow {
            limit: 50,
            window: 500_000,
        },
        &[],
    );
    scenario(
        server,
        "sliding_log",
        r#"{"algorithm":"sliding_log","limit":50,"window":"500ms"}"#,
        Bound::SlidingLog {
            limit: 50,
            window: 500_000,
        },
        &[],
    );
    scenario(
        server,
        "token_bucket",
        r#"{"algorithm":"token_bucket","capacity":20,"refill":100,"interval":"1s"}"#,
        Bound::TokenBucket {
            capacity: 20,
            refill: 100,
            interval: 1_000_000,
        },
        &[],
    );
    scenario(
        server,
        "gcra",
        r#"{"algorithm":"gcra","rate":100,"period":"1s","burst":20}"#,
        Bound::Gcra {
            burst: 20,
            rate: 100,
            period: 1_000_000,
        },
        &[],
    );
    // Leases are released explicitly after 200 ms; the ttl never ends one
    // within the run.
    scenario(
        server,
        "concurrency",
        r#"{"algorithm":"concurrency","limit":5,"ttl":"10s"}"#,
        Bound::Concurrency {
            limit: 5,
            hold: 200_000,
        },
        &["--op", "acquire", "--hold-ms", "200"],
    );
    println!("all scenarios ({}) in {:.1} s", engine(), began.elapsed().as_secs_f64());
}

/// The same limits with a lease of 20 ms (sliding window included): four
/// processes take blocks of one hot key and hand them out, and together
/// stay within each bound stretched by one lease.
#[test]
fn processes_leasing_a_limit_never_exceed_its_bound_stretched_by_one_lease() {
    let _serial = one_at_a_time();
    let redis = RedisServer::start();
    let server = &with_engine(&redis.url());
    let lease = 20_000;
    for (name, limit, bound) in [
        (
            "fixed_window",
            r#"{"algorithm":"fixed_window","limit":5000,"window":"500ms","lease":"20ms"}"#,
            Bound::FixedWindow {
                limit: 5_000,
                window: 500_000,
            },
        ),
        (
            "sliding_window",
            r#"{"algorithm":"sliding_window","limit":5000,"window":"500ms","buckets":10,"lease":"20ms"}"#,
            Bound::SlidingWindow {
                limit: 5_000,
                window: 500_000,
            },
        ),
        (
            "sliding_log",
            r#"{"algorithm":"sliding_log","limit":500,"window":"500ms","lease":"20ms"}"#,
            Bound::SlidingLog {
                limit: 500,
                window: 500_000,
            },
        ),
        (
            "token_bucket",
            r#"{"algorithm":"token_bucket","capacity":2000,"refill":10000,"interval":"1s","lease":"20ms"}"#,
            Bound::TokenBucket {
                capacity: 2_000,
                refill: 10_000,
                interval: 1_000_000,
            },
        ),
        (
            "gcra",
            r#"{"algorithm":"gcra","rate":10000,"period":"1s","burst":2000,"lease":"20ms"}"#,
            Bound::Gcra {
                burst: 2_000,
                rate: 10_000,
                period: 1_000_000,
            },
        ),
    ] {
        leased_scenario(server, name, limit, bound, lease);
    }
}

/// The same on a Redis Cluster (3 masters, 3 replicas): one subject lives
/// in one slot, on one master, and its limit holds exactly as on one server.
#[test]
fn processes_sharing_a_limit_on_a_cluster_never_exceed_its_bound() {
    let _serial = one_at_a_time();
    let began = Instant::now();
    let nodes = RedisCluster::start();
    let cluster = &with_engine(&nodes.url());
    scenario(
        cluster,
        "cluster_sliding_log",
        r#"{"algorithm":"sliding_log","limit":50,"window":"500ms"}"#,
        Bound::SlidingLog {
            limit: 50,
            window: 500_000,
        },
        &[],
    );
    scenario(
        cluster,
        "cluster_gcra",
        r#"{"algorithm":"gcra","rate":100,"period":"1s","burst":20}"#,
        Bound::Gcra {
            burst: 20,
            rate: 100,
            period: 1_000_000,
        },
        &[],
    );
    scenario(
        cluster,
        "cluster_concurrency",
        r#"{"algorithm":"concurrency","limit":5,"ttl":"10s"}"#,
        Bound::Concurrency {
            limit: 5,
            hold: 200_000,
        },
        &["--op", "acquire", "--hold-ms", "200"],
    );
    println!("all Cluster scenarios in {:.1} s", began.elapsed().as_secs_f64());
}

/// A token budget kept by four processes as a gateway keeps it (a check of
/// 0, then a record of the tokens used, 1 to 20 at random), over one million
/// operations: the store's count is exactly the sum of what the processes
/// recorded, the budget was spent, and the overspend stays within the bound
/// the README states — at most one report per request in flight when the
/// budget ran out (here 4 × 64 tasks, 20 tokens each).
#[test]
fn processes_recording_token_usage_count_every_token() {
    const BUDGET: u64 = 5_000_000;
    const REQUESTS: &str = "200000";
    const TASKS: u64 = 64;
    const MOST: u64 = 20;
    let _serial = one_at_a_time();
    let began = Instant::now();
    let redis = RedisServer::start();
    let url = with_engine(&redis.url());
    // One window for the whole run (windows of 10 years, aligned on the epoch).
    let limit = format!(r#"{{"algorithm":"fixed_window","limit":{BUDGET},"window":"3650d"}}"#);
    let most = MOST.to_string();
    let tasks = TASKS.to_string();
    let args = [
        "--op",
        "check-then-record",
        "--cost",
        "1",
        "--cost-max",
        &most,
        "--tasks",
        &tasks,
        "--requests",
        REQUESTS,
    ];
    let (mut recorded, mut checks, mut admitted) = (0, 0, 0);
    for summary in bench_together(&url, "budget", &limit, &args) {
        let field = |name: &str| summary[name].as_u64().unwrap_or_else(|| panic!("{name} in {summary}"));
        recorded += field("units");
        checks += field("allowed") + field("denied");
        admitted += field("allowed");
    }
    // Every admitted check was followed by a record.
    let operations = checks + admitted;
    let keys = redis.cli(&["--scan", "--pattern", "budget:*"]);
    let keys: Vec<&str> = keys.lines().filter(|key| !key.is_empty()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let value = redis.cli(&["GET", keys[0]]);
    let count: u64 = value.rsplit(':').next().unwrap().trim().parse().unwrap();
    let bound = BUDGET + PROCESSES as u64 * TASKS * MOST;
    println!(
        "budget {BUDGET}: {operations} operations ({checks} checks, {admitted} admitted and recorded), \
         recorded {recorded}, the store holds {count}; bound {bound}; {:?}",
        began.elapsed()
    );
    assert!(operations >= 1_000_000, "{operations} operations");
    assert_eq!(count, recorded, "every recorded token is counted, exactly");
    assert!(count > BUDGET, "the budget was spent ({count} of {BUDGET})");
    assert!(
        count <= bound,
        "overspend {} beyond the bound {}",
        count - BUDGET,
        bound - BUDGET
    );
}
