//! Envoy's rate limit service, as its gRPC client sees it.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;

/// The OK code.
pub const OK: i32 = 1;
/// The OVER_LIMIT code.
pub const OVER_LIMIT: i32 = 2;

/// A descriptor of `entries`.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// `(code, limit_remaining, requests_per_unit)` of each status.
pub fn statuses(response: &RateLimitResponse) -> Vec<(i32, u32, Option<u32>)> {
    response
        .statuses
        .iter()
        .map(|status| {
            (
                status.code,
                status.limit_remaining,
                status.current_limit.as_ref().map(|limit| limit.requests_per_unit),
            )
        })
        .collect()
}
