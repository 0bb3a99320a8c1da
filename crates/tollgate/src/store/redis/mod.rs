//! The Redis (or Valkey) store: state shared by every instance of a service.
//!
//! Every decision runs inside Redis in one call of one Lua library, so the
//! read, the decision and the write happen atomically: no locks, no
//! read-then-write races. On Redis 7+ and Valkey the library is loaded once
//! as a Redis Functions library (`FUNCTION LOAD`, called with `FCALL`); on
//! older servers the same source runs through `EVALSHA`. A library or script
//! that the server lost (`FUNCTION FLUSH`, `SCRIPT FLUSH`, a restart without
//! persistence) is loaded again and the call repeated. The library reads the
//! server's `TIME` unless the request carries an explicit `now`, so clients
//! with skewed clocks agree.
//!
//! **Micro-batching.** Decisions that callers of one store start while a
//! call is under way are sent together in the next call (at most
//! [`RedisStoreBuilder::max_batch`] of them), which reads `TIME` once; each
//! stays atomic and all-or-nothing on its own. Nothing waits for a timer: a
//! decision started while no other of the store is under way is sent at
//! once from the caller's task, so batching adds no latency to it.
//!
//! Keys are `<prefix>:{<subject>}:<limit name>`: the braces make the subject a
//! Redis Cluster hash tag, so all limits of one subject share a slot and a
//! policy is one call. Each key holds its algorithm's own encoding (a plain
//! integer for GCRA; a short tagged string for the other one- and
//! two-number states; a hash for the sliding window; a sorted set for the
//! sliding log and the concurrency leases) and expires when its state no
//! longer carries information. (With an explicit `now` — tests,
//! replays, a store given a [`RedisStoreBuilder::clock`] — real time and the caller's time differ, so keys are kept at least
//! an hour; decisions never depend on that, as each state records when it
//! lapses in the caller's time.)
//!
//! **Cluster and Sentinel.** On a Redis Cluster (`redis+cluster://`) each
//! call goes to the master of its keys' slot, and redirections during a
//! resharding or a failover are followed; the library is loaded on every
//! master, and the batcher batches per hash slot (a call never mixes slots,
//! and a slow master holds back only its own slots). With Sentinels
//! (`redis+sentinel://`) the store talks to the master they name and asks
//! them again when that master fails or is demoted. See the `connection`
//! module for the details.
//!
//! The client is redis-rs: one multiplexed connection
//! ([`ConnectionManager`]) serves any number of concurrent tasks without a
//! lock around each call, and reconnects by itself when Redis comes back.
//! Measured against fred on Tollgate's own workload (64 tasks on one client,
//! EVALSHA of this script; `tools/client-choice`), the two were a tie within
//! noise (51–56 k decisions/s each, Redis's script thread the bottleneck),
//! so redis-rs was kept for `ConnectionManager` and TLS with a private CA;
//! see `BENCHMARKS.md`.
//!
//! **Worst-case Redis time of one call**, per limit of each decision it
//! carries (n live entries of the key; measured on a 2-core EPYC guest,
//! Redis 7.0, `BENCHMARKS.md`):
//!
//! | algorithm | worst case | measured |
//! |---|---|---|
//! | fixed window, GCRA, token bucket, reservation, leaky bucket | O(1): one read, one write | 10–25 µs |
//! | sliding window | O(buckets): one hash of at most buckets + 1 fields | 15–30 µs |
//! | sliding log | O(log n + e), e the entries that left the window since the log was last written (at most the limit) | 46–90 µs at 10…100 000 live entries; trimming 100 000 at once: 6–11 ms |
//! | concurrency | O(log n + e + w), e the leases ended since the last call, w the leases a denial's `retry_after` walks (at most the units it needs) | 38–70 µs at 10…100 000 leases; 100 000 ended leases of one unit: 33–46 ms (of mixed units, paged: about 2.6 µs each) |
//!
//! A batched call costs the sum of its decisions (at most
//! [`RedisStoreBuilder::max_batch`]). The long calls are the first after a
//! pause on a key that held many entries: a sliding log or lease set sized
//! in the hundreds of thousands holds Redis for milliseconds once per
//! window.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::Slot;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use self::connection::{Connection, Engine, Followed};
pub use self::connection::{EngineChoice, EngineKind};
use self::durable::{counts, ClusterNodes, Dedicated, Reach};
pub use self::outbox::{Outbox, OutboxEntry};
pub use self::persistence::Persistence;
pub use self::region::{RegionStats, RegionalStore, RegionalStoreBuilder, RuleStats, Share};
pub use self::table::{SharedTable, TableChange, TableChanges};
use self::url::Target;
use super::{spread, Spread, Store};
use crate::clock::{Clock, Sleep, SystemClock, Timestamp};
use crate::decision::{Crossing, Outcome};
use crate::engine::protocol::{
    decision_reply_len, limit_argument, read_head, read_limit, Head, OpCode, ALLOWED, FOREIGN, REPLY_PER_LIMIT,
};
use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::Subject;

