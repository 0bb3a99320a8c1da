//! `tollgate bench`: load against a store, with a progress bar and a summary.
//!
//! `--tasks` tokio tasks on a multi-threaded runtime share one store — for
//! Redis one multiplexed connection, as a service's handlers would — and
//! decide as fast as they can, each taking the `--keys` subjects in turn,
//! until `--duration` has passed or `--requests` have been sent. Each task
//! records its latencies in its own histogram; they are merged at the end,
//! so recording costs no lock.
//!
//! The summary brackets the run with the store's clock: for Redis, the
//! server's `TIME` read just before the first request and just after the
//! last answer, so every decision of the run was taken at a server instant
//! between the two. Several `bench` processes loading one limit can then be
//! checked against the limit's exact bound over that span (the multi-process
//! tests do).
//!
//! With `--target`, the load goes to a running `tollgate serve` instead, over
//! gRPC or HTTP (see [`target`]).

mod args;
mod report;
mod target;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tollgate::{
    LeasedStore, Limiter, MemoryStore, OnStoreError, Op, Path, Policy, Request, ResilientStore, Store as _, Subject,
};

pub use self::args::{Args, BenchOp, HttpRequest};
use self::report::Report;
use crate::store::{self, AnyStore, StoreUrl};
use crate::UsageError;

/// GCRA at a billion per second with a burst as large: nearly everything is
/// allowed, so the run measures the store rather than denials.
const DEFAULT_LIMIT: &str = r#"{"algorithm":"gcra","rate":1000000000,"period":"1s","burst":1000000000}"#;

/// The key prefix of a Redis bench unless `--prefix` says otherwise.
const DEFAULT_PREFIX: &str = "tollgate-bench";

/// The longest latency recorded exactly; longer ones count as this.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// When the run stops.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// After this long.
    Elapsed(Duration),
    /// After this many requests, over all tasks.
    Requests(u64),
}

impl Until {
    fn new(args: &Args) -> Self {
        match (args.requests, args.duration) {
            (Some(requests), _) => Self::Requests(requests),
            (None, duration) => Self::Elapsed(duration.unwrap_or(Duration::from_secs(5))),
        }
    }

    /// When each task stops, for a run that started at `started`.
    fn deadline(self, started: Instant) -> Deadline {
        match self {
            Self::Elapsed(duration) => Deadline::At(started + duration),
            Self::Requests(requests) => Deadline::Count(requests),
        }
    }
}

/// A validated run.
#[derive(Debug)]
struct Plan {
    store: StoreUrl,
    prefix: String,
    policy: Policy,
    tasks: u32,
    keys: u64,
    until: Until,
    op: BenchOp,
    hold: Duration,
    /// Each request's cost is drawn from this range (both ends included).
    cost: (u64, u64),
    /// With `--rate`: the time between two requests of one task.
    pace: Option<Duration>,
    batch: Option<u32>,
    on_store_error: Option<OnStoreError>,
    store_timeout: Option<Duration>,
    deny_cache: usize,
}

impl Plan {
    fn new(args: &Args) -> Result<Self, UsageError> {
        let store = StoreUrl::parse(&args.store)?;
        if store == StoreUrl::Memory && args.prefix.is_some() {
            return Err(UsageError("--prefix applies only to a Redis store".to_owned()));
        }
        if store == StoreUrl::Memory && args.batch.is_some() {
            return Err(UsageError("--batch applies only to a Redis store".to_owned()));
        }
        if store == StoreUrl::Memory && args.on_store_error.is_some() {
            return Err(UsageError("--on-store-error applies only to a Redis store".to_owned()));
        }
        if args.cost_max.is_some_and(|most| most < args.cost) {
            return Err(UsageError("--cost-max must be at least --cost".to_owned()));
        }
        if args.hold_ms > 0 && args.op != BenchOp::Acquire {
            return Err(UsageError("--hold-ms applies only to --op acquire".to_owned()));
        }
        let policy = Policy::from_json(args.limit.as_deref().unwrap_or(DEFAULT_LIMIT))
            .map_err(|error| UsageError(format!("invalid --limit: {error}")))?;
        Ok(Self {
            store,
            prefix: args.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.to_owned()),
            policy,
            tasks: args.tasks,
            keys: args.keys.unwrap_or(1),
            op: args.op,
            hold: Duration::from_millis(args.hold_ms),
            cost: (args.cost, args.cost_max.unwrap_or(args.cost)),
            pace: args
                .rate
                .map(|rate| Duration::from_secs_f64(f64::from(args.tasks) / rate as f64)),
            batch: args.batch,
            on_store_error: args.on_store_error,
            store_timeout: args.store_timeout,
            deny_cache: args.deny_cache.unwrap_or(0),
            until: Until::new(args),
        })
    }
}

