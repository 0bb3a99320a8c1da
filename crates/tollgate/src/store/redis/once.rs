//! Decisions made once: a request that names itself (a marker key) is
//! decided at most once however often it is sent, so that a sender may
//! repeat it until it is acknowledged (at least once) and the limit counts
//! it exactly once. The marker and the decision go in one transaction,
//! watched on the marker, on a connection of their own to the master of
//! the subject's keys (the marker shares their Cluster slot).

use std::time::Duration;

use super::{fill, store_error, RedisStore};
use crate::clock::Timestamp;
use crate::engine::protocol::OpCode;
use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::subject::Subject;

/// One report to count once: its name (unique to its sender), its units,
/// and the instant it was made at when the sender decides on explicit time.
pub(crate) struct Report {
    /// Unique to the report, among its sender's.
    pub name: String,
    /// What it counts.
    pub units: u64,
    /// `None`: the store's clock.
    pub at: Option<Timestamp>,
}

impl RedisStore {
    /// Records each of `reports` for `subject` on `policy`, each at most
    /// once however often it is sent: a report whose marker (its name) the
    /// store holds was counted, and is left. All in one transaction, on a
    /// connection of its own. Answers how many were counted now.
    ///
    /// # Errors
    ///
    /// A store fault, or no answer within the store's timeout; the sender
    /// sends them again (nothing was counted, or the markers say so).
    pub(crate) async fn record_once(
        &self,
        subject: &Subject,
        policy: &Policy,
        reports: &[Report],
        remember: Duration,
    ) -> Result<usize> {
        let timeout = self.inner.timeout;
        tokio::time::timeout(
            timeout,
            Box::pin(self.record_once_untimed(subject, policy, reports, remember)),
        )
        .await
        .map_err(|_| Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}")))?
    }

    async fn record_once_untimed(
        &self,
        subject: &Subject,
        policy: &Policy,
        reports: &[Report],
        remember: Duration,
    ) -> Result<usize> {
        let markers: Vec<String> = reports
            .iter()
            .map(|report| self.key(subject, &format!("once:{}", report.name)))
            .collect();
        let Some(first) = markers.first() else {
            return Ok(0);
        };
        let client = &self.inner.client;
        let engine = client.engine.read().clone();
        let commands: Vec<redis::Cmd> = reports
            .iter()
            .map(|report| {
                let keys = policy.limits().map(|(limit, _)| self.key(subject, limit)).collect();
                let mut request = Request::new(Op::Record, report.units);
                request.now = report.at;
                let encoded = self.encode(keys, policy, &request, OpCode::Record);
                fill(engine.command(), &[&encoded])
            })
            .collect();
        let millis = u64::try_from(remember.as_millis()).unwrap_or(u64::MAX).max(1);
        let (mut connection, home) = client.dedicated.connection(first).await.map_err(store_error)?;
        let result: redis::RedisResult<usize> = async {
            // A transaction that another sender's markers abort is tried
            // again: it then finds them.
            loop {
                redis::cmd("WATCH")
                    .arg(&markers)
                    .query_async::<()>(&mut connection)
                    .await?;
                let seen: Vec<Option<String>> = redis::cmd("MGET").arg(&markers).query_async(&mut connection).await?;
                let fresh: Vec<usize> = (0..markers.len())
                    .filter(|&at| seen.get(at).is_none_or(Option::is_none))
                    .collect();
                if fresh.is_empty() {
                    redis::cmd("UNWATCH").query_async::<()>(&mut connection).await?;
                    return Ok(0);
                }
                let mut transaction = redis::pipe();
                transaction.atomic();
                for &at in &fresh {
                    transaction
                        .cmd("SET")
                        .arg(&markers[at])
                        .arg(1)
                        .arg("PX")
                        .arg(millis)
                        .ignore();
                    transaction.add_command(commands[at].clone()).ignore();
                }
                let done: redis::RedisResult<Option<()>> = transaction.query_async(&mut connection).await;
                match done {
                    Ok(Some(())) => return Ok(fresh.len()),
                    Ok(None) => {}
                    // The server answered with an error (a call refused: a
                    // transaction does not roll back): no record counted,
                    // so no marker may stay.
                    Err(error) if !error.is_io_error() && !error.is_timeout() && error.code().is_some() => {
                        let fresh_markers: Vec<&String> = fresh.iter().map(|&at| &markers[at]).collect();
                        redis::cmd("DEL")
                            .arg(fresh_markers)
                            .query_async::<()>(&mut connection)
                            .await?;
                        return Err(error);
                    }
                    Err(error) => return Err(error),
                }
            }
        }
        .await;
        match result {
            Ok(counted) => {
                client.dedicated.keep(connection, home);
                Ok(counted)
            }
            Err(error) => {
                client.dedicated.failed(&error);
                Err(store_error(error))
            }
        }
    }
}
