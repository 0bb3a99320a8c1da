//! Documents that every process on one Redis shares beside the limits'
//! state: a hash of named values, a version counter bumped by every change,
//! and a log of the fields the last [`LOG_LEN`] changes touched, all in one
//! slot (a Cluster hash tag). A change is one atomic call; a reader polls
//! the version (one small key) and reads only what changed since the
//! version it holds, so that following a table of 100 000 documents costs
//! no more than following one. `tollgate serve` keeps its overrides in
//! them, one table per domain.

use std::time::Duration;

use redis::Script;

use super::{store_error, RedisStore};
use crate::error::{Error, ErrorKind, Result};

/// Fields read per `HSCAN` step when loading a table: each step is a short
/// call, so a table of any size never stalls the server.
const SCAN_STEP: usize = 1_000;

/// Changes remembered, for readers that follow the table.
pub const LOG_LEN: u64 = 1_000;

/// What changed since a version a reader holds ([`SharedTable::changes_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableChanges {
    /// Nothing: the table is at that version.
    None,
    /// The fields changed since, each with its value now (`None`: deleted),
    /// and the version they bring the reader to.
    Some {
        /// The table's version.
        version: u64,
        /// Each field changed since, once, with its value now.
        fields: Vec<(String, Option<String>)>,
    },
    /// Too many changes since (or the table was reset): load it whole.
    Reload,
}

/// A change: the value the field held before, and the table's version after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableChange {
    /// The field's value before the change; `None` if it had none.
    pub previous: Option<String>,
    /// The table's version once changed.
    pub version: u64,
}

/// A table of documents in a [`RedisStore`] ([`RedisStore::table`]).
#[derive(Clone)]
pub struct SharedTable {
    store: RedisStore,
    fields: String,
    version: String,
    log: String,
}

/// Sets, deletes, or deletes only while the field still holds a value;
/// answers the previous value and the version (unchanged when nothing was
/// done).
const CHANGE: &str = r"
local previous = redis.call('HGET', KEYS[1], ARGV[2])
local op = ARGV[1]
if op == 'set' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
elseif (op == 'delete' and previous) or (op == 'delete_if' and previous == ARGV[3]) then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  return {previous, tonumber(redis.call('GET', KEYS[2]) or '0'), 0}
end
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
return {previous, redis.call('INCR', KEYS[2]), 1}
";

