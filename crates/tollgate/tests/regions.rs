//! Global limits across regions: a home redis-server, three regions each
//! with its own redis-server and two replicas (stores of their own), the
//! second and third reaching home through a link 40 ms long each way.
//! Time is the caller's (explicit `now`, stepped): what is asserted is what
//! was admitted in each window, never how long anything took.

use std::time::Duration;

use futures_util::future::join_all;
use tollgate::{Limit, OnStoreError, Op, Policy, RedisStore, RegionalStore, Request, Scope, Store, Subject, Timestamp};
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::slow_link::SlowLink;

/// The start of a window of every length used here.
const T0: u64 = 1_700_000_000_000_000;

/// A home, three regional servers, and the links to home: started (and
/// stopped) outside any runtime, as the links run runtimes of their own.
struct Servers {
    home: RedisServer,
    regional: Vec<RedisServer>,
    links: Vec<Option<SlowLink>>,
}

impl Servers {
    fn start() -> Self {
        let home = RedisServer::start();
        let regional = (0..3).map(|_| RedisServer::start()).collect();
        let links = (0..3)
            .map(|region| (region > 0).then(|| SlowLink::start(home.port(), Duration::from_millis(40))))
            .collect();
        Self { home, regional, links }
    }

    fn link(&self, region: usize) -> &SlowLink {
        self.links[region].as_ref().expect("a region far from home")
    }
}

/// The servers, and per region its two replicas.
struct World<'a> {
    servers: &'a Servers,
    regions: Vec<Vec<RegionalStore>>,
}

async fn store(port: u16) -> RedisStore {
    RedisStore::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("a redis-server")
}

impl<'a> World<'a> {
    async fn connect(servers: &'a Servers, on_home_error: OnStoreError, fraction: f64) -> Self {
        let mut regions = Vec::new();
        for (region, server) in servers.regional.iter().enumerate() {
            let home_port = servers.links[region]
                .as_ref()
                .map_or(servers.home.port(), SlowLink::port);
            let mut replicas = Vec::new();
            for _ in 0..2 {
                let replica = RegionalStore::builder(
                    store(server.port()).await,
                    store(home_port).await,
                    format!("r{}", region + 1),
                )
                .block(Duration::from_millis(200))
                .on_home_error(on_home_error, fraction)
                .build();
                replicas.push(replica);
            }
            regions.push(replicas);
        }
        Self { servers, regions }
    }
}

fn global(limit: Limit) -> Policy {
    Policy::new([("global", limit.with_scope(Scope::Global).unwrap())]).unwrap()
}

/// Steps time through `windows` windows of 1 s, 400 steps each; at each
/// step each region asks as its share of `demand` (requests per window)
/// says, its replicas in turn. Answers what was admitted per window, per
/// region.
async fn run(
    world: &World<'_>,
    policy: &Policy,
    subject: &Subject,
    demand: [u64; 3],
    first: u64,
    windows: u64,
) -> Vec<[u64; 3]> {
    const STEPS: u64 = 400;
    let mut admitted = vec![[0_u64; 3]; usize::try_from(windows).unwrap()];
    let mut owed = [0_u64; 3];
    let mut turn = 0_usize;
    for step in 0..windows * STEPS {
        let now = Timestamp::from_micros(T0 + (first * STEPS + step) * 1_000_000 / STEPS);
        let mut asks = Vec::new();
        for region in 0..3 {
            owed[region] += demand[region];
            while owed[region] >= STEPS {
                owed[region] -= STEPS;
                turn += 1;
                let replica = &world.regions[region][turn % 2];
                asks.push(async move {
                    let request = Request::new(Op::Check, 1).at(now);
                    (region, replica.decide(subject, policy, &request).await.unwrap())
                });
            }
        }
        for (region, outcome) in join_all(asks).await {
            if outcome.decision.allowed {
                let window = (outcome.decided_at.as_micros() - T0) / 1_000_000 - first;
                admitted[usize::try_from(window).unwrap()][region] += 1;
            }
        }
    }
    admitted
}

