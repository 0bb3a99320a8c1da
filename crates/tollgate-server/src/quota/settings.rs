//! What `serve` sets for RLQS, and the values the quota service and its
//! front end exchange: streams, buckets, usages and actions.

use std::time::Duration;

/// What `serve` does for RLQS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSettings {
    /// How often shares are split and assignments sent (1 s).
    pub interval: Duration,
    /// How long an assignment lives (3 intervals): how long an Envoy keeps
    /// its last rate once this server stops answering.
    pub ttl: Duration,
    /// A bucket an Envoy has neither reported nor sent requests into for
    /// this long is abandoned (60 s).
    pub abandon_after: Duration,
    /// What a bucket that matches no rule is assigned (allow all).
    pub unmatched: Blanket,
}

/// RLQS settings that cannot be used, naming the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuotaSettingsError {
    /// The reporting interval.
    #[error("rlqs interval must be a whole number of seconds, at least 1s")]
    Interval,
    /// The assignments' ttl.
    #[error("rlqs ttl must be a whole number of seconds, at least the interval")]
    Ttl,
    /// When a silent Envoy's share is taken back.
    #[error("rlqs abandon-after must be at least 10s (Envoy reports every 5 s)")]
    AbandonAfter,
}

impl QuotaSettings {
    /// Settings of these values.
    ///
    /// # Errors
    ///
    /// Naming the setting: an interval or ttl not in whole seconds (Envoy
    /// reads only those), an interval under one second, a ttl shorter than
    /// the interval, an abandon time shorter than Envoy's 5 s reports.
    pub fn new(
        interval: Duration,
        ttl: Duration,
        abandon_after: Duration,
        unmatched: Blanket,
    ) -> Result<Self, QuotaSettingsError> {
        if interval < Duration::from_secs(1) || interval.subsec_nanos() != 0 {
            return Err(QuotaSettingsError::Interval);
        }
        if ttl < interval || ttl.subsec_nanos() != 0 {
            return Err(QuotaSettingsError::Ttl);
        }
        if abandon_after < Duration::from_secs(10) {
            return Err(QuotaSettingsError::AbandonAfter);
        }
        Ok(Self {
            interval,
            ttl,
            abandon_after,
            unmatched,
        })
    }
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            ttl: Duration::from_secs(3),
            abandon_after: Duration::from_secs(60),
            unmatched: Blanket::AllowAll,
        }
    }
}

/// A blanket rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blanket {
    /// Every request passes.
    AllowAll,
    /// Every request is denied.
    DenyAll,
}

/// How an Envoy decides a bucket's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// All or nothing.
    Blanket(Blanket),
    /// A token bucket: at most `max_tokens`, gaining `tokens_per_fill`
    /// every `fill_interval` (whole seconds: Envoy reads only those).
    TokenBucket {
        /// Its capacity.
        max_tokens: u32,
        /// Tokens gained per `fill_interval`.
        tokens_per_fill: u32,
        /// The refill period, in whole seconds.
        fill_interval: Duration,
    },
}

/// What the server tells an Envoy about one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Decide with `strategy` for `ttl`.
    Assign {
        /// How to decide.
        strategy: Strategy,
        /// How long; zero expires the assignment at once.
        ttl: Duration,
    },
    /// Forget the bucket (and stop reporting it).
    Abandon,
}

impl Action {
    /// How the metrics name it: `token_bucket`, `allow_all`, `deny_all`,
    /// `expire` (an assignment of no time) or `abandon`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Abandon => "abandon",
            Self::Assign { ttl, .. } if ttl.is_zero() => "expire",
            Self::Assign {
                strategy: Strategy::TokenBucket { .. },
                ..
            } => "token_bucket",
            Self::Assign {
                strategy: Strategy::Blanket(Blanket::AllowAll),
                ..
            } => "allow_all",
            Self::Assign {
                strategy: Strategy::Blanket(Blanket::DenyAll),
                ..
            } => "deny_all",
        }
    }
}

/// A bucket's id: its entries in key order.
pub type BucketId = Vec<(String, String)>;

/// One action for one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAction {
    /// The bucket.
    pub bucket: BucketId,
    /// What to do.
    pub action: Action,
}

/// One bucket's usage in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The bucket's id, as sent.
    pub bucket: BucketId,
    /// The time since the previous report, if sent.
    pub elapsed: Option<Duration>,
    /// Requests the Envoy let through.
    pub allowed: u64,
    /// Requests it denied.
    pub denied: u64,
}

/// The most requests one report may say a bucket had: more is refused.
pub const MAX_REPORTED: u64 = 1 << 40;

/// The most buckets one stream may report on (and one report may carry):
/// the buckets past it are refused, so one Envoy cannot grow the server's
/// state without bound.
pub const MAX_BUCKETS_PER_STREAM: usize = 10_000;

/// An Envoy's stream, as the server knows it.
pub type StreamId = u64;
