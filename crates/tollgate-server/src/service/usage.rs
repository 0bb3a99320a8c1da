//! Usage: where each descriptor of a request stands against what applies
//! to it, without consuming anything (`POST /v1/usage`, the console's
//! tenant page, `tollgate usage`).
//!
//! A usage request is matched as a check is (the same rules, overrides and
//! `replaces`), then every limit that applies is peeked in the store in one
//! spread call: a check of cost 0, which reads and never writes, on every
//! store and engine. Nothing is counted in the metrics.

use serde::Serialize;

use super::deciding::{set_decisions, Charge};
use super::matching::Matched;
use super::request::Descriptor;
use super::{answer::unix_now, CheckRequest, Service, ServiceError};

/// Where one descriptor stands.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Usage {
    /// The descriptor's entries, as asked.
    pub descriptor: Vec<UsageEntry>,
    /// The rule that applies (its path in the configuration), if any.
    pub rule: Option<String>,
    /// The rule's `name`, if it has one.
    pub name: Option<String>,
    /// envoyproxy/ratelimit's stat key (`domain.key_value…`).
    pub stat_key: Option<String>,
    /// An override set while running applies instead of the file's rule.
    #[serde(rename = "override")]
    pub overridden: bool,
    /// The rule decides and counts but never refuses.
    pub shadow_mode: bool,
    /// The rule never limits.
    pub unlimited: bool,
    /// The most unit-cost requests the limit admits at once (0: the rule
    /// refuses everything).
    pub limit: Option<u64>,
    /// The rule's unit (`second` … `year`), when it has one.
    pub unit: Option<&'static str>,
    /// The limit whole (its `algorithm` block), for rules with one.
    pub algorithm: Option<serde_json::Value>,
    /// What the limit holds as used now, at most `limit`.
    pub used: Option<u64>,
    /// Unit-cost requests that would still be admitted now.
    pub remaining: Option<u64>,
    /// Until the limit resets (a window's end; a bucket full again).
    pub reset_after_ms: Option<u64>,
    /// When it resets (RFC 3339, UTC).
    pub resets_at: Option<String>,
}

/// One entry of a descriptor.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UsageEntry {
    /// The entry's key.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// `micros` since the Unix epoch, in RFC 3339 (UTC, to the millisecond).
pub(crate) fn rfc3339(micros: u64) -> Option<String> {
    let micros = i64::try_from(micros).ok()?;
    let at = jiff::Timestamp::from_microsecond(micros).ok()?;
    Some(format!("{at:.3}"))
}

impl Service {
    /// Where each descriptor of `request` stands, in its order: peeks of
    /// every limit that applies (costs in the request are ignored).
    ///
    /// # Errors
    ///
    /// A malformed request ([`super::Failure::InvalidArgument`]), or a
    /// store fault ([`super::Failure::Unavailable`]).
    pub async fn usage(&self, request: &CheckRequest) -> Result<Vec<Usage>, ServiceError> {
        self.validate(request)?;
        let config = self.config.load();
        let domain = config.domains.get(&request.domain);
        let overrides = self.overrides.domain(&request.domain);
        let mut items = self.match_rules(request, domain, overrides.as_deref())?;
        for item in &mut items {
            item.cost = 0;
        }
        let limited: Vec<usize> = (0..items.len())
            .filter(|&index| items[index].limited().is_some())
            .collect();
        let mut decided_at = None;
        if !limited.is_empty() {
            let (decisions, at) = self
                .decide_together(&items, &limited, Charge::Peek)
                .await
                .map_err(ServiceError::from)?;
            set_decisions(&mut items, decisions);
            decided_at = Some(at);
        }
        let now = decided_at.unwrap_or_else(unix_now);
        let mut usage = Vec::with_capacity(items.len());
        for (descriptor, mut item) in request.descriptors.iter().zip(items) {
            self.answer(&request.domain, &mut item, now, false);
            let matched = !matches!(item.matched, Matched::Nothing);
            let rule = item.rule.filter(|_| matched);
            let (limit, used, remaining) = match (&item.matched, &item.status.decision) {
                (Matched::Limited(_), Some(decision)) => (
                    Some(decision.limit),
                    Some(decision.limit.saturating_sub(decision.remaining)),
                    Some(decision.remaining),
                ),
                (Matched::Blocked, _) => (Some(0), Some(0), Some(0)),
                _ => (None, None, None),
            };
            let reset = item.status.duration_until_reset.filter(|_| limit.is_some());
            let reset_micros = reset.map(|reset| u64::try_from(reset.as_micros()).unwrap_or(u64::MAX));
            usage.push(Usage {
                descriptor: descriptor
                    .entry_list()
                    .iter()
                    .map(|(key, value)| UsageEntry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                rule: item.status.rule.clone(),
                name: rule.and_then(|rule| rule.name.clone()),
                stat_key: matched.then(|| format!("{}.{}", request.domain, item.stat_key)),
                overridden: item.overridden,
                shadow_mode: item.shadow,
                unlimited: matches!(item.matched, Matched::Unlimited),
                limit,
                unit: rule.and_then(|rule| rule.unit).map(crate::unit::Unit::name),
                algorithm: item.limited().map(|limited| limited.limit.to_value()),
                used,
                remaining,
                reset_after_ms: reset.map(|reset| u64::try_from(reset.as_millis()).unwrap_or(u64::MAX)),
                resets_at: reset_micros.and_then(|micros| rfc3339(now.saturating_add(micros))),
            });
        }
        Ok(usage)
    }
}

/// A page of every limit that applies below a prefix ([`Service::usage_below`]).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UsagePage {
    /// The domain.
    pub domain: String,
    /// Where each descriptor of this page stands.
    pub usage: Vec<Usage>,
    /// Where the next page starts (`cursor=`), when there is one.
    pub cursor: Option<String>,
    /// Rules deeper down whose descriptors vary (any value, a wildcard):
    /// they apply to every value a request brings, so they are named here
    /// (a usage request for a value answers where it stands).
    pub varying: Vec<Varying>,
}

