//! The Redis module (`crates/tollgate-redis-module`) against real
//! `redis-server` processes: it decides exactly as the memory store, reads
//! and writes the Lua library's keys both ways, replicates its effects to a
//! real replica and survives an RDB save and reload; the store picks it
//! when present, falls back to Lua, and refuses `engine=module` without it.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use tollgate::{Limit, Outcome, Policy, RedisStore, Request, Result, Store, Subject};

use common::differential::{any_policies_sharing_names, any_policy, memory_and_store_agree, replay, Step, StepOp};
use common::redis_server::RedisServer;

static PREFIXES: AtomicUsize = AtomicUsize::new(0);

/// A store on `server`'s `?engine=` with a prefix (`None`: a fresh one).
async fn store(server: &RedisServer, engine: &str, prefix: Option<&str>) -> Result<RedisStore> {
    let prefix = prefix.map_or_else(
        || format!("m{}", PREFIXES.fetch_add(1, Ordering::Relaxed)),
        str::to_owned,
    );
    RedisStore::builder(format!("{}?engine={engine}", server.url()))
        .prefix(prefix)
        .connect()
        .await
}

// --- Which engine decides. -------------------------------------------------

#[tokio::test]
async fn the_store_prefers_the_module_and_falls_back_to_lua() {
    let with = RedisServer::start_with_module(&[]);
    assert_eq!(
        store(&with, "auto", None).await.unwrap().engine(),
        tollgate::EngineKind::Module
    );
    assert_eq!(
        store(&with, "module", None).await.unwrap().engine(),
        tollgate::EngineKind::Module
    );
    assert_eq!(
        store(&with, "lua", None).await.unwrap().engine(),
        tollgate::EngineKind::Lua
    );

    let without = RedisServer::start_with(&[]);
    // (Under TOLLGATE_LOAD_MODULE=1 every server has it: skip that half then.)
    if without.cli(&["MODULE", "LIST"]).contains("tollgate") {
        return;
    }
    assert_eq!(
        store(&without, "auto", None).await.unwrap().engine(),
        tollgate::EngineKind::Lua
    );
    let error = store(&without, "module", None).await.unwrap_err().to_string();
    assert!(
        error.contains("no tollgate module") && error.contains("engine=module"),
        "{error}"
    );
}

#[tokio::test]
async fn a_server_that_loses_the_module_is_decided_by_lua() {
    let server = RedisServer::start_with_module(&["--enable-module-command".to_owned(), "yes".to_owned()]);
    let redis = store(&server, "auto", None).await.unwrap();
    let policy = Policy::single(Limit::sliding_log(3, std::time::Duration::from_secs(3_600)).unwrap());
    let subject = Subject::new("lost");
    let check = Request::new(tollgate::Op::Check, 1);
    assert!(redis.decide(&subject, &policy, &check).await.unwrap().decision.allowed);
    assert_eq!(server.cli(&["MODULE", "UNLOAD", "tollgate"]).trim(), "OK");
    // The same key, now read and written by the library.
    let outcome = redis.decide(&subject, &policy, &check).await.unwrap();
    assert_eq!(outcome.decision.remaining, 1, "{outcome:?}");
    assert_eq!(redis.engine(), tollgate::EngineKind::Lua);
}

