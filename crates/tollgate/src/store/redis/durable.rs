//! Durable records: a decision of a limit asking for it runs on a
//! connection of its own to the master that holds its keys (the one
//! server, the master Sentinels name, or on a Cluster the master of the
//! keys' slot), followed there by `WAIT 1` (a replica has it) or
//! `WAITAOF 1 0` (the append-only file has it), bounded by the store's
//! timeout; not acknowledged in time, it is [`ErrorKind::NotDurable`].
//!
//! `WAIT` blocks the connection it is sent on until it ends, so it never
//! goes out on the connection other decisions share: on every target the
//! wait holds only a connection of its own, and every other decision of
//! the process goes on meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;

use super::connection::{self, Engine, Fault, Followed};
use super::{fill, store_error, Client, Encoded, RedisStore};
use crate::algorithm::Durability;
use crate::error::{Error, ErrorKind, Result};
use crate::request::{Op, Request};

/// Where a durable record's connection goes.
pub(super) enum Reach {
    /// One server.
    Server(redis::Client),
    /// The master the Sentinels found last.
    Sentinel(Arc<Followed>),
    /// A Cluster: the master of the record's slot.
    Cluster(ClusterNodes),
}

/// Which master an idle connection reaches: behind Sentinels, the
/// generation of the master found (a failover makes older ones stale); on a
/// Cluster, the node's address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Home {
    generation: u64,
    node: Option<Arc<str>>,
}

/// Connections of their own for durable records, opened as needed: the
/// `WAIT` after a record blocks the connection it is sent on, so it must
/// not be the one every other decision shares, nor one another durable
/// record waits on. Idle ones are kept for the next, up to
/// [`DEDICATED_IDLE`] per master.
pub(super) struct Dedicated {
    reach: Reach,
    config: redis::AsyncConnectionConfig,
    idle: Mutex<Vec<(Home, MultiplexedConnection)>>,
}

/// The masters of a Cluster's slots, as `CLUSTER SLOTS` last said, and a
/// client for each; read again when a call is redirected (`MOVED`) or a
/// master cannot be reached.
pub(super) struct ClusterNodes {
    /// Asked `CLUSTER SLOTS` (it routes the question to any node).
    shared: ClusterConnection,
    /// A seed's URL: the scheme and credentials of every node's.
    seed: String,
    tls: Option<redis::TlsCertificates>,
    /// Slot → the address (`host:port`) of its master; empty until read.
    masters: RwLock<HashMap<Slot, Arc<str>>>,
    /// Asks `CLUSTER SLOTS`, one task at a time.
    reading: tokio::sync::Mutex<()>,
    clients: Mutex<HashMap<Arc<str>, redis::Client>>,
}

impl ClusterNodes {
    pub(super) fn new(shared: ClusterConnection, seed: String, tls: Option<redis::TlsCertificates>) -> Self {
        Self {
            shared,
            seed,
            tls,
            masters: RwLock::new(HashMap::new()),
            reading: tokio::sync::Mutex::new(()),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The address of the master of `key`'s slot.
    async fn master_of(&self, key: &str) -> redis::RedisResult<Arc<str>> {
        let slot = Slot::for_key(key);
        if let Some(node) = self.masters.read().get(&slot) {
            return Ok(Arc::clone(node));
        }
        self.read_slots().await?;
        self.masters.read().get(&slot).cloned().ok_or_else(|| {
            redis::RedisError::from(std::io::Error::other("the cluster names no master for a key's slot"))
        })
    }

    /// Reads `CLUSTER SLOTS` into the map (one task at a time; one that
    /// waited uses what the other read).
    async fn read_slots(&self) -> redis::RedisResult<()> {
        let before = self.masters.read().len();
        let _reading = self.reading.lock().await;
        if before == 0 && !self.masters.read().is_empty() {
            return Ok(());
        }
        let reply: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.shared.clone())
            .await?;
        let masters = slot_masters(reply);
        *self.masters.write() = masters;
        Ok(())
    }

    /// Forgets the slots' masters: the next record reads them again.
    fn forget(&self) {
        self.masters.write().clear();
    }

    /// A client for the node at `address`, with the seed's scheme,
    /// credentials and certificates.
    fn client(&self, address: &Arc<str>) -> redis::RedisResult<redis::Client> {
        if let Some(client) = self.clients.lock().get(address) {
            return Ok(client.clone());
        }
        let url = node_url(&self.seed, address);
        let client = match &self.tls {
            Some(certificates) => redis::Client::build_with_tls(url.as_str(), certificates.clone()),
            None => redis::Client::open(url.as_str()),
        }?;
        self.clients.lock().insert(Arc::clone(address), client.clone());
        Ok(client)
    }
}

/// `seed` (`scheme://[userinfo@]host:port[/…]`) with `address` in place of
/// its host and port.
fn node_url(seed: &str, address: &str) -> String {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, _)) => format!("{scheme}://{userinfo}@{address}{path}"),
        None => format!("{scheme}://{address}{path}"),
    }
}

