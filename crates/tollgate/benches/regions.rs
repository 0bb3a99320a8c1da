//! Global limits across regions, at the real pace (`cargo bench -p
//! tollgate --bench regions`): a home redis-server, three regions each with
//! its own redis-server and two replicas (`RegionalStore`s of their own),
//! regions 2 and 3 reaching home through a link of 40 ms each way
//! (`tollgate_testkit::slow_link`). Every 5 ms each region asks its part
//! of the demand, spread over its two replicas, and one check of a
//! regional-only rule (the latency anchor); every global decision also
//! records a token report on a global monthly budget.
//!
//! 1. A fixed window of 1 000 per 5 s, demand twice the limit skewed
//!    70/20/10 for 4 windows, then 10/20/70 for 4: per window, what all
//!    regions admitted (over the limit: must be 0; at least 95 % of it).
//! 2. The same limit and demand for 4 windows with region 3 cut off from
//!    home for 20 s (`local`, 10 %): the others' admissions, region 3's
//!    against its bound (its share when cut, then 10 % of the limit per
//!    window).
//! 3. A GCRA of 200 per second (burst 50), demand twice it, 70/20/10 then
//!    10/20/70: how long after the shift region 3 admits 90 % of its rate
//!    at the end (in 100 ms bins), against 3 round trips plus a block.
//!
//! Then every outbox is drained: the tokens home counted against those
//! recorded (lost, counted twice).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tollgate::Clock as _;
use tollgate::{
    Limit, OnStoreError, Op, Policy, RedisStore, RegionalStore, Request, Scope, Store, Subject, SystemClock,
};
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::slow_link::SlowLink;

const TICK: Duration = Duration::from_millis(5);

/// One decision: region, allowed, when (µs, the deciding server's clock), latency.
type Sample = (usize, bool, u64, Duration);

struct Region {
    replicas: Vec<RegionalStore>,
    regional_only: RedisStore,
}

async fn store(port: u16, timeout: Duration) -> RedisStore {
    RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(timeout)
        .connect()
        .await
        .expect("a redis-server")
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let at = ((samples.len() as f64 * q) as usize).min(samples.len() - 1);
    samples[at]
}

/// Runs `demand` (requests per second per region) for `length`, every
/// decision of `policy` on `subject`; records token reports on `budget`.
/// Answers the global decisions, and the regional-only checks' latencies.
#[allow(clippy::too_many_arguments)]
async fn drive(
    regions: &Arc<Vec<Region>>,
    policy: &Policy,
    subject: &Subject,
    budget: &Policy,
    recorded: &Arc<Mutex<u64>>,
    demand: [u64; 3],
    length: Duration,
    cut: Option<(&SlowLink, Duration, Duration)>,
) -> (Vec<Sample>, [Vec<Duration>; 3]) {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let anchors: Arc<Mutex<[Vec<Duration>; 3]>> = Arc::new(Mutex::new([Vec::new(), Vec::new(), Vec::new()]));
    let started = Instant::now();
    let mut owed = [0_u64; 3];
    let mut turn = 0_usize;
    let mut ticker = tokio::time::interval(TICK);
    let mut is_cut = false;
    let regional = Policy::new([(
        "regional",
        Limit::fixed_window(1 << 40, Duration::from_secs(3600)).unwrap(),
    )])
    .unwrap();
    while started.elapsed() < length {
        ticker.tick().await;
        if let Some((link, from, until)) = cut {
            let at = started.elapsed();
            if !is_cut && at >= from && at < until {
                link.cut();
                is_cut = true;
            } else if is_cut && at >= until {
                link.restore();
                is_cut = false;
            }
        }
        for region in 0..3 {
            owed[region] += demand[region] * 5;
            while owed[region] >= 1_000 {
                owed[region] -= 1_000;
                turn += 1;
                let store = regions[region].replicas[turn % 2].clone();
                let (policy, budget, subject) = (policy.clone(), budget.clone(), subject.clone());
                let (samples, recorded) = (Arc::clone(&samples), Arc::clone(recorded));
                let tokens = 1 + (turn as u64 % 10);
                tokio::spawn(async move {
                    let asked = Instant::now();
                    let Ok(outcome) = store.decide(&subject, &policy, &Request::new(Op::Check, 1)).await else {
                        return;
                    };
                    let latency = asked.elapsed();
                    samples.lock().push((
                        region,
                        outcome.decision.allowed,
                        outcome.decided_at.as_micros(),
                        latency,
                    ));
                    if outcome.decision.allowed
                        && store
                            .decide(&subject, &budget, &Request::new(Op::Record, tokens))
                            .await
                            .is_ok()
                    {
                        *recorded.lock() += tokens;
                    }
                });
            }
            let anchor = regions[region].regional_only.clone();
            let (anchors, regional, subject) = (Arc::clone(&anchors), regional.clone(), subject.clone());
            tokio::spawn(async move {
                let asked = Instant::now();
                if anchor
                    .decide(&subject, &regional, &Request::new(Op::Check, 1))
                    .await
                    .is_ok()
                {
                    anchors.lock()[region].push(asked.elapsed());
                }
            });
        }
    }
    if let Some((link, _, _)) = cut {
        link.restore();
    }
    // What is in flight lands.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let samples = std::mem::take(&mut *samples.lock());
    let anchors = std::mem::take(&mut *anchors.lock());
    (samples, anchors)
}

