//! The connection behind a store: one server, a Cluster, or the master that
//! a set of Sentinels names; and the library on it.
//!
//! - **One server**: a [`ConnectionManager`], which reconnects by itself.
//! - **Cluster**: redis-rs's cluster connection, which routes each call to
//!   the master of its keys' slot, follows `MOVED` and `ASK` (a resharding is
//!   invisible), retries `TRYAGAIN` and `CLUSTERDOWN`, and refreshes its slot
//!   map after a failover. `FUNCTION LOAD` goes to every master (and
//!   `SCRIPT LOAD` to every node), so the library is wherever a call lands;
//!   a node that lost it (a new master, a flush) gets it again on every
//!   master, and the call is repeated.
//! - **Sentinel**: a [`ConnectionManager`] to the master the Sentinels name.
//!   When a call fails on the connection (the master died) or is refused as
//!   `READONLY` (the master was demoted), the Sentinels are asked again, and
//!   if they name another master the store connects to it, loads the
//!   library and repeats the call. One task asks at a time; the others
//!   use what it found.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::SentinelClient;

use super::{function_source, library_name, script_source, store_error};
use crate::engine::protocol::{self, PROTOCOL};
use crate::error::Result;

/// Which engine decides, as `?engine=` in the store URL says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineChoice {
    /// The module when the server has it, the Lua library otherwise.
    #[default]
    Auto,
    /// The module; a server without it is an error.
    Module,
    /// The Lua library, even on a server with the module.
    Lua,
}

/// The engine deciding on a Redis server.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Tollgate's Redis module (`TOLLGATE.DECIDE`): the Rust algorithms
    /// inside the server.
    Module,
    /// The Lua library (a functions library, or its script on Redis 6.2).
    Lua,
}

impl EngineKind {
    /// Every engine.
    pub const ALL: [Self; 2] = [Self::Module, Self::Lua];

    /// `module` or `lua`, as logs, metrics and `?engine=` name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Module => "module",
            Self::Lua => "lua",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How decisions are made on this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Engine {
    /// `TOLLGATE.DECIDE` of the Redis module (the Rust algorithms).
    Module,
    /// `FCALL` of the function library (Redis 7+, Valkey).
    Function,
    /// `EVALSHA` of the script, by its SHA-1.
    Script(String),
}

impl Engine {
    /// The command that calls the engine, before its keys and arguments.
    pub(super) fn command(&self) -> redis::Cmd {
        match self {
            Self::Module => redis::cmd("TOLLGATE.DECIDE"),
            Self::Function => redis::cmd("FCALL").arg(library_name()).to_owned(),
            Self::Script(sha) => redis::cmd("EVALSHA").arg(sha).to_owned(),
        }
    }

    /// True for the module.
    pub(super) fn is_module(&self) -> bool {
        matches!(self, Self::Module)
    }

    /// Which engine this is.
    pub(super) fn kind(&self) -> EngineKind {
        match self {
            Self::Module => EngineKind::Module,
            Self::Function | Self::Script(_) => EngineKind::Lua,
        }
    }

