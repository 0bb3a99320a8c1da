//! Budget alerts. A rule's `alerts` thresholds (percent of its limit) are
//! crossed by the decision that takes a descriptor's use from below one to
//! at or above it; the store finds the crossing in the decision's own
//! atomic step, so each crossing is seen by one replica. It is counted
//! (`tollgate_alerts`), shown among the events, and delivered to
//! `--alert-webhook` at least once, with an idempotency key: on Redis the
//! deciding call itself writes it into the store's outbox (a Stream), which
//! the replicas read through one consumer group (a stopped replica's
//! entries taken over by another), so that neither a replica that stops
//! nor a webhook that fails for minutes loses one; on the memory store (or
//! for decisions made locally while Redis fails) a bounded queue in this
//! process holds them.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{watch, Notify};
use tollgate::{Outbox, OutboxEntry, Outcome, Path};

use super::Service;
use crate::config::{Rule, RuleLimit};
use crate::overrides::format_instant;

/// Alerts the in-process queue keeps (the oldest dropped past them).
pub const QUEUE_KEPT: usize = 10_000;
/// Entries the Redis outbox keeps at about most (`XADD … MAXLEN ~`).
pub const OUTBOX_KEPT: u64 = 100_000;
/// The consumer group the replicas read the outbox with.
pub const GROUP: &str = "tollgate-alerts";
/// How often the outbox is read when nothing wakes the deliverer.
const POLL: Duration = Duration::from_millis(200);
/// Entries read at a time.
const BATCH: usize = 32;
/// The longest wait between attempts after failures.
const MOST_BACK_OFF: Duration = Duration::from_secs(30);
/// How long one delivery may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The client alerts are POSTed with, to `http://` or to `https://` whose
/// certificate chains to a public root (webpki-roots) or to one of the
/// roots given: hyper's, over rustls with the ring provider.
#[derive(Clone)]
pub struct WebhookClient {
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        http_body_util::Full<bytes::Bytes>,
    >,
}

impl WebhookClient {
    /// A client trusting the public roots and `roots`.
    ///
    /// # Errors
    ///
    /// A root that is not a CA certificate rustls can use.
    pub fn new(roots: &[rustls::pki_types::CertificateDer<'static>]) -> Result<Self, WebhookError> {
        let mut store = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for root in roots {
            store.add(root.clone()).map_err(WebhookError::Root)?;
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(WebhookError::Tls)?
            .with_root_certificates(store)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Ok(Self { client })
    }

    /// POSTs `alert` to `url` as JSON with its id as `Idempotency-Key`,
    /// within 10 s.
    ///
    /// # Errors
    ///
    /// No answer, or one that is not a 2xx ([`DeliveryError`]).
    pub async fn post(&self, url: &str, alert: &Alert) -> Result<(), DeliveryError> {
        let body = serde_json::to_vec(alert).map_err(DeliveryError::Write)?;
        let request = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &alert.id)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(DeliveryError::Url)?;
        match tokio::time::timeout(DELIVERY_TIMEOUT, self.client.request(request)).await {
            Ok(Ok(response)) if response.status().is_success() => Ok(()),
            Ok(Ok(response)) => Err(DeliveryError::Status(response.status())),
            Ok(Err(error)) => Err(DeliveryError::Unreachable(error)),
            Err(_) => Err(DeliveryError::Timeout),
        }
    }
}

/// Why an alert was not delivered (it is tried again).
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The alert could not be written as JSON.
    #[error("the alert could not be written: {0}")]
    Write(serde_json::Error),
    /// The webhook's URL does not make a request.
    #[error("the webhook URL: {0}")]
    Url(http::Error),
    /// The webhook answered, but not with a 2xx.
    #[error("the webhook answered {0}")]
    Status(http::StatusCode),
    /// The webhook could not be reached (its causes: `{:?}`).
    #[error("the webhook could not be reached: {0:?}")]
    Unreachable(hyper_util::client::legacy::Error),
    /// No answer in time.
    #[error("the webhook did not answer within {DELIVERY_TIMEOUT:?}")]
    Timeout,
    /// The outbox could not be read or acknowledged.
    #[error("the outbox could not be read: {0}")]
    Outbox(tollgate::Error),
}

