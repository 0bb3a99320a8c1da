//! Durable records: a decision of a limit asking for it runs on a
//! connection of its own (one server, or the master Sentinels name),
//! followed there by `WAIT 1` (a replica has it) or
//! `WAITAOF 1 0` (the append-only file has it), bounded by the store's
//! timeout; not acknowledged in time, it is [`ErrorKind::NotDurable`].

use std::sync::Arc;
use std::time::Duration;

use super::connection::{self, Connection, Followed};
use super::{fill, store_error, Client, Encoded, RedisStore};
use crate::algorithm::Durability;
use crate::error::{Error, ErrorKind, Result};
use crate::policy::{Op, Request};

/// Connections of their own for durable records, opened as needed: the
/// `WAIT` after a record blocks the connection it is sent on, so it must
/// not be the one every other decision shares, nor one another durable
/// record waits on. Idle ones are kept for the next, up to
/// [`DEDICATED_IDLE`], each with the generation of the master it reaches
/// (behind Sentinels, a failover makes them stale).
pub(super) struct Dedicated {
    /// One server's client; behind Sentinels, none (the master found last's).
    client: Option<redis::Client>,
    config: redis::AsyncConnectionConfig,
    idle: parking_lot::Mutex<Vec<(u64, redis::aio::MultiplexedConnection)>>,
}

impl Dedicated {
    pub(super) fn new(client: Option<redis::Client>, connect_timeout: Duration, timeout: Duration) -> Self {
        Self {
            client,
            config: redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(timeout)),
            idle: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// A connection to the server (behind Sentinels, the master found
    /// last), idle or new, and the generation of the master it reaches.
    async fn connection(
        &self,
        followed: Option<&Arc<Followed>>,
    ) -> redis::RedisResult<(redis::aio::MultiplexedConnection, u64)> {
        let (client, generation) = match (&self.client, followed) {
            (Some(client), _) => (client.clone(), 0),
            (None, Some(followed)) => followed.master().await,
            (None, None) => {
                let lost = std::io::Error::other("no server for a connection of its own");
                return Err(redis::RedisError::from(lost));
            }
        };
        let idle = {
            let mut idle = self.idle.lock();
            idle.retain(|(of, _)| *of == generation);
            idle.pop()
        };
        let connection = match idle {
            Some((_, connection)) => connection,
            None => {
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?
            }
        };
        Ok((connection, generation))
    }

    /// Keeps `connection` for the next record, after a clean round (one
    /// that failed is dropped).
    fn keep(&self, connection: redis::aio::MultiplexedConnection, generation: u64) {
        let mut idle = self.idle.lock();
        if idle.len() < DEDICATED_IDLE {
            idle.push((generation, connection));
        }
    }
}

/// Idle connections of durable records kept open.
const DEDICATED_IDLE: usize = 16;

/// The error of a `WAIT` or `WAITAOF`; a server without `WAITAOF` is told
/// what `fsynced` needs.
fn wait_error(error: redis::RedisError, durability: Durability) -> Error {
    let unknown = error.to_string().to_ascii_lowercase().contains("unknown command");
    if durability == Durability::Fsynced && unknown {
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
    request.cost > 0 && !matches!(request.op, Op::Release { .. })
}

impl Client {
    /// Runs one decision on a connection of its own (one server, or the
    /// master behind Sentinels; on a Cluster the shared one), then `WAIT 1`
    /// or `WAITAOF 1 0` there: the reply, and whether what it wrote was
    /// acknowledged in time.
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
        // The server checks a WAIT's own timeout only every 100 ms or so, and
        // the connection's response timeout is the call's: the wait is also
        // bounded here, inside both, and a wait cut short is "not durable"
        // (its connection, which still owes the answer, is dropped).
        let wait = {
            let millis = |left: Duration| u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
            move |left: Duration| {
                let mut wait = match durability {
                    Durability::Replicated => redis::cmd("WAIT"),
                    Durability::Fsynced => redis::cmd("WAITAOF"),
                };
                match durability {
                    Durability::Replicated => wait.arg(1).arg(millis(left)),
                    Durability::Fsynced => wait.arg(1).arg(0).arg(millis(left)),
                };
                wait
            }
        };
        let acknowledged = |reply: redis::Value| -> bool {
            match durability {
                Durability::Replicated => redis::from_redis_value::<i64>(reply).is_ok_and(|replicas| replicas >= 1),
                Durability::Fsynced => redis::from_redis_value::<Vec<i64>>(reply)
                    .is_ok_and(|counts| counts.first().is_some_and(|&local| local >= 1)),
            }
        };
        let followed = match &self.connection {
            Connection::Sentinel(followed) => Some(followed),
            _ => None,
        };
        if let Some(dedicated) = &self.dedicated {
            let counted = async {
                let (mut connection, generation) = dedicated.connection(followed).await?;
                let reply = connection::run_on(&mut connection, &command, &engine).await?;
                redis::RedisResult::Ok((connection, generation, reply))
            };
            let (mut connection, generation, reply) = tokio::time::timeout(left(), counted)
                .await
                .map_err(|_| timed_out())?
                .map_err(|error| {
                    if let Some(followed) = followed {
                        followed.failed(&error);
                    }
                    store_error(error)
                })?;
            let remaining = left();
            let waited = tokio::time::timeout(
                remaining * 9 / 10,
                wait(remaining * 3 / 4).query_async::<redis::Value>(&mut connection),
            )
            .await;
            let waited = match waited {
                Err(_) => return Ok((reply, false)),
                Ok(waited) => waited.map_err(|error| wait_error(error, durability))?,
            };
            dedicated.keep(connection, generation);
            return Ok((reply, acknowledged(waited)));
        }
        let reply = tokio::time::timeout(left(), self.call(&[decision]))
            .await
            .map_err(|_| timed_out())??;
        let remaining = left();
        let waited = tokio::time::timeout(
            remaining * 9 / 10,
            self.connection
                .query_near::<redis::Value>(&wait(remaining * 3 / 4), first_key),
        )
        .await;
        match waited {
            Err(_) => Ok((reply, false)),
            Ok(waited) => Ok((
                reply,
                acknowledged(waited.map_err(|error| wait_error(error, durability))?),
            )),
        }
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