    /// True when the server no longer has the engine (flushed, restarted,
    /// or a new master without the module).
    pub(super) fn is_lost(&self, error: &redis::RedisError) -> bool {
        match self {
            Self::Module => Fault::of(error) == Fault::UnknownCommand,
            Self::Function => Fault::of(error) == Fault::NoFunction,
            Self::Script(_) => Fault::of(error) == Fault::NoScript,
        }
    }
}

/// The module's calling convention version on one server (`None`: it has
/// no module).
async fn module_protocol<C: ConnectionLike + Send>(connection: &mut C) -> redis::RedisResult<Option<i64>> {
    match redis::cmd("TOLLGATE.VERSION").query_async(connection).await {
        Ok(version) => Ok(Some(version)),
        Err(error) if is_unknown_command(&error) => Ok(None),
        Err(error) => Err(error),
    }
}

/// [`module_protocol`] on every master of a Cluster: `None` unless every
/// master has the module (decisions land on all of them). Each master's
/// answer is read: under `ResponsePolicy::AllSucceeded` redis-rs answers
/// with one master's reply, and a master's error reply ("unknown command")
/// comes back as a value, not as a failure.
async fn cluster_module_protocol(connection: &mut ClusterConnection) -> redis::RedisResult<Option<i64>> {
    let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let answers = connection
        .route_command(redis::cmd("TOLLGATE.VERSION"), every_master)
        .await?;
    let redis::Value::Map(answers) = answers else {
        return Ok(None);
    };
    let mut protocol = None;
    for (_, answer) in answers {
        let version = match answer.extract_error() {
            Ok(redis::Value::Int(version)) => version,
            Ok(_) => return Ok(None),
            Err(error) if is_unknown_command(&error) => return Ok(None),
            Err(error) => return Err(error),
        };
        // Masters speaking different protocols: none is assumed.
        if protocol.is_some_and(|agreed| agreed != version) {
            return Ok(None);
        }
        protocol = Some(version);
    }
    Ok(protocol)
}

/// The engine `choice` allows, given the module's `protocol` on the server
/// (`None`: no module); the library is loaded when it is Lua.
async fn load_engine<C: ConnectionLike + Send>(
    connection: &mut C,
    choice: EngineChoice,
    protocol: Option<i64>,
) -> redis::RedisResult<Engine> {
    match (choice, protocol) {
        (EngineChoice::Module | EngineChoice::Auto, Some(PROTOCOL)) => Ok(Engine::Module),
        // No module, or one of another version: the library decides.
        (EngineChoice::Lua | EngineChoice::Auto, _) => load_library(connection).await,
        (EngineChoice::Module, None) => Err(no_module(
            "the server (on a Cluster, a master) has no tollgate module loaded (the store URL says engine=module)",
        )),
        (EngineChoice::Module, Some(other)) => Err(no_module(&format!(
            "the server's tollgate module speaks protocol {other}, this client {PROTOCOL} \
             (the store URL says engine=module)"
        ))),
    }
}

fn no_module(message: &str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Client, "redis", message.to_owned()))
}

/// Loads the function library, or on a server without functions the script.
/// On a Cluster, redis-rs sends `FUNCTION LOAD` to every master and
/// `SCRIPT LOAD` to every node, and answers once all have succeeded.
pub(super) async fn load_library<C: ConnectionLike + Send>(connection: &mut C) -> redis::RedisResult<Engine> {
    let loaded: redis::RedisResult<String> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(function_source())
        .query_async(connection)
        .await;
    match loaded {
        Ok(_) => Ok(Engine::Function),
        Err(error) if is_unknown_command(&error) => {
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script_source())
                .query_async(connection)
                .await?;
            Ok(Engine::Script(sha))
        }
        Err(error) => Err(error),
    }
}

/// What a Redis error means to the store, recognised here once; the rest of
/// the store matches on the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// The server has no such command (no module) or subcommand.
    UnknownCommand,
    /// `FCALL` of a function the server does not hold (flushed).
    NoFunction,
    /// `EVALSHA` of a script the server does not hold (flushed, restarted).
    NoScript,
    /// The server is a replica now.
    ReadOnly,
    /// The connection failed, was refused or dropped.
    Connection,
    /// Anything else.
    Other,
}