/// After a fault on its connection the store picks its engine again: a
/// server that gained the module meanwhile (a rolling upgrade, a failover to
/// a master that has it) is decided by the module from then on.
#[tokio::test]
async fn a_reconnected_store_picks_up_a_module_loaded_meanwhile() {
    let server = RedisServer::start_with(&["--enable-module-command".to_owned(), "yes".to_owned()]);
    // (Under TOLLGATE_LOAD_MODULE=1 every server has it from the start.)
    if server.cli(&["MODULE", "LIST"]).contains("tollgate") {
        return;
    }
    let redis = store(&server, "auto", None).await.unwrap();
    let policy = Policy::single(Limit::sliding_log(100, std::time::Duration::from_secs(3_600)).unwrap());
    let subject = Subject::new("upgraded");
    let check = Request::new(tollgate::Op::Check, 1);
    assert!(redis.decide(&subject, &policy, &check).await.unwrap().decision.allowed);
    assert_eq!(redis.engine(), tollgate::EngineKind::Lua);
    let module = common::redis_server::module_path().display().to_string();
    assert_eq!(server.cli(&["MODULE", "LOAD", &module]).trim(), "OK");
    // Cut the store's connection: its next call fails, and a later one
    // reconnects and picks again.
    server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    let mut admitted = 1;
    for _ in 0..5 {
        if let Ok(outcome) = redis.decide(&subject, &policy, &check).await {
            admitted += u64::from(outcome.decision.allowed);
        }
        if redis.engine() == tollgate::EngineKind::Module {
            break;
        }
    }
    assert_eq!(redis.engine(), tollgate::EngineKind::Module);
    // The same key, now read and written by the module.
    let outcome = redis.decide(&subject, &policy, &check).await.unwrap();
    assert_eq!(outcome.decision.remaining, 100 - admitted - 1, "{outcome:?}");
}

#[tokio::test]
async fn bad_calls_are_errors_not_crashes() {
    let server = RedisServer::start_with_module(&[]);
    for args in [
        &["TOLLGATE.DECIDE", "5", "k"][..],
        &["TOLLGATE.DECIDE", "1", "k", "1", "9:1:1:-1:"],
        &["TOLLGATE.DECIDE", "1", "k", "1", "1:1:1:-1:", "99:1:1"],
        &["TOLLGATE.DECIDE", "1", "k", "1", "1:1:1:-1:", "7:0:1:1:1"],
        &["TOLLGATE.DECIDE", "0", "x"],
    ] {
        let answer = server.cli(args);
        assert!(answer.contains("ERR"), "{args:?}: {answer}");
    }
    assert_eq!(server.cli(&["PING"]).trim(), "PONG");
    assert_eq!(
        server.cli(&["TOLLGATE.VERSION"]).trim(),
        tollgate::engine::PROTOCOL.to_string()
    );
}

/// A `WATCH`ed key counts as changed when a decision writes it, never when
/// one is denied (a denial changes nothing).
#[tokio::test]
async fn a_watched_key_changes_only_when_a_decision_writes_it() {
    let server = RedisServer::start_with_module(&[]);
    let redis = store(&server, "module", None).await.unwrap();
    let policy = Policy::single(Limit::gcra(1, std::time::Duration::from_secs(3_600), 1).unwrap());
    let check = Request::new(tollgate::Op::Check, 1);
    let client = redis::Client::open(server.url()).unwrap();
    // True when a transaction begun after WATCH on `subject`'s key ran,
    // with `decide` made between the WATCH and the EXEC.
    let transaction_runs = |subject: Subject, allowed: bool| {
        let (redis, policy, check, client) = (redis.clone(), policy.clone(), check.clone(), client.clone());
        async move {
            let mut connection = client.get_multiplexed_async_connection().await.unwrap();
            let key = redis.key(&subject, policy.limits().next().unwrap().0);
            let () = redis::cmd("WATCH")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .unwrap();
            let outcome = redis.decide(&subject, &policy, &check).await.unwrap();
            assert_eq!(outcome.decision.allowed, allowed, "{outcome:?}");
            let ran: Option<(i64,)> = redis::pipe()
                .atomic()
                .cmd("INCR")
                .arg("transactions")
                .query_async(&mut connection)
                .await
                .unwrap();
            ran.is_some()
        }
    };
    assert!(
        !transaction_runs(Subject::new("watched"), true).await,
        "an admission wrote the key"
    );
    assert!(
        transaction_runs(Subject::new("watched"), false).await,
        "a denial wrote the key"
    );
}

// --- The differential tests. -------------------------------------------------

