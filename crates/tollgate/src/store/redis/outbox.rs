//! The alert outbox: a Redis Stream to which the call that crosses a
//! limit's alert threshold adds the crossing, read through a consumer
//! group, so that each entry goes to one process, stays pending until that
//! process acknowledges it, and is taken over by another when it stops.

use std::time::Duration;

use redis::Value;

use super::{store_error, RedisStore};
use crate::clock::Timestamp;
use crate::error::Result;

/// A store's alert outbox, read by one consumer group
/// ([`RedisStore::outbox`]).
#[derive(Clone)]
pub struct Outbox {
    group: StreamGroup,
}

/// A Redis Stream read by one consumer group: each entry goes to one
/// consumer, stays pending until acknowledged, and is taken over by another
/// consumer when it is left idle. Entries are read as their fields; each
/// user of a stream reads its own out of them.
#[derive(Clone)]
pub(super) struct StreamGroup {
    store: RedisStore,
    stream: String,
    group: String,
}

/// An entry of a stream: its id, and its fields `(name, value)`.
pub(super) struct StreamEntry {
    pub(super) id: String,
    pub(super) fields: Vec<(String, String)>,
}

impl StreamEntry {
    /// The value of field `name`.
    pub(super) fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }
}

/// One crossing, as the call that crossed it wrote it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The stream entry's id (what [`Outbox::ack`] takes).
    pub id: String,
    /// The key of the limit that crossed.
    pub key: String,
    /// The label the request gave the limit ([`Request::labels`](crate::Request::labels)).
    pub label: String,
    /// The threshold, a percent of the limit.
    pub threshold: u8,
    /// Units used after the decision (at most the limit).
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// When the limit's use resets (a window's end).
    pub reset_at: Timestamp,
    /// When it crossed.
    pub at: Timestamp,
}

impl RedisStore {
    /// Its alert outbox ([`RedisStoreBuilder::alert_outbox`](super::RedisStoreBuilder::alert_outbox)),
    /// read by the consumer group `group`; `None` when it has none.
    pub fn outbox(&self, group: &str) -> Option<Outbox> {
        let (stream, _) = self.inner.outbox.as_ref()?;
        Some(Outbox {
            group: StreamGroup::new(self.clone(), stream.to_string(), group.to_owned()),
        })
    }
}

impl Outbox {
    /// The stream's key.
    pub fn stream(&self) -> &str {
        &self.group.stream
    }

    /// Creates the consumer group (and the stream) unless it exists; it
    /// reads the stream from its start.
    ///
    /// # Errors
    ///
    /// The store's ([`ErrorKind::Store`](crate::ErrorKind::Store)).
    pub async fn join(&self) -> Result<()> {
        self.group.join().await
    }

    /// Up to `count` entries no consumer of the group has been given, now
    /// given to `consumer` (pending until acknowledged).
    ///
    /// # Errors
    ///
    /// The store's; a group not [`join`](Self::join)ed.
    pub async fn read(&self, consumer: &str, count: usize) -> Result<Vec<OutboxEntry>> {
        Ok(alerts(&self.group.read(consumer, count).await?))
    }

    /// Up to `count` entries given to `consumer` and not yet acknowledged
    /// (to deliver again after a failure), oldest first.
    ///
    /// # Errors
    ///
    /// As [`Outbox::read`].
    pub async fn pending(&self, consumer: &str, count: usize) -> Result<Vec<OutboxEntry>> {
        Ok(alerts(&self.group.pending(consumer, count).await?))
    }

    /// Gives `consumer` up to `count` entries another consumer was given
    /// and left unacknowledged for `min_idle` or more (a process that
    /// stopped, or cannot deliver).
    ///
    /// # Errors
    ///
    /// The store's.
    pub async fn claim(&self, consumer: &str, min_idle: Duration, count: usize) -> Result<Vec<OutboxEntry>> {
        Ok(alerts(&self.group.claim(consumer, min_idle, count).await?))
    }

    /// Acknowledges the entries `ids` (delivered) and removes them.
    ///
    /// # Errors
    ///
    /// The store's.
    pub async fn ack(&self, ids: &[String]) -> Result<()> {
        self.group.ack(ids).await
    }

    /// The entries in the stream (delivered ones are removed).
    ///
    /// # Errors
    ///
    /// The store's.
    pub async fn len(&self) -> Result<u64> {
        self.group.len().await
    }
}

/// The alerts among `entries` (others were not written by the library).
fn alerts(entries: &[StreamEntry]) -> Vec<OutboxEntry> {
    entries.iter().filter_map(alert).collect()
}

impl StreamGroup {
    pub(super) fn new(store: RedisStore, stream: String, group: String) -> Self {
        Self { store, stream, group }
    }

    /// The stream's key.
    pub(super) fn stream(&self) -> &str {
        &self.stream
    }

