//! Usage a region records after the fact: into the region's outbox at once
//! (never refused), then home, at least once, each report counted once.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Region, Share};
use crate::clock::Timestamp;
use crate::decision::{Decision, Outcome, Path};
use crate::error::Result;
use crate::policy::Policy;
use crate::request::Request;
use crate::store::redis::once::Report;
use crate::store::redis::outbox::{StreamEntry, StreamGroup};
use crate::store::Store;
use crate::subject::Subject;
use crate::Limit;

/// The consumer group of every replica's forwarder.
const GROUP: &str = "forwarders";

/// Reports read per round.
const BATCH: usize = 512;

/// How often a forwarder looks at the outbox.
const EVERY: Duration = Duration::from_millis(50);

/// After this long unacknowledged, another replica's reports are taken over.
const IDLE: Duration = Duration::from_secs(10);

/// How long home remembers a report it counted (longer than any report can
/// be sent again).
const REMEMBER: Duration = Duration::from_secs(24 * 3600);

impl<S: Store> Region<S> {
    /// The region's outbox.
    pub(super) fn outbox(&self) -> StreamGroup {
        let stream = format!("{}:region:{{{}}}:outbox", self.regional.prefix(), self.name);
        StreamGroup::new(self.regional.clone(), stream, GROUP.to_owned())
    }

    /// Reports in the outbox.
    pub(super) async fn outbox_len(&self) -> Result<u64> {
        self.outbox().len().await
    }

    /// Records `request`'s units of the global limit `name`: into the
    /// outbox, whence home counts them; starts this replica's forwarder.
    pub(super) async fn report(
        self: &Arc<Self>,
        subject: &Subject,
        name: &str,
        limit: &Limit,
        request: &Request,
    ) -> Result<Outcome> {
        let outbox = self.outbox();
        if !self.forwarding.swap(true, Ordering::AcqRel) {
            // Its rounds join the outbox's group first.
            tokio::spawn(forward(Arc::downgrade(self)));
        }
        let at = request.now.map(|now| now.as_micros().to_string()).unwrap_or_default();
        let mut add = redis::cmd("XADD");
        add.arg(outbox.stream())
            .arg("*")
            .arg("subject")
            .arg(subject.as_key())
            .arg("name")
            .arg(name)
            .arg("limit")
            .arg(limit.to_value().to_string())
            .arg("units")
            .arg(request.units())
            .arg("at")
            .arg(at);
        let policy = Policy::new([(name, limit.clone())])?;
        let added = self
            .regional
            .bounded(self.regional.inner.client.connection.query::<String>(&add))
            .await;
        if added.is_err() {
            // The region's outbox cannot take it: home counts it directly
            // (once; a report that fails there too is the caller's error).
            return self.home.decide(subject, &policy, request).await;
        }
        let share = self.peek(subject, name).await.unwrap_or(Share {
            units: 0,
            lapses_in: Duration::ZERO,
        });
        let decision = Decision::allow(limit.capacity(), share.units, super::micros(share.lapses_in), 0);
        Ok(Self::outcome(
            &policy,
            request,
            true,
            request.units(),
            decision,
            Path::Leased,
        ))
    }

    async fn peek(&self, subject: &Subject, name: &str) -> Result<Share> {
        let key = self.share_key(subject, name);
        let mut invocation = super::share::peek().key(&key);
        invocation.arg("");
        let (units, lapses_in): (u64, u64) = self
            .regional
            .bounded(self.regional.inner.client.connection.invoke(&invocation))
            .await?;
        Ok(Share {
            units,
            lapses_in: Duration::from_micros(lapses_in),
        })
    }
}

/// Forwards the outbox home while the store lives.
async fn forward<S: Store>(region: Weak<Region<S>>) {
    loop {
        tokio::time::sleep(EVERY).await;
        let Some(region) = region.upgrade() else { return };
        let _ = forward_once(&region).await;
    }
}

/// One round: this replica's pending reports, else another's left idle,
/// else new ones, counted at home and then acknowledged.
pub(super) async fn forward_once<S: Store>(region: &Region<S>) -> Result<usize> {
    let outbox = region.outbox();
    outbox.join().await?;
    let consumer = region.replica.as_str();
    let mut entries = outbox.pending(consumer, BATCH).await?;
    if entries.is_empty() {
        entries = outbox.claim(consumer, IDLE, BATCH).await?;
    }
    if entries.is_empty() {
        entries = outbox.read(consumer, BATCH).await?;
    }
    let mut counted = 0;
    let mut done = Vec::new();
    for ((subject, name, limit), reports) in by_limit(&region.name, &entries) {
        let Ok(limit) = Limit::from_json(&limit) else {
            // Not a report this library wrote: dropped, not retried forever.
            done.extend(reports.into_iter().map(|(id, _)| id));
            continue;
        };
        let policy = Policy::new([(name, limit)])?;
        let subject = Subject::from_key(&subject);
        let (ids, reports): (Vec<String>, Vec<Report>) = reports.into_iter().unzip();
        match region.home.record_once(&subject, &policy, &reports, REMEMBER).await {
            Ok(now) => {
                region.stats.home_unreachable.store(false, Ordering::Relaxed);
                counted += now;
                done.extend(ids);
            }
            Err(error) => {
                region.stats.home_unreachable.store(true, Ordering::Relaxed);
                outbox.ack(&done).await?;
                return Err(error);
            }
        }
    }
    region.stats.forwarded.fetch_add(counted as u64, Ordering::Relaxed);
    outbox.ack(&done).await?;
    Ok(counted)
}

/// The reports among `entries`, by subject, limit name and limit: each
/// with its entry's id and its report (named after the region and the id).
#[allow(clippy::type_complexity)]
fn by_limit(region: &str, entries: &[StreamEntry]) -> HashMap<(String, String, String), Vec<(String, Report)>> {
    let mut grouped: HashMap<(String, String, String), Vec<(String, Report)>> = HashMap::new();
    for entry in entries {
        let parsed = (|| {
            let units = entry.field("units")?.parse::<u64>().ok()?;
            let at = match entry.field("at")? {
                "" => None,
                at => Some(Timestamp::from_micros(at.parse().ok()?)),
            };
            let key = (
                entry.field("subject")?.to_owned(),
                entry.field("name")?.to_owned(),
                entry.field("limit")?.to_owned(),
            );
            Some((key, units, at))
        })();
        let (key, units, at) = parsed.unwrap_or_else(|| ((String::new(), String::new(), String::new()), 0, None));
        let report = Report {
            name: format!("{region}:{}", entry.id),
            units,
            at,
        };
        grouped.entry(key).or_default().push((entry.id.clone(), report));
    }
    grouped
}