/// Why no webhook client could be made ([`WebhookClient::new`]).
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A CA certificate given for the webhook cannot be used.
    #[error("a webhook CA certificate cannot be used: {0}")]
    Root(rustls::Error),
    /// The TLS settings were refused.
    #[error("the webhook's TLS settings: {0}")]
    Tls(rustls::Error),
}

/// What an alert names, carried with the crossing (in the outbox, as
/// JSON): sent with every decision of a limit that alerts, read for a
/// crossing. The rule's, made once per rule and shared by its decisions:
/// the domain and the descriptor are read back from the limit's key (its
/// subject holds them) — but for a subject kept under a hash, or one that
/// is not the descriptor's entries, whose label carries them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct AlertLabel<D = Vec<(String, String)>, S = String> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    domain: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    descriptor: Option<D>,
    rule: S,
    /// A fixed window's length, µs: the window starts that long before it
    /// resets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_us: Option<u64>,
}

/// Who and what crossed: a label with its domain and descriptor.
struct Named {
    domain: String,
    descriptor: Vec<(String, String)>,
    rule: String,
    window_us: Option<u64>,
}

impl AlertLabel {
    /// The label `text`, of the limit kept at `key` (a Redis key, or a
    /// subject's and the limit's name joined by U+001F); `None` when it
    /// does not read.
    fn named(text: &str, key: &str) -> Option<Named> {
        let label: Self = serde_json::from_str(text).ok()?;
        let (domain, descriptor) = if let (Some(domain), Some(descriptor)) = (label.domain, label.descriptor) {
            (domain, descriptor)
        } else {
            let mut parts = tollgate::subject_parts(subject_of(key))?.into_iter();
            let domain = parts.next()?;
            let parts: Vec<String> = parts.collect();
            let descriptor = parts
                .chunks_exact(2)
                .map(|pair| (pair[0].clone(), pair[1].clone()))
                .collect();
            (domain, descriptor)
        };
        Some(Named {
            domain,
            descriptor,
            rule: label.rule,
            window_us: label.window_us,
        })
    }
}

/// The subject of the limit kept at `key`: between the braces of a Redis
/// key (`prefix:{subject}:name`), or before U+001F.
fn subject_of(key: &str) -> &str {
    match (key.find('{'), key.rfind('}')) {
        (Some(open), Some(close)) if open < close => &key[open + 1..close],
        _ => key.split('\u{1f}').next().unwrap_or(key),
    }
}

/// The label of `rule`'s alerts, made once for the rule: its path (the stat
/// key) and, for a fixed window, the window's length.
pub(crate) fn rule_alert_label(rule: &Rule) -> Option<Arc<str>> {
    rule.alert_label
        .get_or_init(|| {
            let RuleLimit::Limited(limit) = &rule.limit else {
                return None;
            };
            if limit.alerts().is_empty() {
                return None;
            }
            let label: AlertLabel<(), &str> = AlertLabel {
                domain: None,
                descriptor: None,
                rule: &rule.path,
                window_us: window_us(rule.limit.fixed_window()),
            };
            serde_json::to_string(&label).ok().map(Arc::from)
        })
        .clone()
}

/// The label of an alert of `rule` for `descriptor` of `domain` whole, for
/// a limit whose key does not hold them.
pub(crate) fn full_alert_label(domain: &str, descriptor: &[(String, String)], rule: &Rule) -> Option<Arc<str>> {
    let label = AlertLabel {
        domain: Some(domain),
        descriptor: Some(descriptor),
        rule: rule.path.as_str(),
        window_us: window_us(rule.limit.fixed_window()),
    };
    serde_json::to_string(&label).ok().map(Arc::from)
}

fn window_us(window: Option<Duration>) -> Option<u64> {
    window.map(|window| u64::try_from(window.as_micros()).unwrap_or(u64::MAX))
}

/// One entry of an alert's descriptor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AlertEntry {
    /// The entry's key.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// An alert, as the webhook receives it (JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Alert {
    /// The crossing's id: the same for every delivery of one crossing (its
    /// key, window and threshold), sent as `Idempotency-Key`.
    pub id: String,
    /// The domain.
    pub domain: String,
    /// The descriptor's entries.
    pub descriptor: Vec<AlertEntry>,
    /// The rule (its stat key).
    pub rule: String,
    /// The threshold crossed, a percent of the limit.
    pub threshold: u8,
    /// Units used once crossed (at most the limit).
    pub used: u64,
    /// The limit.
    pub limit: u64,
    /// When the window began (RFC 3339; a fixed window's only).
    pub window_start: Option<String>,
    /// When the use resets (RFC 3339).
    pub resets_at: String,
    /// When it crossed (RFC 3339).
    pub at: String,
}

