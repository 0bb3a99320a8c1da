//! The Redis store against real `redis-server` processes: conformance, the
//! differential test against the memory store, keys and expiry, faults.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Limit, Op, Policy, RedisStore, Request, Store, Subject, Timestamp};

use common::differential::{any_policies_sharing_names, any_policy, any_steps, memory_and_store_agree, micros, StepOp};
use common::redis_server::RedisServer;

static PREFIXES: AtomicUsize = AtomicUsize::new(0);

/// A store on `server` with a prefix no other store of this process uses.
async fn store(server: &RedisServer) -> RedisStore {
    let prefix = format!("t{}", PREFIXES.fetch_add(1, Ordering::Relaxed));
    RedisStore::builder(server.url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect")
}

#[tokio::test]
async fn redis_store_conforms() {
    let server = RedisServer::start();
    common::conformance::run_all(|| store(&server)).await;
}

/// The server's clock (`TIME`), µs since the epoch.
fn server_time(server: &RedisServer) -> u64 {
    let time = server.cli(&["TIME"]);
    let mut parts = time
        .lines()
        .map(|part| part.trim().parse::<u64>().expect("TIME answers numbers"));
    let (seconds, micros) = (parts.next().unwrap(), parts.next().unwrap());
    seconds * 1_000_000 + micros
}

#[tokio::test]
async fn decides_on_server_time_by_default() {
    let server = RedisServer::start();
    let store = store(&server).await;
    // A relative limit: no window boundary for the run to cross.
    let limiter = tollgate::Limiter::new(store.clone(), Limit::sliding_log(2, Duration::from_secs(3600)).unwrap());
    let subject = Subject::new("clock");
    assert!(limiter.check(&subject).await.unwrap().allowed);
    assert!(limiter.check(&subject).await.unwrap().allowed);
    let third = limiter.check(&subject).await.unwrap();
    assert!(!third.allowed);
    let retry = third.retry_after.unwrap();
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(3600),
        "{retry:?}"
    );

    // An aligned window ends on a multiple of the window in the server's
    // time, wherever in the hour the test runs: some instant between two
    // readings of the server's clock, plus reset_after, is a whole hour.
    let hour = 3_600_000_000;
    let hourly = tollgate::Limiter::new(store, Limit::fixed_window(2, Duration::from_secs(3600)).unwrap());
    let before = server_time(&server);
    let decision = hourly.check(&Subject::new("aligned")).await.unwrap();
    let after = server_time(&server);
    let reset = u64::try_from(decision.reset_after.as_micros()).unwrap();
    let end = (before + reset).div_ceil(hour) * hour;
    assert!(
        end <= after + reset,
        "no window end in [{before}, {after}] + {reset} us"
    );
}

#[tokio::test]
async fn a_caller_clock_replaces_the_server_time() {
    let server = RedisServer::start();
    // Noon UTC: a day window has 12 hours to go, whenever the test runs.
    let noon = 1_699_963_200 * 1_000_000;
    let clock = tollgate::ManualClock::new(Timestamp::from_micros(noon));
    let store = RedisStore::builder(server.url())
        .prefix("manual")
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let day = Duration::from_secs(86_400);
    let limiter = tollgate::Limiter::new(store, Limit::fixed_window(2, day).unwrap());
    let subject = Subject::new("a");
    let first = limiter.check(&subject).await.unwrap();
    assert_eq!((first.allowed, first.remaining), (true, 1));
    assert_eq!(first.reset_after, day / 2);
    assert!(limiter.check(&subject).await.unwrap().allowed);
    let denied = limiter.check(&subject).await.unwrap();
    assert_eq!(denied.retry_after, Some(day / 2));
    // A request's own `now` still wins over the store's clock.
    let request = Request::new(Op::Check, 0).at(Timestamp::from_micros(noon + 86_400_000_000));
    let next_day = limiter
        .store()
        .decide(&subject, limiter.policy(), &request)
        .await
        .unwrap();
    assert_eq!(next_day.decision.remaining, 2);
    // The clock moves, and the next window begins.
    clock.advance(day / 2);
    assert_eq!(limiter.check(&subject).await.unwrap().remaining, 1);
}

// --- The differential test: memory and Redis decide identically. ---------

