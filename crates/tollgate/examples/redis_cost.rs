//! What a decision costs Redis, next to hand-written anchors on the same
//! server in the same run (`scripts/bench-redis.sh` runs it):
//!
//! 1. Redis CPU per decision of each algorithm (`INFO commandstats`, one
//!    decision per call), next to a 12-line GCRA script, an
//!    `INCRBY` + `PEXPIRE` script and a hand-written sliding log
//!    (`ZREMRANGEBYSCORE` + `ZCARD` + `ZADD` + `PEXPIRE`) called the same way;
//! 2. the sliding log and the concurrency limiter on one key holding 10,
//!    1 000, 20 000 and 100 000 live entries, next to the hand-written
//!    sliding log on a key of as many;
//! 3. the longest call on a sliding log (a concurrency key) whose 1 000 …
//!    100 000 entries (leases) have all left the window (ended), call after
//!    call until it is gone, with what `SLOWLOG` and `LATENCY LATEST` saw;
//!    a set of as many members that expires whole, with
//!    `lazyfree-lazy-expire` `no` and `yes`; and the longest of the calls
//!    that trim a backlog of as many ended entries beside 10 live ones, a
//!    step of at most 250 per call, until it is gone;
//! 4. `MEMORY USAGE` of one key per algorithm, next to a plain string key of
//!    a name as long holding a timestamp with a PX expiry.
//!
//! Usage: `cargo run --release -p tollgate --example redis_cost -- redis://127.0.0.1:6379 [decisions]`
//! (`redis://…?engine=module` on a server with the module measures the module).
//! (a server of its own: it resets the server's statistics).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use tollgate::{Limit, Op, Policy, RedisStore, Request, Store, Subject, Timestamp};

/// The anchor: GCRA in a dozen lines (TIME, GET, SET … PX), as one writes it
/// by hand (also run by `scripts/bench-redis.sh` and `tools/client-choice`).
const GCRA_ANCHOR: &str = include_str!("anchors/gcra.lua");

/// The anchor for the sorted sets (sliding log, concurrency): a sliding log
/// by hand (TIME, ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE).
const SORTED_ANCHOR: &str = include_str!("anchors/sliding_log.lua");

/// The anchor for a fixed window: count and expire.
const FIXED_ANCHOR: &str = r"
local count = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return count
";

const KEYS: u64 = 1_000;
/// Measurements of each algorithm, each right after its anchor's.
const ROUNDS: usize = 3;
const TASKS: u64 = 16;

fn hour() -> Duration {
    Duration::from_secs(3_600)
}

/// One limit per algorithm that allows everything the run sends.
fn algorithms() -> Vec<(&'static str, Limit)> {
    let big = 1_000_000_000;
    vec![
        ("fixed_window", Limit::fixed_window(big, hour()).unwrap()),
        ("sliding_window", Limit::sliding_window(big, hour(), 10).unwrap()),
        ("sliding_log", Limit::sliding_log(big, hour()).unwrap()),
        ("token_bucket", Limit::token_bucket(big, big, hour()).unwrap()),
        ("reservation", Limit::reservation(big, hour(), big).unwrap()),
        ("leaky_bucket", Limit::leaky_bucket(big, hour(), big).unwrap()),
        ("gcra", Limit::gcra(big, hour(), big).unwrap()),
        // An emission interval of whole microseconds (1 µs): the TAT is a
        // bare integer, where 10⁹ per hour needs a fraction ("<at>:<frac>").
        (
            "gcra_whole_us",
            Limit::gcra(big, Duration::from_secs(1_000), big).unwrap(),
        ),
        ("concurrency", Limit::concurrency(big, hour()).unwrap()),
    ]
}

/// What one use of `limit` is: an acquire of `lease` on a concurrency
/// limit, a check on the others.
fn one_use(concurrency: bool, lease: String) -> Op {
    if concurrency {
        Op::Acquire { lease, max_wait: None }
    } else {
        Op::Check
    }
}

/// `usec` and `calls` of one command in `INFO commandstats`.
async fn command_stats(connection: &mut MultiplexedConnection, command: &str) -> (f64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find(|line| line.starts_with(&prefix)) else {
        return (0.0, 0.0);
    };
    let field = |name: &str| -> f64 {
        line.split(',')
            .find_map(|part| part.split_once('=').filter(|(key, _)| key.ends_with(name)))
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0.0)
    };
    (field("usec"), field("calls"))
}

