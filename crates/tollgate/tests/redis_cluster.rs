//! The Redis store on a Redis Cluster (3 masters, 3 replicas) and behind
//! Sentinels (a master, a replica, 3 Sentinels), all real processes:
//! conformance and the differential test on the Cluster, exact decisions
//! under concurrency, a resharding and a master's failure mid-run, a
//! Sentinel failover, and which engine a Cluster store picks when only some
//! masters have the module.
//!
//! The tests of this file run one at a time: each starts its own topology,
//! and failure detection (1 s without an answer) must not be set off by
//! several Clusters competing for the CPU.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use proptest::prelude::*;
use tollgate::{Limit, Limiter, Op, Policy, RedisStore, Request, Store as _, Subject, Timestamp};

use common::differential::{any_policies_sharing_names, any_policy, memory_and_store_agree};
use common::redis_cluster::{wait_until, RedisCluster, SentinelSet};
use common::redis_server::module_path;

static PREFIXES: AtomicUsize = AtomicUsize::new(0);

/// One topology at a time (see the module docs).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A store at `url` with a prefix no other store of this process uses.
async fn store(url: &str) -> RedisStore {
    let prefix = format!("c{}", PREFIXES.fetch_add(1, Ordering::Relaxed));
    RedisStore::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect")
}

/// The Lua library's commands: FCALL, or EVALSHA before Redis 7.
const LIBRARY: &[&str] = &["fcall", "evalsha"];

/// The module's command.
const MODULE: &[&str] = &["tollgate.decide"];

/// Calls of `commands` (lowercase, as `INFO commandstats` names them) that
/// node `index` served since its start or the last CONFIG RESETSTAT.
fn calls_on(cluster: &RedisCluster, index: usize, commands: &[&str]) -> u64 {
    let stats = cluster.node(index).cli(&["INFO", "commandstats"]);
    commands
        .iter()
        .filter_map(|command| {
            let prefix = format!("cmdstat_{command}:");
            stats.lines().find(|line| line.starts_with(&prefix))
        })
        .filter_map(|line| line.split([':', ',']).find_map(|part| part.strip_prefix("calls=")))
        .map(|calls| calls.trim().parse::<u64>().unwrap())
        .sum()
}

/// Library calls served by every master since the last CONFIG RESETSTAT.
fn library_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|index| calls_on(cluster, index, LIBRARY))
        .sum()
}

#[test]
fn cluster_store_conforms_and_decides_exactly_as_memory() {
    let _serial = one_at_a_time();
    let cluster = RedisCluster::start();
    let runtime = tollgate_testkit::runtime();
    let url = cluster.url();
    runtime.block_on(common::conformance::run_all(|| store(&url)));
    let redis = runtime.block_on(store(&url));
    memory_and_store_agree(
        &runtime,
        &redis,
        100,
        any_policy().prop_map(|policy| vec![policy]),
        "one",
        "tests/redis_cluster.proptest-regressions",
    );
    memory_and_store_agree(
        &runtime,
        &redis,
        60,
        any_policies_sharing_names().prop_map(Vec::from),
        "shared",
        "tests/redis_cluster.proptest-regressions",
    );
    // The traces wrote to every master: the subjects spread over the slots.
    assert!(cluster.keys_per_master().iter().all(|&keys| keys > 0));
    // An empty subject has no hash tag (`{}`): its limits' keys are hashed
    // whole, into different slots, which one call cannot span.
    let policy = Policy::new([
        ("a", Limit::gcra(1, Duration::from_secs(1), 1).unwrap()),
        ("b", Limit::gcra(1, Duration::from_secs(1), 1).unwrap()),
    ])
    .unwrap();
    let error = runtime
        .block_on(Limiter::new(redis, policy).check(&Subject::new("")))
        .unwrap_err();
    assert!(error.to_string().contains("empty subject"), "{error}");
}