/// Replays `cases` traces through a memory store and through Redis, each
/// step deciding by one of the trace's policies, and compares every answer.
fn memory_and_redis_agree(cases: u32, policies: impl Strategy<Value = Vec<Policy>>, label: &str) {
    let server = RedisServer::start();
    let runtime = common::runtime();
    let redis = runtime.block_on(store(&server));
    memory_and_store_agree(
        &runtime,
        &redis,
        cases,
        policies,
        label,
        "tests/redis_store.proptest-regressions",
    );
}

#[test]
fn redis_decides_exactly_as_memory() {
    memory_and_redis_agree(300, any_policy().prop_map(|policy| vec![policy]), "one");
}

/// The same across policies that share limit names: one state per
/// `(subject, name)` whichever policy decides it, and a limit redefined with
/// another algorithm starting afresh, in both stores alike.
#[test]
fn redis_decides_exactly_as_memory_across_policies() {
    memory_and_redis_agree(200, any_policies_sharing_names().prop_map(Vec::from), "shared");
}

// --- Keys and expiry. -----------------------------------------------------

/// Every key a trace writes has a TTL, never longer than its state's
/// information and never shorter, so no key outlives its use.
#[test]
fn every_key_expires_when_its_state_stops_mattering() {
    let server = RedisServer::start();
    let runtime = common::runtime();
    let redis = runtime.block_on(store(&server));
    let cases = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: 60,
        ..ProptestConfig::default()
    };
    proptest!(config, |(policy in any_policy(), steps in any_steps())| {
        let case = cases.fetch_add(1, Ordering::Relaxed);
        let subjects = [Subject::new("ttl").and(case), Subject::new("ttl").and(case).and(1)];
        // Server time, so that Redis's own expiry and the decisions share a clock.
        let mut longest = Duration::ZERO;
        for step in &steps {
            let subject = &subjects[usize::from(step.key)];
            let op = match step.op {
                StepOp::Acquire(lease) => Op::Acquire { lease: format!("lease-{lease}"), max_wait: None },
                StepOp::Release(lease) => Op::Release { lease: format!("lease-{lease}") },
                StepOp::Reserve(max_wait) => Op::Reserve { max_wait: max_wait.map(micros) },
                StepOp::Record => Op::Record,
                _ => Op::Check,
            };
            if let Ok(outcome) = runtime.block_on(redis.decide(subject, &policy, &Request::new(op, step.cost))) {
                let decisions = if outcome.limits.is_empty() { vec![outcome.decision] } else { outcome.limits.into_iter().map(|(_, d)| d).collect() };
                for decision in decisions {
                    longest = longest.max(decision.reset_after);
                }
            }
        }
        let pattern = format!("{}:{{ttl:{case}*", redis.prefix());
        let keys = server.cli(&["--scan", "--pattern", &pattern]);
        for key in keys.lines().filter(|key| !key.is_empty()) {
            let ttl: i64 = server.cli(&["PTTL", key]).parse().unwrap();
            // -1 is a key without TTL; -2 one that expired since the scan.
            prop_assert!(ttl != -1, "key {} has no TTL", key);
            let longest_ms = i64::try_from(longest.as_micros().div_ceil(1_000)).unwrap();
            prop_assert!(ttl <= longest_ms, "key {} lives {} ms, past the longest reset_after {:?}", key, ttl, longest);
        }
    });
}

#[tokio::test]
async fn keys_follow_the_documented_layout() {
    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url()).prefix("app").connect().await.unwrap();
    // 10 an hour: one admission keeps its state for 6 minutes, longer than
    // any run of the checks below.
    let policy = Policy::new([("per_second", Limit::gcra(10, Duration::from_secs(3_600), 5).unwrap())]).unwrap();
    let subject = Subject::new("203.0.113.7").and("/login");
    redis
        .decide(&subject, &policy, &Request::new(Op::Check, 1))
        .await
        .unwrap();
    let keys = server.cli(&["--scan", "--pattern", "app:*"]);
    assert_eq!(keys, "app:{203.0.113.7:/login}:per_second");
    assert_eq!(redis.key(&subject, "per_second"), keys);
    // A GCRA state is one integer, the TAT, with an expiry.
    assert_eq!(server.cli(&["TYPE", &keys]), "string");
    assert!(server.cli(&["GET", &keys]).parse::<u64>().is_ok());
    assert!(server.cli(&["PTTL", &keys]).parse::<u64>().is_ok());
}