/// The fields changed since version ARGV[1], newest first, each once with
/// its value now: `{version, field, value or false, …}`; `{version}` alone
/// when nothing changed, `{-1}` when the log does not reach back so far.
const SINCE: &str = r"
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
local since = tonumber(ARGV[1])
if version == since then return {version} end
if since > version or version - since > redis.call('LLEN', KEYS[3]) then return {-1} end
local reply, seen = {version}, {}
for _, field in ipairs(redis.call('LRANGE', KEYS[3], 0, version - since - 1)) do
  if not seen[field] then
    seen[field] = true
    reply[#reply + 1] = field
    reply[#reply + 1] = redis.call('HGET', KEYS[1], field) or false
  end
end
return reply
";

impl RedisStore {
    /// The shared table `name` (keys `<prefix>:table:{<name>}`, `…:version`
    /// and `…:log`).
    pub fn table(&self, name: &str) -> SharedTable {
        let fields = format!("{}:table:{{{name}}}", self.prefix());
        SharedTable {
            store: self.clone(),
            version: format!("{fields}:version"),
            log: format!("{fields}:log"),
            fields,
        }
    }
}

impl SharedTable {
    fn timeout(&self) -> Duration {
        self.store.inner.timeout
    }

    async fn bounded<T>(&self, call: impl std::future::Future<Output = redis::RedisResult<T>>) -> Result<T> {
        let timeout = self.timeout();
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}")))?
            .map_err(store_error)
    }

    /// The table's version: 0 for a table never written.
    ///
    /// # Errors
    ///
    /// A store fault, or no answer within the store's timeout.
    pub async fn version(&self) -> Result<u64> {
        let version: Option<u64> = self
            .bounded(
                self.store
                    .inner
                    .client
                    .connection
                    .query(redis::cmd("GET").arg(&self.version)),
            )
            .await?;
        Ok(version.unwrap_or(0))
    }

    /// Every field and its value, with the version they are of: read in
    /// short steps, and read again if the table changed meanwhile.
    ///
    /// # Errors
    ///
    /// As [`SharedTable::version`].
    pub async fn load(&self) -> Result<(u64, Vec<(String, String)>)> {
        let connection = &self.store.inner.client.connection;
        loop {
            let before = self.version().await?;
            let mut fields = Vec::new();
            let mut cursor = 0_u64;
            loop {
                let mut command = redis::cmd("HSCAN");
                command.arg(&self.fields).arg(cursor).arg("COUNT").arg(SCAN_STEP);
                let (next, step): (u64, Vec<(String, String)>) = self.bounded(connection.query(&command)).await?;
                fields.extend(step);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            if self.version().await? == before {
                // HSCAN may return a field twice; the last value is current.
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                fields.dedup_by(|later, earlier| later.0 == earlier.0);
                return Ok((before, fields));
            }
        }
    }

    async fn change(&self, op: &str, field: &str, value: &str) -> Result<(TableChange, bool)> {
        static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let script = SCRIPT.get_or_init(|| Script::new(CHANGE));
        let mut invocation = script.key(&self.fields);
        invocation
            .key(&self.version)
            .key(&self.log)
            .arg(op)
            .arg(field)
            .arg(value)
            .arg(LOG_LEN);
        let (previous, version, changed): (Option<String>, u64, u8) = self
            .bounded(self.store.inner.client.connection.invoke(&invocation))
            .await?;
        Ok((TableChange { previous, version }, changed == 1))
    }

    /// What changed since `version` (one short call: at most `LOG_LEN` (1 000)
    /// fields are read).
    ///
    /// # Errors
    ///
    /// As [`SharedTable::version`].
    pub async fn changes_since(&self, version: u64) -> Result<TableChanges> {
        static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
        let script = SCRIPT.get_or_init(|| Script::new(SINCE));
        let mut invocation = script.key(&self.fields);
        invocation.key(&self.version).key(&self.log).arg(version);
        let reply: Vec<redis::Value> = self
            .bounded(self.store.inner.client.connection.invoke(&invocation))
            .await?;
        let malformed = || Error::new(ErrorKind::Store, "redis: a malformed reply to a table's changes");
        let mut reply = reply.into_iter();
        let now: i64 = redis::from_redis_value(reply.next().ok_or_else(malformed)?).map_err(|_| malformed())?;
        let Ok(now) = u64::try_from(now) else {
            return Ok(TableChanges::Reload);
        };
        if now == version {
            return Ok(TableChanges::None);
        }
        let mut fields = Vec::new();
        while let (Some(field), Some(value)) = (reply.next(), reply.next()) {
            let field: String = redis::from_redis_value(field).map_err(|_| malformed())?;
            let value: Option<String> = redis::from_redis_value(value).map_err(|_| malformed())?;
            fields.push((field, value));
        }
        Ok(TableChanges::Some { version: now, fields })
    }

    /// Sets `field` to `value`, in one atomic call with the version's bump.
    ///
    /// # Errors
    ///
    /// As [`SharedTable::version`].
    pub async fn set(&self, field: &str, value: &str) -> Result<TableChange> {
        Ok(self.change("set", field, value).await?.0)
    }

    /// Deletes `field`; the version is bumped only if it existed.
    ///
    /// # Errors
    ///
    /// As [`SharedTable::version`].
    pub async fn delete(&self, field: &str) -> Result<TableChange> {
        Ok(self.change("delete", field, "").await?.0)
    }

    /// Deletes `field` only if it still holds `value` (what a reader found
    /// expired, and nobody replaced meanwhile): the change, or `None`.
    ///
    /// # Errors
    ///
    /// As [`SharedTable::version`].
    pub async fn delete_if(&self, field: &str, value: &str) -> Result<Option<TableChange>> {
        let (change, changed) = self.change("delete_if", field, value).await?;
        Ok(changed.then_some(change))
    }
}