/// Replays traces through the memory store and through `redis`.
fn agree(redis: &RedisStore, runtime: &tokio::runtime::Runtime, cases: u32, shared: bool, label: &str) {
    let regressions = "tests/redis_module.proptest-regressions";
    if shared {
        memory_and_store_agree(
            runtime,
            redis,
            cases,
            any_policies_sharing_names().prop_map(Vec::from),
            label,
            regressions,
        );
    } else {
        memory_and_store_agree(
            runtime,
            redis,
            cases,
            any_policy().prop_map(|policy| vec![policy]),
            label,
            regressions,
        );
    }
}

#[test]
fn the_module_decides_exactly_as_memory() {
    let server = RedisServer::start_with_module(&[]);
    let runtime = common::runtime();
    let redis = runtime.block_on(store(&server, "module", None)).unwrap();
    agree(&redis, &runtime, 300, false, "one");
    agree(&redis, &runtime, 150, true, "shared");
}

/// One step of a hand-written trace, on the first subject and policy.
fn step(dt: u64, cost: u64, op: StepOp) -> Step {
    Step {
        dt,
        key: 0,
        cost,
        op,
        costs: None,
        policy: 0,
    }
}

const MS: u64 = 1_000;

/// A sliding log of 800 per second, filled with 300 entries of 1 to 4
/// units (750 in all), one a millisecond; then denials whose `retry_after`
/// lands deep in it, records over the limit, refunds (one emptying an
/// entry with others before and after it), entries leaving the window.
fn a_long_log() -> Vec<Step> {
    let mut log: Vec<Step> = (0..300).map(|i| step(MS, 1 + i % 4, StepOp::Check)).collect();
    let probes = |steps: &mut Vec<Step>| {
        for cost in [0, 1, 49, 50, 51, 200, 640, 800, 801] {
            steps.push(step(0, cost, StepOp::Check));
        }
        steps.push(step(0, 300, StepOp::AtMost));
        steps.push(step(0, 30, StepOp::Record));
    };
    probes(&mut log);
    log.push(step(MS, 5, StepOp::Check));
    log.push(step(MS, 3, StepOp::Refund(1, None)));
    log.push(step(0, 2, StepOp::Refund(0, None)));
    probes(&mut log);
    // 800 ms on, the oldest hundred entries have left.
    log.push(step(800 * MS, 1, StepOp::Check));
    probes(&mut log);
    log.push(step(2_000 * MS, 1, StepOp::Check));
    probes(&mut log);
    // Last, on a log of a few entries (the stored set is checked after it).
    log.push(step(2_000 * MS, 1, StepOp::Check));
    log.extend((0..5).map(|_| step(MS, 1, StepOp::Check)));
    log.push(step(MS, 4, StepOp::Check));
    log.push(step(MS, 2, StepOp::Check));
    log.push(step(0, 4, StepOp::Refund(2, None)));
    log.push(step(MS, 1, StepOp::Check));
    log
}

/// 200 leases of 1 to 3 units (399 in all) on a limit of 400, one taken a
/// millisecond, each for one second; then denials that walk many leases,
/// renewals deep in the set, releases of the leases that end last, leases
/// ending while others live.
fn many_leases() -> Vec<Step> {
    let mut leases: Vec<Step> = (0..200u8)
        .map(|i| step(MS, 1 + u64::from(i % 3), StepOp::Acquire(i)))
        .collect();
    let denials = |steps: &mut Vec<Step>| {
        for cost in [2, 150, 300, 400, 401] {
            steps.push(step(0, cost, StepOp::Acquire(250)));
        }
        // Renewals: the lease's own units count as freed.
        steps.push(step(0, 200, StepOp::Acquire(5)));
        steps.push(step(0, 200, StepOp::Acquire(199)));
        steps.push(step(0, 0, StepOp::Check));
    };
    denials(&mut leases);
    leases.push(step(MS, 0, StepOp::Release(199)));
    leases.push(step(0, 0, StepOp::Release(198)));
    leases.push(step(0, 2, StepOp::Acquire(199)));
    leases.push(step(0, 1, StepOp::Acquire(7)));
    denials(&mut leases);
    // 900 ms on, about a hundred leases have ended.
    leases.push(step(900 * MS, 1, StepOp::Acquire(251)));
    leases.push(step(0, 0, StepOp::Release(150)));
    denials(&mut leases);
    leases.push(step(2_000 * MS, 1, StepOp::Acquire(252)));
    denials(&mut leases);
    leases
}

