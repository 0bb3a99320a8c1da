//! The quota service (RLQS) through its real gRPC listener, with tonic's
//! generated client of Envoy's protocol: what each bucket is assigned, bad
//! input, and what a stopping server tells the Envoys. (Three real Envoys
//! sharing one limit: `tollgate-cli`'s `envoy` tests.)

mod common;

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tollgate::{AnyStore, MemoryStore};
use tollgate_server::quota::{Blanket, QuotaSettings};
use tollgate_server::{Config, Options, Server};

use common::{on_port_0, OnPort0};

const CONFIG: &str = r"
domain: rlqs
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 100}
    descriptors:
      - key: tenant
        value: internal
        rate_limit: {unlimited: true}
      - key: tenant
        value: banned
        rate_limit: {unit: second, requests_per_unit: 0}
";

struct Running {
    server: OnPort0,
    _dir: tempfile::TempDir,
}

async fn start(settings: QuotaSettings) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rlqs.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    let server = Server::new(
        Config::load(&file).unwrap(),
        Some(file),
        AnyStore::Memory(MemoryStore::new()),
        Options::default(),
    )
    .rlqs(settings);
    Running {
        server: on_port_0(server).await,
        _dir: dir,
    }
}

/// One Envoy's stream: reports go out, actions come in.
struct Stream {
    reports: mpsc::UnboundedSender<RateLimitQuotaUsageReports>,
    actions: tonic::Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    /// Reports `usages` in the domain `rlqs`.
    fn report(&self, usages: Vec<BucketQuotaUsage>) {
        self.reports.send(report("rlqs", usages)).unwrap();
    }
}

impl Running {
    async fn open(&self) -> Stream {
        let mut client = RateLimitQuotaServiceClient::connect(self.server.grpc_url())
            .await
            .unwrap();
        let (reports, outgoing) = mpsc::unbounded_channel();
        let actions = client
            .stream_rate_limit_quotas(UnboundedReceiverStream::new(outgoing))
            .await
            .unwrap()
            .into_inner();
        Stream { reports, actions }
    }

    /// The text at `path` of the HTTP listener.
    async fn text(&self, path: &str) -> String {
        self.server.text(path).await
    }

    /// Asserts that the text at `path` holds each of `lines`.
    async fn shows(&self, path: &str, lines: &[&str]) {
        let text = self.text(path).await;
        for line in lines {
            assert!(text.contains(line), "missing {line} in {path}:\n{text}");
        }
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect(),
    }
}

