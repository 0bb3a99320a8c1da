//! From a request to its descriptors' rules: validation, and one [`Item`]
//! per descriptor carrying what applies to it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use tollgate::{Decision, Limit, Subject};

use super::alerts::{full_alert_label, rule_alert_label};
use super::{CheckRequest, Descriptor, DescriptorStatus, Service, ServiceError, Target, MAX_COST, RULE};
use crate::config::{exact_stat_key, Domain, Rule, RuleLimit};
use crate::overrides::DomainOverrides;

/// One descriptor on its way through the service: what it matched, then
/// its decision and its status.
pub(super) struct Item<'a> {
    /// What it costs (0: a peek).
    pub(super) cost: u64,
    /// The configured rule that applied, if any (none for Envoy's override).
    pub(super) rule: Option<&'a Rule>,
    /// What applies to it.
    pub(super) matched: Matched,
    /// envoyproxy/ratelimit's stat key, without the domain.
    pub(super) stat_key: Cow<'a, str>,
    /// One of the request's alternatives ([`Rule::alternative`]).
    pub(super) alternative: bool,
    /// In shadow mode.
    pub(super) shadow: bool,
    /// An override set while running applies, not the file's rule.
    pub(super) overridden: bool,
    /// Its rule's metadata, for the dynamic metadata.
    pub(super) metadata: Option<&'a serde_json::Value>,
    /// The store's decision on its limit, once made.
    pub(super) decision: Option<Decision>,
    /// The answer, filled in as the request is decided.
    pub(super) status: DescriptorStatus,
}

/// What applies to a descriptor (of an RLS request, or an RLQS bucket's).
#[derive(Debug, Clone)]
pub(crate) enum Matched {
    /// No rule: OK, with nothing counted.
    Nothing,
    /// An unlimited rule: OK, with everything remaining.
    Unlimited,
    /// A rule of `requests_per_unit: 0`: over (but for a peek), consuming nothing.
    Blocked,
    /// A limit, decided in the store.
    Limited(Box<Limited>),
}

/// A limit kept in the store for a descriptor.
#[derive(Debug, Clone)]
pub(crate) struct Limited {
    pub(crate) limit: Limit,
    /// The descriptor: the domain and its entries.
    pub(crate) subject: Subject,
    /// The counter's name within the subject.
    pub(crate) name: String,
    /// A fixed window's length (its reset is the window's end).
    pub(crate) window: Option<Duration>,
    /// Who and what an alert of this limit names (when it alerts).
    pub(crate) alert: Option<std::sync::Arc<str>>,
}

impl Item<'_> {
    pub(super) fn limited(&self) -> Option<&Limited> {
        match &self.matched {
            Matched::Limited(limited) => Some(limited),
            _ => None,
        }
    }

    /// Decided in the store, and enforced (not in shadow mode).
    pub(super) fn is_enforced(&self) -> bool {
        self.limited().is_some() && !self.shadow
    }

    /// Over its limit, as far as the overall code is concerned.
    pub(super) fn is_over(&self) -> bool {
        match &self.matched {
            Matched::Blocked => self.cost > 0 && !self.shadow,
            Matched::Limited(_) => self.decision.as_ref().is_some_and(|decision| !decision.allowed),
            Matched::Nothing | Matched::Unlimited => false,
        }
    }
}