/// A GCRA state is an integer Redis stores as one (`OBJECT ENCODING` int,
/// the size of a bare timestamp), whether or not its TAT carries a fraction
/// of a microsecond; beyond 1 000 ticks a microsecond the fraction is
/// written after a colon. Each is read back exactly.
#[tokio::test]
async fn gcra_states_are_integers() {
    let server = RedisServer::start();
    let redis = store(&server).await;
    let subject = Subject::new("encoded");
    let t0 = common::conformance::T0;
    for (name, rate, integer) in [
        ("whole", 10, true),         // 100 000 µs a cell
        ("thirds", 3, true),         // 333 333⅓ µs
        ("thousandths", 999, true),  // 1 001.001… µs: 999 ticks a µs
        ("finer", 1_000_003, false), // 1 000 003 ticks a µs
    ] {
        let limit = Limit::gcra(rate, Duration::from_secs(1), 2).unwrap();
        let limiter = tollgate::Limiter::new(redis.clone(), Policy::new([(name, limit)]).unwrap());
        let at = |micros| Request::new(Op::Check, 1).at(Timestamp::from_micros(t0 + micros));
        assert_eq!(
            limiter.decide(&subject, &at(0)).await.unwrap().decision.remaining,
            1,
            "{name}"
        );
        let key = redis.key(&subject, name);
        let value = server.cli(&["GET", &key]);
        let encoding = server.cli(&["OBJECT", "ENCODING", &key]);
        assert_eq!(encoding == "int", integer, "{name}: {value} is {encoding}");
        assert_eq!(value.contains(':'), !integer, "{name}: {value}");
        // Read back at the same instant: the second cell fits, a third only
        // after its retry_after.
        assert!(
            limiter.decide(&subject, &at(0)).await.unwrap().decision.allowed,
            "{name}"
        );
        let denied = limiter.decide(&subject, &at(0)).await.unwrap().decision;
        assert!(!denied.allowed, "{name}");
        let wait = u64::try_from(denied.retry_after.unwrap().as_micros()).unwrap();
        assert!(
            !limiter.decide(&subject, &at(wait - 1)).await.unwrap().decision.allowed,
            "{name}"
        );
        assert!(
            limiter.decide(&subject, &at(wait)).await.unwrap().decision.allowed,
            "{name}"
        );
    }
}

// --- Faults and errors. ---------------------------------------------------

/// A library or script the server lost (FUNCTION FLUSH on Redis 7+ and
/// Valkey, SCRIPT FLUSH before) is loaded again and the decision repeated.
#[tokio::test]
async fn a_flushed_library_is_loaded_again() {
    let server = RedisServer::start();
    let limiter = tollgate::Limiter::new(
        store(&server).await,
        Limit::gcra(100, Duration::from_secs(1), 100).unwrap(),
    );
    let subject = Subject::new("flush");
    let at = Request::new(Op::Check, 1).at(Timestamp::from_micros(common::conformance::T0));
    assert!(limiter.decide(&subject, &at).await.unwrap().decision.allowed);
    let functions = server.cli(&["FUNCTION", "LIST"]);
    let has_functions = !functions.contains("unknown command");
    if has_functions {
        assert!(
            functions.contains("tollgate_"),
            "the library is a function library: {functions}"
        );
        assert_eq!(server.cli(&["FUNCTION", "FLUSH"]), "OK");
    }
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    let outcome = limiter
        .decide(&subject, &at)
        .await
        .expect("the library is loaded again");
    assert_eq!(outcome.decision.remaining, 98);
    if has_functions {
        assert!(server.cli(&["FUNCTION", "LIST"]).contains("tollgate_"));
    }
}

/// Calls of one command since the last CONFIG RESETSTAT: FCALL, or EVALSHA
/// on servers without functions.
fn library_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    ["cmdstat_fcall:", "cmdstat_evalsha:"]
        .iter()
        .filter_map(|prefix| stats.lines().find(|line| line.starts_with(prefix)))
        .filter_map(|line| line.split([':', ',']).find_map(|part| part.strip_prefix("calls=")))
        .map(|calls| calls.trim().parse::<u64>().unwrap())
        .sum()
}