/// The library is loaded on every master at connect; one that loses it (a
/// flush here; a new master in production) gets it again on the next call.
/// A node named with `redis://` answers for its own slots and says to use
/// `redis+cluster://` for the others.
#[test]
fn the_library_is_on_every_master_and_reloaded_when_lost() {
    let _serial = one_at_a_time();
    let cluster = RedisCluster::start();
    let runtime = tollgate_testkit::runtime();
    let limiter = Limiter::new(
        runtime.block_on(store(&cluster.url())),
        Limit::gcra(100, Duration::from_secs(1), 100).unwrap(),
    );
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for &master in &masters {
        let functions = cluster.node(master).cli(&["FUNCTION", "LIST"]);
        assert!(functions.contains("tollgate_"), "master {master}: {functions}");
    }
    for &master in &masters {
        assert_eq!(cluster.node(master).cli(&["FUNCTION", "FLUSH"]), "OK");
    }
    // Subjects on every master decide: each master loaded it again.
    for index in 0..60 {
        let decision = runtime
            .block_on(limiter.check(&Subject::new("reload").and(index)))
            .expect("the library is loaded again");
        assert!(decision.allowed);
    }
    for &master in &masters {
        assert!(cluster.node(master).cli(&["FUNCTION", "LIST"]).contains("tollgate_"));
    }
    // One node named as a single server: the keys of other nodes' slots
    // are a clear error, not a hang or a wrong answer.
    let single = Limiter::new(
        runtime.block_on(store(&cluster.node(masters[0]).url())),
        Limit::gcra(100, Duration::from_secs(1), 100).unwrap(),
    );
    let errors: Vec<String> = (0..30)
        .filter_map(|index| {
            runtime
                .block_on(single.check(&Subject::new("single").and(index)))
                .err()
                .map(|error| error.to_string())
        })
        .collect();
    assert!(!errors.is_empty());
    assert!(
        errors.iter().all(|error| error.contains("use a redis+cluster:// URL")),
        "{errors:?}"
    );
}

/// Decisions land on every master, so a Cluster store takes the module only
/// when every master has it. With one master without it, `engine=auto`
/// picks the Lua library, whose decisions stay exact on every master (that
/// one too), and `engine=module` refuses to connect, saying why. Once that
/// master loads the module, a new store picks it.
#[test]
fn a_cluster_store_takes_the_module_only_when_every_master_has_it() {
    let _serial = one_at_a_time();
    let module = module_path().display().to_string();
    // Node 0 is a master (see `RedisCluster::start_with`); it starts without
    // the module and may load it later. Its replica has the module, as does
    // every other node.
    let cluster = RedisCluster::start_with(|index| {
        if index == 0 {
            vec!["--enable-module-command".into(), "yes".into()]
        } else {
            vec!["--loadmodule".into(), module.clone()]
        }
    });
    assert!(cluster.is_master(0));
    assert!(
        !cluster.node(0).cli(&["MODULE", "LIST"]).contains("tollgate"),
        "node 0 has the module: run this test without TOLLGATE_LOAD_MODULE=1"
    );
    let runtime = tollgate_testkit::runtime();
    let url = cluster.url();

    let lua = runtime.block_on(store(&format!("{url}?engine=auto")));
    assert_eq!(lua.engine(), tollgate::EngineKind::Lua);
    admits_exactly_its_limit(&runtime, &lua, 5);
    for master in cluster.masters() {
        assert!(
            calls_on(&cluster, master, LIBRARY) > 0,
            "master {master} decided nothing"
        );
        assert_eq!(calls_on(&cluster, master, MODULE), 0, "master {master}");
    }
    let error = runtime
        .block_on(RedisStore::builder(format!("{url}?engine=module")).connect())
        .unwrap_err()
        .to_string();
    assert!(error.contains("no tollgate module"), "{error}");

    assert_eq!(cluster.node(0).cli(&["MODULE", "LOAD", &module]), "OK");
    let native = runtime.block_on(store(&url));
    assert_eq!(native.engine(), tollgate::EngineKind::Module);
    admits_exactly_its_limit(&runtime, &native, 5);
    for master in cluster.masters() {
        assert!(
            calls_on(&cluster, master, MODULE) > 0,
            "master {master} decided nothing"
        );
    }
}