mod connection;
mod durable;
mod once;
mod outbox;
mod persistence;
mod region;
mod subjects;
mod table;
mod url;

/// The library's source: the prelude, every algorithm's Lua version (in the
/// algorithms' registry order), the entry point.
pub(crate) const LIBRARY: &str = concat!(
    include_str!("prelude.lua"),
    crate::algorithm::lua_sources!(),
    include_str!("tollgate.lua"),
);

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// The most decisions one call carries, by default.
const DEFAULT_MAX_BATCH: usize = 64;

/// Calls under way at once from the batcher, per lane (per hash slot on a
/// Cluster): one being decided while the next is on the wire.
const CALLS_IN_FLIGHT: usize = 2;

/// The name of the library (and of its one function) on the server: its
/// content's hash, so that versions of Tollgate sharing a server coexist.
fn library_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let digest = Sha256::digest(LIBRARY.as_bytes());
        let hex = u64::from_be_bytes(digest[..8].try_into().unwrap_or_default());
        format!("tollgate_{hex:016x}")
    })
}

/// The library as `FUNCTION LOAD` takes it.
fn function_source() -> String {
    let name = library_name();
    format!("#!lua name={name}\n{LIBRARY}\nredis.register_function('{name}', run)\n")
}

/// The library as a script for `EVAL` (servers before Redis 7).
fn script_source() -> String {
    format!("{LIBRARY}\nreturn run(KEYS, ARGV)\n")
}

/// A store in Redis; cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    timeout: Duration,
    /// Feeds the batcher; `None` when every decision is a call of its own.
    batcher: Option<mpsc::UnboundedSender<Job>>,
    /// Decisions of this store under way. One that finds none is a call of
    /// its own, made at once: batching adds no latency to a lone decision.
    under_way: AtomicUsize,
    /// [`RedisStoreBuilder::clock`]: the time of requests without `now`.
    clock: Option<CallerClock>,
    /// [`RedisStoreBuilder::alert_outbox`]: the stream, and its length cap
    /// as an argument.
    outbox: Option<(Arc<str>, Arc<str>)>,
}

/// The connection and the library on it.
#[derive(Clone)]
struct Client {
    connection: Connection,
    /// Connections of their own for durable records.
    dedicated: Arc<Dedicated>,
    /// The engine deciding now; changed when the server loses the module,
    /// and picked again after a fault on the connection.
    engine: Arc<RwLock<Arc<Engine>>>,
    /// What the store URL allows (`?engine=`).
    choice: EngineChoice,
    /// A call failed on the connection: a reconnect or a failover may have
    /// put another server (with or without the module) behind it, so the
    /// next call picks the engine again first.
    recheck: Arc<AtomicBool>,
}

/// One decision, encoded for the library.
struct Encoded {
    keys: Vec<String>,
    args: Vec<Arg>,
    /// How many integers its reply holds.
    reply_len: usize,
}

/// One argument of a call: made for it, or shared with other calls (the
/// outbox's stream and cap, a label), so that none is copied per call.
enum Arg {
    Owned(String),
    Shared(Arc<str>),
}

impl From<String> for Arg {
    fn from(text: String) -> Self {
        Self::Owned(text)
    }
}

impl redis::ToRedisArgs for Arg {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(match self {
            Self::Owned(text) => text.as_bytes(),
            Self::Shared(text) => text.as_bytes(),
        });
    }
}