/// Checks that the set at `key` is whole: a log's totals rise from its
/// base (no entry emptied and kept); leases add up to their total.
fn assert_set_is_whole(server: &RedisServer, key: &str, limit: &Limit) {
    let mut connection = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
    let members: Vec<(Vec<u8>, i64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut connection)
        .unwrap();
    assert!(members.len() > 2, "{limit}: {members:?}");
    if limit.is_concurrency() {
        let score = |member: &[u8]| members.iter().find(|(m, _)| m == member).map(|&(_, s)| s);
        let units: i64 = members
            .iter()
            .filter(|&&(_, ends)| ends > 0)
            .map(|(name, _)| score(&[b"\0c", name.as_slice()].concat()).map_or(1, i64::abs))
            .sum();
        assert_eq!(score(b"\0n"), Some(-units), "{limit}: {members:?}");
    } else {
        // "\0x", named "\0x<instant>" once the log lapsed; then "\0b".
        assert!(
            members[0].0.starts_with(b"\0x") && members[1].0 == b"\0b",
            "{limit}: {members:?}"
        );
        assert!(
            members[1..].windows(2).all(|pair| pair[0].1 < pair[1].1),
            "{limit}: {members:?}"
        );
    }
}

/// Logs and leases far longer than the random traces grow: the module
/// reads only the members each decision needs, answers as the memory store
/// does, and leaves a whole set.
#[test]
fn keys_of_many_entries_are_decided_as_memory_decides() {
    let server = RedisServer::start_with_module(&[]);
    let runtime = common::runtime();
    let redis = runtime.block_on(store(&server, "module", None)).unwrap();
    let second = std::time::Duration::from_secs(1);
    let log = Limit::sliding_log(800, second).unwrap();
    for (limit, steps) in [
        (log.clone(), a_long_log()),
        (log.recording_overage().unwrap(), a_long_log()),
        (Limit::concurrency(400, second).unwrap(), many_leases()),
    ] {
        let policies = [Policy::single(limit.clone())];
        let subjects = [Subject::new("many").and(limit.to_string()), Subject::new("unused")];
        let memory = tollgate::MemoryStore::new();
        let expected = runtime.block_on(replay(&memory, &policies, &steps, &subjects));
        let actual = runtime.block_on(replay(&redis, &policies, &steps, &subjects));
        for (index, (expected, actual)) in expected.iter().zip(&actual).enumerate() {
            assert_eq!(expected, actual, "{limit}, step {index}");
        }
        let name = policies[0].limits().next().unwrap().0;
        assert_set_is_whole(&server, &redis.key(&subjects[0], name), &limit);
    }
}

/// Decides by the module and by Lua in turn (a pattern drawn per call) on
/// the same keys: a fleet mid-upgrade. Each engine reads what the other
/// wrote, so the answers are the memory store's.
#[derive(Clone)]
struct Mixed {
    module: RedisStore,
    lua: RedisStore,
    calls: std::sync::Arc<AtomicUsize>,
    pattern: u64,
}

impl Mixed {
    fn pick(&self) -> &RedisStore {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) % 64;
        if self.pattern >> call & 1 == 1 {
            &self.module
        } else {
            &self.lua
        }
    }
}

impl Store for Mixed {
    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        self.pick().decide(subject, policy, request).await
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        self.pick().reset(subject, policy).await
    }
}

