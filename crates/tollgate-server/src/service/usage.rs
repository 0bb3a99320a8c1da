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
use super::matching::{Limited, Matched};
use super::request::Descriptor;
use super::{answer::unix_now, CheckRequest, Service, ServiceError, RULE};
use tollgate::SubjectPattern;

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
    /// A global limit (`scope: global`) where this process is a region's
    /// (`--global-redis`): `used` and `remaining` are then home's, across
    /// every region, and this is the region's side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global: Option<GlobalUsage>,
}

/// A region's side of a global limit.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GlobalUsage {
    /// The region's name.
    pub region: String,
    /// Units the region's share holds for this descriptor now.
    pub share: u64,
    /// Until they lapse.
    pub share_lapses_in_ms: u64,
    /// Home answered (its `used` and `remaining` are shown); when it did
    /// not, they are the share's.
    pub home_reachable: bool,
    /// Reports recorded in the region and not yet counted at home.
    pub outbox: u64,
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
            let global = match item.limited() {
                Some(limited) if limited.limit.is_global() => self.global_usage(limited).await,
                _ => None,
            };
            let (used, remaining) = match &global {
                Some((_, Some(home))) => (Some(home.limit.saturating_sub(home.remaining)), Some(home.remaining)),
                _ => (used, remaining),
            };
            let global = global.map(|(region, _)| region);
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
                global,
            });
        }
        Ok(usage)
    }
}

impl Service {
    /// The region's side of the global limit `limited`, and home's
    /// decision on it (a peek; `None` when home does not answer); `None`
    /// when this process is no region's.
    async fn global_usage(&self, limited: &Limited) -> Option<(GlobalUsage, Option<tollgate::Decision>)> {
        let tollgate::AnyStore::Regional(region) = self.store() else {
            return None;
        };
        let policy = tollgate::Policy::new([(limited.name.as_str(), limited.limit.clone())]).ok()?;
        let share = region.share(&limited.subject, &policy).await.ok()?;
        let peek = tollgate::Request::new(tollgate::Op::CheckAtMost, 0);
        let home = tollgate::Store::decide(region.home(), &limited.subject, &policy, &peek)
            .await
            .ok();
        let stats = region.stats().await.ok();
        Some((
            GlobalUsage {
                region: region.region().to_owned(),
                share: share.units,
                share_lapses_in_ms: u64::try_from(share.lapses_in.as_millis()).unwrap_or(u64::MAX),
                home_reachable: home.is_some(),
                outbox: stats.map_or(0, |stats| stats.outbox),
            },
            home.map(|outcome| outcome.decision),
        ))
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

/// Store listings one page of [`Service::usage_below`] makes at most.
const LISTINGS_PER_PAGE: usize = 2;

/// Where a listing below a prefix stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cursor {
    /// At this row of the descriptors the configuration names whole.
    Exact(usize),
    /// At the `index`th varying rule, at this store cursor within it.
    Varying(usize, Option<String>),
}

impl Cursor {
    fn parse(cursor: Option<&str>) -> Result<Self, ServiceError> {
        let Some(text) = cursor else {
            return Ok(Self::Exact(0));
        };
        let parsed = if let Some(row) = text.strip_prefix('e') {
            row.parse().ok().map(Self::Exact)
        } else if let Some(rest) = text.strip_prefix('v') {
            let (index, store) = rest.split_once('~').unwrap_or((rest, ""));
            index
                .parse()
                .ok()
                .map(|index| Self::Varying(index, (!store.is_empty()).then(|| store.to_owned())))
        } else {
            None
        };
        parsed.ok_or_else(|| ServiceError::invalid(format!("cursor: \"{text}\" is not a cursor this server gave")))
    }

    fn text(&self) -> String {
        match self {
            Self::Exact(row) => format!("e{row}"),
            Self::Varying(index, store) => format!("v{index}~{}", store.as_deref().unwrap_or_default()),
        }
    }
}

impl Service {
    /// Every limit that applies below `prefix` in `domain`: the prefix's
    /// own rule and each deeper rule the configuration names whole, then,
    /// for each deeper rule whose values vary, the descriptors the store
    /// holds state for; a page of at most `limit` from `cursor`, each
    /// peeked as [`Service::usage`] does. A page costs one store call for
    /// the peek and at most two bounded store listings
    /// ([`tollgate::AnyStore::subjects`]), whatever the size of the store:
    /// a page may hold fewer than `limit`, even none, and still have a
    /// cursor.
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
        let mut at = Cursor::parse(cursor)?;
        let config = self.config.load();
        let Some(configured) = config.domains.get(domain) else {
            return Err(ServiceError::invalid(format!("domain \"{domain}\" is not configured")));
        };
        let below = configured.below(prefix);
        drop(config);
        let mut usage = Vec::new();
        if let Cursor::Exact(start) = at {
            let end = below.exact.len().min(start.saturating_add(limit));
            let page: Vec<Descriptor> = below
                .exact
                .get(start..end)
                .unwrap_or_default()
                .iter()
                .map(|entries| Descriptor::entries(entries.clone()))
                .collect();
            usage = self.peek(domain, page).await?;
            at = if end < below.exact.len() {
                Cursor::Exact(end)
            } else {
                Cursor::Varying(0, None)
            };
        }
        let mut listings = 0;
        while let Cursor::Varying(index, store_cursor) = &at {
            let Some((rule, path)) = below.varying.get(*index) else {
                break;
            };
            if usage.len() >= limit || listings == LISTINGS_PER_PAGE {
                break;
            }
            listings += 1;
            let pattern = SubjectPattern::new(
                std::iter::once(Some(domain)).chain(
                    path.iter()
                        .flat_map(|(key, value)| [Some(key.as_str()), value.as_deref()]),
                ),
            );
            let listed = self
                .store()
                .subjects(&pattern, RULE, store_cursor.as_deref(), limit - usage.len())
                .await
                .map_err(ServiceError::from)?;
            let descriptors = listed
                .subjects
                .into_iter()
                .map(|parts| {
                    let entries = parts[1..]
                        .chunks_exact(2)
                        .map(|pair| (pair[0].clone(), pair[1].clone()))
                        .collect();
                    Descriptor::entries(entries)
                })
                .collect();
            // A subject of the shape may be another rule's (one whose value
            // is fixed, or an override's): only the varying rule's are its.
            let peeked = self.peek(domain, descriptors).await?;
            usage.extend(
                peeked
                    .into_iter()
                    .filter(|row| row.rule.as_deref() == Some(rule.as_str())),
            );
            at = match listed.cursor {
                Some(next) => Cursor::Varying(*index, Some(next)),
                None => Cursor::Varying(index + 1, None),
            };
        }
        let over = matches!(at, Cursor::Varying(index, _) if index >= below.varying.len());
        Ok(UsagePage {
            domain: domain.to_owned(),
            usage,
            cursor: (!over).then(|| at.text()),
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

    /// Where each of `descriptors` stands (none: no call).
    async fn peek(&self, domain: &str, descriptors: Vec<Descriptor>) -> Result<Vec<Usage>, ServiceError> {
        if descriptors.is_empty() {
            return Ok(Vec::new());
        }
        let request = CheckRequest {
            domain: domain.to_owned(),
            descriptors,
            cost: Some(0),
        };
        self.usage(&request).await
    }
}
