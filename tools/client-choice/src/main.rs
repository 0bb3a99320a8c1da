//! redis-rs against fred on the one-connection workload of `tollgate bench
//! --batch 1`: `TASKS` tasks sharing one client, each sending EVALSHA of the
//! hand-written GCRA anchor script (crates/tollgate/examples/anchors/gcra.lua,
//! always allowing) in a loop for `SECONDS`, over 1000 keys. Prints
//! decisions per second for each: what one connection of a Rust client
//! reaches with the cheapest script, the ceiling for Tollgate's own calls.
//!
//! Usage: client-choice redis://127.0.0.1:PORT [tasks] [seconds]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;

const SCRIPT: &str = include_str!("../../../crates/tollgate/examples/anchors/gcra.lua");

/// The anchor's arguments: an emission interval of 1 µs, a horizon of 10⁹ µs
/// (always allowed).
fn args() -> Vec<String> {
    vec!["1".to_owned(), "1000000000".to_owned()]
}

async fn run<F, Fut>(tasks: usize, seconds: u64, call: F) -> f64
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (stop, done, call) = (stop.clone(), done.clone(), call.clone());
        handles.push(tokio::spawn(async move {
            let mut i = task;
            while !stop.load(Ordering::Relaxed) {
                call(format!("choice:{{{}}}:gcra", i % 1000)).await;
                done.fetch_add(1, Ordering::Relaxed);
                i += tasks;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.await.expect("task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let mut argv = std::env::args().skip(1);
    let url = argv.next().expect("usage: client-choice redis://HOST:PORT [tasks] [seconds]");
    let tasks: usize = argv.next().map_or(64, |t| t.parse().expect("tasks"));
    let seconds: u64 = argv.next().map_or(5, |s| s.parse().expect("seconds"));

    let client = redis::Client::open(url.as_str()).expect("url");
    let manager = redis::aio::ConnectionManager::new(client).await.expect("connect");
    let script = redis::Script::new(SCRIPT);
    let sha = script.get_hash().to_owned();
    let redis_rs = {
        let (manager, script) = (manager.clone(), Arc::new(script));
        run(tasks, seconds, move |key| {
            let (mut manager, script) = (manager.clone(), script.clone());
            async move {
                let mut invocation = script.prepare_invoke();
                invocation.key(key);
                for arg in args() {
                    invocation.arg(arg);
                }
                let _: redis::Value = invocation.invoke_async(&mut manager).await.expect("redis-rs call");
            }
        })
        .await
    };

    let config = Config::from_url(&url).expect("url");
    let fred_client = Builder::from_config(config).build().expect("fred client");
    fred_client.init().await.expect("fred connect");
    let _: String = fred_client.script_load(SCRIPT).await.expect("script load");
    let fred = {
        let (client, sha) = (fred_client.clone(), sha.clone());
        run(tasks, seconds, move |key| {
            let (client, sha) = (client.clone(), sha.clone());
            async move {
                let _: fred::types::Value = client.evalsha(sha, vec![key], args()).await.expect("fred call");
            }
        })
        .await
    };
    println!("| client | tasks | decisions/s |");
    println!("| --- | ---: | ---: |");
    println!("| redis-rs 1.8 (ConnectionManager, one multiplexed connection) | {tasks} | {redis_rs:.0} |");
    println!("| fred 10 (one client, auto-pipelined) | {tasks} | {fred:.0} |");
}