/// A usage of `bucket`: `allowed` requests over `seconds`.
fn usage(bucket: BucketId, allowed: u64, seconds: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(bucket),
        time_elapsed: Some(ProtoDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

/// What an action says: its bucket, and its strategy and time to live (in
/// seconds), or `None` for an abandon.
type Seen = (BucketId, Option<(Strategy, i64)>);

/// The next actions on `stream`, within 3 s (an interval and a half).
async fn next(stream: &mut Stream) -> Vec<Seen> {
    let response = tokio::time::timeout(Duration::from_secs(3), stream.actions.message())
        .await
        .expect("actions within 3 s")
        .expect("no error")
        .expect("the stream goes on");
    response
        .bucket_action
        .into_iter()
        .map(|action| {
            let seen = match action.bucket_action.unwrap() {
                BucketAction::QuotaAssignmentAction(assignment) => Some((
                    assignment.rate_limit_strategy.unwrap().strategy.unwrap(),
                    assignment.assignment_time_to_live.unwrap().seconds,
                )),
                BucketAction::AbandonAction(_) => None,
            };
            (action.bucket_id.unwrap(), seen)
        })
        .collect()
}

/// The strategy assigned to `id` by the next actions naming it.
async fn assigned(stream: &mut Stream, id: &BucketId) -> (Strategy, i64) {
    for _ in 0..5 {
        for (bucket, seen) in next(stream).await {
            if &bucket == id {
                return seen.expect("an assignment");
            }
        }
    }
    panic!("no assignment for {id:?}");
}

fn blanket(rule: BlanketRule) -> Strategy {
    Strategy::BlanketRule(rule as i32)
}

/// A bucket is assigned as soon as it is first reported (a token bucket of
/// its share of the rule's 100 a second, living 3 s), and again every
/// interval; rules that do not count are blanket rules.
#[tokio::test]
async fn buckets_are_assigned_at_once_and_every_interval() {
    let server = start(QuotaSettings::default()).await;
    let mut stream = server.open().await;
    let api = bucket(&[("name", "api")]);
    // Envoy's first report of a bucket: one request, no time elapsed.
    stream.report(vec![usage(api.clone(), 1, 0)]);
    let (strategy, ttl) = assigned(&mut stream, &api).await;
    assert_eq!(ttl, 3);
    let Strategy::TokenBucket(first) = strategy else {
        panic!("{strategy:?}")
    };
    assert!(first.max_tokens >= 1);
    assert_eq!(first.fill_interval.unwrap().seconds, 1);
    // The next interval: alone on the bucket, it gets the whole limit.
    let (next, _) = assigned(&mut stream, &api).await;
    assert!((85..=100).contains(&per_second(&next)), "{next:?}");

    let cases = [
        (
            bucket(&[("name", "api"), ("tenant", "internal")]),
            blanket(BlanketRule::AllowAll),
        ),
        (
            bucket(&[("tenant", "banned"), ("name", "api")]),
            blanket(BlanketRule::DenyAll),
        ),
        (bucket(&[("name", "other")]), blanket(BlanketRule::AllowAll)),
    ];
    for (id, expected) in cases {
        stream.report(vec![usage(id.clone(), 1, 0)]);
        assert_eq!(assigned(&mut stream, &id).await, (expected, 3), "{id:?}");
    }
    server
        .shows(
            "/rlconfig",
            &[
                "rlqs rlqs {name=api} -> rlqs.name_api: 127.0.0.1:",
                "rlqs rlqs {name=api,tenant=banned} -> blocked: deny all",
                "rlqs rlqs {name=other} -> no rule: AllowAll",
            ],
        )
        .await;
    server
        .shows(
            "/metrics",
            &[
                "tollgate_rlqs_streams 1",
                "tollgate_rlqs_buckets 4",
                r#"tollgate_rlqs_share{domain="rlqs",bucket="name=api,tenant=banned""#,
            ],
        )
        .await;
    server.stop().await;
}

/// With `unmatched: deny`, a bucket no rule matches is denied.
#[tokio::test]
async fn unmatched_buckets_get_the_configured_default() {
    let settings = QuotaSettings {
        unmatched: Blanket::DenyAll,
        ..QuotaSettings::default()
    };
    let server = start(settings).await;
    let mut stream = server.open().await;
    let other = bucket(&[("name", "other")]);
    stream.report(vec![usage(other.clone(), 1, 0)]);
    assert_eq!(assigned(&mut stream, &other).await, (blanket(BlanketRule::DenyAll), 3));
    server.stop().await;
}

/// A usage that cannot be read (an empty bucket id, counts no Envoy could
/// have) is skipped and counted; the stream's other buckets go on.
#[tokio::test]
async fn bad_usages_are_skipped_and_the_stream_goes_on() {
    let server = start(QuotaSettings::default()).await;
    let mut stream = server.open().await;
    let api = bucket(&[("name", "api")]);
    let usages = vec![
        usage(bucket(&[]), 1, 0),
        usage(bucket(&[("name", "huge")]), u64::MAX, 5),
        usage(api.clone(), 1, 0),
    ];
    stream.report(usages);
    assert!(matches!(
        assigned(&mut stream, &api).await,
        (Strategy::TokenBucket(_), 3)
    ));
    server
        .shows(
            "/metrics",
            &[
                r#"tollgate_rlqs_reports_rejected_total{reason="empty_bucket_id"} 1"#,
                r#"tollgate_rlqs_reports_rejected_total{reason="implausible_counts"} 1"#,
                "tollgate_rlqs_buckets 1",
            ],
        )
        .await;
    server.stop().await;
}

/// A stream in a domain no configuration has, or without one, ends with
/// INVALID_ARGUMENT naming it; the server goes on serving others.
#[tokio::test]
async fn an_unknown_domain_ends_its_stream() {
    let server = start(QuotaSettings::default()).await;
    for (domain, message) in [
        ("nowhere", "domain \"nowhere\" is not configured"),
        ("", "domain must be set"),
    ] {
        let mut stream = server.open().await;
        stream
            .reports
            .send(report(domain, vec![usage(bucket(&[("name", "api")]), 1, 0)]))
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(3), stream.actions.message())
            .await
            .expect("an answer within 3 s")
            .expect_err("the stream ends with a status");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(message), "{status:?}");
    }
    let mut stream = server.open().await;
    let api = bucket(&[("name", "api")]);
    stream.report(vec![usage(api.clone(), 1, 0)]);
    assert!(matches!(
        assigned(&mut stream, &api).await,
        (Strategy::TokenBucket(_), 3)
    ));
    server.stop().await;
}