/// Checks `limit + 2` times for each of 30 subjects (spread over the slots,
/// so over every master) on a fixed window of `limit`: each admits exactly
/// `limit`.
fn admits_exactly_its_limit(runtime: &tokio::runtime::Runtime, redis: &RedisStore, limit: u64) {
    let policy = Policy::single(Limit::fixed_window(limit, Duration::from_secs(60)).unwrap());
    // Every decision at one instant: the window cannot roll over mid-test.
    let micros = SystemTime::UNIX_EPOCH.elapsed().unwrap().as_micros();
    let check = Request::new(Op::Check, 1).at(Timestamp::from_micros(u64::try_from(micros).unwrap()));
    for index in 0..30 {
        let subject = Subject::new("engine").and(index);
        let allowed = (0..limit + 2)
            .filter(|_| {
                let outcome = runtime.block_on(redis.decide(&subject, &policy, &check));
                outcome.expect("a decision").decision.allowed
            })
            .count();
        assert_eq!(allowed as u64, limit, "subject {index}");
    }
}

/// Many tasks deciding for many subjects at once: the batcher groups them
/// per slot, and every subject admits exactly its limit — no decision is
/// lost or counted twice across slots and masters.
#[test]
fn concurrent_decisions_over_many_subjects_stay_exact() {
    let _serial = one_at_a_time();
    let cluster = RedisCluster::start();
    let runtime = tollgate_testkit::runtime();
    let policy = Policy::new([
        ("per_hour", Limit::sliding_log(7, Duration::from_secs(3_600)).unwrap()),
        (
            "per_minute",
            Limit::fixed_window(1_000, Duration::from_secs(60)).unwrap(),
        ),
    ])
    .unwrap();
    let limiter = Limiter::new(runtime.block_on(store(&cluster.url())), policy);
    for master in cluster.masters() {
        assert_eq!(cluster.node(master).cli(&["CONFIG", "RESETSTAT"]), "OK");
    }
    let (subjects, attempts) = (60, 15);
    let allowed: HashMap<usize, u64> = runtime.block_on(async {
        let tasks: Vec<_> = (0..attempts)
            .flat_map(|_| 0..subjects)
            .map(|index| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let decision = limiter.check(&Subject::new("many").and(index)).await.unwrap();
                    (index, decision.allowed)
                })
            })
            .collect();
        let mut allowed = HashMap::new();
        for task in tasks {
            let (index, admitted) = task.await.unwrap();
            *allowed.entry(index).or_default() += u64::from(admitted);
        }
        allowed
    });
    for index in 0..subjects {
        assert_eq!(allowed[&index], 7, "subject {index}");
    }
    let calls = library_calls(&cluster);
    let decisions = (subjects * attempts) as u64;
    eprintln!("{decisions} decisions over {subjects} subjects took {calls} calls");
    assert!(calls < decisions, "{decisions} decisions took {calls} calls");
    assert!(cluster.keys_per_master().iter().all(|&keys| keys > 0));
}