/// Decisions started together go to Redis in fewer calls than there are
/// decisions, and each is still decided on its own, exactly: a log of 50 an
/// hour admits 50 of 100, each seeing a different `remaining`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_share_calls_and_stay_exact() {
    let server = RedisServer::start();
    let limiter = tollgate::Limiter::new(
        store(&server).await,
        Limit::sliding_log(50, Duration::from_secs(3_600)).unwrap(),
    );
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    let subject = Subject::new("batched");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (limiter, subject) = (limiter.clone(), subject.clone());
            tokio::spawn(async move { limiter.check(&subject).await.unwrap() })
        })
        .collect();
    let mut remaining = Vec::new();
    for task in tasks {
        let decision = task.await.unwrap();
        if decision.allowed {
            remaining.push(decision.remaining);
        }
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (0..50).collect::<Vec<u64>>());
    let calls = library_calls(&server);
    assert!(calls < 100, "100 decisions took {calls} calls");
}

/// Settlements of one subject that arrive while one of its refunds is under
/// way go to Redis as one refund of their summed cost: 100 settlements at
/// once take 2 refund calls (the first, then all the others), and every
/// unit they give back comes back; a sliding log's refunds (entries of
/// their own) still go one by one. (Batching off: each decision a call.)
#[tokio::test]
async fn concurrent_settlements_of_a_subject_go_as_one_refund() {
    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url()).max_batch(1).connect().await.unwrap();
    let hour = Duration::from_secs(3_600);
    // The buckets refill over a year (one unit every 315 s): on the real
    // clock nothing comes back during the test but the refunds (over an
    // hour, a unit every 36 ms did, and the count was one off).
    let year = Duration::from_secs(365 * 86_400);
    for (limit, refund_calls) in [
        (Limit::fixed_window(100_000, hour).unwrap(), 2),
        (Limit::token_bucket(100_000, 100_000, year).unwrap(), 2),
        (Limit::gcra(100_000, year, 100_000).unwrap(), 2),
        (Limit::sliding_log(100_000, hour).unwrap(), 100),
    ] {
        let name = limit.algorithm();
        let limiter = tollgate::Limiter::new(redis.clone(), limit);
        let subject = Subject::new("settle-together").and(name);
        let mut settlements = Vec::new();
        for _ in 0..100 {
            match limiter.estimate(&subject, 100).await.unwrap() {
                tollgate::Estimated::Admitted(settlement) => settlements.push(settlement),
                tollgate::Estimated::Denied(_) => panic!("{name}: 100 × 100 fit in 100 000"),
            }
        }
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
        // Polled together by one task: the first settlement's refund is
        // under way while each of the others arrives.
        let settled = futures_util::future::join_all(
            settlements
                .into_iter()
                .enumerate()
                .map(|(i, settlement)| settlement.settle(u64::try_from(i % 10).unwrap())),
        )
        .await;
        assert!(settled.iter().all(Result::is_ok), "{name}: {settled:?}");
        assert_eq!(library_calls(&server), refund_calls, "{name}: refund calls");
        // Each used i % 10 of its 100: 100 × 4.5 used in all.
        assert_eq!(
            limiter.peek(&subject).await.unwrap().remaining,
            100_000 - 450,
            "{name}: every unused unit came back"
        );
    }
}

/// With batching off, every decision is a call of its own.
#[tokio::test]
async fn max_batch_one_sends_each_decision_alone() {
    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url()).max_batch(1).connect().await.unwrap();
    let limiter = tollgate::Limiter::new(redis, Limit::gcra(1_000, Duration::from_secs(1), 1_000).unwrap());
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]), "OK");
    for key in 0..10 {
        assert!(limiter.check(&Subject::new("alone").and(key)).await.unwrap().allowed);
    }
    assert_eq!(library_calls(&server), 10);
}