/// Runs `tollgate bench`: the load, then the summary on standard output.
///
/// # Errors
///
/// A [`UsageError`] for invalid arguments (an operation the limit does not
/// support included); a store that cannot be reached; a run in which every
/// request failed.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let plan = match &args.target {
        Some(url) => Either::Target(target::Plan::new(args, url)?),
        None => Either::Store(Plan::new(args)?),
    };
    let runtime = match args.threads {
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Some(threads) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(threads))
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
    }
    .context("cannot start the async runtime")?;
    let progress = if args.quiet {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
    } else {
        // Drawn only when stderr is a terminal.
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10))
    };
    let report = match plan {
        Either::Store(plan) => runtime.block_on(bench(&plan, &progress))?,
        Either::Target(plan) => runtime.block_on(target::bench(plan, &progress))?,
    };
    progress.finish_and_clear();
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    for warning in report.warnings() {
        eprintln!("warning: {warning}");
    }
    if report.errors > 0 && report.errors == report.requests {
        anyhow::bail!("every request failed");
    }
    Ok(())
}

/// A run against a store, or against a server.
enum Either {
    Store(Plan),
    Target(target::Plan),
}

/// What the tasks share while they run.
#[derive(Default)]
struct Shared {
    /// Requests sent, for `--requests` (each task takes one before sending).
    issued: AtomicU64,
    /// Requests answered, for the progress bar.
    answered: AtomicU64,
    /// The next key a `--target` request takes: the connections take the
    /// `--keys` values in turn between them, so that K requests visit K
    /// distinct values.
    next_key: AtomicU64,
    /// Set when a task met an invalid argument: every task stops.
    stop: AtomicBool,
    invalid: Mutex<Option<String>>,
}