/// A stopping server expires every assignment at once (a time to live of
/// zero: each Envoy falls back to its `expired_assignment_behavior` rather
/// than keep a rate no one renews), then ends the streams.
#[tokio::test]
async fn stopping_expires_every_assignment() {
    let server = start(QuotaSettings::default()).await;
    let mut stream = server.open().await;
    let api = bucket(&[("name", "api")]);
    let internal = bucket(&[("name", "api"), ("tenant", "internal")]);
    stream
        .reports
        .send(report(
            "rlqs",
            vec![usage(api.clone(), 1, 0), usage(internal.clone(), 1, 0)],
        ))
        .unwrap();
    assigned(&mut stream, &api).await;
    let stop = tokio::spawn(server.stop());
    let mut expired = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(3), stream.actions.message())
            .await
            .expect("an answer within 3 s");
        let Some(response) = message.expect("no error") else {
            break;
        };
        for action in response.bucket_action {
            if let Some(BucketAction::QuotaAssignmentAction(assignment)) = action.bucket_action {
                if assignment.assignment_time_to_live.unwrap().seconds == 0 {
                    expired.push(action.bucket_id.unwrap());
                }
            }
        }
    }
    expired.sort_by_key(|id| id.bucket.len());
    assert_eq!(expired, [api, internal]);
    stop.await.unwrap();
}

/// The per-second rate of a token bucket assignment (its refill; the
/// capacity comes once).
fn per_second(strategy: &Strategy) -> u64 {
    match strategy {
        Strategy::TokenBucket(bucket) => {
            u64::from(bucket.tokens_per_fill.unwrap().value)
                / u64::try_from(bucket.fill_interval.unwrap().seconds).unwrap()
        }
        other => panic!("{other:?}"),
    }
}

/// Two Envoys asking more than the limit each get half of it; once one
/// closes its stream, the other gets the whole limit at the next interval.
#[tokio::test]
async fn a_closed_stream_leaves_its_share_to_the_others() {
    let server = start(QuotaSettings::default()).await;
    let api = bucket(&[("name", "api")]);
    let (mut one, mut other) = (server.open().await, server.open().await);
    // Each asked 500 over the last 5 s: 100 a second, the whole limit.
    for stream in [&one, &other] {
        stream.report(vec![usage(api.clone(), 500, 5)]);
    }
    // Past the first assignments (each took what the interval had left).
    for _ in 0..2 {
        assigned(&mut one, &api).await;
        assigned(&mut other, &api).await;
    }
    let (shared, _) = assigned(&mut one, &api).await;
    assert!((40..=55).contains(&per_second(&shared)), "{shared:?}");
    drop(other);
    let mut alone = 0;
    for _ in 0..3 {
        alone = per_second(&assigned(&mut one, &api).await.0);
    }
    assert!((85..=100).contains(&alone), "{alone}");
    server.stop().await;
}

/// A bucket without requests for `abandon_after` is abandoned: the Envoy
/// is told to forget it, and it is no longer assigned.
#[tokio::test]
async fn a_quiet_bucket_is_abandoned() {
    // Shorter than `QuotaSettings::new` allows, for the test's sake.
    let settings = QuotaSettings {
        abandon_after: Duration::from_secs(2),
        ..QuotaSettings::default()
    };
    let server = start(settings).await;
    let mut stream = server.open().await;
    let api = bucket(&[("name", "api")]);
    stream.report(vec![usage(api.clone(), 1, 0)]);
    assigned(&mut stream, &api).await;
    let mut abandoned = false;
    for _ in 0..5 {
        if next(&mut stream).await.contains(&(api.clone(), None)) {
            abandoned = true;
            break;
        }
    }
    assert!(abandoned, "never abandoned");
    server
        .shows(
            "/metrics",
            &[
                r#"tollgate_rlqs_assignments_total{strategy="abandon"} 1"#,
                "tollgate_rlqs_buckets 0",
            ],
        )
        .await;
    server.stop().await;
}

/// One stream reports on at most 10 000 buckets: those past it are refused
/// and counted, the others assigned (in one answer).
#[tokio::test]
async fn a_stream_holds_at_most_ten_thousand_buckets() {
    let server = start(QuotaSettings::default()).await;
    let mut stream = server.open().await;
    let usages: Vec<BucketQuotaUsage> = (0..10_001)
        .map(|index| usage(bucket(&[("name", "api"), ("user", &index.to_string())]), 1, 0))
        .collect();
    stream.report(usages);
    assert_eq!(next(&mut stream).await.len(), 10_000);
    server
        .shows(
            "/metrics",
            &[
                r#"tollgate_rlqs_reports_rejected_total{reason="too_many_buckets"} 1"#,
                "tollgate_rlqs_buckets 10000",
            ],
        )
        .await;
    server.stop().await;
}
