//! Decisions per second of one `RedisStore` shared by many tasks: the client
//! side of the Redis store (batching, the connection), on one server, a
//! Cluster or behind Sentinels. GCRA at a rate it never refuses, over many
//! subjects, so every decision writes.
//!
//! Usage: `cargo run --release -p tollgate --example redis_throughput -- <url> [tasks] [seconds] [subjects]`
//! (defaults: 64 tasks, 5 s, 1000 subjects), e.g. with
//! `redis+cluster://127.0.0.1:7000,127.0.0.1:7001`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::{Limit, Limiter, RedisStore, Subject};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: redis_throughput <url> [tasks] [seconds] [subjects]")?;
    let tasks: usize = args.next().map_or(Ok(64), |arg| arg.parse())?;
    let seconds: u64 = args.next().map_or(Ok(5), |arg| arg.parse())?;
    let subjects: usize = args.next().map_or(Ok(1000), |arg| arg.parse())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros();
        let store = RedisStore::builder(url.as_str())
            .prefix(format!("throughput-{run}"))
            .connect()
            .await?;
        let limit = Limit::gcra(1_000_000_000, Duration::from_secs(1), 1_000_000_000)?;
        let limiter = Limiter::new(store, limit);
        let (stop, decisions, errors) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let workers: Vec<_> = (0..tasks)
            .map(|task| {
                let (limiter, stop) = (limiter.clone(), Arc::clone(&stop));
                let (decisions, errors) = (Arc::clone(&decisions), Arc::clone(&errors));
                tokio::spawn(async move {
                    let mut key = task % subjects;
                    while !stop.load(Ordering::Relaxed) {
                        match limiter.check(&Subject::new("s").and(key)).await {
                            Ok(_) => decisions.fetch_add(1, Ordering::Relaxed),
                            Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                        };
                        key = (key + tasks) % subjects;
                    }
                })
            })
            .collect();
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = started.elapsed();
        for worker in workers {
            worker.await?;
        }
        let done = decisions.load(Ordering::Relaxed);
        println!(
            "{tasks} tasks, {subjects} subjects, {:.1} s: {:.0} decisions/s, {} errors",
            elapsed.as_secs_f64(),
            done as f64 / elapsed.as_secs_f64(),
            errors.load(Ordering::Relaxed)
        );
        Ok(())
    })
}