/// Admitted per window (of `window` µs, aligned on the epoch), per region.
fn per_window(samples: &[Sample], window: u64) -> BTreeMap<u64, [u64; 3]> {
    let mut windows: BTreeMap<u64, [u64; 3]> = BTreeMap::new();
    for &(region, allowed, at, _) in samples {
        if allowed {
            windows.entry(at / window).or_default()[region] += 1;
        }
    }
    windows
}

fn latencies(samples: &[Sample], anchors: &mut [Vec<Duration>; 3]) {
    for (region, anchor) in anchors.iter_mut().enumerate() {
        let mut global: Vec<Duration> = samples.iter().filter(|s| s.0 == region).map(|s| s.3).collect();
        let (p50, p99) = (quantile(&mut global, 0.5), quantile(&mut global, 0.99));
        let (a50, a99) = (quantile(anchor, 0.5), quantile(anchor, 0.99));
        println!(
            "  region {}: global p50 {:>7.2?} p99 {:>7.2?} | regional-only p50 {:>7.2?} p99 {:>7.2?} | p99 difference {:+.2} ms",
            region + 1,
            p50,
            p99,
            a50,
            a99,
            (p99.as_secs_f64() - a99.as_secs_f64()) * 1e3
        );
    }
}

fn windows_table(windows: &BTreeMap<u64, [u64; 3]>, limit: u64) -> (u64, f64) {
    let mut worst_over = 0;
    let mut least = f64::MAX;
    let count = windows.len();
    for (index, (_, admitted)) in windows.iter().enumerate() {
        let total: u64 = admitted.iter().sum();
        // The first and last windows are partial.
        let whole = index > 0 && index + 1 < count;
        worst_over = worst_over.max(total.saturating_sub(limit));
        #[allow(clippy::cast_precision_loss)]
        let share = total as f64 / limit as f64;
        if whole {
            least = least.min(share);
        }
        println!(
            "  window {index}: {admitted:?} total {total} ({:.1} % of {limit}){}",
            share * 100.0,
            if whole { "" } else { " partial" }
        );
    }
    (worst_over, least)
}

fn main() {
    // The links run runtimes of their own: started and stopped outside
    // the benchmark's.
    let home = RedisServer::start();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let links: Vec<Option<SlowLink>> = (0..3)
        .map(|region| (region > 0).then(|| SlowLink::start(home.port(), Duration::from_millis(40))))
        .collect();
    tollgate_testkit::runtime().block_on(run(&home, &servers, &links));
}

