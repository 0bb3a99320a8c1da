//! What a durable record costs (`cargo bench -p tollgate --bench
//! durable`): a redis-server and a replica of it are started on free ports
//! (no persistence, as the tests start them), then one task records
//! on a plain limit and on a durable one (`"durable": "replicated"`) in
//! turns, 50 rounds of 200 records each, and prints the median and p99
//! latency of each, and of a bare `PING` round trip, the anchor.
//!
//! Then a Cluster of 3 masters without replicas (so a `replicated` record
//! waits out the store's timeout, 200 ms): three tasks check a plain limit
//! on random subjects for 6 s alone, then 6 s more while four tasks record
//! on a durable limit without pause; the checks' count and latency each
//! time (a record's wait must hold up no other decision).

use tollgate_testkit::redis_cluster;
use tollgate_testkit::redis_server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_cluster::RedisCluster;
use redis_server::RedisServer;
use tollgate::{Durability, Limit, Limiter, RedisStore, Subject};

fn quantiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    one_server().await;
    cluster().await;
}

async fn one_server() {
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay".to_owned(), "0".to_owned()]);
    let replica = RedisServer::start_with(&[
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        master.port().to_string(),
    ]);
    let started = Instant::now();
    while !replica.cli(&["INFO", "replication"]).contains("master_link_status:up") {
        assert!(started.elapsed() < Duration::from_secs(10), "the replica never synced");
        std::thread::sleep(Duration::from_millis(10));
    }
    let store = RedisStore::connect(&master.url()).await.unwrap();
    let window = Limit::fixed_window(1 << 50, Duration::from_secs(86_400)).unwrap();
    let plain = Limiter::new(store.clone(), window.clone());
    let durable = Limiter::new(store.clone(), window.durable(Durability::Replicated));
    // A synced replica counts for WAIT once it has reported its offset.
    while durable.record(&Subject::new("warm-up"), 1).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the replica never acknowledged"
        );
    }
    let (mut plain_samples, mut durable_samples, mut ping_samples) = (Vec::new(), Vec::new(), Vec::new());
    let client = redis::Client::open(master.url().as_str()).unwrap();
    let mut ping = client.get_multiplexed_async_connection().await.unwrap();
    for round in 0..50 {
        for index in 0..200 {
            let subject = Subject::new(format!("tenant-{}", (round * 200 + index) % 1_000));
            let at = Instant::now();
            plain.record(&subject, 100).await.unwrap();
            plain_samples.push(at.elapsed());
            let at = Instant::now();
            durable.record(&subject, 100).await.unwrap();
            durable_samples.push(at.elapsed());
            let at = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut ping).await.unwrap();
            ping_samples.push(at.elapsed());
        }
    }
    let (plain_p50, plain_p99) = quantiles(plain_samples);
    let (durable_p50, durable_p99) = quantiles(durable_samples);
    let (ping_p50, ping_p99) = quantiles(ping_samples);
    println!("| record, 10 000 each, one task | p50 | p99 |");
    println!("|---|---:|---:|");
    println!("| plain | {plain_p50:.1?} | {plain_p99:.1?} |");
    println!("| durable (replicated) | {durable_p50:.1?} | {durable_p99:.1?} |");
    println!("| PING (a round trip) | {ping_p50:.1?} | {ping_p99:.1?} |");
    println!(
        "durable - plain: p50 {:.1?} ({:.2} round trips)",
        durable_p50.saturating_sub(plain_p50),
        durable_p50.saturating_sub(plain_p50).as_secs_f64() / ping_p50.as_secs_f64()
    );
}

/// `tasks` tasks checking `plain` on random subjects for `period`: every
/// check's latency.
async fn checks(plain: &Limiter<RedisStore>, tasks: usize, period: Duration) -> Vec<Duration> {
    let until = Instant::now() + period;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let plain = plain.clone();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while Instant::now() < until {
                    let subject = Subject::new(format!("plain-{}", fastrand::u64(..)));
                    let at = Instant::now();
                    plain.check(&subject).await.unwrap();
                    samples.push(at.elapsed());
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.unwrap());
    }
    samples.sort();
    samples
}

async fn cluster() {
    let cluster = RedisCluster::start_masters();
    let store = RedisStore::builder(cluster.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let window = Limit::fixed_window(1 << 50, Duration::from_secs(86_400)).unwrap();
    let plain = Limiter::new(store.clone(), window.clone());
    let durable = Limiter::new(store.clone(), window.durable(Durability::Replicated));
    let period = Duration::from_secs(6);
    checks(&plain, 3, Duration::from_secs(1)).await;
    let alone = checks(&plain, 3, period).await;
    let stop = Arc::new(AtomicBool::new(false));
    let recorders: Vec<_> = (0..4)
        .map(|_| {
            let (durable, stop) = (durable.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut records = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let subject = Subject::new(format!("durable-{}", fastrand::u64(..)));
                    // No replica: "not durable" after the timeout, counted.
                    let _ = durable.record(&subject, 1).await;
                    records += 1;
                }
                records
            })
        })
        .collect();
    let during = checks(&plain, 3, period).await;
    stop.store(true, Ordering::Relaxed);
    let mut records = 0;
    for recorder in recorders {
        records += recorder.await.unwrap();
    }
    let at =
        |samples: &[Duration], per_mille: usize| samples[(samples.len() * per_mille / 1_000).min(samples.len() - 1)];
    println!();
    println!("| a Cluster of 3 masters, no replica; plain checks, 3 tasks, 6 s | checks | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|");
    for (name, samples) in [("alone", &alone), ("while 4 tasks record durably", &during)] {
        println!(
            "| {name} | {} | {:.1?} | {:.1?} | {:.1?} |",
            samples.len(),
            at(samples, 500),
            at(samples, 990),
            samples.last().unwrap()
        );
    }
    println!("durable records meanwhile (each waiting 200 ms, answered not durable): {records}");
}