/// Demand twice the limit, skewed 70/20/10, then moved to 10/20/70: no
/// window admits more than the limit across the three regions, every
/// window admits, and the region in demand after the move takes most.
/// (The caller's clock runs faster here than the link's 40 ms: how much
/// of the limit is admitted at the real pace is measured by the
/// `regions` benchmark.)
#[test]
fn three_regions_never_admit_more_than_the_global_limit() {
    let servers = Servers::start();
    tollgate_testkit::runtime().block_on(async {
        let world = World::connect(&servers, OnStoreError::Error, 0.0).await;
        let policy = global(Limit::fixed_window(100, Duration::from_secs(1)).unwrap());
        let subject = Subject::new("tenant-a");
        let before = run(&world, &policy, &subject, [140, 40, 20], 0, 4).await;
        let after = run(&world, &policy, &subject, [20, 40, 140], 4, 4).await;
        for (window, admitted) in before.iter().chain(&after).enumerate() {
            let total: u64 = admitted.iter().sum();
            assert!(
                total <= 100,
                "window {window} admitted {total} ({admitted:?}), over the limit of 100"
            );
            assert!(
                total >= 25,
                "window {window} admitted only {total} ({admitted:?}) under demand of twice the limit"
            );
        }
        // After the move, the busy region is no longer the first.
        let last = after.last().unwrap();
        assert!(
            last[2] > last[0],
            "capacity did not follow demand to region 3: {last:?}"
        );
    });
}

/// Usage recorded in every region (as token counts after responses),
/// region 3 cut off from home for part of it: the home counter ends at the
/// exact total, each report counted once, however many replicas forward.
#[test]
fn reports_made_while_cut_off_are_counted_once_after() {
    let servers = Servers::start();
    tollgate_testkit::runtime().block_on(async {
        let world = World::connect(&servers, OnStoreError::Error, 0.0).await;
        let policy = global(Limit::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap());
        let subject = Subject::new("tenant-b");
        let record = |region: usize, replica: usize, units: u64, step: u64| {
            let store = world.regions[region][replica].clone();
            let (policy, subject) = (policy.clone(), subject.clone());
            async move {
                let request = Request::new(Op::Record, units).at(Timestamp::from_micros(T0 + step));
                let outcome = store.decide(&subject, &policy, &request).await.unwrap();
                assert!(outcome.decision.allowed, "a record is never refused");
            }
        };
        let mut total = 0;
        for step in 0..60_u64 {
            let region = usize::try_from(step % 3).unwrap();
            let replica = usize::try_from(step / 3 % 2).unwrap();
            if step == 20 {
                world.servers.link(2).cut();
            }
            record(region, replica, step + 1, step).await;
            total += step + 1;
        }
        // Cut off, region 3 cannot forward; what it recorded waits in its outbox.
        assert!(world.regions[2][0].forward().await.is_err() || world.regions[2][1].forward().await.is_err());
        // Forwarded by every replica at once, as their forwarders do.
        let forward_all = || join_all(world.regions.iter().flatten().map(RegionalStore::forward));
        forward_all().await;
        world.servers.link(2).restore();
        let mut rounds = 0;
        loop {
            forward_all().await;
            let left: u64 = join_all(world.regions.iter().map(|replicas| replicas[0].stats()))
                .await
                .into_iter()
                .map(|stats| stats.unwrap().outbox)
                .sum();
            if left == 0 {
                break;
            }
            rounds += 1;
            assert!(rounds < 500, "the outboxes never drained: {left} reports left");
        }
        let home = store(world.servers.home.port()).await;
        let regional_view = Policy::new([(
            "global",
            Limit::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap(),
        )])
        .unwrap();
        let peek = Request::new(Op::CheckAtMost, 0).at(Timestamp::from_micros(T0 + 100));
        let counted = 1_000_000
            - home
                .decide(&subject, &regional_view, &peek)
                .await
                .unwrap()
                .decision
                .remaining;
        assert_eq!(counted, total, "home counted {counted} of {total} units recorded");
        let forwarded: u64 = join_all(world.regions.iter().flatten().map(RegionalStore::stats))
            .await
            .into_iter()
            .map(|stats| stats.unwrap().forwarded)
            .sum();
        assert_eq!(forwarded, 60, "each of 60 reports counted once");
    });
}

/// Home unreachable with `local` and a fraction: a region spends its share,
/// then admits at most that fraction of the limit per window on its own.
#[test]
fn cut_off_with_local_a_region_takes_its_fraction_per_window() {
    let servers = Servers::start();
    tollgate_testkit::runtime().block_on(async {
        let world = World::connect(&servers, OnStoreError::Local, 0.1).await;
        let policy = global(Limit::fixed_window(100, Duration::from_secs(1)).unwrap());
        let subject = Subject::new("tenant-c");
        world.servers.link(2).cut();
        let admitted = run(&world, &policy, &subject, [0, 0, 300], 0, 3).await;
        for (window, admitted) in admitted.iter().enumerate() {
            assert!(
                admitted[2] <= 10,
                "window {window}: region 3 admitted {} cut off, over 10 % of 100",
                admitted[2]
            );
            assert!(
                admitted[2] >= 9,
                "window {window}: region 3 admitted only {} of its 10 cut off",
                admitted[2]
            );
        }
    });
}