/// A decision waiting for the batcher, and where its reply goes.
struct Job {
    decision: Encoded,
    reply: oneshot::Sender<Result<Vec<i64>>>,
}

/// Options for a [`RedisStore`]: URL, key prefix, timeouts, batching.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    root_certificate: Option<Vec<u8>>,
    /// A client certificate and its key, PEM.
    client_certificate: Option<(Vec<u8>, Vec<u8>)>,
    max_batch: usize,
    clock: Option<CallerClock>,
    /// [`RedisStoreBuilder::alert_outbox`]: the stream's length cap.
    outbox: Option<u64>,
}

/// A clock the caller gave in place of the server's `TIME`.
#[derive(Clone)]
struct CallerClock(Arc<dyn Clock>);

impl std::fmt::Debug for CallerClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallerClock")
    }
}

impl RedisStoreBuilder {
    /// For `rediss://`: trust this CA certificate (PEM) instead of the
    /// system's roots — for servers with a private CA.
    #[must_use]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// For `rediss://`: present this client certificate and its private key
    /// (both PEM), for servers that require one (`tls-auth-clients yes`).
    #[must_use]
    pub fn tls_client_certificate(mut self, certificate: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.client_certificate = Some((certificate.into(), key.into()));
        self
    }

    /// The prefix of every key (default `tollgate`); no `{`, `}` or spaces.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one decision may take before it fails with a timeout
    /// (default 1 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most decisions sent in one call (default 64). Decisions started
    /// while a call is under way wait for the next one; `1` sends every
    /// decision in a call of its own.
    #[must_use]
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Decides at `clock`'s time, instead of the server's `TIME`, every
    /// request that carries no `now` of its own (tests on a
    /// [`ManualClock`](crate::ManualClock), replays); [`Store::sleep`] then
    /// waits on `clock` too. Default: the server's clock, so that clients
    /// with skewed clocks agree.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(CallerClock(Arc::new(clock)));
        self
    }

    /// Writes each crossing of a limit's alert thresholds
    /// ([`Limit::alerting`](crate::Limit::alerting)) into a Redis Stream,
    /// `<prefix>:alerts`, in the same atomic call as the decision that
    /// crossed it (with the label the request gives the limit,
    /// [`Request::labels`]), so that no crossing is lost when the process
    /// stops after it; the stream is capped near `max_len` entries
    /// (`XADD … MAXLEN ~`). Read it with [`RedisStore::outbox`]. One server
    /// or Sentinel: a Cluster keeps keys of one call in one slot, and the
    /// stream is in one.
    #[must_use]
    pub fn alert_outbox(mut self, max_len: u64) -> Self {
        self.outbox = Some(max_len.max(1));
        self
    }

    /// Connects, checks the server answers, and loads the library.
    ///
    /// # Errors
    ///
    /// An invalid URL or prefix ([`ErrorKind::InvalidArgument`]); a server that
    /// cannot be reached, refuses the credentials, or is not Redis
    /// ([`ErrorKind::Store`]); no answer in time ([`ErrorKind::Timeout`]).
    pub async fn connect(self) -> Result<RedisStore> {
        let valid_prefix = !self.prefix.is_empty()
            && self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}'));
        if !valid_prefix {
            return Err(Error::invalid_argument(format!(
                "key prefix \"{}\" must be printable ASCII without spaces, '{{' or '}}'",
                self.prefix
            )));
        }
        let (url, choice) = url::take_engine(&self.url)?;
        let (connection, dedicated) = tokio::time::timeout(self.connect_timeout, self.open(&url))
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, "redis: no connection within the connect timeout"))??;
        if self.outbox.is_some() && connection.is_cluster() {
            return Err(Error::invalid_argument(
                "an alert outbox needs one Redis server or Sentinel, not a Cluster (its stream is in one slot)",
            ));
        }
        let outbox = self.outbox.map(|max_len| {
            (
                Arc::from(format!("{}:alerts", self.prefix)),
                Arc::from(max_len.to_string()),
            )
        });
        let engine = tokio::time::timeout(self.connect_timeout, connection.load_engine(choice))
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, "redis: no answer while loading the library"))??;
        let client = Client {
            connection,
            dedicated,
            engine: Arc::new(RwLock::new(Arc::new(engine))),
            recheck: Arc::new(AtomicBool::new(false)),
            choice,
        };
        let batcher = (self.max_batch > 1).then(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(batch(client.clone(), receiver, self.max_batch));
            sender
        });
        Ok(RedisStore {
            inner: Arc::new(Inner {
                client,
                prefix: self.prefix,
                timeout: self.timeout,
                batcher,
                under_way: AtomicUsize::new(0),
                clock: self.clock,
                outbox,
            }),
        })
    }
}