/// Limits of subjects in different slots: each slot is one call; when one
/// denies, the other gives its unit back (consume, then refund), so a
/// refused decision leaves every limit as it was. Prints how long a refused
/// decision takes, consume to refund: the window in which another caller
/// can see the units taken.
#[test]
fn a_decision_across_slots_is_refunded_when_one_slot_denies() {
    let _serial = one_at_a_time();
    let cluster = RedisCluster::start();
    let runtime = tollgate_testkit::runtime();
    let redis = runtime.block_on(store(&cluster.url()));
    let slot = |subject: &Subject| {
        cluster
            .node(0)
            .cli(&["CLUSTER", "KEYSLOT", &redis.key(subject, "rule")])
    };
    let full = Subject::new("across").and("ip").and("203.0.113.7");
    let other = Subject::new("across").and("user").and("alice");
    assert_ne!(slot(&full), slot(&other), "the test needs two slots");
    let hour = Duration::from_secs(3_600);
    let spread = |cost| {
        let mut rows = tollgate::Spread::builder();
        // A log, not a window aligned on the clock: no window ends mid-test
        // and admits again.
        rows.row(full.clone(), "rule", Limit::sliding_log(1, hour).unwrap(), cost);
        rows.row(other.clone(), "rule", Limit::gcra(10, hour, 10).unwrap(), cost);
        rows.build().unwrap()
    };
    let check = tollgate::Op::Check;
    let (mut latencies, calls) = runtime.block_on(async {
        let first = redis.decide_spread(&spread(1), check.clone()).await.unwrap();
        assert!(first.decision.allowed, "{first:?}");
        for master in cluster.masters() {
            assert_eq!(cluster.node(master).cli(&["CONFIG", "RESETSTAT"]), "OK");
        }
        let mut latencies = Vec::new();
        for _ in 0..200 {
            let started = Instant::now();
            let refused = redis.decide_spread(&spread(1), check.clone()).await.unwrap();
            latencies.push(started.elapsed());
            assert!(!refused.decision.allowed, "{refused:?}");
            assert_eq!(refused.granted, 0);
            assert_eq!(
                refused.limits[1].1.remaining, 9,
                "the other slot reports after its refund"
            );
        }
        let calls = library_calls(&cluster);
        let peek = redis.decide_spread(&spread(0), check.clone()).await.unwrap();
        assert_eq!(peek.limits[0].1.remaining, 0);
        assert_eq!(peek.limits[1].1.remaining, 9, "200 refused decisions took nothing");
        (latencies, calls)
    });
    // Each refused decision: one call per slot, and the refund.
    assert_eq!(calls, 3 * 200);
    latencies.sort();
    let at = |share: usize| latencies[latencies.len() * share / 100 - 1];
    eprintln!(
        "a decision refused across two slots (consume, then refund): p50 {:?}, p99 {:?}, max {:?}",
        at(50),
        at(99),
        latencies[latencies.len() - 1]
    );
}

/// Tasks decide without pause while 1 000 slots move from one master to
/// another (`redis-cli --cluster reshard`): no caller sees an error, and the
/// state moved with its keys (each subject still admits exactly its limit).
#[test]
fn a_resharding_mid_run_raises_no_error() {
    let _serial = one_at_a_time();
    let cluster = RedisCluster::start();
    let runtime = tollgate_testkit::runtime();
    // A slow answer is not what this test is about (a loaded machine can take
    // over a second while slots move): only redirections must not fail a call.
    let redis = runtime.block_on(async {
        RedisStore::builder(cluster.url())
            .prefix(format!("c{}", PREFIXES.fetch_add(1, Ordering::Relaxed)))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect")
    });
    let limiter = Limiter::new(redis, Limit::sliding_log(40, Duration::from_secs(3_600)).unwrap());
    let subjects = 300;
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (limiter, stop, errors) = (limiter.clone(), Arc::clone(&stop), Arc::clone(&errors));
            runtime.spawn(async move {
                let mut tally = vec![(0u64, 0u64); subjects];
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    for index in (worker..subjects).step_by(4) {
                        match limiter.check(&Subject::new("reshard").and(index)).await {
                            Ok(decision) => {
                                tally[index].0 += 1;
                                tally[index].1 += u64::from(decision.allowed);
                            }
                            Err(error) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                eprintln!("round {round}: {error}");
                            }
                        }
                    }
                    round += 1;
                }
                tally
            })
        })
        .collect();
    let masters = cluster.masters();
    let started = Instant::now();
    let output = cluster.reshard(masters[0], masters[1], 1_000);
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut tally = vec![(0u64, 0u64); subjects];
    for worker in workers {
        for (index, (attempts, allowed)) in runtime.block_on(worker).unwrap().into_iter().enumerate() {
            tally[index].0 += attempts;
            tally[index].1 += allowed;
        }
    }
    let decisions: u64 = tally.iter().map(|(attempts, _)| attempts).sum();
    eprintln!("resharding 1000 slots took {took:?}; {decisions} decisions meanwhile");
    assert!(output.contains("Moving slot"), "{output}");
    assert_eq!(errors.load(Ordering::Relaxed), 0, "callers saw errors");
    assert!(decisions > 0);
    // Some of the subjects lived in the slots that moved; all are exact.
    for (index, (attempts, allowed)) in tally.into_iter().enumerate() {
        assert_eq!(allowed, attempts.min(40), "subject {index} after {attempts} attempts");
    }
}