/// A rule below the prefix whose descriptors vary.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Varying {
    /// The rule's path.
    pub rule: String,
    /// The entries that lead to it: a value where it is fixed, none where
    /// any value (or a wildcard's match) applies.
    pub descriptor: Vec<VaryingEntry>,
}

/// One entry leading to a varying rule.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VaryingEntry {
    /// The entry's key.
    pub key: String,
    /// Its value, when fixed.
    pub value: Option<String>,
}

/// The most descriptors one page of [`Service::usage_below`] peeks.
pub const MAX_PAGE: usize = 1_000;

impl Service {
    /// Every limit that applies below `prefix` in `domain` (the prefix's
    /// own rule, then each deeper rule the configuration names whole), a
    /// page of at most `limit` from `cursor`, each peeked as
    /// [`Service::usage`] does: one store call per page, whatever the size
    /// of the store.
    ///
    /// # Errors
    ///
    /// An unknown domain, a bad cursor or limit
    /// ([`super::Failure::InvalidArgument`]); a store fault.
    pub async fn usage_below(
        &self,
        domain: &str,
        prefix: &[(String, String)],
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<UsagePage, ServiceError> {
        if limit == 0 || limit > MAX_PAGE {
            return Err(ServiceError::invalid(format!("limit must be from 1 to {MAX_PAGE}")));
        }
        if prefix.iter().any(|(key, _)| key.is_empty()) {
            return Err(ServiceError::invalid("an entry of the prefix has no key"));
        }
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .map_err(|_| ServiceError::invalid(format!("cursor: \"{cursor}\" is not a cursor this server gave")))?,
        };
        let config = self.config.load();
        let Some(configured) = config.domains.get(domain) else {
            return Err(ServiceError::invalid(format!("domain \"{domain}\" is not configured")));
        };
        let below = configured.below(prefix);
        drop(config);
        let end = below.exact.len().min(start.saturating_add(limit));
        let page: Vec<Descriptor> = below
            .exact
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .map(|entries| Descriptor::entries(entries.clone()))
            .collect();
        let usage = if page.is_empty() {
            Vec::new()
        } else {
            let request = CheckRequest {
                domain: domain.to_owned(),
                descriptors: page,
                cost: Some(0),
            };
            self.usage(&request).await?
        };
        Ok(UsagePage {
            domain: domain.to_owned(),
            usage,
            cursor: (end < below.exact.len()).then(|| end.to_string()),
            varying: below
                .varying
                .into_iter()
                .map(|(rule, path)| Varying {
                    rule,
                    descriptor: path
                        .into_iter()
                        .map(|(key, value)| VaryingEntry { key, value })
                        .collect(),
                })
                .collect(),
        })
    }
}