/// `CLUSTER SLOTS`' reply as a map from each slot to its master's address
/// (`[[start, end, [host, port, …], replicas…], …]`).
fn slot_masters(reply: redis::Value) -> HashMap<Slot, Arc<str>> {
    let mut masters = HashMap::new();
    let redis::Value::Array(ranges) = reply else {
        return masters;
    };
    for range in ranges {
        let redis::Value::Array(range) = range else { continue };
        let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end)), Some(redis::Value::Array(master))) =
            (range.first(), range.get(1), range.get(2))
        else {
            continue;
        };
        let host = match master.first() {
            Some(redis::Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(redis::Value::SimpleString(host)) => host.clone(),
            _ => continue,
        };
        let Some(redis::Value::Int(port)) = master.get(1) else {
            continue;
        };
        let address: Arc<str> = Arc::from(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        });
        let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else {
            continue;
        };
        for slot in start..=end {
            if let Some(slot) = Slot::new(slot) {
                masters.insert(slot, Arc::clone(&address));
            }
        }
    }
    masters
}

impl Dedicated {
    pub(super) fn new(reach: Reach, connect_timeout: Duration, timeout: Duration) -> Self {
        Self {
            reach,
            config: redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(timeout)),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A connection (idle or new) to the master that holds `first_key`,
    /// and which master that is.
    pub(super) async fn connection(&self, first_key: &str) -> redis::RedisResult<(MultiplexedConnection, Home)> {
        let (client, home) = match &self.reach {
            Reach::Server(client) => (client.clone(), Home::default()),
            Reach::Sentinel(followed) => {
                let (client, generation) = followed.master().await;
                (client, Home { generation, node: None })
            }
            Reach::Cluster(nodes) => {
                let node = nodes.master_of(first_key).await?;
                (
                    nodes.client(&node)?,
                    Home {
                        generation: 0,
                        node: Some(node),
                    },
                )
            }
        };
        self.open(client, home).await
    }

    /// A connection to the Cluster node at `address` (a redirection's).
    async fn connection_to(&self, address: &str) -> redis::RedisResult<(MultiplexedConnection, Home)> {
        let Reach::Cluster(nodes) = &self.reach else {
            return Err(redis::RedisError::from(std::io::Error::other(
                "redirected outside a cluster",
            )));
        };
        let node: Arc<str> = Arc::from(address);
        let client = nodes.client(&node)?;
        self.open(
            client,
            Home {
                generation: 0,
                node: Some(node),
            },
        )
        .await
    }

    async fn open(&self, client: redis::Client, home: Home) -> redis::RedisResult<(MultiplexedConnection, Home)> {
        let idle = {
            let mut idle = self.idle.lock();
            // Behind Sentinels, connections to a master found earlier go.
            idle.retain(|(of, _)| of.generation == home.generation);
            idle.iter()
                .position(|(of, _)| *of == home)
                .map(|at| idle.swap_remove(at).1)
        };
        let connection = match idle {
            Some(connection) => connection,
            None => {
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?
            }
        };
        Ok((connection, home))
    }

    /// Keeps `connection` for the next record, after a clean round (one
    /// that failed is dropped).
    pub(super) fn keep(&self, connection: MultiplexedConnection, home: Home) {
        let mut idle = self.idle.lock();
        if idle.iter().filter(|(of, _)| *of == home).count() < DEDICATED_IDLE {
            idle.push((home, connection));
        }
    }

    /// Tells of `error` on a connection of its own: after a fault that
    /// may mean a failover, the master is looked up again.
    pub(super) fn failed(&self, error: &redis::RedisError) {
        match &self.reach {
            Reach::Server(_) => {}
            Reach::Sentinel(followed) => followed.failed(error),
            Reach::Cluster(nodes) => {
                if error.redirect_node().is_some() || Fault::of(error) == Fault::Connection {
                    nodes.forget();
                }
            }
        }
    }
}

/// Idle connections of durable records kept open, per master.
const DEDICATED_IDLE: usize = 16;

/// The error of a `WAIT` or `WAITAOF`; a server without `WAITAOF` is told
/// what `fsynced` needs.
fn wait_error(error: redis::RedisError, durability: Durability) -> Error {
    if durability == Durability::Fsynced && Fault::of(&error) == Fault::UnknownCommand {
        return Error::new(
            ErrorKind::Store,
            format!("redis: a durable \"fsynced\" limit needs WAITAOF (Redis 7.2 or later, Valkey): {error}"),
        );
    }
    store_error(error)
}

/// True when `request` counts units (a durable limit then waits): not a
/// peek, a reset or a release.
pub(super) fn counts(request: &Request) -> bool {
    request.units() > 0 && !matches!(request.op, Op::Release { .. })
}

/// The `WAIT 1 <ms>` or `WAITAOF 1 0 <ms>` that follows a durable record.
fn wait_command(durability: Durability, left: Duration) -> redis::Cmd {
    let millis = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
    match durability {
        Durability::Replicated => redis::cmd("WAIT").arg(1).arg(millis).to_owned(),
        Durability::Fsynced => redis::cmd("WAITAOF").arg(1).arg(0).arg(millis).to_owned(),
    }
}

/// Whether a `WAIT` or `WAITAOF` reply says a replica (or the local
/// append-only file) has what the connection wrote.
fn acknowledged(durability: Durability, reply: redis::Value) -> bool {
    match durability {
        Durability::Replicated => redis::from_redis_value::<i64>(reply).is_ok_and(|replicas| replicas >= 1),
        Durability::Fsynced => redis::from_redis_value::<Vec<i64>>(reply)
            .is_ok_and(|counts| counts.first().is_some_and(|&local| local >= 1)),
    }
}

impl Dedicated {
    /// Runs the engine's `command` on a connection of its own to the master
    /// of `first_key`; on a Cluster, a redirection (`MOVED`, `ASK`: nothing
    /// was decided) is followed once. The connection, for the `WAIT`.
    async fn decide(
        &self,
        command: &redis::Cmd,
        engine: &Engine,
        first_key: &str,
    ) -> redis::RedisResult<(MultiplexedConnection, Home, Vec<i64>)> {
        let (mut connection, home) = self.connection(first_key).await?;
        let error = match connection::run_on(&mut connection, command, engine).await {
            Ok(reply) => return Ok((connection, home, reply)),
            Err(error) => error,
        };
        self.failed(&error);
        let Some((address, _)) = error.redirect_node() else {
            return Err(error);
        };
        let asking = error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask);
        let (mut connection, home) = self.connection_to(address).await?;
        let reply = if asking {
            connection::run_asking(&mut connection, command).await
        } else {
            connection::run_on(&mut connection, command, engine).await
        };
        match reply {
            Ok(reply) => Ok((connection, home, reply)),
            Err(error) => {
                self.failed(&error);
                Err(error)
            }
        }
    }
}