/// What one task counted.
struct Tally {
    allowed: u64,
    /// Units the store counted (granted, recorded, less what settlements
    /// gave back).
    units: u64,
    denied: u64,
    errors: u64,
    first_error: Option<String>,
    /// Latency of each request, in ns.
    latency: Histogram<u64>,
    /// Decisions by the path that decided them, in the order of `Path::ALL`.
    paths: [u64; Path::ALL.len()],
    /// Latency of the requests not decided by the store (a fault answered
    /// by the failure policy, or the error itself), in ns.
    fallback_latency: Histogram<u64>,
    /// When this task last saw the store decide again after a fault (ms
    /// since the Unix epoch).
    recovered_at_ms: Option<u64>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

impl Tally {
    fn new() -> Self {
        Self {
            allowed: 0,
            units: 0,
            denied: 0,
            errors: 0,
            first_error: None,
            latency: histogram(),
            paths: [0; Path::ALL.len()],
            fallback_latency: histogram(),
            recovered_at_ms: None,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// The store's clock, read to bracket the run.
enum StoreClock {
    /// The memory store decides on the system clock.
    System,
    /// Redis decides on the server's `TIME` (on a Cluster, a node's).
    Redis(tollgate::RedisStore),
}

impl StoreClock {
    fn of(store: &AnyStore) -> Self {
        match store {
            AnyStore::Redis(redis) => Self::Redis(redis.clone()),
            AnyStore::Resilient(resilient) => resilient
                .store()
                .map_or(Self::System, |redis| Self::Redis(redis.clone())),
            _ => Self::System,
        }
    }

    /// Microseconds since the Unix epoch.
    async fn now(&mut self) -> anyhow::Result<u64> {
        match self {
            Self::System => {
                let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                Ok(u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX))
            }
            Self::Redis(redis) => Ok(redis
                .server_time()
                .await
                .context("cannot read the server's TIME")?
                .as_micros()),
        }
    }
}

async fn bench(plan: &Plan, progress: &ProgressBar) -> anyhow::Result<Report> {
    let mut engine = None;
    let store = match &plan.store {
        StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
        StoreUrl::Redis(url) => {
            let mut builder = tollgate::RedisStore::builder(url.as_str()).prefix(plan.prefix.as_str());
            if let Some(batch) = plan.batch {
                builder = builder.max_batch(batch as usize);
            }
            let redis = store::connect_redis_with(builder, url).await?;
            engine = Some(redis.engine().name());
            match plan.on_store_error {
                None => AnyStore::Redis(redis),
                Some(on_error) => {
                    let mut builder = ResilientStore::builder(redis)
                        .on_error(on_error)
                        .deny_cache(plan.deny_cache);
                    if let Some(timeout) = plan.store_timeout {
                        builder = builder.timeout(timeout);
                    }
                    AnyStore::Resilient(builder.build())
                }
            }
        }
    };
    let mut clock = StoreClock::of(&store);
    // A limit with a lease is taken in blocks from a shared store; the
    // memory store is this process's own.
    let leased = plan.policy.lease().is_some() && !store.in_process();
    let store = LeasedStore::new(store);
    let limiter = Limiter::new(store.clone(), plan.policy.clone());
    let subjects: Arc<[Subject]> = (0..plan.keys).map(|key| Subject::new(format!("bench-{key}"))).collect();
    let shared = Arc::new(Shared::default());
    show_progress(progress, plan.until);

    let server_time_start_us = clock.now().await?;
    let cpu_at_start = report::process_cpu();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..plan.tasks {
        let worker = Worker {
            limiter: limiter.clone(),
            subjects: Arc::clone(&subjects),
            shared: Arc::clone(&shared),
            first_key: u64::from(task) % plan.keys,
            stride: u64::from(plan.tasks),
            until: plan.until.deadline(started),
            op: plan.op,
            hold: plan.hold,
            cost: plan.cost,
            // Task `i` of `n` starts `i/n` of a pace late: the tasks' sends
            // interleave evenly.
            pace: plan.pace.map(|pace| (pace, started + pace * task / plan.tasks)),
        };
        tasks.spawn(worker.run());
    }
    let tallies = join_workers(tasks, progress, &shared, plan.until, started).await?;
    let elapsed = started.elapsed();
    let cpu = report::process_cpu()
        .zip(cpu_at_start)
        .map(|(end, start)| end.saturating_sub(start));
    // Redis may be down at the end of a run that tests its failures.
    let server_time_end_us = clock.now().await.unwrap_or(0);

    // Unused units go back before the process ends (and before the
    // server's clock is read again).
    store.close(None).await;
    if let Some(message) = shared.invalid.lock().expect("no panic while holding the lock").take() {
        return Err(UsageError(message).into());
    }
    let report = Report::store(plan, tallies, elapsed, server_time_start_us, server_time_end_us);
    // Without a lease every decision is a store call.
    let calls = leased.then(|| store.stats().calls);
    Ok(report.with_process(engine, cpu).with_store_calls(calls))
}

fn show_progress(progress: &ProgressBar, until: Until) {
    let (length, template) = match until {
        Until::Elapsed(duration) => (
            u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            "{spinner} [{elapsed_precise}] {wide_bar} {msg}",
        ),
        Until::Requests(requests) => (requests, "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        progress.set_style(style);
    }
    progress.set_length(length);
}

/// Waits for every worker, moving the progress bar along meanwhile; returns
/// their tallies.
async fn join_workers(
    mut tasks: tokio::task::JoinSet<Tally>,
    progress: &ProgressBar,
    shared: &Arc<Shared>,
    until: Until,
    started: Instant,
) -> anyhow::Result<Vec<Tally>> {
    let ticker = tokio::spawn(tick(progress.clone(), Arc::clone(shared), until, started));
    let mut tallies = Vec::with_capacity(tasks.len());
    while let Some(tally) = tasks.join_next().await {
        tallies.push(tally);
    }
    ticker.abort();
    tallies
        .into_iter()
        .map(|tally| tally.context("a bench task panicked"))
        .collect()
}

/// Moves the progress bar along until aborted.
async fn tick(progress: ProgressBar, shared: Arc<Shared>, until: Until, started: Instant) {
    let mut interval = tokio::time::interval(Duration::from_millis(100));
    loop {
        interval.tick().await;
        let answered = shared.answered.load(Ordering::Relaxed);
        let elapsed = started.elapsed();
        let position = match until {
            Until::Elapsed(_) => u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            Until::Requests(_) => answered,
        };
        progress.set_position(position);
        let rate = answered as f64 / elapsed.as_secs_f64().max(1e-9);
        progress.set_message(format!("{answered} requests, {rate:.0}/s"));
    }
}

/// When one task stops.
#[derive(Debug, Clone, Copy)]
enum Deadline {
    At(Instant),
    /// When the shared count of issued requests reaches this.
    Count(u64),
}

impl Deadline {
    /// True when the task must stop; otherwise it may send one more request
    /// (which, with a count, it has now taken).
    fn reached(self, shared: &Shared) -> bool {
        if shared.stop.load(Ordering::Relaxed) {
            return true;
        }
        match self {
            Self::At(deadline) => Instant::now() >= deadline,
            Self::Count(requests) => shared.issued.fetch_add(1, Ordering::Relaxed) >= requests,
        }
    }
}

/// One task of the run.
struct Worker {
    limiter: Limiter<LeasedStore<AnyStore>>,
    subjects: Arc<[Subject]>,
    shared: Arc<Shared>,
    /// Task `i` of `n` takes keys `i`, `i + n`, `i + 2n`, … (modulo the
    /// keys): together the tasks visit every key.
    first_key: u64,
    stride: u64,
    until: Deadline,
    op: BenchOp,
    hold: Duration,
    /// Each request's cost is drawn from this range (both ends included).
    cost: (u64, u64),
    /// With `--rate`: the time between two requests, and when the first goes.
    pace: Option<(Duration, Instant)>,
}

impl Worker {
    /// This request's cost.
    fn cost(&self) -> u64 {
        let (least, most) = self.cost;
        if least == most {
            least
        } else {
            fastrand::u64(least..=most)
        }
    }

    fn request(&self, cost: u64) -> Request {
        match self.op {
            BenchOp::Check | BenchOp::Settle => Request::new(Op::Check, cost),
            BenchOp::Record => Request::new(Op::Record, cost),
            // The check first; the record follows when it passes.
            BenchOp::CheckThenRecord => Request::new(Op::Check, 0),
            BenchOp::Acquire => {
                // Unique among processes too: a repeated name would renew a
                // lease instead of taking a new one.
                let lease = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
                let op = Op::Acquire {
                    lease,
                    max_wait: Some(Duration::ZERO),
                };
                Request::new(op, cost)
            }
        }
    }

    /// What follows a request the limit admitted: a record of its cost
    /// (`check-then-record`), or the settlement of its estimate at half of
    /// it (`settle`, a refund of the units taken at `taken_at`).
    fn follow_up(&self, cost: u64, taken_at: tollgate::Timestamp) -> Option<Request> {
        match self.op {
            BenchOp::CheckThenRecord => Some(Request::new(Op::Record, cost)),
            BenchOp::Settle => Some(Request::new(
                Op::Refund {
                    at: taken_at,
                    lease: None,
                },
                cost - cost / 2,
            )),
            _ => None,
        }
    }

    async fn run(mut self) -> Tally {
        let mut tally = Tally::new();
        let keys = self.subjects.len();
        let stride = usize::try_from(self.stride).unwrap_or(1) % keys;
        let mut key = usize::try_from(self.first_key).unwrap_or(0);
        let mut in_fault = false;
        while !self.until.reached(&self.shared) {
            // A steady schedule: a late request goes at once, and the next
            // keeps its own time.
            if let Some((pace, next)) = &mut self.pace {
                tokio::time::sleep_until((*next).into()).await;
                *next += *pace;
            }
            let subject = &self.subjects[key];
            key = (key + stride.max(1)) % keys;
            let cost = self.cost();
            let request = self.request(cost);
            let sent = Instant::now();
            let mut result = self.limiter.decide(subject, &request).await;
            if let Ok(outcome) = &result {
                if outcome.decision.allowed || self.op == BenchOp::Record {
                    tally.units += outcome.granted;
                }
                if let (true, Some(follow_up)) = (outcome.decision.allowed, self.follow_up(cost, outcome.decided_at)) {
                    let granted = outcome.granted;
                    let followed = if self.op == BenchOp::Settle {
                        // Through the settlement's own road (refunds of one
                        // subject under way together go as one).
                        let actual = cost - follow_up.units();
                        let settled = self.limiter.settle(subject, outcome.decided_at, cost, actual).await;
                        // The settlement gave back what it did not use.
                        settled.map(|_| tally.units -= granted.min(follow_up.units()))
                    } else {
                        let recorded = self.limiter.decide(subject, &follow_up).await;
                        recorded.map(|after| tally.units += after.granted)
                    };
                    if let Err(error) = followed {
                        result = Err(error);
                    }
                }
            }
            let latency = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
            tally.latency.saturating_record(latency);
            self.shared.answered.fetch_add(1, Ordering::Relaxed);
            match &result {
                Ok(outcome) => {
                    tally.paths[outcome.path.index()] += 1;
                    if outcome.path == Path::Store && in_fault {
                        in_fault = false;
                        tally.recovered_at_ms = Some(unix_ms());
                    } else if matches!(outcome.path, Path::Local | Path::Policy) {
                        in_fault = true;
                        tally.fallback_latency.saturating_record(latency);
                    }
                }
                Err(error) if !error.is_invalid() => {
                    in_fault = true;
                    tally.fallback_latency.saturating_record(latency);
                }
                Err(_) => {}
            }
            match result {
                Ok(outcome) if outcome.decision.allowed => {
                    tally.allowed += 1;
                    if let Some(lease) = outcome.lease {
                        if !self.hold.is_zero() {
                            tokio::time::sleep(self.hold).await;
                        }
                        let release = Request::new(Op::Release { lease }, 0);
                        if let Err(error) = self.limiter.decide(subject, &release).await {
                            tally.errors += 1;
                            tally.first_error.get_or_insert_with(|| format!("release: {error}"));
                        }
                    }
                }
                Ok(_) => tally.denied += 1,
                Err(error) if error.is_invalid() => {
                    self.shared.stop.store(true, Ordering::Relaxed);
                    let mut invalid = self.shared.invalid.lock().expect("no panic while holding the lock");
                    invalid.get_or_insert_with(|| format!("--op {}: {error}", self.op.name()));
                    break;
                }
                Err(error) => {
                    tally.errors += 1;
                    tally.first_error.get_or_insert_with(|| error.to_string());
                }
            }
            // The memory store never waits: let the other tasks (and the
            // progress bar) have the thread now and then.
            tokio::task::consume_budget().await;
        }
        tally
    }
}
