//! `/rlconfig`'s lines for RLQS: each bucket, what it matched, and each
//! Envoy's assigned rate.

use super::Quotas;
use crate::metrics::bucket_name;
use crate::service::{BucketMatch, Matched};

impl Quotas {
    /// The buckets Envoys report on, one line each (for `/rlconfig`): the
    /// domain and the bucket, what it matched, and each Envoy's assigned
    /// rate; nothing when no Envoy reports.
    pub fn describe(&self) -> String {
        let interval = self.settings.interval.as_secs_f64();
        let state = self.state();
        let mut lines: Vec<String> = state
            .buckets
            .iter()
            .map(|((domain, bucket), entry)| {
                let matched = match self.service.match_bucket(domain, bucket.clone()) {
                    Some(BucketMatch {
                        matched: Matched::Limited(_),
                        stat_key,
                    }) => format!("{domain}.{stat_key}"),
                    Some(BucketMatch {
                        matched: Matched::Unlimited,
                        ..
                    }) => "unlimited: allow all".to_owned(),
                    Some(BucketMatch {
                        matched: Matched::Blocked,
                        ..
                    }) => "blocked: deny all".to_owned(),
                    Some(BucketMatch {
                        matched: Matched::Nothing,
                        ..
                    })
                    | None => format!("no rule: {:?}", self.settings.unmatched),
                };
                let mut envoys: Vec<String> = entry
                    .envoys
                    .iter()
                    .map(|(id, share)| {
                        let peer = state.streams.get(id).map_or("?", |stream| stream.peer.as_str());
                        match share.current {
                            Some(current) => format!("{peer} {:.1}/s", current.per_interval as f64 / interval),
                            None => format!("{peer} -"),
                        }
                    })
                    .collect();
                envoys.sort();
                format!(
                    "rlqs {domain} {{{}}} -> {matched}: {}\n",
                    bucket_name(bucket),
                    envoys.join(", ")
                )
            })
            .collect();
        lines.sort();
        lines.concat()
    }
}