impl Fault {
    /// The kind of `error`. Redis gives most a code of their own (which
    /// redis-rs reads into its kind); an unknown command and a missing
    /// function come as a plain `ERR` whose detail says which, and Redis
    /// 6.2 wraps a script's `READONLY` and `NOSCRIPT` in its own `ERR
    /// Error running script`: those are read from the detail.
    pub(super) fn of(error: &redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_unrecoverable_error()
        {
            return Self::Connection;
        }
        match error.kind() {
            ErrorKind::Server(ServerErrorKind::NoScript) => return Self::NoScript,
            ErrorKind::Server(ServerErrorKind::ReadOnly) => return Self::ReadOnly,
            _ => {}
        }
        let detail = error.detail().unwrap_or_default();
        let starts = |prefix: &str| {
            detail
                .get(..prefix.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
        };
        if starts("unknown command") || starts("unknown subcommand") {
            Self::UnknownCommand
        } else if starts("Function not found") {
            Self::NoFunction
        } else if detail.contains("READONLY") {
            Self::ReadOnly
        } else if detail.contains("NOSCRIPT") {
            Self::NoScript
        } else {
            Self::Other
        }
    }
}

fn is_unknown_command(error: &redis::RedisError) -> bool {
    Fault::of(error) == Fault::UnknownCommand
}

/// An engine's reply, [`protocol::pack`]ed.
struct Packed(Vec<i64>);

impl redis::FromRedisValue for Packed {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        match value {
            redis::Value::BulkString(bytes) => match protocol::unpack(&bytes) {
                Some(integers) => Ok(Self(integers)),
                None => Err("the engine's reply is not packed integers".into()),
            },
            other => Err(format!("the engine's reply is not packed integers: {other:?}").into()),
        }
    }
}

/// [`run`] on one connection of the caller's (a durable record's own).
pub(super) async fn run_on<C: ConnectionLike + Send>(
    connection: &mut C,
    command: &redis::Cmd,
    engine: &Engine,
) -> redis::RedisResult<Vec<i64>> {
    run(connection, command, engine).await
}

/// The engine's call after `ASKING`, on the Cluster node an `ASK`
/// redirection named (a slot being migrated to it).
pub(super) async fn run_asking<C: ConnectionLike + Send>(
    connection: &mut C,
    command: &redis::Cmd,
) -> redis::RedisResult<Vec<i64>> {
    let (reply,): (Packed,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .add_command(command.clone())
        .query_async(connection)
        .await?;
    Ok(reply.0)
}

/// Runs the engine's call on `connection`; when the server lost the Lua
/// library, loads it again and repeats the call (a lost module is the
/// caller's to handle: the engine changes).
async fn run<C: ConnectionLike + Send>(
    connection: &mut C,
    command: &redis::Cmd,
    engine: &Engine,
) -> redis::RedisResult<Vec<i64>> {
    let reply: Packed = match command.query_async(connection).await {
        Err(error) if !engine.is_module() && engine.is_lost(&error) => {
            load_library(connection).await?;
            command.query_async(connection).await?
        }
        result => result?,
    };
    Ok(reply.0)
}

/// The connection of a store; cheap to clone.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
    /// The master named by Sentinels.
    Sentinel(Arc<Followed>),
}

impl Connection {
    /// True on a Cluster: calls must not mix slots.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Picks the engine `choice` allows on the server (on every master of
    /// a Cluster), loading the library when it is Lua.
    pub(super) async fn load_engine(&self, choice: EngineChoice) -> Result<Engine> {
        let skip = choice == EngineChoice::Lua;
        match self {
            Self::Single(connection) => {
                let connection = &mut connection.clone();
                let protocol = if skip {
                    None
                } else {
                    module_protocol(connection).await.map_err(store_error)?
                };
                load_engine(connection, choice, protocol).await
            }
            Self::Cluster(connection) => {
                let connection = &mut connection.clone();
                let protocol = if skip {
                    None
                } else {
                    cluster_module_protocol(connection).await.map_err(store_error)?
                };
                load_engine(connection, choice, protocol).await
            }
            Self::Sentinel(followed) => {
                let connection = &mut followed.current().0;
                let protocol = if skip {
                    None
                } else {
                    module_protocol(connection).await.map_err(store_error)?
                };
                load_engine(connection, choice, protocol).await
            }
        }
        .map_err(store_error)
    }

    /// The server's `TIME`, in microseconds since the Unix epoch (on a
    /// Cluster, the node redis-rs picks; behind Sentinels, the master's).
    pub(super) async fn time(&self) -> Result<u64> {
        let command = redis::cmd("TIME");
        let (seconds, micros): (u64, u64) = match self {
            Self::Single(connection) => command.query_async(&mut connection.clone()).await,
            Self::Cluster(connection) => command.query_async(&mut connection.clone()).await,
            Self::Sentinel(followed) => command.query_async(&mut followed.current().0).await,
        }
        .map_err(store_error)?;
        Ok(seconds.saturating_mul(1_000_000).saturating_add(micros))
    }