impl RedisStoreBuilder {
    /// Connections of their own for durable records, to `reach`.
    fn dedicated(&self, reach: Reach) -> Arc<Dedicated> {
        Arc::new(Dedicated::new(reach, self.connect_timeout, self.timeout))
    }

    /// Opens the connection the URL names.
    async fn open(&self, url: &str) -> Result<(Connection, Arc<Dedicated>)> {
        let tls = || {
            let client_tls = self
                .client_certificate
                .clone()
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                });
            (client_tls.is_some() || self.root_certificate.is_some()).then(|| redis::TlsCertificates {
                client_tls,
                root_cert: self.root_certificate.clone(),
            })
        };
        let invalid = |error: redis::RedisError| {
            Error::invalid_argument(format!("invalid redis url: {}", error.detail().unwrap_or("unreadable")))
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        match url::parse(url)? {
            Target::Single(url) => {
                let client = match tls() {
                    Some(certificates) => redis::Client::build_with_tls(url.as_str(), certificates),
                    None => redis::Client::open(url.as_str()),
                }
                .map_err(invalid)?;
                let dedicated = self.dedicated(Reach::Server(client.clone()));
                let connection = ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(store_error)?;
                Ok((Connection::Single(connection), dedicated))
            }
            Target::Cluster(nodes) => {
                let seed = nodes.first().cloned().unwrap_or_default();
                let mut builder = ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.timeout);
                if let Some(certificates) = tls() {
                    builder = builder.certs(certificates);
                }
                let client = builder.build().map_err(invalid)?;
                let connection = client.get_async_connection().await.map_err(store_error)?;
                // Durable records wait on connections of their own to the
                // master of their slot.
                let dedicated = self.dedicated(Reach::Cluster(ClusterNodes::new(connection.clone(), seed, tls())));
                Ok((Connection::Cluster(connection), dedicated))
            }
            Target::Sentinel(target) => {
                if self.root_certificate.is_some() || self.client_certificate.is_some() {
                    return Err(Error::invalid_argument(
                        "TLS certificates apply to rediss:// and rediss+cluster:// only, not redis+sentinel://",
                    ));
                }
                let master = redis::IntoConnectionInfo::into_connection_info(target.master_settings.as_str())
                    .map_err(invalid)?;
                let master =
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(master.redis_settings().clone());
                let sentinels = SentinelClient::build(
                    target.sentinels,
                    target.master,
                    Some(master),
                    SentinelServerType::Master,
                )
                .map_err(invalid)?;
                let followed = Followed::connect(sentinels, config, self.connect_timeout)
                    .await
                    .map_err(store_error)?;
                // Durable records wait on connections of their own to the
                // master found last.
                let followed = Arc::new(followed);
                let dedicated = self.dedicated(Reach::Sentinel(Arc::clone(&followed)));
                Ok((Connection::Sentinel(followed), dedicated))
            }
        }
    }
}

impl Client {
    /// Runs `decisions` in one call; the library's reply, all integers.
    /// On a Cluster, the keys of all `decisions` must share a slot.
    async fn call(&self, decisions: &[&Encoded]) -> Result<Vec<i64>> {
        // Read before swapped: every call reads it, few write it.
        if self.recheck.load(Ordering::Acquire) && self.recheck.swap(false, Ordering::AcqRel) {
            self.pick_engine_again().await;
        }
        let engine = self.engine.read().clone();
        let first_key = decisions
            .iter()
            .find_map(|decision| decision.keys.first())
            .map_or("", String::as_str);
        let command = fill(engine.command(), decisions);
        match self.connection.run(&command, &engine, first_key).await {
            // The server lost the module (a restart without it, a failover
            // to a master without it): nothing was decided; pick again.
            Err(error) if engine.is_module() && engine.is_lost(&error) => {
                let found = Arc::new(self.connection.load_engine(self.choice).await?);
                tracing::warn!(
                    engine = %found.kind(),
                    "redis: the server no longer has the tollgate module"
                );
                *self.engine.write() = Arc::clone(&found);
                let command = fill(found.command(), decisions);
                self.connection
                    .run(&command, &found, first_key)
                    .await
                    .map_err(store_error)
            }
            Err(error) => {
                if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal() {
                    self.recheck.store(true, Ordering::Release);
                }
                Err(store_error(error))
            }
            Ok(reply) => Ok(reply),
        }
    }

