//! What an HTTP answer says about a decision: the IETF draft's
//! `RateLimit-Policy` and `RateLimit` headers, `Retry-After`, and the
//! decision as JSON.
//!
//! `tollgate serve` and the tower layer both answer through this module, so
//! a client sees the same headers and the same body from either. Headers come
//! as `(lowercase name, value)` pairs, so this module needs no HTTP crate;
//! durations in headers are whole seconds rounded up (a client told `0`
//! would retry at once), in JSON milliseconds with microsecond precision.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::wire::{rate_limit_headers, DecisionJson, HeaderLimit};
//! use tollgate::{Limit, Limiter, Subject};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let limiter = Limiter::in_memory(Limit::fixed_window(1, Duration::from_secs(60))?);
//! let subject = Subject::new("203.0.113.7");
//! limiter.check(&subject).await?;
//! let decision = limiter.check(&subject).await?;
//!
//! let limit = HeaderLimit::new("per_minute", &decision).window(Duration::from_secs(60));
//! let headers = rate_limit_headers(&[limit], !decision.allowed);
//! assert_eq!(headers[0], ("ratelimit-policy", "\"per_minute\";q=1;w=60".to_owned()));
//! assert_eq!(headers[1].0, "ratelimit");
//! assert_eq!(headers[2].0, "retry-after");
//!
//! let json = serde_json::to_value(DecisionJson::from(&decision)).unwrap();
//! assert_eq!(json["allowed"], false);
//! # Ok::<(), tollgate::Error>(())
//! # }).unwrap();
//! ```

use std::time::Duration;

use serde::Serialize;

use crate::decision::Decision;

/// One limit as the headers describe it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderLimit<'a> {
    /// The limit's name (the policy item of `RateLimit-Policy`).
    pub name: &'a str,
    /// The limit (`q`): units it admits.
    pub limit: u64,
    /// The window (`w`) the limit applies to, when it has one.
    pub window: Option<Duration>,
    /// Units left (`r`).
    pub remaining: u64,
    /// Until the limit frees units (`t`): when over, until this request would
    /// pass; otherwise until the limit is full again.
    pub reset: Duration,
    /// The limit refused the request.
    pub over: bool,
}

impl<'a> HeaderLimit<'a> {
    /// `name`'s limit as `decision` left it: `decision.limit` units, no
    /// window, `reset` the `retry_after` when denied (its `reset_after` when
    /// never admissible) and the `reset_after` when allowed.
    pub fn new(name: &'a str, decision: &Decision) -> Self {
        Self {
            name,
            limit: decision.limit,
            window: None,
            remaining: decision.remaining,
            reset: if decision.allowed {
                decision.reset_after
            } else {
                decision.retry_after.unwrap_or(decision.reset_after)
            },
            over: !decision.allowed,
        }
    }

    /// The same, with all fields given.
    pub fn from_parts(
        name: &'a str,
        limit: u64,
        window: Option<Duration>,
        remaining: u64,
        reset: Duration,
        over: bool,
    ) -> Self {
        Self {
            name,
            limit,
            window,
            remaining,
            reset,
            over,
        }
    }

    /// The same, with the window `w` the limit applies to.
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// The same, with another limit `q`.
    #[must_use]
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }
}

/// Whole seconds, rounded up (a client told 0 would retry at once).
pub fn seconds(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// `RateLimit-Policy` (every limit), `RateLimit` (the most restrictive: a
/// refusing one, else the one with the least remaining) and, when `denied`,
/// `Retry-After` (that limit's `reset`). No headers for no limits.
pub fn rate_limit_headers(limits: &[HeaderLimit<'_>], denied: bool) -> Vec<(&'static str, String)> {
    // The most restrictive limit, by the rule of `Restrictiveness`: a refusing
    // one first, the longest wait among those (an over limit's reset is its
    // retry_after), then the fewest remaining; the first of equals.
    let restrictiveness = |limit: &&HeaderLimit<'_>| {
        let wait = if limit.over { limit.reset } else { Duration::ZERO };
        (limit.over, wait, std::cmp::Reverse(limit.remaining))
    };
    let Some(tightest) = limits.iter().rev().max_by_key(restrictiveness) else {
        return Vec::new();
    };
    let policies: Vec<String> = limits
        .iter()
        .map(|limit| {
            let window = limit
                .window
                .map(|window| format!(";w={}", window.as_secs()))
                .unwrap_or_default();
            format!("\"{}\";q={}{window}", limit.name, limit.limit)
        })
        .collect();
    let mut headers = vec![
        ("ratelimit-policy", policies.join(", ")),
        (
            "ratelimit",
            format!(
                "\"{}\";r={};t={}",
                tightest.name,
                tightest.remaining,
                seconds(tightest.reset)
            ),
        ),
    ];
    if denied {
        headers.push(("retry-after", seconds(tightest.reset).to_string()));
    }
    headers
}

/// A decision as JSON: the fields of [`Decision`], durations in milliseconds
/// (`retry_after_ms` is `null` when the request can never be admitted).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionJson {
    /// See [`Decision::allowed`].
    pub allowed: bool,
    /// See [`Decision::limit`].
    pub limit: u64,
    /// See [`Decision::remaining`].
    pub remaining: u64,
    /// [`Decision::retry_after`] in milliseconds.
    pub retry_after_ms: Option<f64>,
    /// [`Decision::reset_after`] in milliseconds.
    pub reset_after_ms: f64,
    /// [`Decision::wait`] in milliseconds.
    pub wait_ms: f64,
}

/// Milliseconds, from whole microseconds (so 1.5 ms is 1.5).
fn ms(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1_000.0
}

impl From<&Decision> for DecisionJson {
    fn from(decision: &Decision) -> Self {
        Self {
            allowed: decision.allowed,
            limit: decision.limit,
            remaining: decision.remaining,
            retry_after_ms: decision.retry_after.map(ms),
            reset_after_ms: ms(decision.reset_after),
            wait_ms: ms(decision.wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusing_limit_sets_ratelimit_and_retry_after() {
        let limits = [
            HeaderLimit::from_parts(
                "per_second",
                10,
                Some(Duration::from_secs(1)),
                7,
                Duration::from_millis(300),
                false,
            ),
            HeaderLimit::from_parts("per_hour", 100, None, 0, Duration::from_millis(1_200), true),
        ];
        let headers = rate_limit_headers(&limits, true);
        assert_eq!(
            headers,
            vec![
                (
                    "ratelimit-policy",
                    "\"per_second\";q=10;w=1, \"per_hour\";q=100".to_owned()
                ),
                ("ratelimit", "\"per_hour\";r=0;t=2".to_owned()),
                ("retry-after", "2".to_owned()),
            ]
        );
    }

    #[test]
    fn allowed_names_the_least_remaining_and_no_retry_after() {
        let limits = [
            HeaderLimit::from_parts("a", 10, None, 7, Duration::from_millis(1), false),
            HeaderLimit::from_parts("b", 10, None, 3, Duration::ZERO, false),
        ];
        let headers = rate_limit_headers(&limits, false);
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[1], ("ratelimit", "\"b\";r=3;t=0".to_owned()));
        assert!(rate_limit_headers(&[], true).is_empty());
    }

    #[test]
    fn json_is_in_milliseconds_and_null_for_never() {
        let never = Decision::deny(5, 0, None, 1_500);
        let json = serde_json::to_string(&DecisionJson::from(&never)).unwrap();
        assert_eq!(
            json,
            r#"{"allowed":false,"limit":5,"remaining":0,"retry_after_ms":null,"reset_after_ms":1.5,"wait_ms":0.0}"#
        );
    }
}