impl Alert {
    /// The alert of a crossing of `threshold` by the limit kept at `key`.
    fn new(label: &Named, key: &str, threshold: u8, (used, limit): (u64, u64), reset_at: u64, at: u64) -> Self {
        let mut digest = Sha256::new();
        digest.update(key.as_bytes());
        digest.update([0]);
        digest.update(reset_at.to_be_bytes());
        digest.update([threshold]);
        let id = digest.finalize()[..16]
            .iter()
            .fold(String::with_capacity(32), |mut id, byte| {
                let _ = write!(id, "{byte:02x}");
                id
            });
        Self {
            id,
            domain: label.domain.clone(),
            descriptor: label
                .descriptor
                .iter()
                .map(|(key, value)| AlertEntry {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            rule: label.rule.clone(),
            threshold,
            used,
            limit,
            window_start: label
                .window_us
                .map(|window| format_instant(reset_at.saturating_sub(window))),
            resets_at: format_instant(reset_at),
            at: format_instant(at),
        }
    }

    /// The alert an outbox entry holds (`None`: its label does not read).
    fn of_entry(entry: &OutboxEntry) -> Option<Self> {
        let label = AlertLabel::named(&entry.label, &entry.key)?;
        Some(Self::new(
            &label,
            &entry.key,
            entry.threshold,
            (entry.used, entry.limit),
            entry.reset_at.as_micros(),
            entry.at.as_micros(),
        ))
    }
}

/// The alerts this process holds to deliver (memory store, or decided
/// locally), and what wakes the deliverer.
#[derive(Debug, Default)]
pub(super) struct Alerts {
    queue: Mutex<VecDeque<Alert>>,
    wake: Notify,
    /// Alerts waiting, as the deliverer last counted them.
    waiting: AtomicU64,
}

impl Service {
    /// Notes the thresholds `outcome` crossed: `labels(i)` names row `i`'s
    /// limit, kept at `keys(i)`.
    pub(super) fn note_crossings<'a>(
        &self,
        outcome: &Outcome,
        labels: &dyn Fn(usize) -> Option<&'a str>,
        keys: &dyn Fn(usize) -> String,
    ) {
        let decided_at = outcome.decided_at.as_micros();
        // On Redis the deciding call wrote them into the outbox; decided
        // here (memory, or locally while Redis fails), this process keeps them.
        let keep = self.options.alert_webhook.is_some() && (outcome.path != Path::Store || self.outbox().is_none());
        for crossing in &outcome.crossed {
            let key = keys(crossing.index);
            let Some(label) = labels(crossing.index).and_then(|text| AlertLabel::named(text, &key)) else {
                continue;
            };
            self.metrics
                .alerts()
                .crossed(&label.domain, &label.rule, crossing.threshold);
            self.events.push(
                "alert",
                format!(
                    "{} reached {} % of rule {} in domain {}: {} of {}",
                    describe(&label.descriptor),
                    crossing.threshold,
                    label.rule,
                    label.domain,
                    crossing.used,
                    crossing.limit
                ),
            );
            if keep {
                let reset_at =
                    decided_at.saturating_add(u64::try_from(crossing.reset_after.as_micros()).unwrap_or(u64::MAX));
                let alert = Alert::new(
                    &label,
                    &key,
                    crossing.threshold,
                    (crossing.used, crossing.limit),
                    reset_at,
                    decided_at,
                );
                self.queue_alert(alert);
            }
        }
    }

    /// Alerts waiting to be delivered, as last counted.
    pub(super) fn alerts_waiting(&self) -> u64 {
        self.alerts.waiting.load(Ordering::Relaxed)
    }

    fn queue_alert(&self, alert: Alert) {
        let mut queue = self.alerts.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.len() == QUEUE_KEPT {
            queue.pop_front();
            self.metrics.alerts().dropped(1);
            tracing::warn!("alerts: the queue is full ({QUEUE_KEPT}); its oldest alert is dropped");
        }
        queue.push_back(alert);
        drop(queue);
        self.alerts.wake.notify_one();
    }

    /// The store's outbox, when it has one (Redis with a webhook).
    fn outbox(&self) -> Option<Outbox> {
        self.store().redis()?.outbox(GROUP)
    }

    /// Delivers alerts to the webhook until `stopped`: this process's
    /// queue, and the outbox's entries this replica is given, has left
    /// undelivered, or takes over from a replica idle for
    /// [`Options::alert_take_over`](super::Options::alert_take_over); each acknowledged once the webhook answers 2xx,
    /// retried with a back-off (up to 30 s apart) until then.
    pub async fn deliver_alerts(&self, mut stopped: watch::Receiver<bool>) {
        let Some(webhook) = self.options.alert_webhook.clone() else {
            return;
        };
        let client = match WebhookClient::new(&self.options.alert_webhook_roots) {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "alerts: no HTTP client; alerts are not delivered");
                return;
            }
        };
        let deliver = |alert: Alert| {
            let (client, webhook) = (client.clone(), webhook.clone());
            async move { client.post(&webhook, &alert).await }
        };
        let outbox = self.outbox();
        let consumer = self.top.replica().to_owned();
        let mut joined = false;
        let mut back_off = Duration::ZERO;
        loop {
            let wait = if back_off.is_zero() { POLL } else { back_off };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.alerts.wake.notified(), if back_off.is_zero() => {}
                _ = stopped.wait_for(|stop| *stop) => return,
            }
            let mut failed = None;
            // This process's queue, oldest first.
            loop {
                let next = self
                    .alerts
                    .queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pop_front();
                let Some(alert) = next else { break };
                if let Err(error) = deliver(alert.clone()).await {
                    self.alerts
                        .queue
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push_front(alert);
                    failed = Some(error);
                    break;
                }
                self.metrics.alerts().delivery("delivered");
            }
            let queued = self.alerts.queue.lock().unwrap_or_else(PoisonError::into_inner).len() as u64;
            let mut waiting = queued;
            if let (Some(outbox), None) = (&outbox, &failed) {
                if !joined {
                    joined = outbox.join().await.is_ok();
                }
                if joined {
                    match deliver_outbox(outbox, &consumer, &deliver, self).await {
                        Ok(()) => {}
                        Err(error) => failed = Some(error),
                    }
                    waiting += outbox.len().await.unwrap_or(0);
                }
            }
            self.metrics.alerts().outbox_length(waiting);
            self.alerts.waiting.store(waiting, Ordering::Relaxed);
            back_off = match failed {
                None => Duration::ZERO,
                Some(error) => {
                    self.metrics.alerts().delivery("failed");
                    let next = (back_off * 2).clamp(POLL, MOST_BACK_OFF);
                    tracing::warn!(%error, retry_in = ?next, "alerts: a delivery failed; it is retried");
                    next
                }
            };
        }
    }
}