    /// Creates the consumer group (and the stream) unless it exists; it
    /// reads the stream from its start.
    ///
    /// # Errors
    ///
    /// The store's ([`ErrorKind::Store`](crate::ErrorKind::Store)).
    pub(super) async fn join(&self) -> Result<()> {
        let mut create = redis::cmd("XGROUP");
        create
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM");
        match self.store.inner.client.connection.query::<()>(&create).await {
            Ok(()) => Ok(()),
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            Err(error) => Err(store_error(error)),
        }
    }

    /// Up to `count` entries no consumer of the group has been given, now
    /// given to `consumer` (pending until acknowledged).
    ///
    /// # Errors
    ///
    /// The store's; a group not [`join`](Self::join)ed.
    pub(super) async fn read(&self, consumer: &str, count: usize) -> Result<Vec<StreamEntry>> {
        self.read_from(consumer, count, ">").await
    }

    /// Up to `count` entries given to `consumer` and not yet acknowledged
    /// (to deliver again after a failure), oldest first.
    ///
    /// # Errors
    ///
    /// As [`Outbox::read`].
    pub(super) async fn pending(&self, consumer: &str, count: usize) -> Result<Vec<StreamEntry>> {
        self.read_from(consumer, count, "0").await
    }

    async fn read_from(&self, consumer: &str, count: usize, from: &str) -> Result<Vec<StreamEntry>> {
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(&self.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(from);
        let reply: Value = self
            .store
            .inner
            .client
            .connection
            .query(&read)
            .await
            .map_err(store_error)?;
        // [[stream, [[id, [field, value, …]], …]]], or nil.
        let Some(streams) = array(&reply) else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::new();
        for stream in streams {
            if let Some(listed) = array(stream).and_then(|pair| pair.get(1)) {
                entries.extend(array(listed).into_iter().flatten().filter_map(entry));
            }
        }
        Ok(entries)
    }

    /// Gives `consumer` up to `count` entries another consumer was given
    /// and left unacknowledged for `min_idle` or more (a process that
    /// stopped, or cannot deliver).
    ///
    /// # Errors
    ///
    /// The store's.
    pub(super) async fn claim(&self, consumer: &str, min_idle: Duration, count: usize) -> Result<Vec<StreamEntry>> {
        let mut claim = redis::cmd("XAUTOCLAIM");
        claim
            .arg(&self.stream)
            .arg(&self.group)
            .arg(consumer)
            .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
            .arg("0")
            .arg("COUNT")
            .arg(count);
        let reply: Value = self
            .store
            .inner
            .client
            .connection
            .query(&claim)
            .await
            .map_err(store_error)?;
        // [next, [[id, [field, value, …]], …], (Redis 7) [deleted ids]].
        let claimed = array(&reply).and_then(|parts| parts.get(1)).and_then(array);
        Ok(claimed.into_iter().flatten().filter_map(entry).collect())
    }

    /// Acknowledges the entries `ids` (delivered) and removes them.
    ///
    /// # Errors
    ///
    /// The store's.
    pub(super) async fn ack(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let connection = &self.store.inner.client.connection;
        let mut ack = redis::cmd("XACK");
        ack.arg(&self.stream).arg(&self.group).arg(ids);
        connection.query::<()>(&ack).await.map_err(store_error)?;
        let mut delete = redis::cmd("XDEL");
        delete.arg(&self.stream).arg(ids);
        connection.query::<()>(&delete).await.map_err(store_error)
    }

    /// The entries in the stream (delivered ones are removed).
    ///
    /// # Errors
    ///
    /// The store's.
    pub(super) async fn len(&self) -> Result<u64> {
        let mut len = redis::cmd("XLEN");
        len.arg(&self.stream);
        self.store
            .inner
            .client
            .connection
            .query(&len)
            .await
            .map_err(store_error)
    }
}

/// The elements of an array reply.
fn array(value: &Value) -> Option<&Vec<Value>> {
    match value {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// An entry `[id, [field, value, …]]` (`None`: deleted).
fn entry(value: &Value) -> Option<StreamEntry> {
    let [id, fields] = array(value)?.as_slice() else {
        return None;
    };
    let fields = array(fields)?
        .chunks_exact(2)
        .filter_map(|pair| Some((text(&pair[0])?, text(&pair[1])?)))
        .collect();
    Some(StreamEntry { id: text(id)?, fields })
}

/// An alert the library wrote (`None`: another entry).
fn alert(entry: &StreamEntry) -> Option<OutboxEntry> {
    let number = |name: &str| entry.field(name)?.parse::<u64>().ok();
    Some(OutboxEntry {
        id: entry.id.clone(),
        key: entry.field("key")?.to_owned(),
        label: entry.field("label").unwrap_or_default().to_owned(),
        threshold: u8::try_from(number("threshold")?).ok()?,
        used: number("used")?,
        limit: number("limit")?,
        reset_at: Timestamp::from_micros(number("reset_at")?),
        at: Timestamp::from_micros(number("at")?),
    })
}