/// The benchmark's store, limits and tallies.
struct Bench {
    regions: Arc<Vec<Region>>,
    budget: Policy,
    recorded: Arc<Mutex<u64>>,
    windowed: Policy,
}

impl Bench {
    async fn drive(
        &self,
        policy: &Policy,
        subject: &str,
        demand: [u64; 3],
        length: Duration,
        cut: Option<(&SlowLink, Duration, Duration)>,
    ) -> (Vec<Sample>, [Vec<Duration>; 3]) {
        let subject = Subject::new(subject);
        drive(
            &self.regions,
            policy,
            &subject,
            &self.budget,
            &self.recorded,
            demand,
            length,
            cut,
        )
        .await
    }
}

async fn run(home: &RedisServer, servers: &[RedisServer], links: &[Option<SlowLink>]) {
    let bench = connect(home, servers, links).await;
    // Align on a window's start.
    let now = SystemClock.now().as_micros();
    tokio::time::sleep(Duration::from_micros(5_000_000 - now % 5_000_000)).await;
    skew_then_shift(&bench).await;
    cut_off(&bench, links[2].as_ref().expect("region 3 is far")).await;
    reaction(&bench).await;
    reconcile(&bench, home).await;
}

async fn connect(home: &RedisServer, servers: &[RedisServer], links: &[Option<SlowLink>]) -> Bench {
    let mut regions = Vec::new();
    for (region, server) in servers.iter().enumerate() {
        let home_port = links[region].as_ref().map_or(home.port(), SlowLink::port);
        let mut replicas = Vec::new();
        for _ in 0..2 {
            replicas.push(
                RegionalStore::builder(
                    store(server.port(), Duration::from_millis(500)).await,
                    store(home_port, Duration::from_secs(1)).await,
                    format!("r{}", region + 1),
                )
                .on_home_error(OnStoreError::Local, 0.1)
                .build(),
            );
        }
        regions.push(Region {
            replicas,
            regional_only: store(server.port(), Duration::from_millis(500)).await,
        });
    }
    let global = |name: &str, limit: Limit| Policy::new([(name, limit.with_scope(Scope::Global).unwrap())]).unwrap();
    Bench {
        regions: Arc::new(regions),
        budget: global(
            "tokens",
            Limit::fixed_window(1 << 40, Duration::from_secs(30 * 86_400)).unwrap(),
        ),
        recorded: Arc::new(Mutex::new(0)),
        windowed: global("per_5s", Limit::fixed_window(1_000, Duration::from_secs(5)).unwrap()),
    }
}

async fn skew_then_shift(bench: &Bench) {
    println!("1. fixed window 1000 / 5 s, demand 400/s: 70/20/10 for 20 s, then 10/20/70 for 20 s");
    let twenty = Duration::from_secs(20);
    let (mut samples, mut anchors) = bench
        .drive(&bench.windowed, "tenant-a", [280, 80, 40], twenty, None)
        .await;
    let (after, after_anchors) = bench
        .drive(&bench.windowed, "tenant-a", [40, 80, 280], twenty, None)
        .await;
    samples.extend(after);
    for (anchor, after) in anchors.iter_mut().zip(after_anchors) {
        anchor.extend(after);
    }
    let (over, least) = windows_table(&per_window(&samples, 5_000_000), 1_000);
    println!(
        "  most over the limit in a window: {over}; least admitted in a whole window: {:.1} %",
        least * 100.0
    );
    latencies(&samples, &mut anchors);
}

async fn cut_off(bench: &Bench, link: &SlowLink) {
    println!("2. the same, region 3 cut off from home for 20 s (local, 10 %)");
    let cut = Some((link, Duration::from_secs(5), Duration::from_secs(25)));
    let (samples, mut anchors) = bench
        .drive(&bench.windowed, "tenant-b", [280, 80, 40], Duration::from_secs(30), cut)
        .await;
    let (over, least) = windows_table(&per_window(&samples, 5_000_000), 1_000);
    println!(
        "  most over the limit in a window: {over}; least admitted in a whole window: {:.1} %",
        least * 100.0
    );
    latencies(&samples, &mut anchors);
}