/// The region's own Redis lost: a global decision follows the region's
/// failure policy as its own limits do (`local`: this process's memory
/// store, the whole limit per process), and a report goes home directly.
#[test]
fn a_region_without_its_redis_falls_back_as_its_own_limits_do() {
    let home = RedisServer::start();
    let mut regional = RedisServer::start();
    tollgate_testkit::runtime().block_on(async {
        let region = |policy: OnStoreError| {
            let (regional, home) = (regional.port(), home.port());
            async move {
                RegionalStore::builder(store(regional).await, store(home).await, "r1")
                    .on_home_error(policy, 0.0)
                    .build()
            }
        };
        let (local, closed) = (region(OnStoreError::Local).await, region(OnStoreError::Closed).await);
        let policy = global(Limit::fixed_window(5, Duration::from_secs(3600)).unwrap());
        let budget = Policy::new([(
            "tokens",
            Limit::fixed_window(1_000, Duration::from_secs(3600))
                .unwrap()
                .with_scope(Scope::Global)
                .unwrap(),
        )])
        .unwrap();
        let subject = Subject::new("tenant-d");
        let now = Timestamp::from_micros(T0);
        assert!(
            local
                .decide(&subject, &policy, &Request::new(Op::Check, 1).at(now))
                .await
                .unwrap()
                .decision
                .allowed
        );
        regional.stop();
        let mut admitted = 0;
        for _ in 0..10 {
            let outcome = local
                .decide(&subject, &policy, &Request::new(Op::Check, 1).at(now))
                .await
                .unwrap();
            assert_eq!(outcome.path, tollgate::Path::Local);
            admitted += u64::from(outcome.decision.allowed);
        }
        assert_eq!(admitted, 5, "this process's memory store holds the whole limit");
        let refused = closed
            .decide(&subject, &policy, &Request::new(Op::Check, 1).at(now))
            .await
            .unwrap();
        assert!(!refused.decision.allowed && refused.path == tollgate::Path::Policy);
        let reported = local
            .decide(&subject, &budget, &Request::new(Op::Record, 7).at(now))
            .await
            .unwrap();
        assert!(reported.decision.allowed);
        let counted = store(home.port())
            .await
            .decide(&subject, &budget, &Request::new(Op::CheckAtMost, 0).at(now))
            .await
            .unwrap();
        assert_eq!(
            counted.decision.remaining,
            1_000 - 7,
            "the report counted at home directly"
        );
    });
}

/// A durable global limit (`durable: replicated`): a block counts for a
/// region only once home's replica has it, so a failover of home (its
/// replica cut off and promoted, the old master killed) loses none of the
/// units a region admitted.
#[test]
fn a_failover_of_home_loses_no_block_a_region_spent() {
    let mut master = RedisServer::start_with(&["--repl-diskless-sync-delay".to_owned(), "0".to_owned()]);
    let replica = master.start_replica();
    let regional = RedisServer::start();
    tollgate_testkit::runtime().block_on(async {
        let region = RegionalStore::builder(store(regional.port()).await, store(master.port()).await, "r1")
            .on_home_error(OnStoreError::Closed, 0.0)
            .block(Duration::from_millis(10))
            .build();
        let limit = Limit::fixed_window(1_000, Duration::from_secs(3600))
            .unwrap()
            .durable(tollgate::Durability::Replicated);
        let policy = global(limit);
        let subject = Subject::new("tenant-e");
        let mut admitted = 0;
        // A request a millisecond, blocks that lapse after 10: the region
        // asks home for blocks all along.
        for round in 0..600 {
            if round == 300 {
                replica.cli(&["REPLICAOF", "NO", "ONE"]);
            }
            let check = Request::new(Op::Check, 1).at(Timestamp::from_micros(T0 + round * 1_000));
            let outcome = region.decide(&subject, &policy, &check).await.unwrap();
            admitted += u64::from(outcome.decision.allowed);
        }
        assert!(admitted >= 250, "only {admitted} admitted before the cut and after it");
        master.stop();
        let promoted = store(replica.port()).await;
        let peek = Request::new(Op::CheckAtMost, 0).at(Timestamp::from_micros(T0 + 600_000));
        let held = 1_000
            - promoted
                .decide(&subject, &policy, &peek)
                .await
                .unwrap()
                .decision
                .remaining;
        assert!(
            held >= admitted,
            "the promoted home holds {held}, the region admitted {admitted}"
        );
    });
}
