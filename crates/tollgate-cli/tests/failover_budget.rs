//! Failover with a counter: what a Sentinel failover loses of a token
//! budget that `tollgate serve` keeps in Redis, on a plain rule and on a
//! durable one (`durable: replicated`).
//!
//! A master, its replica and three Sentinels on 127.0.0.1; `tollgate serve`
//! on the master they name (`--redis redis+sentinel://…`, the default
//! failure policy: a store fault is a 503); two rules recording token usage
//! on a monthly budget nothing exhausts. Four `tollgate bench` processes,
//! two per rule, each report 100 tokens per call through `/json` and count
//! the calls answered 200. Midway the master is killed (SIGKILL, by its
//! pid); once the Sentinels have promoted the replica and serve answers from
//! it, what the new master holds is compared with what the clients saw
//! acknowledged: lost = acknowledged − held. Two modes:
//!
//! - **killed**: the master merely dies;
//! - **cut, then killed**: 0.3 s before the kill the replica's link is cut
//!   (a proxy in front of the master, which every client goes through, the
//!   Sentinels and the replica included, drops what the master sends on the
//!   replication connection) while the clients go on.
//!
//! A durable record waits for its replica on a connection of its own, so
//! the plain rule's calls on the same serve are answered throughout, the
//! cut included. A durable rule loses nothing in either mode; a plain rule
//! loses what the master acknowledged and had not sent to the replica (the
//! test checks it does after a cut: the measurement sees a loss).
//!
//! `cargo test` runs each mode once, with 3 s of load (about 15 s in all);
//! the measurement is
//! `TOLLGATE_FAILOVER_RUNS=5 TOLLGATE_FAILOVER_SECS=10 cargo test -p
//! tollgate-cli --test failover_budget -- --nocapture`. Either prints a
//! Markdown table of the figures on stderr.

mod common;

use std::fmt::Write as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::redis_cluster::SentinelSet;
use common::tcp_proxy::TcpProxy;
use common::{tollgate, Serve};
use serde_json::Value;

/// The tokens each call reports.
const TOKENS: u64 = 100;
/// Client processes per rule.
const CLIENTS_PER_RULE: usize = 2;
/// How long before the kill the replica's link is cut.
const CUT_BEFORE_KILL: Duration = Duration::from_millis(300);
/// The longest the failover (promotion, serve answering again) may take.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(60);
/// The descriptor key of each rule; each client sends `<rule>=tokens`.
const RULES: [&str; 2] = ["plain", "durable"];

/// Two rules recording token usage, one of them durable: a budget of 4e9
/// tokens a month, which no run comes near.
const CONFIG: &str = "
domain: llm
descriptors:
  - key: plain
    rate_limit:
      unit: month
      requests_per_unit: 4000000000
      algorithm: {algorithm: fixed_window, limit: 4000000000, calendar: month, overage: record}
  - key: durable
    rate_limit:
      unit: month
      requests_per_unit: 4000000000
      algorithm: {algorithm: fixed_window, limit: 4000000000, calendar: month, overage: record, durable: replicated}
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The master killed.
    Killed,
    /// The replica's link cut, then the master killed.
    CutThenKilled,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Killed => "killed",
            Self::CutThenKilled => "cut, then killed",
        }
    }
}

/// One rule's figures in one run, in tokens.
struct Row {
    rule: &'static str,
    /// Tokens of the calls answered 200.
    acknowledged: u64,
    /// Tokens the new master holds.
    held: u64,
    /// Calls answered otherwise (503 while the master was down, or not
    /// replicated).
    failed_calls: u64,
}

impl Row {
    fn lost(&self) -> u64 {
        self.acknowledged.saturating_sub(self.held)
    }

    /// Held but never acknowledged: calls that counted and were answered
    /// 503 (a durable record not confirmed in time, one cut off by the kill).
    fn unacknowledged(&self) -> u64 {
        self.held.saturating_sub(self.acknowledged)
    }
}

/// One run: its rows and how the failover went.
struct Run {
    number: u64,
    mode: Mode,
    rows: Vec<Row>,
    /// Replication bytes the master had and the replica lacked at the kill.
    lag: u64,
    /// From the kill to the Sentinels naming the replica.
    promoted: Duration,
    /// How the serve answered after the kill.
    serving: Serving,
}