async fn reset_stats(connection: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(connection)
        .await
        .unwrap();
}

/// Redis CPU per call of the engine since the last reset (the module's
/// TOLLGATE.DECIDE, FCALL, or EVALSHA on Redis 6).
async fn library_usec_per_call(connection: &mut MultiplexedConnection) -> f64 {
    let (usec, calls) = command_stats(connection, "tollgate.decide").await;
    let (usec, calls) = if calls > 0.0 {
        (usec, calls)
    } else {
        command_stats(connection, "fcall").await
    };
    let (usec, calls) = if calls > 0.0 {
        (usec, calls)
    } else {
        command_stats(connection, "evalsha").await
    };
    usec / calls.max(1.0)
}

/// `decisions` decisions over `KEYS` subjects from `TASKS` tasks.
async fn load(store: &RedisStore, policy: &Policy, decisions: u64, op: impl Fn(u64) -> Op + Clone + Send + 'static) {
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (store, policy, op) = (store.clone(), policy.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            for i in (task..decisions).step_by(TASKS as usize) {
                let subject = Subject::new("cost").and(i % KEYS);
                store.decide(&subject, &policy, &Request::new(op(i), 1)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// The anchor `sha` called `decisions` times the same way, on `key(i)`
/// with `args(i)` for the `i`-th call.
async fn load_anchor(
    connection: &MultiplexedConnection,
    sha: &str,
    decisions: u64,
    key: impl Fn(u64) -> String + Clone + Send + 'static,
    args: impl Fn(u64) -> Vec<String> + Clone + Send + 'static,
) {
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (mut connection, sha) = (connection.clone(), sha.to_owned());
        let (key, args) = (key.clone(), args.clone());
        tasks.push(tokio::spawn(async move {
            for i in (task..decisions).step_by(TASKS as usize) {
                let _: redis::Value = redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg(key(i))
                    .arg(args(i))
                    .query_async(&mut connection)
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

fn system_micros() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: redis_cost REDIS_URL [DECISIONS]");
    let decisions: u64 = args
        .next()
        .map_or(20_000, |n| n.parse().expect("DECISIONS must be a number"));
    // `?engine=` is Tollgate's, not redis-rs's.
    let client = redis::Client::open(url.split('?').next().unwrap_or(&url)).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let store = RedisStore::builder(url.as_str()).max_batch(1).connect().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    cpu_per_decision(&store, &mut raw, decisions).await;
    many_entries(&store, &mut raw).await;
    longest_calls(&store, &mut raw).await;
    expiring_whole(&mut raw).await;
    backlog_calls(&store, &mut raw).await;
    alert_crossings(&url, &mut raw, decisions).await;
    memory_per_key(&store, &mut raw).await;
}

/// The SHA-1 of `script`, loaded.
async fn load_script(raw: &mut MultiplexedConnection, script: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(raw)
        .await
        .unwrap()
}

/// 1. Redis CPU per decision, next to the anchors.
async fn cpu_per_decision(store: &RedisStore, raw: &mut MultiplexedConnection, decisions: u64) {
    let gcra_sha = load_script(raw, GCRA_ANCHOR).await;
    let fixed_sha = load_script(raw, FIXED_ANCHOR).await;
    let sorted_sha = load_script(raw, SORTED_ANCHOR).await;
    println!("## Redis CPU per decision (µs, INFO commandstats, one decision per call, {decisions} decisions over {KEYS} keys)\n");
    println!("Each algorithm is measured {ROUNDS} times, each time right after its anchor; the");
    println!("table gives the least of each and the median of the {ROUNDS} ratios.\n");
    println!("| what | µs per decision | its anchor, µs | ratio to its anchor (median) |");
    println!("|---|---:|---:|---:|");
    for (name, limit) in algorithms() {
        // Each anchor on keys of its own.
        let (sha, args, anchor, anchor_name): (&str, fn(u64) -> Vec<String>, _, _) = match name {
            "fixed_window" => (
                &fixed_sha,
                |_| vec!["1".into(), "3600000".into()],
                "fixed",
                "INCRBY + PEXPIRE",
            ),
            "sliding_log" | "concurrency" => (&sorted_sha, sorted_anchor_args, "log", "the sliding log script"),
            _ => (
                &gcra_sha,
                |_| vec!["1".into(), "1000000000".into()],
                "gcra",
                "the GCRA script",
            ),
        };
        let policy = Policy::single(limit.clone());
        let (mut ours, mut anchors, mut ratios) = (f64::MAX, f64::MAX, Vec::new());
        for _ in 0..ROUNDS {
            reset_stats(raw).await;
            let key = move |i| format!("anchor:{{cost:{}}}:{anchor}", i % KEYS);
            load_anchor(&*raw, sha, decisions, key, args).await;
            let (usec, calls) = command_stats(raw, "evalsha").await;
            let anchor = usec / calls;
            reset_stats(raw).await;
            let concurrency = limit.is_concurrency();
            load(store, &policy, decisions, move |i| {
                one_use(concurrency, format!("lease-{i}"))
            })
            .await;
            let per_call = library_usec_per_call(raw).await;
            ours = ours.min(per_call);
            anchors = anchors.min(anchor);
            ratios.push(per_call / anchor);
        }
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        println!("| tollgate {name} | {ours:.2} | {anchors:.2} | {median:.2} × {anchor_name} |");
    }
}

/// The hand-written sliding log's arguments for its `i`-th call: a window
/// of an hour, a limit no run reaches, a member of its own.
fn sorted_anchor_args(i: u64) -> Vec<String> {
    vec![
        "3600000000".into(),
        "1000000000".into(),
        format!("request-{i}"),
        "3600000".into(),
    ]
}

/// Redis CPU per call of the hand-written sliding log on a key of `entries`
/// members (at distinct instants of the last `entries` µs), `calls` calls.
async fn sorted_anchor_on(raw: &mut MultiplexedConnection, entries: u64, calls: u64) -> f64 {
    let sha = load_script(raw, SORTED_ANCHOR).await;
    let key = format!("anchor:entries:{entries}");
    let start = system_micros() - entries - 1_000;
    for chunk in (0..entries).collect::<Vec<_>>().chunks(1_000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&key);
        for &i in chunk {
            zadd.arg(start + i).arg(format!("fill-{i}"));
        }
        let _: () = zadd.query_async(raw).await.unwrap();
    }
    reset_stats(raw).await;
    for i in 0..calls {
        let _: redis::Value = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(sorted_anchor_args(i))
            .query_async(raw)
            .await
            .unwrap();
    }
    let (usec, calls) = command_stats(raw, "evalsha").await;
    usec / calls.max(1.0)
}

/// 2. Logs and leases of many entries.
async fn many_entries(store: &RedisStore, raw: &mut MultiplexedConnection) {
    println!("\n## One key holding many entries: Redis CPU per decision (µs)\n");
    println!("| live entries | sliding_log check | concurrency acquire or release | the sliding log script | log / script | leases / script |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let measured = 2_000;
    for entries in [10u64, 1_000, 20_000, 100_000] {
        let mut row = format!("| {entries} |");
        let mut costs = Vec::new();
        for (name, limit) in [
            ("log", Limit::sliding_log(1_000_000_000, hour()).unwrap()),
            ("lease", Limit::concurrency(1_000_000_000, hour()).unwrap()),
        ] {
            let policy = Policy::single(limit.clone());
            let subject = Subject::new("entries").and(name).and(entries);
            // Filled at distinct past instants, so each is an entry of its own.
            fill(store, &subject, &policy, entries, system_micros() - entries - 1_000).await;
            reset_stats(raw).await;
            for i in 0..measured {
                if limit.is_concurrency() {
                    let lease = format!("measured-{}", i / 2);
                    let op = if i % 2 == 0 {
                        Op::Acquire { lease, max_wait: None }
                    } else {
                        Op::Release { lease }
                    };
                    store.decide(&subject, &policy, &Request::new(op, 1)).await.unwrap();
                } else {
                    store
                        .decide(&subject, &policy, &Request::new(Op::Check, 1))
                        .await
                        .unwrap();
                }
            }
            let per_call = library_usec_per_call(raw).await;
            let outcome = store
                .decide(&subject, &policy, &Request::new(Op::Check, 0))
                .await
                .unwrap();
            let held = 1_000_000_000 - outcome.decision.remaining;
            write!(row, " {per_call:.2} ({held} held) |").unwrap();
            costs.push(per_call);
        }
        let anchor = sorted_anchor_on(raw, entries, measured).await;
        write!(
            row,
            " {anchor:.2} | {:.2} | {:.2} |",
            costs[0] / anchor,
            costs[1] / anchor
        )
        .unwrap();
        println!("{row}");
    }
}

/// Fills `subject`'s key with `entries` entries (or leases) at distinct
/// instants from `start` on, 256 decisions at a time.
async fn fill(store: &RedisStore, subject: &Subject, policy: &Policy, entries: u64, start: u64) {
    let concurrency = policy.limits().any(|(_, limit)| limit.is_concurrency());
    let mut pending = Vec::new();
    for i in 0..entries {
        let op = one_use(concurrency, format!("fill-{i}"));
        let request = Request::new(op, 1).at(Timestamp::from_micros(start + i));
        let (store, subject, policy) = (store.clone(), subject.clone(), policy.clone());
        pending.push(tokio::spawn(async move {
            store.decide(&subject, &policy, &request).await.unwrap();
        }));
        if pending.len() == 256 {
            for task in pending.drain(..) {
                task.await.unwrap();
            }
        }
    }
    for task in pending {
        task.await.unwrap();
    }
}

/// 3. The longest call on a key whose every entry has left the window (or
///    whose every lease has ended): one decision after another, each timed
///    alone, until the set is gone or small: the longest call, how many
///    calls, and what `SLOWLOG` (calls above 1 ms) and `LATENCY LATEST`
///    (events above 1 ms) saw meanwhile. A sliding log that lapsed is
///    replaced whole (`UNLINK`, freed by the lazy-free thread); leases go a
///    step per call.
async fn longest_calls(store: &RedisStore, raw: &mut MultiplexedConnection) {
    println!("\n## A key whose every entry has ended: the calls until it is gone (µs, the longest; calls; SLOWLOG entries above 1 ms; LATENCY LATEST max ms)\n");
    println!("| entries | sliding_log: longest | calls | slowlog | latency | concurrency: longest | calls | slowlog | latency |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for entries in [1_000u64, 20_000, 100_000] {
        let mut row = format!("| {entries} |");
        for (name, limit) in [
            (
                "log",
                Limit::sliding_log(1_000_000_000, Duration::from_secs(1)).unwrap(),
            ),
            (
                "lease",
                Limit::concurrency(1_000_000_000, Duration::from_secs(1)).unwrap(),
            ),
        ] {
            let policy = Policy::single(limit.clone());
            let subject = Subject::new("trimmed").and(name).and(entries);
            let key = store.key(&subject, policy.limits().next().unwrap().0);
            // Ten seconds ago, with a window (a lease) of one second.
            fill(store, &subject, &policy, entries, system_micros() - 10_000_000).await;
            watch_latency(raw).await;
            let (mut longest, mut calls) = (0.0_f64, 0);
            loop {
                reset_stats(raw).await;
                let op = one_use(limit.is_concurrency(), format!("after-{calls}"));
                let outcome = store.decide(&subject, &policy, &Request::new(op, 1)).await.unwrap();
                assert!(outcome.decision.allowed);
                longest = longest.max(library_usec_per_call(raw).await);
                calls += 1;
                let held: u64 = redis::cmd("ZCARD").arg(&key).query_async(raw).await.unwrap();
                // Those added, and the log's (the leases') own members.
                if held <= calls + 3 {
                    break;
                }
                assert!(
                    calls < entries / 250 + 10,
                    "{name}: {held} members left after {calls} calls"
                );
            }
            let (slow, latency) = slow_and_latency(raw).await;
            write!(row, " {longest:.0} | {calls} | {slow} | {latency} |").unwrap();
        }
        println!("{row}");
    }
}

/// Clears `SLOWLOG` and `LATENCY`, and sets both to note what passes 1 ms.
async fn watch_latency(raw: &mut MultiplexedConnection) {
    for args in [
        &["CONFIG", "SET", "slowlog-log-slower-than", "1000"][..],
        &["CONFIG", "SET", "latency-monitor-threshold", "1"],
        &["SLOWLOG", "RESET"],
        &["LATENCY", "RESET"],
    ] {
        let _: redis::Value = redis::cmd(args[0]).arg(&args[1..]).query_async(raw).await.unwrap();
    }
}

/// The calls `SLOWLOG` holds, and the longest event `LATENCY LATEST` holds
/// (ms), since [`watch_latency`].
async fn slow_and_latency(raw: &mut MultiplexedConnection) -> (u64, u64) {
    let slow: u64 = redis::cmd("SLOWLOG").arg("LEN").query_async(raw).await.unwrap();
    // Each event: its name, when, the latest and the longest ms (Valkey
    // adds more fields after them).
    let events: Vec<Vec<redis::Value>> = redis::cmd("LATENCY").arg("LATEST").query_async(raw).await.unwrap();
    let latest = events
        .iter()
        .filter_map(|event| redis::from_redis_value::<u64>(event.get(2)?.clone()).ok())
        .max();
    (slow, latest.unwrap_or(0))
}

/// 3a. A key that expires whole: a sorted set of `entries` members (as a
///     log or leases leave it) given a 50 ms expiry, on a server whose
///     `lazyfree-lazy-expire` is `no` (Redis 7.0's default), then `yes`:
///     the longest event `LATENCY LATEST` saw (`expire-del`, and the
///     command that met the key, when it met it first).
async fn expiring_whole(raw: &mut MultiplexedConnection) {
    println!("\n## A key that expires whole: the longest expire event (LATENCY LATEST, ms)\n");
    println!("| members | lazyfree-lazy-expire no | yes |");
    println!("|---:|---:|---:|");
    for entries in [20_000u64, 100_000] {
        let mut row = format!("| {entries} |");
        for lazy in ["no", "yes"] {
            let _: () = redis::cmd("CONFIG")
                .arg(&["SET", "lazyfree-lazy-expire", lazy][..])
                .query_async(raw)
                .await
                .unwrap();
            let key = format!("expiring:{entries}:{lazy}");
            for chunk in (0..entries).collect::<Vec<_>>().chunks(5_000) {
                let mut zadd = redis::cmd("ZADD");
                zadd.arg(&key);
                for i in chunk {
                    zadd.arg(i).arg(format!("member-{i}"));
                }
                let _: u64 = zadd.query_async(raw).await.unwrap();
            }
            watch_latency(raw).await;
            let _: () = redis::cmd("PEXPIRE").arg(&key).arg(50).query_async(raw).await.unwrap();
            // The expire cycle (ten times a second) frees it, or the
            // first command that meets it does.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _: u64 = redis::cmd("EXISTS").arg(&key).query_async(raw).await.unwrap();
            let (_, latency) = slow_and_latency(raw).await;
            write!(row, " {latency} |").unwrap();
        }
        println!("{row}");
    }
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "lazyfree-lazy-expire", "no"][..])
        .query_async(raw)
        .await
        .unwrap();
}

/// 3b. A backlog: `entries` ended entries (leases) beside 10 live ones.
///     One decision after another, each timed alone, until the backlog is
///     trimmed: the longest call and how many calls it took.
async fn backlog_calls(store: &RedisStore, raw: &mut MultiplexedConnection) {
    println!("\n## A backlog of ended entries beside 10 live ones, trimmed a step per call (µs, the longest call; calls until gone)\n");
    println!("| decisions filled | sliding_log: members | longest | calls | concurrency: members | longest | calls |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let window = Duration::from_secs(60);
    for entries in [1_000u64, 20_000, 100_000] {
        let mut row = format!("| {entries} |");
        for (name, limit) in [
            ("log", Limit::sliding_log(1_000_000_000, window).unwrap()),
            ("lease", Limit::concurrency(1_000_000_000, window).unwrap()),
        ] {
            let policy = Policy::single(limit.clone());
            let subject = Subject::new("backlog").and(name).and(entries);
            let key = store.key(&subject, policy.limits().next().unwrap().0);
            // 65 s ago, with a window (a lease) of 60 s; then ten more 30 s
            // ago, while those still counted (the first ten names taken
            // again): now only the ten do (however long the fill took, up
            // to 30 s).
            let start = system_micros();
            fill(store, &subject, &policy, entries, start - 65_000_000).await;
            fill(store, &subject, &policy, 10, start - 30_000_000).await;
            // Decisions filled out of order merge into the newest entry of
            // a log (the clock went back): the members it holds.
            let members: u64 = redis::cmd("ZCARD").arg(&key).query_async(raw).await.unwrap();
            let (mut longest, mut calls) = (0.0_f64, 0);
            loop {
                reset_stats(raw).await;
                let op = one_use(limit.is_concurrency(), format!("after-{calls}"));
                let outcome = store.decide(&subject, &policy, &Request::new(op, 1)).await.unwrap();
                assert!(outcome.decision.allowed);
                longest = longest.max(library_usec_per_call(raw).await);
                calls += 1;
                let held: u64 = redis::cmd("ZCARD").arg(&key).query_async(raw).await.unwrap();
                // The live entries, those added, and the log's two members.
                if held <= 2 * (10 + calls) + 2 {
                    break;
                }
                assert!(
                    calls < entries / 250 + 10,
                    "{name}: {held} members left after {calls} calls"
                );
            }
            write!(row, " {members} | {longest:.0} | {calls} |").unwrap();
        }
        println!("{row}");
    }
}

/// 5. Alerts: Redis CPU per call of a fixed window that alerts at 50 and
///    100 % when no call crosses (a limit no call reaches half of), when
///    every call crosses both (a limit of one unit, a key per call: two
///    entries added to the outbox), next to the same window without alerts.
async fn alert_crossings(url: &str, raw: &mut MultiplexedConnection, decisions: u64) {
    let store = RedisStore::builder(url)
        .max_batch(1)
        .alert_outbox(1_000)
        .connect()
        .await
        .unwrap();
    println!("\n## Alerts: Redis CPU per call of a fixed window (µs, {decisions} calls, least of {ROUNDS})\n");
    println!("| window | µs per call | ratio to no alerts |");
    println!("|---|---:|---:|");
    let day = Duration::from_secs(86_400);
    let plain = Limit::fixed_window(1_000_000_000, day).unwrap();
    let rows = [
        ("no alerts", plain.clone(), false),
        ("alerts, no crossing", plain.alerting([50, 100]).unwrap(), false),
        (
            "alerts, two crossings a call",
            Limit::fixed_window(1, day).unwrap().alerting([50, 100]).unwrap(),
            true,
        ),
    ];
    let mut base = 0.0;
    for (round, (name, limit, crossing)) in rows.into_iter().enumerate() {
        let policy = Policy::single(limit);
        let mut least = f64::MAX;
        for attempt in 0..ROUNDS {
            reset_stats(raw).await;
            for i in 0..decisions {
                // Crossing: a key per call, each first check crossing both.
                let key = if crossing {
                    i + decisions * attempt as u64
                } else {
                    i % KEYS
                };
                let subject = Subject::new("alerts").and(round).and(key);
                let request = Request::new(Op::Check, 1)
                    .with_labels(vec![std::sync::Arc::from("a label of some length, as serve writes")]);
                store.decide(&subject, &policy, &request).await.unwrap();
            }
            least = least.min(library_usec_per_call(raw).await);
        }
        if round == 0 {
            base = least;
        }
        println!("| {name} | {least:.2} | {:.2} |", least / base);
    }
}

/// 4. Memory per key.
async fn memory_per_key(store: &RedisStore, raw: &mut MultiplexedConnection) {
    println!("\n## MEMORY USAGE of one key after one decision (bytes)\n");
    println!("| algorithm | tollgate key | plain string key, same name length, timestamp with PX | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, limit) in algorithms() {
        let policy = Policy::new([(name, limit.clone())]).unwrap();
        let subject = Subject::new("203.0.113.7");
        let op = one_use(limit.is_concurrency(), "0123456789abcdef".to_owned());
        store.decide(&subject, &policy, &Request::new(op, 1)).await.unwrap();
        let key = store.key(&subject, name);
        let used: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .query_async(raw)
            .await
            .unwrap();
        let plain = format!("{}x", &key[..key.len() - 1]);
        let _: () = redis::cmd("SET")
            .arg(&plain)
            .arg(system_micros())
            .arg("PX")
            .arg(3_600_000)
            .query_async(raw)
            .await
            .unwrap();
        let plain_used: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&plain)
            .query_async(raw)
            .await
            .unwrap();
        println!(
            "| {name} | {used} | {plain_used} | {:.2} |",
            used as f64 / plain_used as f64
        );
    }
}
