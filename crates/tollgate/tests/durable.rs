//! Durable records: a limit that asks for it answers a call that counted
//! only once a replica has what it counted (`WAIT`), or the append-only file
//! (`WAITAOF`); past the store's timeout, a typed error, and the count stays.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use tollgate::{
    Durability, ErrorKind, Limit, Limiter, OnStoreError, Op, Path, Policy, RedisStore, Request, ResilientStore, Store,
    Subject,
};

/// A replica of `master`, once its link is up (polled, with a deadline).
fn replica_of(master: &RedisServer) -> RedisServer {
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof".to_owned(), "127.0.0.1".to_owned(), port]);
    let started = Instant::now();
    while !replica.cli(&["INFO", "replication"]).contains("master_link_status:up") {
        assert!(started.elapsed() < Duration::from_secs(10), "the replica never synced");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Synced is not yet acknowledging: the master counts a replica for WAIT
    // once it has reported its offset.
    while !acknowledges(master) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the replica never acknowledged"
        );
    }
    replica
}

/// A write and a `WAIT 1 100` on one connection to `master` count one replica.
fn acknowledges(master: &RedisServer) -> bool {
    let mut child = std::process::Command::new("redis-cli")
        .args(["-p", &master.port().to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    std::io::Write::write_all(
        child.stdin.as_mut().expect("stdin"),
        b"SET replica-probe 1\nWAIT 1 100\n",
    )
    .expect("write");
    let output = child.wait_with_output().expect("redis-cli ends");
    String::from_utf8_lossy(&output.stdout).lines().last() == Some("1")
}

async fn limiter(master: &RedisServer, durability: Durability) -> Limiter<RedisStore> {
    let store = RedisStore::builder(master.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    // A day's window: a boundary (midnight UTC) passing during a test of a
    // few seconds is far less likely than an hour's.
    let limit = Limit::fixed_window(1_000_000, Duration::from_secs(86_400))
        .unwrap()
        .durable(durability);
    Limiter::new(store, limit)
}

#[test]
fn durable_reads_back_from_json() {
    let limit =
        Limit::from_json(r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"durable":"replicated"}"#).unwrap();
    assert_eq!(limit.durability(), Some(Durability::Replicated));
    assert_eq!(Limit::from_value(limit.to_value()).unwrap(), limit);
    let error =
        Limit::from_json(r#"{"algorithm":"gcra","rate":10,"period":"1s","burst":5,"durable":"yes"}"#).unwrap_err();
    assert!(
        error.to_string().contains("durable: expected \"replicated\""),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_record_answers_once_a_replica_has_it() {
    // The first sync at once, not after the default 5 s.
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay".to_owned(), "0".to_owned()]);
    let mut replica = replica_of(&master);
    let limiter = limiter(&master, Durability::Replicated).await;
    let store = limiter.store().clone();
    let acme = Subject::new("acme");
    let key = store.key(&acme, limiter.policy().limits().next().unwrap().0);
    for used in 1..=20_u64 {
        let decision = limiter.record(&acme, 1_000).await.unwrap();
        assert_eq!(decision.remaining, 1_000_000 - used * 1_000);
        // Answered: the replica has it already.
        let counted = replica.cli(&["GET", &key]);
        assert!(!counted.is_empty(), "the replica does not have record {used}");
    }
    // No replica: the record is counted on the master, but the call is a
    // NotDurable error within the store's timeout.
    replica.stop();
    let started = Instant::now();
    let error = limiter.record(&acme, 1_000).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotDurable, "{error}");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(limiter.peek(&acme).await.unwrap().remaining, 1_000_000 - 21 * 1_000);
    // A peek never waits, a plain limit never waits.
    let plain = Limiter::new(store, Limit::fixed_window(10, Duration::from_secs(60)).unwrap());
    assert!(plain.check(&Subject::new("bob")).await.unwrap().allowed);
}

/// A record counted but not made durable is answered by each failure
/// policy, and is no fault of the store's: the breaker stays closed, so
/// limits that ask for no durability are decided by the store throughout.
#[tokio::test]
async fn a_record_not_made_durable_takes_the_failure_policy_not_the_breaker() {
    let master = RedisServer::start();
    let redis = limiter(&master, Durability::Replicated).await;
    let (durable, inner) = (redis.policy().clone(), redis.store().clone());
    // A sliding log: no window boundary can pass during the test and refill it.
    let plain = Policy::single(Limit::sliding_log(100, Duration::from_secs(3_600)).unwrap());
    let record = Request::new(Op::Record, 10);
    let mut counted = 0;
    for on_error in [
        OnStoreError::Error,
        OnStoreError::Open,
        OnStoreError::Closed,
        OnStoreError::Local,
    ] {
        // The deadline is the store's timeout, as serve sets them: the wait
        // ends inside it, "not durable".
        let store = ResilientStore::builder(inner.clone())
            .on_error(on_error)
            .timeout(Duration::from_millis(300))
            .build();
        let bob = Subject::new(format!("bob-{on_error:?}"));
        for round in 0..10 {
            let answer = store.decide(&Subject::new("acme"), &durable, &record).await;
            counted += 10;
            match on_error {
                OnStoreError::Error => assert_eq!(answer.unwrap_err().kind(), ErrorKind::NotDurable),
                OnStoreError::Open => assert!(answer.unwrap().decision.allowed),
                OnStoreError::Closed => assert!(!answer.unwrap().decision.allowed),
                OnStoreError::Local => assert_eq!(answer.unwrap().path, Path::Local),
                other => panic!("no case for {other:?}"),
            }
            let outcome = store.decide(&bob, &plain, &Request::new(Op::Check, 1)).await.unwrap();
            assert_eq!(outcome.path, Path::Store, "{on_error:?}, round {round}");
            assert_eq!(outcome.decision.remaining, 99 - round);
        }
        assert_eq!(store.stats().breaker_opened, 0, "{on_error:?}");
        assert!(!store.stats().breaker_open, "{on_error:?}");
    }
    // Each record was counted on the master all the same.
    let left = redis.peek(&Subject::new("acme")).await.unwrap().remaining;
    assert_eq!(left, 1_000_000 - counted);
}

#[tokio::test]
async fn an_fsynced_record_waits_for_the_append_only_file_where_the_server_has_waitaof() {
    let master = RedisServer::start_with(&["--appendonly".to_owned(), "yes".to_owned()]);
    let limiter = limiter(&master, Durability::Fsynced).await;
    let version = master.cli(&["INFO", "server"]);
    let has_waitaof = !master.cli(&["COMMAND", "INFO", "WAITAOF"]).trim().is_empty();
    let result = limiter.record(&Subject::new("acme"), 5).await;
    if has_waitaof {
        assert_eq!(result.unwrap().remaining, 1_000_000 - 5, "{version}");
    } else {
        let error = result.unwrap_err();
        assert!(error.to_string().contains("needs WAITAOF"), "{error}");
    }
}

/// A failover that loses what the old master had not sent: the replica is
/// cut off (`REPLICAOF NO ONE`, as a partition then a promotion would) while
/// four tasks record on a plain budget and four on a durable one, and the
/// old master is then killed. What the durable tasks saw acknowledged is all
/// on the new master; what the plain ones saw acknowledged after the cut is
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_keeps_every_acknowledged_durable_record() {
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay".to_owned(), "0".to_owned()]);
    let mut master = master;
    let replica = replica_of(&master);
    let durable = limiter(&master, Durability::Replicated).await;
    let plain = Limiter::new(
        durable.store().clone(),
        Limit::fixed_window(1_000_000_000, Duration::from_secs(3600)).unwrap(),
    );
    let (budget, other) = (Subject::new("durable-budget"), Subject::new("plain-budget"));
    let cut = std::sync::Arc::new(tokio::sync::Barrier::new(9));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let (durable, plain, cut) = (durable.clone(), plain.clone(), std::sync::Arc::clone(&cut));
        let (budget, other) = (budget.clone(), other.clone());
        tasks.push(tokio::spawn(async move {
            // (acknowledged before the cut, acknowledged after it)
            let mut acknowledged = (0_u64, 0_u64);
            let mut failures = Vec::new();
            for (phase, records) in [(0, 50), (1, 10)] {
                for _ in 0..records {
                    let answer = if task % 2 == 0 {
                        durable.record(&budget, 100).await
                    } else {
                        plain.record(&other, 100).await
                    };
                    if let Err(error) = &answer {
                        // Reported, not asserted here: a panicking task would
                        // leave the others at the barrier.
                        if !(phase == 1 && error.kind() == ErrorKind::NotDurable) {
                            failures.push(format!("task {task}, phase {phase}: {error}"));
                        }
                    }
                    if answer.is_ok() {
                        if phase == 0 {
                            acknowledged.0 += 100;
                        } else {
                            acknowledged.1 += 100;
                        }
                    }
                }
                if phase == 0 {
                    cut.wait().await;
                    cut.wait().await;
                }
            }
            (task % 2 == 0, acknowledged, failures)
        }));
    }
    // Every task has recorded its first half: cut the replica off, promote it.
    cut.wait().await;
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    cut.wait().await;
    let mut seen = [(0_u64, 0_u64); 2];
    let mut failures = Vec::new();
    for task in tasks {
        let (is_durable, (before, after), failed) = task.await.unwrap();
        failures.extend(failed);
        let side = &mut seen[usize::from(is_durable)];
        side.0 += before;
        side.1 += after;
    }
    assert!(failures.is_empty(), "{failures:#?}");
    master.stop();
    // What the new master holds, as a peek there reads it.
    let promoted = RedisStore::connect(&replica.url()).await.unwrap();
    let held = |limiter: Limiter<RedisStore>, subject: Subject| {
        let on_promoted = Limiter::new(promoted.clone(), limiter.policy().clone());
        async move {
            let peek = on_promoted.peek(&subject).await.unwrap();
            peek.limit - peek.remaining
        }
    };
    let (durable_held, plain_held) = (held(durable, budget).await, held(plain, other).await);
    let [(plain_before, plain_after), (durable_before, durable_after)] = seen;
    // Durable: every acknowledged record is on the new master; none after
    // the cut was acknowledged (no replica to have it).
    assert_eq!(durable_after, 0, "acknowledged without a replica");
    assert!(
        durable_held >= durable_before,
        "lost: {durable_before} acknowledged, {durable_held} held"
    );
    // Plain: what was acknowledged after the cut is gone.
    assert_eq!((plain_before, plain_after), (20_000, 4_000));
    assert_eq!(
        plain_held, plain_before,
        "the plain budget kept what was replicated before the cut"
    );
    eprintln!(
        "failover: durable acknowledged {durable_before}, held {durable_held} (0 lost); \
         plain acknowledged {}, held {plain_held} ({plain_after} lost)",
        plain_before + plain_after
    );
}