#[test]
fn a_failover_loses_no_acknowledged_durable_token() {
    let runs = setting("TOLLGATE_FAILOVER_RUNS", 1);
    let load = Duration::from_millis(setting("TOLLGATE_FAILOVER_SECS", 3) * 1_000);
    let began = Instant::now();
    let mut done = Vec::new();
    for number in 1..=runs {
        for mode in [Mode::Killed, Mode::CutThenKilled] {
            done.push(run(number, mode, load));
        }
    }
    eprintln!(
        "\n{runs} run(s) of each mode, {load:?} of load each, in {:.0?}:\n\n{}",
        began.elapsed(),
        table(&done)
    );
    for run in &done {
        let durable = run
            .rows
            .iter()
            .find(|row| row.rule == "durable")
            .expect("the durable row");
        let what = format!("run {} ({})", run.number, run.mode.name());
        assert!(durable.acknowledged > 0, "{what}: no durable call answered");
        assert_eq!(durable.lost(), 0, "{what}: acknowledged durable tokens lost");
        if run.mode == Mode::CutThenKilled {
            let plain = run.rows.iter().find(|row| row.rule == "plain").expect("the plain row");
            assert!(plain.lost() > 0, "{what}: the plain rule lost nothing after the cut");
        }
    }
}

/// A positive integer from the environment, else `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .ok()
            .filter(|&value| value > 0)
            .unwrap_or_else(|| panic!("{name}={value}: expected a positive integer"))
    })
}

/// Failover `number` in `mode`, under `load` of load.
fn run(number: u64, mode: Mode, load: Duration) -> Run {
    let mut proxy = None;
    let mut set = SentinelSet::start_fronted(
        "failover",
        &["--repl-diskless-sync-delay".to_owned(), "0".to_owned()],
        |master| {
            let started = TcpProxy::start(master);
            let port = started.port();
            proxy = Some(started);
            port
        },
    );
    let proxy = proxy.expect("the proxy started");
    assert_eq!(set.master_port(), Some(proxy.port()), "the Sentinels name the proxy");
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("llm.yaml");
    std::fs::write(&config, CONFIG).expect("write the configuration");
    let serve = Serve::start_with(&config, &["--redis", &set.url()]);
    let http = serve.http.as_str();

    let started = Instant::now();
    let clients: Vec<(&str, Child)> = RULES
        .iter()
        .flat_map(|&rule| (0..CLIENTS_PER_RULE).map(move |_| rule))
        .map(|rule| (rule, client(http, rule, load)))
        .collect();
    let kill_at = started + load / 2;
    if mode == Mode::CutThenKilled {
        sleep_until(started + (load / 2).saturating_sub(CUT_BEFORE_KILL));
        proxy.cut_replication();
    }
    sleep_until(kill_at);
    // The replica's offset first: the master's only grows meanwhile.
    let received = offset(&set.replica.cli(&["INFO", "replication"]));
    let lag = offset(&set.master.cli(&["INFO", "replication"])).saturating_sub(received);
    set.master.stop();
    let killed = Instant::now();
    let (promoted, serving) = failover(&set, http, killed, started + load);

    let mut rows: Vec<Row> = RULES
        .iter()
        .map(|&rule| Row {
            rule,
            acknowledged: 0,
            held: 0,
            failed_calls: 0,
        })
        .collect();
    for (rule, child) in clients {
        let (acknowledged, failed) = answered(child);
        let row = rows.iter_mut().find(|row| row.rule == rule).expect("a rule's row");
        row.acknowledged += acknowledged;
        row.failed_calls += failed;
    }
    // Every client has ended: the new master's counts are final.
    for row in &mut rows {
        row.held = held(&set, row.rule);
    }
    if mode == Mode::CutThenKilled {
        assert!(lag > 0, "the replica's link was cut, yet it lacked nothing at the kill");
    }
    Run {
        number,
        mode,
        rows,
        lag,
        promoted,
        serving,
    }
}