    /// Picks the engine the server behind the connection has now (after a
    /// reconnect or a failover); on a fault, keeps the current one and tries
    /// again at the next call.
    async fn pick_engine_again(&self) {
        match self.connection.load_engine(self.choice).await {
            Ok(found) => {
                let found = Arc::new(found);
                if found.kind() != self.engine.read().kind() {
                    tracing::info!(
                        engine = %found.kind(),
                        "redis: the server now decides with another engine"
                    );
                }
                *self.engine.write() = found;
            }
            Err(_) => self.recheck.store(true, Ordering::Release),
        }
    }

    /// The engine deciding now.
    fn engine(&self) -> EngineKind {
        self.engine.read().kind()
    }
}

/// The library's call (`FCALL <name>` or `EVALSHA <sha>`) plus the keys
/// and arguments of `decisions`.
fn fill(mut command: redis::Cmd, decisions: &[&Encoded]) -> redis::Cmd {
    let keys: usize = decisions.iter().map(|decision| decision.keys.len()).sum();
    command.arg(keys);
    for decision in decisions {
        for key in &decision.keys {
            command.arg(key);
        }
    }
    command.arg(decisions.len());
    for decision in decisions {
        for arg in &decision.args {
            command.arg(arg);
        }
    }
    command
}

/// The batcher: sends the decisions waiting, up to `max_batch` in one call,
/// and hands each its reply. Calls go out by lane, at most
/// [`CALLS_IN_FLIGHT`] at once per lane; decisions that arrive meanwhile wait
/// in their lane for its next call.
///
/// On one server (or the master of Sentinels) there is one lane. On a
/// Cluster the keys of one call must share a slot, so each hash slot is a
/// lane (all keys of one subject share it, through the `{subject}` hash
/// tag): a slow or dead master holds back its own slots' calls, never the
/// others'. A decision whose keys span slots (an empty subject's: `{}` is no
/// hash tag) is a call of its own, so that the error it meets is its own.
async fn batch(client: Client, mut jobs: mpsc::UnboundedReceiver<Job>, max_batch: usize) {
    let by_slot = client.connection.is_cluster();
    let (done, mut finished) = mpsc::unbounded_channel::<LaneKey>();
    let mut lanes: HashMap<LaneKey, Lane> = HashMap::new();
    let send = |lane: LaneKey, group: Vec<Job>, done: &mpsc::UnboundedSender<LaneKey>| {
        let (client, done) = (client.clone(), done.clone());
        tokio::spawn(async move {
            let decisions: Vec<&Encoded> = group.iter().map(|job| &job.decision).collect();
            let result = client.call(&decisions).await;
            let _ = done.send(lane);
            answer(group, result);
        });
    };
    loop {
        let mut touched = Vec::new();
        tokio::select! {
            job = jobs.recv() => {
                let Some(job) = job else { return };
                // Everything waiting now joins its lane.
                let mut next = Some(job);
                while let Some(job) = next {
                    match lane_of(&job, by_slot) {
                        // Keys in several slots: alone, and at once.
                        LaneKey::Alone => send(LaneKey::Alone, vec![job], &done),
                        lane => {
                            lanes.entry(lane).or_default().waiting.push_back(job);
                            touched.push(lane);
                        }
                    }
                    next = jobs.try_recv().ok();
                }
            }
            Some(lane) = finished.recv() => {
                if let Some(state) = lanes.get_mut(&lane) {
                    state.in_flight = state.in_flight.saturating_sub(1);
                    touched.push(lane);
                }
            }
        }
        for lane in touched {
            let Some(state) = lanes.get_mut(&lane) else {
                continue;
            };
            while state.in_flight < CALLS_IN_FLIGHT && !state.waiting.is_empty() {
                let take = state.waiting.len().min(max_batch);
                let group: Vec<Job> = state.waiting.drain(..take).collect();
                state.in_flight += 1;
                send(lane, group, &done);
            }
            if state.in_flight == 0 && state.waiting.is_empty() {
                lanes.remove(&lane);
            }
        }
    }
}