impl Client {
    /// Runs one decision on a connection of its own to the master of its
    /// keys, then `WAIT 1` or `WAITAOF 1 0` there: the reply, and whether
    /// what it wrote was acknowledged in time.
    async fn call_durable(
        &self,
        decision: &Encoded,
        durability: Durability,
        timeout: Duration,
    ) -> Result<(Vec<i64>, bool)> {
        let started = std::time::Instant::now();
        let engine = self.engine.read().clone();
        let first_key = decision.keys.first().map_or("", String::as_str);
        let command = fill(engine.command(), &[decision]);
        let left = || timeout.saturating_sub(started.elapsed());
        let timed_out = || Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}"));
        let dedicated = &self.dedicated;
        let (mut connection, home, reply) =
            tokio::time::timeout(left(), dedicated.decide(&command, &engine, first_key))
                .await
                .map_err(|_| timed_out())?
                .map_err(store_error)?;
        // The server checks a WAIT's own timeout only every 100 ms or so, and
        // the connection's response timeout is the call's: the wait is also
        // bounded here, inside both, and a wait cut short is "not durable"
        // (its connection, which still owes the answer, is dropped).
        let remaining = left();
        let waited = tokio::time::timeout(
            remaining * 9 / 10,
            wait_command(durability, remaining * 3 / 4).query_async::<redis::Value>(&mut connection),
        )
        .await;
        let waited = match waited {
            Err(_) => return Ok((reply, false)),
            Ok(waited) => waited.map_err(|error| {
                dedicated.failed(&error);
                wait_error(error, durability)
            })?,
        };
        dedicated.keep(connection, home);
        Ok((reply, acknowledged(durability, waited)))
    }
}