/// Delivers the outbox's entries for `consumer`: those it left undelivered,
/// those it takes over, then new ones; stops at the first failure (the
/// entry stays pending, delivered again later).
async fn deliver_outbox<F, Fut>(
    outbox: &Outbox,
    consumer: &str,
    deliver: &F,
    service: &Service,
) -> Result<(), DeliveryError>
where
    F: Fn(Alert) -> Fut,
    Fut: std::future::Future<Output = Result<(), DeliveryError>>,
{
    let store_error = DeliveryError::Outbox;
    let take_over = service.options.alert_take_over;
    loop {
        let mut entries = outbox.pending(consumer, BATCH).await.map_err(store_error)?;
        if entries.is_empty() {
            entries = outbox.claim(consumer, take_over, BATCH).await.map_err(store_error)?;
        }
        if entries.is_empty() {
            entries = outbox.read(consumer, BATCH).await.map_err(store_error)?;
        }
        if entries.is_empty() {
            return Ok(());
        }
        for entry in entries {
            if let Some(alert) = Alert::of_entry(&entry) {
                deliver(alert).await?;
                service.metrics.alerts().delivery("delivered");
            } else {
                tracing::warn!(key = %entry.key, "alerts: an outbox entry without a readable label is dropped");
            }
            outbox.ack(&[entry.id]).await.map_err(store_error)?;
        }
    }
}

/// A descriptor as `key=value, …`.
fn describe(descriptor: &[(String, String)]) -> String {
    descriptor
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(", ")
}