/// One decision counted in [`Inner::under_way`] while it lives.
struct UnderWay<'a> {
    count: &'a AtomicUsize,
    /// No other decision of the store was under way when it began.
    alone: bool,
}

impl<'a> UnderWay<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let alone = count.fetch_add(1, Ordering::AcqRel) == 0;
        Self { count, alone }
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The decisions of one lane: waiting, and calls under way.
#[derive(Default)]
struct Lane {
    waiting: VecDeque<Job>,
    in_flight: usize,
}

/// Which lane a decision waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LaneKey {
    /// The one lane of a server that is not a Cluster.
    One,
    /// The hash slot of all the decision's keys.
    Slot(Slot),
    /// Keys in several slots: a call of its own.
    Alone,
}

fn lane_of(job: &Job, by_slot: bool) -> LaneKey {
    if !by_slot {
        return LaneKey::One;
    }
    let mut slots = job.decision.keys.iter().map(Slot::for_key);
    match slots.next() {
        Some(first) if slots.all(|slot| slot == first) => LaneKey::Slot(first),
        _ => LaneKey::Alone,
    }
}

/// Hands each job of one call its part of the reply, or the call's fault.
fn answer(jobs: Vec<Job>, result: Result<Vec<i64>>) {
    match result {
        Ok(reply) => {
            let mut rest = reply.as_slice();
            for job in jobs {
                let len = decision_reply_len(rest, job.decision.reply_len).min(rest.len());
                let (own, tail) = rest.split_at(len);
                rest = tail;
                let _ = job.reply.send(Ok(own.to_vec()));
            }
        }
        Err(error) => {
            // One fault, told to every decision of the call.
            for job in jobs {
                let _ = job.reply.send(Err(Error::new(error.kind(), error.to_string())));
            }
        }
    }
}