#[tokio::test]
async fn a_stopped_server_is_a_typed_error_and_recovery_is_automatic() {
    let mut server = RedisServer::start();
    let redis = RedisStore::builder(server.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let limiter = tollgate::Limiter::new(redis, Limit::fixed_window(1_000, Duration::from_secs(60)).unwrap());
    let subject = Subject::new("outage");
    assert!(limiter.check(&subject).await.unwrap().allowed);

    server.stop();
    let error = limiter.check(&subject).await.expect_err("redis is down");
    assert!(error.is_transient(), "{error}");

    server.restart();
    // The connection comes back by itself: keep asking, as callers would.
    // (The deadline only keeps a broken reconnection from hanging the run.)
    let recovered = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match limiter.check(&subject).await {
                Ok(decision) => break decision,
                Err(error) => {
                    assert!(error.is_transient(), "{error}");
                    tokio::task::yield_now().await;
                }
            }
        }
    })
    .await
    .expect("the store reconnects by itself");
    assert!(recovered.allowed);
}

#[tokio::test]
async fn connection_errors_are_clear() {
    // Nothing listens on the port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let error = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().starts_with("redis:"), "{error}");

    // Not a URL.
    let error = RedisStore::connect("http://example").await.unwrap_err();
    assert!(error.is_invalid(), "{error}");
    assert!(error.to_string().contains("invalid redis url"), "{error}");

    // A bad prefix.
    let error = RedisStore::builder("redis://127.0.0.1:1")
        .prefix("a{b")
        .connect()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("key prefix"), "{error}");
}

#[tokio::test]
async fn a_server_that_is_not_redis_is_an_error_not_a_hang() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let error = RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(!error.is_invalid(), "{error}");
    fake.abort();
}

#[tokio::test]
async fn passwords_and_acl_users() {
    let server = RedisServer::start();
    assert_eq!(
        server.cli(&["ACL", "SETUSER", "limiter", "on", ">s3cret", "~*", "+@all"]),
        "OK"
    );
    let port = server.port();
    let good = RedisStore::connect(&format!("redis://limiter:s3cret@127.0.0.1:{port}/2"))
        .await
        .unwrap();
    let limiter = tollgate::Limiter::new(good, Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    assert!(limiter.check(&Subject::new("acl")).await.unwrap().allowed);
    // The database number is honoured.
    assert_eq!(server.cli(&["-n", "2", "DBSIZE"]), "1");

    let error = RedisStore::connect(&format!("redis://limiter:wrong@127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("authentication failed"), "{error}");
}

#[tokio::test]
async fn a_key_of_another_type_is_a_clear_error() {
    let server = RedisServer::start();
    let redis = RedisStore::builder(server.url())
        .prefix("other")
        .connect()
        .await
        .unwrap();
    let subject = Subject::new("taken");
    assert_eq!(server.cli(&["SET", &redis.key(&subject, "gcra"), "hello"]), "OK");
    let limiter = tollgate::Limiter::new(redis, Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    let error = limiter.check(&subject).await.unwrap_err();
    assert!(error.to_string().contains("another type"), "{error}");
}

/// A server that asks for a client certificate (`tls-auth-clients yes`, as
/// the `REDIS_TLS_CLIENT_CERT` of envoyproxy/ratelimit's environment serves).
#[tokio::test]
async fn tls_with_a_client_certificate() {
    let (server, ca, cert, key) = RedisServer::start_mutual_tls();
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let redis = RedisStore::builder(url.as_str())
        .tls_root_certificate(ca.clone())
        .tls_client_certificate(cert, key)
        .connect()
        .await
        .unwrap();
    let limiter = tollgate::Limiter::new(redis, Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    assert!(limiter.check(&Subject::new("mutual")).await.unwrap().allowed);
    // Without one, the server refuses the connection.
    let error = RedisStore::builder(url.as_str())
        .tls_root_certificate(ca)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(error.to_string().starts_with("redis:"), "{error}");
}

#[tokio::test]
async fn tls_with_a_private_ca() {
    let (server, ca) = RedisServer::start_tls();
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let redis = RedisStore::builder(url.as_str())
        .tls_root_certificate(ca)
        .connect()
        .await
        .unwrap();
    let limiter = tollgate::Limiter::new(redis, Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    assert!(limiter.check(&Subject::new("tls")).await.unwrap().allowed);
    assert!(!limiter.check(&Subject::new("tls")).await.unwrap().allowed);
    // Without the CA the server's certificate is not trusted.
    let error = RedisStore::builder(url.as_str())
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(error.to_string().starts_with("redis:"), "{error}");
}
