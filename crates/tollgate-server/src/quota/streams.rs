//! The registry of Envoys' streams: opened, closed, and their reports
//! taken; what an interval decided sent to each, and every assignment
//! expired when the server stops.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::blocks::Decided;
use super::settings::{
    Action, Blanket, BucketAction, BucketId, Strategy, StreamId, Usage, MAX_BUCKETS_PER_STREAM, MAX_REPORTED,
};
use super::{Quotas, Share, Stream};
use crate::service::{Failure, ServiceError};

impl Quotas {
    /// Opens a stream for the Envoy at `peer`: its id, and where its
    /// actions arrive.
    ///
    /// # Errors
    ///
    /// Unavailable once the server is stopping.
    pub fn open(&self, peer: String) -> Result<(StreamId, mpsc::UnboundedReceiver<Vec<BucketAction>>), ServiceError> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut state = self.state();
        if state.stopped {
            return Err(ServiceError::Refused(
                Failure::Unavailable,
                "the server is stopping".to_owned(),
            ));
        }
        state.streams.insert(
            id,
            Stream {
                domain: None,
                held: 0,
                peer,
                sender,
            },
        );
        self.service.metrics().quota().streams(state.streams.len());
        Ok((id, receiver))
    }

    /// Forgets stream `id`: its shares go back to the others at the next
    /// interval.
    pub fn close(&self, id: StreamId) {
        let mut state = self.state();
        let Some(stream) = state.streams.remove(&id) else {
            return;
        };
        for ((domain, bucket), entry) in &mut state.buckets {
            if entry.envoys.remove(&id).is_some() {
                self.service
                    .metrics()
                    .quota()
                    .forget_share(domain, bucket, &stream.peer);
            }
        }
        state.buckets.retain(|_, bucket| !bucket.envoys.is_empty());
        self.service.metrics().quota().streams(state.streams.len());
        self.service.metrics().quota().buckets(state.buckets.len());
    }

    /// Takes one report of stream `id`: the domain (on its first report),
    /// and each bucket's usage. A bucket reported for the first time is
    /// assigned at once. A usage that cannot be read (no entries, an entry
    /// without a key, implausible counts) is counted and skipped; the
    /// stream's other buckets go on.
    ///
    /// # Errors
    ///
    /// An unknown domain, none on the first report, or another than the
    /// stream's: the stream ends.
    pub async fn report(&self, id: StreamId, domain: &str, usages: Vec<Usage>) -> Result<(), ServiceError> {
        let domain = self.stream_domain(id, domain)?;
        let metrics = self.service.metrics().quota();
        let now = Instant::now();
        let mut subscribed = Vec::new();
        {
            let mut state = self.state();
            let state = &mut *state;
            for (index, usage) in usages.into_iter().enumerate() {
                metrics.report(&domain);
                let readable = if index < MAX_BUCKETS_PER_STREAM {
                    readable(&usage)
                } else {
                    Err("too_many_buckets")
                };
                if let Err(reason) = readable {
                    metrics.rejected(reason);
                    tracing::warn!(domain, reason, "rlqs: a bucket's usage is skipped");
                    continue;
                }
                let mut bucket = usage.bucket;
                bucket.sort();
                let requests = usage.allowed + usage.denied;
                let demand = usage
                    .elapsed
                    .filter(|elapsed| !elapsed.is_zero())
                    .map(|elapsed| requests as f64 / elapsed.as_secs_f64());
                let key = (domain.clone(), bucket);
                if let Some(share) = state.buckets.get_mut(&key).and_then(|entry| entry.envoys.get_mut(&id)) {
                    share.demand = demand.or(share.demand);
                    share.reported = now;
                    if requests > 0 {
                        share.busy = now;
                    }
                    continue;
                }
                let Some(stream) = state
                    .streams
                    .get_mut(&id)
                    .filter(|stream| stream.held < MAX_BUCKETS_PER_STREAM)
                else {
                    metrics.rejected("too_many_buckets");
                    continue;
                };
                stream.held += 1;
                let share = Share {
                    demand,
                    reported: now,
                    busy: now,
                    current: None,
                };
                subscribed.push((key.1.clone(), demand));
                state.buckets.entry(key).or_default().envoys.insert(id, share);
            }
            metrics.buckets(state.buckets.len());
        }
        // The new buckets' first assignments, in one answer.
        let mut first = Vec::with_capacity(subscribed.len());
        for (bucket, demand) in subscribed {
            if let Some(decided) = self.assign_first(id, &domain, &bucket, demand).await {
                first.push((bucket, vec![decided]));
            }
        }
        if !first.is_empty() {
            self.finish(&domain, first);
        }
        Ok(())
    }

    /// The domain of stream `id`, set by its first report.
    fn stream_domain(&self, id: StreamId, sent: &str) -> Result<String, ServiceError> {
        let mut state = self.state();
        let stream = state
            .streams
            .get_mut(&id)
            .ok_or_else(|| ServiceError::Refused(Failure::Unavailable, "the stream is closed".to_owned()))?;
        match &stream.domain {
            Some(domain) if sent.is_empty() || sent == domain => Ok(domain.clone()),
            Some(domain) => Err(ServiceError::invalid(format!(
                "domain \"{sent}\" differs from the stream's \"{domain}\": open another stream"
            ))),
            None if sent.is_empty() => Err(ServiceError::invalid("domain must be set on the stream's first report")),
            None => {
                if !self.service.config().domains.contains_key(sent) {
                    return Err(ServiceError::invalid(format!("domain \"{sent}\" is not configured")));
                }
                stream.domain = Some(sent.to_owned());
                Ok(sent.to_owned())
            }
        }
    }

    /// Records what was decided for a domain's buckets and sends each
    /// stream its actions.
    pub(super) fn finish(&self, domain: &str, decided: Vec<(BucketId, Vec<Decided>)>) {
        let metrics = self.service.metrics().quota();
        let mut outgoing: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        let mut state = self.state();
        let state = &mut *state;
        for (bucket, envoys) in decided {
            let key = (domain.to_owned(), bucket);
            for decided in envoys {
                let Some(share) = state
                    .buckets
                    .get_mut(&key)
                    .and_then(|entry| entry.envoys.get_mut(&decided.stream))
                else {
                    continue;
                };
                share.current = decided.current;
                tracing::debug!(domain, bucket = ?key.1, stream = decided.stream, action = ?decided.action, "rlqs: assigned");
                let Some(stream) = state.streams.get(&decided.stream) else {
                    continue;
                };
                metrics.assigned(decided.action.label());
                metrics.share(domain, &key.1, &stream.peer, decided.rate);
                outgoing.entry(decided.stream).or_default().push(BucketAction {
                    bucket: key.1.clone(),
                    action: decided.action,
                });
            }
        }
        for (id, actions) in outgoing {
            if let Some(stream) = state.streams.get(&id) {
                let _ = stream.sender.send(actions);
            }
        }
    }

    /// Expires every assignment of every stream, and ends the streams.
    pub(super) fn expire_all(&self) {
        let mut state = self.state();
        state.stopped = true;
        let mut outgoing: HashMap<StreamId, Vec<BucketAction>> = HashMap::new();
        for ((_, bucket), entry) in &state.buckets {
            for &id in entry.envoys.keys() {
                outgoing.entry(id).or_default().push(BucketAction {
                    bucket: bucket.clone(),
                    action: Action::Assign {
                        strategy: Strategy::Blanket(Blanket::AllowAll),
                        ttl: Duration::ZERO,
                    },
                });
            }
        }
        for (id, actions) in outgoing {
            if let Some(stream) = state.streams.get(&id) {
                let _ = stream.sender.send(actions);
            }
        }
        // Dropping the senders ends the streams.
        state.streams.clear();
        state.buckets.clear();
    }
}

/// Why a usage cannot be read, if it cannot.
fn readable(usage: &Usage) -> Result<(), &'static str> {
    if usage.bucket.is_empty() {
        return Err("empty_bucket_id");
    }
    if usage.bucket.iter().any(|(key, _)| key.is_empty()) {
        return Err("empty_key");
    }
    if usage.allowed > MAX_REPORTED || usage.denied > MAX_REPORTED {
        return Err("implausible_counts");
    }
    Ok(())
}