impl Service {
    pub(super) fn validate(&self, request: &CheckRequest) -> Result<(), ServiceError> {
        if request.domain.is_empty() {
            return Err(ServiceError::invalid("domain must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(ServiceError::invalid("descriptors must not be empty"));
        }
        let most = self.options.max_descriptors;
        if request.descriptors.len() > most {
            return Err(ServiceError::invalid(format!(
                "descriptors: {} given, at most {most} per request (MAX_DESCRIPTORS, --max-descriptors)",
                request.descriptors.len()
            )));
        }
        if request.default_cost() > MAX_COST {
            return Err(ServiceError::invalid(format!("hits_addend must be at most {MAX_COST}")));
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            match &descriptor.target {
                Target::Entries(entries) if entries.is_empty() => {
                    return Err(ServiceError::invalid(format!("descriptors[{index}] has no entries")));
                }
                Target::Entries(entries) if entries.iter().any(|(key, _)| key.is_empty()) => {
                    return Err(ServiceError::invalid(format!(
                        "descriptors[{index}] has an entry without a key"
                    )));
                }
                Target::Named { rule, .. } if rule.is_empty() => {
                    return Err(ServiceError::invalid("limit must not be empty"));
                }
                _ => {}
            }
            if descriptor.cost.is_some_and(|cost| cost > MAX_COST) {
                return Err(ServiceError::invalid(format!(
                    "descriptors[{index}].hits_addend must be at most {MAX_COST}"
                )));
            }
            if let Some((requests, _)) = descriptor.limit_override {
                if requests == 0 {
                    return Err(ServiceError::invalid(format!(
                        "descriptors[{index}].limit.requests_per_unit must be at least 1"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Finds what applies to each descriptor of `request`, and drops the
    /// rules that a matched rule `replaces`.
    ///
    /// An override of the domain ([`crate::overrides`]) for exactly a
    /// descriptor's entries takes the place of the rule they match, as a
    /// more specific rule of the file would: its counter is the one that
    /// rule would count in, so what was used carries over.
    pub(super) fn match_rules<'a>(
        &self,
        request: &'a CheckRequest,
        domain: Option<&'a Domain>,
        overrides: Option<&'a DomainOverrides>,
    ) -> Result<Vec<Item<'a>>, ServiceError> {
        let mut items = Vec::with_capacity(request.descriptors.len());
        let mut replacing: HashSet<&'a str> = HashSet::new();
        let cost = request.default_cost();
        for descriptor in &request.descriptors {
            let item = self.match_one(&request.domain, domain, overrides, descriptor, cost)?;
            if let Some(rule) = item.rule {
                replacing.extend(rule.replaces.iter().map(String::as_str));
            }
            items.push(item);
        }
        if !replacing.is_empty() {
            for item in &mut items {
                let replaced = item
                    .rule
                    .and_then(|rule| rule.name.as_deref())
                    .is_some_and(|name| replacing.contains(name));
                if replaced {
                    item.matched = Matched::Nothing;
                    item.metadata = None;
                    item.status.rule = None;
                }
            }
        }
        Ok(items)
    }

    /// What applies to the descriptor at `index`.
    fn match_one<'a>(
        &self,
        domain_name: &str,
        domain: Option<&'a Domain>,
        overrides: Option<&'a DomainOverrides>,
        descriptor: &'a Descriptor,
        cost: u64,
    ) -> Result<Item<'a>, ServiceError> {
        let mut item = Item {
            cost: descriptor.cost.unwrap_or(cost),
            rule: None,
            matched: Matched::Nothing,
            stat_key: Cow::Borrowed(""),
            alternative: false,
            shadow: false,
            overridden: false,
            metadata: None,
            decision: None,
            status: DescriptorStatus::unmatched(),
        };
        if let (Some((requests, unit)), Some(_)) = (descriptor.limit_override, domain) {
            // As envoyproxy/ratelimit: only in a known domain, never in
            // shadow mode, but an alternative with `QUOTA_MODE`.
            let limit = Limit::fixed_window(requests, unit.duration())
                .and_then(Limit::recording_overage)
                .map_err(ServiceError::from)?;
            let entries = descriptor.entry_list();
            let parts = entries.iter().flat_map(|(key, value)| [key.as_str(), value.as_str()]);
            item.matched = Matched::Limited(Box::new(Limited {
                limit,
                subject: Subject::from_parts(std::iter::once(domain_name).chain(parts)),
                name: format!("override.{requests}.{}", unit.name()),
                window: Some(unit.duration()),
                alert: None,
            }));
            item.stat_key = Cow::Owned(exact_stat_key(
                entries.iter().map(|(key, value)| (key.as_str(), value.as_str())),
            ));
            item.status.rule = Some("override".to_owned());
            item.alternative = self.options.all_alternatives;
            return Ok(item);
        }
        let (rule, subject, name, stat_key) = match &descriptor.target {
            Target::Entries(entries) => {
                let overridden = overrides.and_then(|overrides| overrides.get(entries, || self.overrides.now()));
                if let Some(found) = overridden {
                    // The descriptor's own subject, as the rule it replaces
                    // would count it (no share_threshold: it is one value).
                    let parts = entries.iter().flat_map(|(key, value)| [key.as_str(), value.as_str()]);
                    let subject = Subject::from_parts(std::iter::once(domain_name).chain(parts));
                    let rule = &found.rule;
                    item.overridden = true;
                    (rule, subject, RULE.to_owned(), Cow::Borrowed(rule.path.as_str()))
                } else {
                    let Some(found) = domain.and_then(|domain| domain.lookup(entries)) else {
                        return Ok(item);
                    };
                    let rule = found.rule;
                    if !matches!(rule.limit, RuleLimit::Unlimited) {
                        item.metadata = found.metadata;
                    }
                    // Subjects are injective encodings, hashed when long. A
                    // share_threshold wildcard puts its pattern in place of the
                    // value, so its matches share.
                    let parts = entries.iter().enumerate().flat_map(|(at, (key, value))| {
                        let value = found
                            .shared
                            .iter()
                            .find(|(shared, _)| *shared == at)
                            .map_or(value.as_str(), |(_, pattern)| *pattern);
                        [key.as_str(), value]
                    });
                    let subject = Subject::from_parts(std::iter::once(domain_name).chain(parts));
                    let stat_key = match found.stat_key {
                        Some(key) => Cow::Owned(key),
                        None => Cow::Borrowed(rule.path.as_str()),
                    };
                    (rule, subject, RULE.to_owned(), stat_key)
                }
            }
            Target::Named { subject, rule: named } => {
                let rule = domain.and_then(|domain| domain.named_rule(named)).ok_or_else(|| {
                    ServiceError::invalid(format!("domain \"{domain_name}\" has no limit named \"{named}\""))
                })?;
                let subject = Subject::new(domain_name).and(subject);
                let name = format!("named:{}", Subject::new(named).as_key());
                (rule, subject, name, Cow::Borrowed(rule.path.as_str()))
            }
        };
        item.rule = Some(rule);
        item.stat_key = stat_key;
        item.status.rule = Some(rule.path.clone());
        item.alternative = rule.alternative || self.options.all_alternatives;
        item.shadow = rule.shadow_mode;
        let alert = alert_of(domain_name, descriptor, rule, &subject);
        item.matched = match &rule.limit {
            RuleLimit::Limited(limit) => Matched::Limited(Box::new(Limited {
                limit: limit.clone(),
                subject,
                name,
                window: rule.limit.fixed_window(),
                alert,
            })),
            RuleLimit::Unlimited => Matched::Unlimited,
            RuleLimit::Blocked => Matched::Blocked,
        };
        Ok(item)
    }
}

/// What applies to an RLQS bucket: what an RLS request of one descriptor
/// of the bucket's entries matches ([`Service::match_bucket`]), and its
/// rule's stat key.
#[derive(Debug, Clone)]
pub(crate) struct BucketMatch {
    pub(crate) matched: Matched,
    pub(crate) stat_key: String,
}

impl Service {
    /// What an RLS request of one descriptor with `entries` (in key order)
    /// would match in `domain`, a rule in shadow mode read as unlimited (it
    /// never refuses); `None` when the domain is not configured or the
    /// entries are not a descriptor (none, or one without a key).
    pub(crate) fn match_bucket(&self, domain: &str, entries: Vec<(String, String)>) -> Option<BucketMatch> {
        let request = CheckRequest {
            domain: domain.to_owned(),
            descriptors: vec![Descriptor::entries(entries)],
            cost: None,
        };
        self.validate(&request).ok()?;
        let config = self.config.load();
        let overrides = self.overrides.domain(domain);
        let domain = config.domains.get(domain)?;
        let item = self
            .match_rules(&request, Some(domain), overrides.as_deref())
            .ok()?
            .pop()?;
        Some(BucketMatch {
            matched: if item.shadow { Matched::Unlimited } else { item.matched },
            stat_key: item.stat_key.into_owned(),
        })
    }
}

/// What an alert of `rule`'s limit names for `descriptor` of `domain`,
/// kept under `subject` (none when the limit does not alert): the rule's
/// label, shared, when the subject holds the domain and the entries.
fn alert_of(domain: &str, descriptor: &Descriptor, rule: &Rule, subject: &Subject) -> Option<std::sync::Arc<str>> {
    let label = rule_alert_label(rule)?;
    match &descriptor.target {
        Target::Entries(_) if !subject.as_key().starts_with('#') => Some(label),
        Target::Entries(entries) => full_alert_label(domain, entries, rule),
        Target::Named { subject, rule: named } => {
            let entries = [
                ("limit".to_owned(), named.clone()),
                ("subject".to_owned(), subject.clone()),
            ];
            full_alert_label(domain, &entries, rule)
        }
    }
}