    /// Runs a plain command (not a decision) on the server that holds its
    /// keys: the one server, the master of its keys' slot, or the master
    /// the Sentinels named last.
    pub(super) async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Self::Single(connection) => command.query_async(&mut connection.clone()).await,
            Self::Cluster(connection) => command.query_async(&mut connection.clone()).await,
            Self::Sentinel(followed) => command.query_async(&mut followed.current().0).await,
        }
    }

    /// Runs a script (loaded on first use) where [`Connection::query`] would.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Single(connection) => invocation.invoke_async(&mut connection.clone()).await,
            Self::Cluster(connection) => invocation.invoke_async(&mut connection.clone()).await,
            Self::Sentinel(followed) => invocation.invoke_async(&mut followed.current().0).await,
        }
    }

    /// Runs the engine's call `command`, whose keys start with `first_key`.
    pub(super) async fn run(
        &self,
        command: &redis::Cmd,
        engine: &Engine,
        first_key: &str,
    ) -> redis::RedisResult<Vec<i64>> {
        match self {
            Self::Single(connection) => run(&mut connection.clone(), command, engine).await,
            // redis-rs routes FCALL and EVALSHA by their keys, not the
            // module's command: it goes to the master of its keys' slot.
            Self::Cluster(connection) if engine.is_module() => {
                let slot = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    first_key,
                    SlotAddr::Master,
                )));
                let reply = connection
                    .clone()
                    .route_command(command.clone(), slot)
                    .await?
                    .extract_error()?;
                let reply: Packed = redis::FromRedisValue::from_redis_value(reply)?;
                Ok(reply.0)
            }
            Self::Cluster(connection) => run(&mut connection.clone(), command, engine).await,
            Self::Sentinel(followed) => followed.run(command, engine).await,
        }
    }
}

/// The master that Sentinels name, followed across failovers.
pub(super) struct Followed {
    /// Asks the Sentinels; locked by the one task asking.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: RwLock<Master>,
    /// The last call failed in a way that may mean a failover.
    suspect: AtomicBool,
    config: ConnectionManagerConfig,
    /// The longest a look-up (Sentinels, then the new master) may take: the
    /// caller has given up by then, and the batcher waits for its calls.
    patience: Duration,
}

/// The connection to the master as last found.
struct Master {
    connection: ConnectionManager,
    /// Its client, for connections of their own (durable records).
    client: redis::Client,
    /// Its address, as redis-rs writes it.
    address: String,
    /// Bumped at each switch to another master.
    generation: u64,
}

/// A fault after which the master may have moved: the connection failed, or
/// the server is now a replica.
fn master_may_have_moved(error: &redis::RedisError) -> bool {
    matches!(Fault::of(error), Fault::Connection | Fault::ReadOnly)
}