/// What the workers of the failover test share.
#[derive(Default)]
struct Run {
    stop: AtomicBool,
    /// Set once the replica is master.
    promoted: AtomicBool,
    /// Workers that finished a round without error, begun after the promotion.
    clean_after_promotion: AtomicUsize,
    errors: AtomicU64,
    /// Errors raised by calls that began after the promotion.
    errors_after_promotion: AtomicU64,
}

/// One worker of the failover test: decides for its share of the subjects
/// (`worker`, `worker + workers`…) until told to stop; returns what each
/// subject was allowed, and the errors each met.
async fn decide_until_stopped(
    limiter: Limiter<RedisStore>,
    run: Arc<Run>,
    worker: usize,
    workers: usize,
    subjects: usize,
) -> (Vec<u64>, Vec<u64>) {
    let (mut allowed, mut errors) = (vec![0u64; subjects], vec![0u64; subjects]);
    let mut counted = false;
    while !run.stop.load(Ordering::Relaxed) {
        let after_promotion = run.promoted.load(Ordering::Relaxed);
        let mut clean = true;
        for index in (worker..subjects).step_by(workers) {
            match limiter.check(&Subject::new("failover").and(index)).await {
                Ok(decision) => allowed[index] += u64::from(decision.allowed),
                Err(error) => {
                    assert!(error.is_transient(), "{error}");
                    clean = false;
                    run.errors.fetch_add(1, Ordering::Relaxed);
                    errors[index] += 1;
                    if after_promotion {
                        run.errors_after_promotion.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if clean && after_promotion && !counted {
            counted = true;
            run.clean_after_promotion.fetch_add(1, Ordering::Relaxed);
        }
    }
    (allowed, errors)
}

/// A master is killed while 4 tasks decide without pause for 90 subjects
/// spread over the 3 masters: calls fail (typed, transient) until its
/// replica is promoted, then every task completes a round without error.
/// Prints the times, and the admissions beyond the limit that
/// asynchronous replication let through (writes the master acknowledged
/// but had not yet sent to its replica when it died).
#[test]
fn decisions_resume_after_a_master_fails_over() {
    let _serial = one_at_a_time();
    let mut cluster = RedisCluster::start();
    let runtime = tollgate_testkit::runtime();
    let redis = runtime.block_on(async {
        RedisStore::builder(cluster.url())
            .timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    });
    let limit = 30;
    let limiter = Limiter::new(redis, Limit::sliding_log(limit, Duration::from_secs(3_600)).unwrap());
    let subjects = 90;
    let (workers, run) = (4, Arc::new(Run::default()));
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let (limiter, run) = (limiter.clone(), Arc::clone(&run));
            runtime.spawn(decide_until_stopped(limiter, run, worker, workers, subjects))
        })
        .collect();
    // Every subject admitted something before the kill.
    wait_until("a few rounds before the kill", || {
        cluster.keys_per_master().iter().sum::<u64>() == subjects as u64
    });

    let master = cluster.masters()[0];
    let replica = cluster.replica_of(master);
    // The subjects whose key lives on the master about to die.
    let on_master: Vec<usize> = cluster
        .node(master)
        .cli(&["--scan"])
        .lines()
        .filter_map(|key| key.split_once("{failover:")?.1.split_once('}')?.0.parse().ok())
        .collect();
    assert!(!on_master.is_empty());
    cluster.node_mut(master).stop();
    let killed = Instant::now();
    wait_until("the replica's promotion", || cluster.is_master(replica));
    let promoted = killed.elapsed();
    run.promoted.store(true, Ordering::Relaxed);
    wait_until("a clean round of every worker after the promotion", || {
        run.clean_after_promotion.load(Ordering::Relaxed) == workers
    });
    let resumed = killed.elapsed();
    run.stop.store(true, Ordering::Relaxed);
    let (mut allowed, mut errors) = (vec![0u64; subjects], vec![0u64; subjects]);
    for task in tasks {
        let (task_allowed, task_errors) = runtime.block_on(task).unwrap();
        for index in 0..subjects {
            allowed[index] += task_allowed[index];
            errors[index] += task_errors[index];
        }
    }
    let errors_elsewhere: u64 = (0..subjects)
        .filter(|index| !on_master.contains(index))
        .map(|index| errors[index])
        .sum();
    // Take every subject to its limit, and past it.
    for (index, count) in allowed.iter_mut().enumerate() {
        for _ in 0..=limit {
            let decision = runtime
                .block_on(limiter.check(&Subject::new("failover").and(index)))
                .unwrap();
            *count += u64::from(decision.allowed);
        }
    }
    let over: u64 = allowed.iter().map(|&count| count.saturating_sub(limit)).sum();
    let over_subjects = allowed.iter().filter(|&&count| count > limit).count();
    // Fewer than the limit: calls that failed to their caller (a timeout,
    // a dropped connection) but had consumed on the master.
    let under: u64 = allowed.iter().map(|&count| limit.saturating_sub(count)).sum();
    eprintln!(
        "master killed: replica promoted after {promoted:?}; every task's next round clean after {resumed:?} \
         ({:?} after the promotion); {} failed calls, {} of them begun after the promotion, \
         {errors_elsewhere} for the {} subjects of the other masters; \
         over-admission: {over} units over {over_subjects} of {subjects} subjects (limit {limit} each); \
         consumed by failed calls: {under} units",
        resumed.saturating_sub(promoted),
        run.errors.load(Ordering::Relaxed),
        run.errors_after_promotion.load(Ordering::Relaxed),
        subjects - on_master.len(),
    );
    assert!(run.errors.load(Ordering::Relaxed) > 0, "the kill went unnoticed");
}

/// The master behind Sentinels is killed: the store finds the promoted
/// replica through the Sentinels and calls resume, without a restart.
#[test]
fn sentinel_failover_is_followed() {
    let _serial = one_at_a_time();
    let mut set = SentinelSet::start("tollgate");
    let runtime = tollgate_testkit::runtime();
    // Database 3: the master's settings go to each master found.
    let redis = runtime.block_on(async {
        RedisStore::builder(format!("{}?db=3", set.url()))
            .timeout(Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
    });
    let limiter = Limiter::new(redis, Limit::sliding_log(1_000, Duration::from_secs(3_600)).unwrap());
    let subject = Subject::new("sentinel");
    for _ in 0..5 {
        assert!(runtime.block_on(limiter.check(&subject)).unwrap().allowed);
    }
    wait_until("the replica to hold the 5 admissions", || {
        set.replica.cli(&["-n", "3", "--scan"]).lines().count() == 1
    });

    let old_master = set.master.port();
    set.master.stop();
    let killed = Instant::now();
    let mut promoted = None;
    let mut failed = 0;
    let decision = loop {
        if promoted.is_none() && set.master_port().is_some_and(|port| port != old_master) {
            promoted = Some(killed.elapsed());
        }
        match runtime.block_on(limiter.check(&subject)) {
            Ok(decision) => break decision,
            Err(error) => {
                assert!(error.is_transient(), "{error}");
                failed += 1;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no answer within a minute of the kill"
        );
    };
    let resumed = killed.elapsed();
    eprintln!(
        "sentinel: master killed, promotion seen after {promoted:?}, calls resumed after {resumed:?} \
         ({failed} failed calls)"
    );
    assert!(decision.allowed);
    // The state survived the failover: 5 before, this one the 6th.
    assert_eq!(decision.remaining, 1_000 - 6);
    assert_eq!(set.master_port(), Some(set.replica.port()));
    assert_eq!(set.replica.cli(&["ROLE"]).lines().next(), Some("master"));
    assert_eq!(set.replica.cli(&["-n", "3", "DBSIZE"]), "1");
    assert_eq!(set.replica.cli(&["DBSIZE"]), "0");
}

#[test]
fn cluster_and_sentinel_urls_are_checked() {
    let runtime = tollgate_testkit::runtime();
    for (url, expected) in [
        ("redis+cluster://", "host:port"),
        ("redis+cluster://127.0.0.1:1/2", "only database 0"),
        ("redis+sentinel://127.0.0.1:1", "master's name"),
    ] {
        let error = runtime.block_on(RedisStore::connect(url)).unwrap_err();
        assert!(error.is_invalid(), "{url}: {error}");
        assert!(error.to_string().contains(expected), "{url}: {error}");
    }
    // Nothing listens: a transient error, not a hang.
    let port = common::redis_server::free_port();
    for url in [
        format!("redis+cluster://127.0.0.1:{port}"),
        format!("redis+sentinel://127.0.0.1:{port}/m"),
    ] {
        let error = runtime
            .block_on(
                RedisStore::builder(url.as_str())
                    .connect_timeout(Duration::from_secs(2))
                    .connect(),
            )
            .unwrap_err();
        assert!(error.is_transient(), "{url}: {error}");
    }
}

/// A manual failover (`SENTINEL FAILOVER`): the master is demoted to a
/// replica while it runs (the Sentinels close its clients' connections, and
/// it refuses writes with `READONLY` from then on); the store asks the
/// Sentinels and moves to the promoted replica, state and all, without an
/// error reaching the caller.
#[test]
fn sentinel_manual_failover_is_followed() {
    let _serial = one_at_a_time();
    let set = SentinelSet::start("manual");
    let runtime = tollgate_testkit::runtime();
    let limiter = Limiter::new(
        runtime.block_on(store(&set.url())),
        Limit::sliding_log(1_000, Duration::from_secs(3_600)).unwrap(),
    );
    let subject = Subject::new("manual");
    for _ in 0..5 {
        assert!(runtime.block_on(limiter.check(&subject)).unwrap().allowed);
    }
    wait_until("the replica to hold the 5 admissions", || {
        set.replica.cli(&["--scan"]).lines().count() == 1
    });
    assert_eq!(set.sentinels[0].cli(&["SENTINEL", "FAILOVER", "manual"]), "OK");
    wait_until("every Sentinel to name the promoted replica", || {
        (0..set.sentinels.len()).all(|index| set.master_port_by(index) == Some(set.replica.port()))
    });
    wait_until("the old master's demotion", || {
        set.master.cli(&["ROLE"]).lines().next() == Some("slave")
    });
    let decision = runtime
        .block_on(limiter.check(&subject))
        .expect("followed within the call");
    assert_eq!(decision.remaining, 1_000 - 6);
    assert_eq!(set.replica.cli(&["ROLE"]).lines().next(), Some("master"));
}

/// `rediss+cluster://`: TLS to every node (a private CA), the slots of
/// every master reached.
#[test]
fn tls_cluster_with_a_private_ca() {
    let _serial = one_at_a_time();
    let (cluster, ca) = RedisCluster::start_tls();
    let runtime = tollgate_testkit::runtime();
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let redis = runtime.block_on(RedisStore::builder(url.as_str()).tls_root_certificate(ca).connect());
    let limiter = Limiter::new(redis.unwrap(), Limit::gcra(1, Duration::from_secs(60), 1).unwrap());
    for index in 0..30 {
        let subject = Subject::new("tls").and(index);
        assert!(runtime.block_on(limiter.check(&subject)).unwrap().allowed);
        assert!(!runtime.block_on(limiter.check(&subject)).unwrap().allowed);
    }
    assert!(cluster.keys_per_master().iter().all(|&keys| keys > 0));
    // Without the CA the nodes' certificate is not trusted.
    let error = runtime
        .block_on(
            RedisStore::builder(url.as_str())
                .connect_timeout(Duration::from_secs(2))
                .connect(),
        )
        .unwrap_err();
    assert!(error.to_string().starts_with("redis:"), "{error}");
}