/// A `tollgate bench` process reporting `TOKENS` tokens per call on `rule`
/// through `/json`, one connection, for `load`.
fn client(http: &str, rule: &str, load: Duration) -> Child {
    tollgate(&[
        "bench",
        "--target",
        &format!("http://{http}"),
        "--request",
        "json",
        "--domain",
        "llm",
        "--descriptor",
        &format!("{rule}=tokens"),
        "--cost",
        &TOKENS.to_string(),
        "--duration",
        &format!("{}ms", load.as_millis()),
        "--threads",
        "1",
        "--json",
        "--quiet",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("the tollgate binary starts")
}

/// The tokens a client saw acknowledged (its calls answered 200, the
/// warm-up call included), and how many of its calls failed.
fn answered(child: Child) -> (u64, u64) {
    let output = child.wait_with_output().expect("the client ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "a client failed: {stderr}");
    let summary: Value = serde_json::from_slice(&output.stdout).expect("the client's JSON summary");
    let field = |name: &str| {
        summary[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in {summary}"))
    };
    assert_eq!(summary["limit_applied"], true, "no rule decided: {summary}");
    assert_eq!(field("over_limit"), 0, "{summary}");
    ((field("ok") + field("warmup_requests")) * TOKENS, field("errors"))
}

/// How the serve answered after the kill: calls of the plain rule (on a
/// subject of their own) sent by the test every 20 ms.
#[derive(Debug, Clone, Copy, Default)]
struct Serving {
    /// From the kill to the first answered 200.
    first: Option<Duration>,
    /// Calls sent after the promotion while the clients still ran, and
    /// those answered 200.
    asked: u32,
    answered: u32,
}

/// Waits for the Sentinels to name the replica and for the serve (at
/// `http`) to answer from it, and goes on asking until `load_ends`;
/// returns the time from `killed` to the promotion, and how the serve
/// answered.
fn failover(set: &SentinelSet, http: &str, killed: Instant, load_ends: Instant) -> (Duration, Serving) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let client = reqwest::Client::new();
    let probe = r#"{"domain":"llm","descriptors":[{"entries":[{"key":"plain","value":"probe"}]}],"hits_addend":1}"#;
    let answers = |http: &str| {
        let request = client
            .post(format!("http://{http}/json"))
            .header("content-type", "application/json")
            .body(probe)
            .timeout(Duration::from_secs(5));
        let status = runtime.block_on(async { request.send().await.map(|response| response.status().as_u16()) });
        matches!(status, Ok(200))
    };
    let mut promoted = None;
    let mut serving = Serving::default();
    loop {
        if promoted.is_none() && set.master_port() == Some(set.replica.port()) {
            promoted = Some(killed.elapsed());
        }
        let loaded = promoted.is_some() && Instant::now() < load_ends;
        if serving.first.is_none() || loaded {
            let answered = answers(http);
            if answered && serving.first.is_none() {
                serving.first = Some(killed.elapsed());
            }
            if loaded {
                serving.asked += 1;
                serving.answered += u32::from(answered);
            }
        }
        if let Some(promoted) = promoted {
            if !loaded && serving.first.is_some() {
                return (promoted, serving);
            }
        }
        assert!(
            killed.elapsed() < FAILOVER_DEADLINE,
            "no failover within {FAILOVER_DEADLINE:?} of the kill (promoted: {promoted:?}, serve: {serving:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The tokens the new master holds for `rule`'s clients: the count of
/// its key (`f<window end>:<count>`, a fixed window).
fn held(set: &SentinelSet, rule: &str) -> u64 {
    let keys = set.replica.cli(&["--scan", "--pattern", &format!("*{rule}*tokens*")]);
    let keys: Vec<&str> = keys.lines().filter(|key| !key.is_empty()).collect();
    assert_eq!(keys.len(), 1, "one key for {rule}: {keys:?}");
    let value = set.replica.cli(&["GET", keys[0]]);
    value
        .strip_prefix('f')
        .and_then(|value| value.rsplit_once(':'))
        .and_then(|(_, count)| count.parse().ok())
        .unwrap_or_else(|| panic!("{}: not a fixed window's count: {value}", keys[0]))
}

/// `master_repl_offset` in an `INFO replication` report (a replica's is
/// what it has received).
fn offset(info: &str) -> u64 {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("master_repl_offset:"))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no master_repl_offset in {info}"))
}

/// Sleeps until `at` (the measurement's own schedule).
fn sleep_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

/// The figures as a Markdown table, then one line per run on the failover.
fn table(runs: &[Run]) -> String {
    let mut out = String::from(
        "| run | mode | rule | acknowledged | held | lost | lost % | held, not acknowledged | failed calls |\n\
         |---:|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        for row in &run.rows {
            let percent = if row.acknowledged == 0 {
                0.0
            } else {
                row.lost() as f64 * 100.0 / row.acknowledged as f64
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {percent:.2} | {} | {} |",
                run.number,
                run.mode.name(),
                row.rule,
                row.acknowledged,
                row.held,
                row.lost(),
                row.unacknowledged(),
                row.failed_calls,
            );
        }
    }
    out.push('\n');
    for run in runs {
        let serving = run.serving;
        let first = serving.first.unwrap_or_default();
        let _ = writeln!(
            out,
            "run {} ({}): replica behind by {} bytes at the kill; promoted after {:.2?}; serve answering after \
             {first:.2?} ({} of {} calls under load after the promotion)",
            run.number,
            run.mode.name(),
            run.lag,
            run.promoted,
            serving.answered,
            serving.asked,
        );
    }
    out
}
