//! Durable records: a limit that asks for it answers a call that counted
//! only once a replica has what it counted (`WAIT`), or the append-only file
//! (`WAITAOF`); past the store's timeout, a typed error, and the count stays.

mod common;

use std::time::{Duration, Instant};

use common::redis_cluster::RedisCluster;
use common::redis_server::RedisServer;
use tollgate::{
    Durability, ErrorKind, Limit, Limiter, OnStoreError, Op, Path, Policy, RedisStore, Request, ResilientStore, Store,
    Subject,
};

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
    let mut replica = master.start_replica();
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
    let replica = master.start_replica();
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

/// Sequential checks of `plain` on subjects spread over every slot: how
/// long each took.
async fn check_times(plain: &Limiter<RedisStore>, round: &str, count: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(count);
    for index in 0..count {
        let started = Instant::now();
        let decision = plain.check(&Subject::new(format!("{round}-{index}"))).await.unwrap();
        times.push(started.elapsed());
        assert!(decision.allowed);
    }
    times.sort_unstable();
    times
}

fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() * 99).div_ceil(100) - 1]
}

/// Clients blocked (in a `WAIT`) on the cluster's masters.
fn blocked(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|index| {
            let info = cluster.node(index).cli(&["INFO", "clients"]);
            info.lines()
                .find_map(|line| line.strip_prefix("blocked_clients:"))
                .and_then(|count| count.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// On a Cluster, a durable record waits on a connection of its own to the
/// master of its slot: while records wait out their whole timeout (the
/// masters have no replica), plain decisions on the same masters keep their
/// pace (their p99 within 2x, or 10 ms, of their p99 alone), and each record
/// is counted and answered "not durable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_waits_on_a_cluster_hold_up_no_other_decision() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cluster = RedisCluster::start_masters();
    let store = RedisStore::builder(cluster.url())
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let plain = Limiter::new(
        store.clone(),
        Limit::sliding_log(1_000_000, Duration::from_secs(3_600)).unwrap(),
    );
    let durable = Limiter::new(
        store.clone(),
        Limit::fixed_window(1_000_000, Duration::from_secs(86_400))
            .unwrap()
            .durable(Durability::Replicated),
    );
    // Warm: the connection to every master is open.
    check_times(&plain, "warm", 100).await;
    let alone = check_times(&plain, "alone", 400).await;

    let stop = Arc::new(AtomicBool::new(false));
    let recorders: Vec<_> = (0..4)
        .map(|task| {
            let (durable, stop) = (durable.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut waits = Vec::new();
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    let subject = Subject::new(format!("durable-{task}-{round}"));
                    let started = Instant::now();
                    let error = durable.record(&subject, 1).await.unwrap_err();
                    assert_eq!(error.kind(), ErrorKind::NotDurable, "{error}");
                    waits.push(started.elapsed());
                    // Counted all the same.
                    assert_eq!(durable.peek(&subject).await.unwrap().remaining, 999_999);
                    round += 1;
                }
                waits
            })
        })
        .collect();
    // The four are waiting in the masters (clients blocked in WAIT).
    let started = Instant::now();
    while blocked(&cluster) < 4 {
        assert!(started.elapsed() < Duration::from_secs(10), "the records never waited");
        tokio::task::yield_now().await;
    }
    let during = check_times(&plain, "during", 400).await;
    let still_waiting = blocked(&cluster);
    stop.store(true, Ordering::Relaxed);
    let mut waits = Vec::new();
    for recorder in recorders {
        waits.extend(recorder.await.unwrap());
    }
    eprintln!(
        "plain checks on a cluster: alone p99 {:?} max {:?}; while {} durable records waited: p99 {:?} max {:?}",
        p99(&alone),
        alone.last().unwrap(),
        waits.len(),
        p99(&during),
        during.last().unwrap()
    );
    assert!(still_waiting >= 1, "no record was still waiting at the end");
    assert!(
        waits.iter().all(|wait| *wait >= Duration::from_millis(500)),
        "every record waited for a replica: {waits:?}"
    );
    let bound = (p99(&alone) * 2).max(p99(&alone) + Duration::from_millis(10));
    assert!(
        p99(&during) <= bound,
        "plain checks while durable records wait: p99 {:?}, alone {:?}",
        p99(&during),
        p99(&alone)
    );
}

/// On a Cluster whose masters have replicas, a durable record is answered
/// once the replica of its slot's master has it, as on one server, and a
/// record whose slot moved to another master (`MOVED`) follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_record_on_a_cluster_answers_once_the_slots_replica_has_it() {
    let cluster = RedisCluster::start();
    let store = RedisStore::builder(cluster.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let durable = Limiter::new(
        store.clone(),
        Limit::fixed_window(1_000_000, Duration::from_secs(86_400))
            .unwrap()
            .durable(Durability::Replicated),
    );
    let record_all = |round: &'static str| {
        let durable = durable.clone();
        async move {
            for index in 0..100 {
                let subject = Subject::new(format!("{round}-{index}"));
                let decision = durable.record(&subject, 1_000).await.unwrap();
                assert_eq!(decision.remaining, 1_000_000 - 1_000, "{round}-{index}");
            }
        }
    };
    record_all("before").await;
    // Each master's replica has its master's keys.
    for master in cluster.masters() {
        let replica = cluster.replica_of(master);
        assert_eq!(
            cluster.node(master).cli(&["DBSIZE"]),
            cluster.node(replica).cli(&["DBSIZE"]),
            "master {master} and its replica"
        );
    }
    // A third of the first master's slots move to the second: records
    // whose slot moved are redirected, and follow.
    let masters = cluster.masters();
    cluster.reshard(masters[0], masters[1], 2_000);
    record_all("after").await;
    let errors = cluster.node(masters[0]).cli(&["INFO", "errorstats"]);
    assert!(errors.contains("errorstat_MOVED"), "no record was redirected: {errors}");
}