impl RedisStore {
    /// Runs one decision of a durable limit alone (never batched), then
    /// waits until what it counted is durable, within the store's timeout.
    pub(super) async fn run_durable(&self, decision: &Encoded, durability: Durability) -> Result<Vec<i64>> {
        let timeout = self.inner.timeout;
        let started = std::time::Instant::now();
        // Boxed: a rare path, kept out of the layout of every decision's future.
        let (reply, durable) = Box::pin(self.inner.client.call_durable(decision, durability, timeout)).await?;
        if !durable {
            return Err(Error::new(
                ErrorKind::NotDurable,
                format!(
                    "redis: counted, but not {} within {:?} (no replica or append-only file acknowledged it)",
                    durability.name(),
                    started.elapsed()
                ),
            ));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_url_keeps_the_seeds_scheme_credentials_and_database() {
        assert_eq!(
            node_url("redis://127.0.0.1:7000", "127.0.0.1:7001"),
            "redis://127.0.0.1:7001"
        );
        assert_eq!(
            node_url("rediss://user:p%40ss@10.0.0.1:7000/0", "10.0.0.2:7002"),
            "rediss://user:p%40ss@10.0.0.2:7002/0"
        );
        assert_eq!(
            node_url("redis://:pw@h:1?protocol=resp3", "[::1]:7003"),
            "redis://:pw@[::1]:7003?protocol=resp3"
        );
    }

    #[test]
    fn cluster_slots_name_each_slots_master() {
        use redis::Value::{Array, BulkString, Int};
        let node = |host: &str, port: i64| {
            Array(vec![
                BulkString(host.as_bytes().to_vec()),
                Int(port),
                BulkString(b"id".to_vec()),
            ])
        };
        let reply = Array(vec![
            Array(vec![
                Int(0),
                Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Array(vec![Int(5461), Int(16383), node("::1", 7001)]),
        ]);
        let masters = slot_masters(reply);
        assert_eq!(masters.len(), 16384);
        assert_eq!(&*masters[&Slot::new(0).unwrap()], "127.0.0.1:7000");
        assert_eq!(&*masters[&Slot::new(5460).unwrap()], "127.0.0.1:7000");
        assert_eq!(&*masters[&Slot::new(5461).unwrap()], "[::1]:7001");
        assert_eq!(&*masters[&Slot::new(16383).unwrap()], "[::1]:7001");
    }
}