#[test]
fn module_and_lua_read_each_others_keys() {
    let server = RedisServer::start_with_module(&[]);
    let runtime = common::runtime();
    for (round, pattern) in [0x5555_5555_5555_5555_u64, 0x3333_3333_3333_3333, 0x9e37_79b9_7f4a_7c15]
        .into_iter()
        .enumerate()
    {
        let prefix = format!("mixed{round}");
        let mixed = Mixed {
            module: runtime.block_on(store(&server, "module", Some(&prefix))).unwrap(),
            lua: runtime.block_on(store(&server, "lua", Some(&prefix))).unwrap(),
            calls: std::sync::Arc::default(),
            pattern,
        };
        let regressions = "tests/redis_module.proptest-regressions";
        memory_and_store_agree(
            &runtime,
            &mixed,
            120,
            any_policy().prop_map(|policy| vec![policy]),
            &prefix,
            regressions,
        );
        memory_and_store_agree(
            &runtime,
            &mixed,
            60,
            any_policies_sharing_names().prop_map(Vec::from),
            &format!("{prefix}s"),
            regressions,
        );
    }
}

// --- Replication and persistence. ------------------------------------------

/// Every key of `server`: its type, its value as `redis-cli` prints it
/// (fields and members sorted), and when it expires (ms since the epoch).
fn snapshot(server: &RedisServer) -> BTreeMap<String, (String, String, i64)> {
    let mut keys = BTreeMap::new();
    for key in server.cli(&["--scan"]).lines().filter(|key| !key.is_empty()) {
        let kind = server.cli(&["TYPE", key]).trim().to_owned();
        let value = match kind.as_str() {
            "string" => server.cli(&["GET", key]),
            "hash" => {
                let mut lines: Vec<String> = server
                    .cli(&["HGETALL", key])
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
                    .chunks(2)
                    .map(|pair| pair.join("="))
                    .collect();
                lines.sort();
                lines.join(",")
            }
            "zset" => server.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
            other => panic!("key {key} of type {other}"),
        };
        let expires = server.cli(&["PEXPIRETIME", key]).trim().parse().unwrap_or(-3);
        keys.insert(key.to_owned(), (kind, value, expires));
    }
    keys
}

/// Same keys and values; expiries within `slack` ms (a replica gets the
/// master's expiry as an instant the module computed from its own clock
/// reading, a millisecond apart at most from the one the master set).
fn assert_same(
    master: &BTreeMap<String, (String, String, i64)>,
    other: &BTreeMap<String, (String, String, i64)>,
    slack: i64,
) {
    assert_eq!(master.keys().collect::<Vec<_>>(), other.keys().collect::<Vec<_>>());
    for (key, (kind, value, expires)) in master {
        let (other_kind, other_value, other_expires) = &other[key];
        assert_eq!((kind, value), (other_kind, other_value), "key {key}");
        assert!(
            (expires - other_expires).abs() <= slack,
            "key {key}: expires {expires} and {other_expires}"
        );
    }
}

#[test]
fn a_replica_holds_what_the_module_wrote_and_an_rdb_keeps_it() {
    let mut master = RedisServer::start_with_module(&[]);
    let replica = RedisServer::start_with_module(&[
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        master.port().to_string(),
    ]);
    common::redis_cluster::wait_until("the replica is in sync", || {
        replica.cli(&["INFO", "replication"]).contains("master_link_status:up")
    });
    let runtime = common::runtime();
    let redis = runtime.block_on(store(&master, "module", None)).unwrap();
    // Random traces of every algorithm and of policies, decided on the master.
    agree(&redis, &runtime, 60, false, "replicated");
    agree(&redis, &runtime, 30, true, "replicated-shared");
    assert_eq!(master.cli(&["WAIT", "1", "5000"]).trim(), "1");
    let written = snapshot(&master);
    assert!(written.len() > 50, "the traces wrote {} keys", written.len());
    assert_same(&written, &snapshot(&replica), 2);
    // What the replica was sent: effects, never the command.
    let commands = replica.cli(&["INFO", "commandstats"]);
    assert!(!commands.contains("tollgate"), "{commands}");

    // An RDB save and a restart keep every state (expiries exactly).
    assert_eq!(master.cli(&["SAVE"]).trim(), "OK");
    let saved = snapshot(&master);
    master.stop();
    master.restart();
    assert_same(&saved, &snapshot(&master), 0);
}