impl RedisStore {
    /// Options for a store at `url`:
    ///
    /// - `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS:
    ///   one server;
    /// - `redis+cluster://[user:password@]host:port[,host:port…]`, or
    ///   `rediss+cluster://`: a Redis Cluster, found from any of its seed
    ///   nodes;
    /// - `redis+sentinel://[user:password@]host:port[,host:port…]/<master name>[?db=N]`:
    ///   the master that these Sentinels know by that name, followed across
    ///   failovers (the credentials and database are the master's; the
    ///   Sentinels are asked without credentials).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            root_certificate: None,
            client_certificate: None,
            max_batch: DEFAULT_MAX_BATCH,
            clock: None,
            outbox: None,
        }
    }

    /// Connects to `url` with the default options.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// The key holding `subject`'s state for the limit `name`.
    pub fn key(&self, subject: &Subject, name: &str) -> String {
        // Pushed rather than formatted: a key is built per decision.
        let (prefix, subject) = (self.inner.prefix.as_str(), subject.as_key());
        let mut key = String::with_capacity(prefix.len() + subject.len() + name.len() + 4);
        for part in [prefix, ":{", subject, "}:", name] {
            key.push_str(part);
        }
        key
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The engine deciding now: the Redis module's `TOLLGATE.DECIDE` (the
    /// Rust algorithms inside the server) or the Lua library (the functions
    /// library, or its script on Redis 6.2). Chosen on connect by
    /// `?engine=` in the URL (`auto`, the default, prefers the module); a
    /// server that loses the module is decided by Lua from then on.
    pub fn engine(&self) -> EngineKind {
        self.inner.client.engine()
    }

    /// The server's clock (`TIME`): the instant a decision made now without
    /// an explicit `now` is taken at. On a Cluster it is one node's clock
    /// (nodes agree as far as their clocks are synchronised); behind
    /// Sentinels, the master's.
    ///
    /// # Errors
    ///
    /// A store fault, or no answer within the timeout.
    pub async fn server_time(&self) -> Result<Timestamp> {
        let timeout = self.inner.timeout;
        let micros = tokio::time::timeout(timeout, self.inner.client.connection.time())
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}")))??;
        Ok(Timestamp::from_micros(micros))
    }

    /// Sends one decision (through the batcher, when batching) and returns
    /// its reply.
    async fn run(&self, decision: Encoded) -> Result<Vec<i64>> {
        let timeout = self.inner.timeout;
        let timed_out = || Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}"));
        let under_way = UnderWay::enter(&self.inner.under_way);
        match &self.inner.batcher {
            Some(batcher) if !under_way.alone => {
                let (reply, answer) = oneshot::channel();
                batcher
                    .send(Job { decision, reply })
                    .map_err(|_| Error::new(ErrorKind::Store, "redis: the store's connection task has stopped"))?;
                tokio::time::timeout(timeout, answer)
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(|_| Error::new(ErrorKind::Store, "redis: the call was dropped"))?
            }
            _ => tokio::time::timeout(timeout, self.inner.client.call(&[&decision]))
                .await
                .map_err(|_| timed_out())?,
        }
    }

    /// The keys of `policy`'s limits for `subject`.
    fn keys(&self, subject: &Subject, policy: &Policy) -> Vec<String> {
        policy.limits().map(|(name, _)| self.key(subject, name)).collect()
    }

    /// Runs one decision on `keys` (one per limit of `policy`) and reads its reply.
    async fn decide_keys(&self, keys: Vec<String>, policy: &Policy, request: &Request) -> Result<Outcome> {
        let encoded = self.encode(keys, policy, request, OpCode::from(&request.op));
        let reply = match policy.durability().filter(|_| counts(request)) {
            Some(durability) => self.run_durable(&encoded, durability).await?,
            None => self.run(encoded).await?,
        };
        read_reply(policy, &request.op, &reply)
    }

    /// Encodes one decision in the library's calling convention: `request`,
    /// or a reset when `op` is [`OpCode::Reset`].
    fn encode(&self, keys: Vec<String>, policy: &Policy, request: &Request, op: OpCode) -> Encoded {
        let now = request
            .now
            .or_else(|| self.inner.clock.as_ref().map(|clock| clock.0.now()))
            .map(|now| now.as_micros().min(i64::MAX.cast_unsigned()));
        let mut head = match op {
            OpCode::Reset => Head::reset(policy.len(), now),
            _ => Head::new(&request.op, request.units(), policy.len(), now),
        };
        let outbox = self
            .inner
            .outbox
            .as_ref()
            .filter(|_| op != OpCode::Reset && policy.limits().any(|(_, limit)| !limit.alerts().is_empty()));
        head.outbox = outbox.is_some();
        let mut args: Vec<Arg> = Vec::with_capacity(3 + 3 * policy.len());
        head.encode(&mut args);
        for (index, (_, limit)) in policy.limits().enumerate() {
            let now = || now.unwrap_or_else(|| SystemClock.now().as_micros());
            args.push(Arg::Owned(limit_argument(limit, request.cost_of(index), now)));
        }
        if let Some((stream, max_len)) = outbox {
            args.push(Arg::Shared(Arc::clone(stream)));
            args.push(Arg::Shared(Arc::clone(max_len)));
            args.extend((0..policy.len()).map(|index| match request.label_of(index) {
                Some(label) => Arg::Shared(Arc::clone(label)),
                None => Arg::Owned(String::new()),
            }));
        }
        Encoded {
            keys,
            args,
            reply_len: op.reply_len(policy.len()),
        }
    }
}

fn store_error(error: redis::RedisError) -> Error {
    let kind = if error.is_timeout() {
        ErrorKind::Timeout
    } else {
        ErrorKind::Store
    };
    // Redis 7 reports WRONGTYPE from inside a script as its code; Redis 6.2
    // wraps it in "Error running script": look at the text too.
    let wrong_type = error.code() == Some("WRONGTYPE") || error.to_string().contains("WRONGTYPE");
    let message = match (error.kind(), wrong_type) {
        (_, true) => wrong_type_message().to_owned(),
        (redis::ErrorKind::AuthenticationFailed, _) => format!("redis: authentication failed: {error}"),
        _ if error.is_connection_refusal() => format!("redis: connection refused: {error}"),
        // A redis:// URL naming one node of a Cluster.
        _ if matches!(error.code(), Some("MOVED" | "ASK")) => {
            format!("redis: the server is a Redis Cluster node (use a redis+cluster:// URL): {error}")
        }
        // `{}` is no hash tag: Redis hashes an empty subject's keys whole.
        _ if error.code() == Some("CROSSSLOT") => format!(
            "redis: the limits of an empty subject live in different Cluster slots; give the subject \
             a part: {error}"
        ),
        _ => format!("redis: {error}"),
    };
    Error::new(kind, message).with_source(error)
}