/// Region 3's admissions per 100 ms bin.
fn bins(samples: &[Sample], region: usize) -> BTreeMap<u64, u64> {
    let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
    for &(r, allowed, at, _) in samples {
        if r == region && allowed {
            *bins.entry(at / 100_000).or_default() += 1;
        }
    }
    bins
}

async fn reaction(bench: &Bench) {
    println!("3. GCRA 200/s (burst 50), demand 400/s: 70/20/10 for 10 s, then 10/20/70 for 10 s");
    let smooth = Policy::new([(
        "per_second",
        Limit::gcra(200, Duration::from_secs(1), 50)
            .unwrap()
            .with_scope(Scope::Global)
            .unwrap(),
    )])
    .unwrap();
    let ten = Duration::from_secs(10);
    let (before, _) = bench.drive(&smooth, "tenant-c", [280, 80, 40], ten, None).await;
    let shifted_at = before.iter().map(|s| s.2).max().unwrap_or(0);
    let (after, _) = bench.drive(&smooth, "tenant-c", [40, 80, 280], ten, None).await;
    let after_bins = bins(&after, 2);
    let tail: Vec<u64> = after_bins.values().rev().skip(2).take(30).copied().collect();
    #[allow(clippy::cast_precision_loss)]
    let steady = tail.iter().sum::<u64>() as f64 / tail.len().max(1) as f64;
    #[allow(clippy::cast_precision_loss)]
    let reached = after_bins
        .iter()
        .find(|(_, &count)| count as f64 >= 0.9 * steady)
        .map(|(&bin, _)| (bin * 100_000).saturating_sub(shifted_at));
    #[allow(clippy::cast_precision_loss)]
    let before_rate = bins(&before, 2).values().rev().skip(2).take(30).sum::<u64>() as f64 / 30.0;
    let round_trip = bench.regions[2].replicas[0].stats().await.unwrap().round_trip;
    println!(
        "  region 3: {before_rate:.1} per 100 ms before, {steady:.1} at the end; 90 % of it reached {:?} after the shift (3 round trips + a block: {:?})",
        reached.map(Duration::from_micros),
        round_trip * 3 + Duration::from_secs(1)
    );
}

async fn reconcile(bench: &Bench, home: &RedisServer) {
    println!("4. token reports: every outbox drained");
    let mut drained = false;
    for _ in 0..2_000 {
        let mut left = 0;
        for region in bench.regions.iter() {
            for replica in &region.replicas {
                let _ = replica.forward().await;
            }
            left += region.replicas[0].stats().await.unwrap().outbox;
        }
        if left == 0 {
            drained = true;
            break;
        }
    }
    let home = store(home.port(), Duration::from_secs(1)).await;
    let view = Policy::new([(
        "tokens",
        Limit::fixed_window(1 << 40, Duration::from_secs(30 * 86_400)).unwrap(),
    )])
    .unwrap();
    let mut counted = 0;
    for subject in ["tenant-a", "tenant-b", "tenant-c"] {
        let peek = home
            .decide(&Subject::new(subject), &view, &Request::new(Op::CheckAtMost, 0))
            .await
            .unwrap();
        counted += (1_u64 << 40) - peek.decision.remaining;
    }
    let recorded = *bench.recorded.lock();
    println!(
        "  recorded {recorded}, home counted {counted}: lost {}, counted twice {} (drained: {drained})",
        recorded.saturating_sub(counted),
        counted.saturating_sub(recorded),
    );
    for region in bench.regions.iter() {
        println!("  {:?}", region.replicas[0].stats().await.unwrap());
    }
}