impl Followed {
    /// Asks `sentinels` for the master and connects to it.
    pub(super) async fn connect(
        mut sentinels: SentinelClient,
        config: ConnectionManagerConfig,
        patience: Duration,
    ) -> redis::RedisResult<Self> {
        let client = sentinels.async_get_client().await?;
        let address = client.get_connection_info().addr().to_string();
        let connection = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(sentinels),
            master: RwLock::new(Master {
                connection,
                client,
                address,
                generation: 0,
            }),
            suspect: AtomicBool::new(false),
            config,
            patience,
        })
    }

    /// The connection to the current master, and its generation.
    fn current(&self) -> (ConnectionManager, u64) {
        let master = self.master.read();
        (master.connection.clone(), master.generation)
    }

    /// The client of the current master (for a connection of its own), and
    /// its generation; asks the Sentinels first while the master is suspect,
    /// as a call on the shared connection does.
    pub(super) async fn master(&self) -> (redis::Client, u64) {
        if self.suspect.load(Ordering::Relaxed) {
            // A fault here is the call's to report, on the master found.
            let _ = self.follow(self.current().1).await;
        }
        let master = self.master.read();
        (master.client.clone(), master.generation)
    }

    /// Tells of `error` on a connection of its own to the master: after a
    /// fault that may mean a failover, the next call asks the Sentinels.
    pub(super) fn failed(&self, error: &redis::RedisError) {
        if master_may_have_moved(error) {
            self.suspect.store(true, Ordering::Relaxed);
        }
    }

    /// Runs `command` on the master; after a fault that may mean a
    /// failover, follows the Sentinels and repeats it on the new master.
    /// While the master is suspect (the last call failed so), the Sentinels
    /// are asked first, so that the first call after a promotion goes to
    /// the new master without waiting for the old one to fail again.
    async fn run(&self, command: &redis::Cmd, engine: &Engine) -> redis::RedisResult<Vec<i64>> {
        let asked = self.suspect.load(Ordering::Relaxed);
        if asked {
            // A fault here is the call's to report, below.
            let _ = self.follow(self.current().1).await;
        }
        let (mut connection, generation) = self.current();
        let result = match run(&mut connection, command, engine).await {
            Err(error) if master_may_have_moved(&error) => {
                self.suspect.store(true, Ordering::Relaxed);
                if !asked && matches!(self.follow(generation).await, Ok(true)) {
                    run(&mut self.current().0, command, engine).await
                } else {
                    Err(error)
                }
            }
            result => result,
        };
        if result.is_ok() {
            self.suspect.store(false, Ordering::Relaxed);
        }
        result
    }

    /// Asks the Sentinels where the master is and connects to it if it
    /// moved. True when the connection changed since generation `seen`
    /// (here, or by another task meanwhile).
    async fn follow(&self, seen: u64) -> redis::RedisResult<bool> {
        let mut sentinels = self.sentinels.lock().await;
        if self.master.read().generation != seen {
            return Ok(true);
        }
        let look_up = async {
            let client = sentinels.async_get_client().await?;
            let address = client.get_connection_info().addr().to_string();
            if address == self.master.read().address {
                return Ok(None);
            }
            // The library came with the replica's copy of the data; if not,
            // the first call finds it missing and loads it.
            let connection = ConnectionManager::new_with_config(client.clone(), self.config.clone()).await?;
            redis::RedisResult::Ok(Some((connection, client, address)))
        };
        let found = tokio::time::timeout(self.patience, look_up).await.map_err(|_| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the Sentinels or the master they name",
            ))
        })??;
        let Some((connection, client, address)) = found else {
            return Ok(false);
        };
        let mut master = self.master.write();
        master.connection = connection;
        master.client = client;
        master.address = address;
        master.generation += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demoted_or_unreachable_master_is_followed_other_faults_are_not() {
        let read_only = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(master_may_have_moved(&read_only));
        let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(master_may_have_moved(&refused));
        let wrong_type = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ExecAbort),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ));
        assert!(!master_may_have_moved(&wrong_type));
    }

    #[test]
    fn faults_are_told_apart_by_code_and_by_the_detail_of_a_plain_err() {
        use redis::{ErrorKind, ServerErrorKind};
        let server = |kind: ServerErrorKind, detail: &str| {
            redis::RedisError::from((ErrorKind::Server(kind), "", detail.to_owned()))
        };
        let plain = |detail: &str| {
            redis::RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "", detail.to_owned()))
        };
        for (error, fault) in [
            (server(ServerErrorKind::NoScript, "No matching script."), Fault::NoScript),
            (server(ServerErrorKind::ReadOnly, "You can't write against a read only replica."), Fault::ReadOnly),
            (plain("unknown command 'TOLLGATE.DECIDE', with args beginning with:"), Fault::UnknownCommand),
            (plain("Unknown subcommand 'x'."), Fault::UnknownCommand),
            (plain("Function not found"), Fault::NoFunction),
            (plain("Error running script (call to f_1): @user_script:1: @user_script: 1: -READONLY You can't write against a read only replica."), Fault::ReadOnly),
            (plain("wrong number of arguments"), Fault::Other),
            (redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)), Fault::Connection),
        ] {
            assert_eq!(Fault::of(&error), fault, "{error}");
        }
    }
}