fn wrong_type_message() -> &'static str {
    "redis: a key of this subject holds another type of value (not written by tollgate?)"
}

fn malformed() -> Error {
    Error::new(ErrorKind::Store, "redis: malformed reply from the library")
}

/// Reads one decision's reply: its head (status, granted, the instant
/// decided at), then each limit's.
fn read_reply(policy: &Policy, op: &Op, reply: &[i64]) -> Result<Outcome> {
    let (head, fields) = read_head(reply).ok_or_else(malformed)?;
    if head.status == FOREIGN {
        return Err(Error::new(ErrorKind::Store, wrong_type_message()));
    }
    if fields.len() != REPLY_PER_LIMIT * policy.len() {
        return Err(malformed());
    }
    let mut decisions = Vec::with_capacity(policy.len());
    let mut crossed = Vec::new();
    for (index, (fields, (_, limit))) in fields.chunks_exact(REPLY_PER_LIMIT).zip(policy.limits()).enumerate() {
        let (decision, mask) = read_limit(fields).ok_or_else(malformed)?;
        if mask != 0 {
            Crossing::of_mask(index, limit.alerts(), mask, &decision, &mut crossed);
        }
        decisions.push(decision);
    }
    let mut outcome = policy.outcome(
        op,
        head.status == ALLOWED,
        head.granted,
        head.now,
        decisions.into_iter(),
    );
    outcome.crossed = crossed;
    Ok(outcome)
}

/// Refuses a lease name the library cannot store.
fn check_lease(request: &Request) -> Result<()> {
    if let Op::Acquire { lease, .. } | Op::Release { lease } | Op::Refund { lease: Some(lease), .. } = &request.op {
        if lease.is_empty() || lease.starts_with('\0') {
            return Err(Error::invalid_argument(
                "a lease name must not be empty or start with a NUL byte",
            ));
        }
    }
    Ok(())
}

impl Store for RedisStore {
    async fn ping(&self) -> Result<()> {
        self.server_time().await.map(|_| ())
    }

    async fn decide(&self, subject: &Subject, policy: &Policy, request: &Request) -> Result<Outcome> {
        policy.validate(request)?;
        check_lease(request)?;
        self.decide_keys(self.keys(subject, policy), policy, request).await
    }

    /// One call on one server; on a Cluster one call per hash slot, refunded
    /// when another slot denies.
    async fn decide_spread(&self, rows: &Spread, op: Op) -> Result<Outcome> {
        let (subjects, policy, request) = (rows.subjects(), rows.policy(), &rows.request(op));
        policy.validate(request)?;
        check_lease(request)?;
        let keys: Vec<String> = policy
            .limits()
            .zip(subjects)
            .map(|((name, _), subject)| self.key(subject, name))
            .collect();
        if !self.inner.client.connection.is_cluster() {
            return self.decide_keys(keys, policy, request).await;
        }
        let parts = spread::group(keys.len(), |index| Slot::for_key(&keys[index]));
        if parts.len() == 1 {
            return self.decide_keys(keys, policy, request).await;
        }
        spread::decide_parts(policy, request, &parts, |part, policy, request| {
            let keys = parts[part].iter().map(|&index| keys[index].clone()).collect();
            async move { self.decide_keys(keys, &policy, &request).await }
        })
        .await
    }

    async fn reset(&self, subject: &Subject, policy: &Policy) -> Result<()> {
        let request = Request::new(Op::Check, 0);
        self.run(self.encode(self.keys(subject, policy), policy, &request, OpCode::Reset))
            .await?;
        Ok(())
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        match &self.inner.clock {
            Some(clock) => clock.0.sleep(duration),
            None => Box::pin(tokio::time::sleep(duration)),
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
