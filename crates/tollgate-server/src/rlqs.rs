//! Envoy's `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`:
//! the RLQS front end of [`Quotas`]. It only translates: reports in,
//! actions out, errors to a gRPC status that ends the stream.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as ProtoStrategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as ProtoAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction as ProtoBucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::grpc::status;
use crate::quota::{Action, Blanket, BucketAction, Quotas, Strategy, Usage};

/// The RLQS gRPC front end.
pub struct Rlqs {
    quotas: Arc<Quotas>,
}

impl Rlqs {
    /// A tonic service answering for `quotas`.
    pub fn server(quotas: Arc<Quotas>) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(Self { quotas })
    }
}

type Outgoing = Result<RateLimitQuotaResponse, Status>;

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = UnboundedReceiverStream<Outgoing>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_owned(), |address| address.to_string());
        let (id, mut actions) = self.quotas.open(peer).map_err(|error| status(&error))?;
        let mut reports = request.into_inner();
        let (outgoing, answers) = mpsc::unbounded_channel::<Outgoing>();
        let quotas = Arc::clone(&self.quotas);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    report = reports.message() => match report {
                        Ok(Some(report)) => {
                            let usages = report.bucket_quota_usages.into_iter().map(usage).collect();
                            if let Err(error) = quotas.report(id, &report.domain, usages).await {
                                tracing::warn!(%error, "rlqs: a stream is refused");
                                let _ = outgoing.send(Err(status(&error)));
                                break;
                            }
                        }
                        // The Envoy closed its side, or the stream broke.
                        Ok(None) | Err(_) => break,
                    },
                    sent = actions.recv() => match sent {
                        Some(actions) => {
                            if outgoing.send(Ok(response(actions))).is_err() {
                                break;
                            }
                        }
                        // The server is stopping: the stream ends.
                        None => break,
                    },
                }
            }
            quotas.close(id);
        });
        Ok(Response::new(UnboundedReceiverStream::new(answers)))
    }
}

fn usage(
    usage: envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage,
) -> Usage {
    Usage {
        bucket: usage
            .bucket_id
            .map(|id| id.bucket.into_iter().collect())
            .unwrap_or_default(),
        elapsed: usage.time_elapsed.and_then(|elapsed| {
            let seconds = u64::try_from(elapsed.seconds).ok()?;
            let nanos = u32::try_from(elapsed.nanos).ok()?;
            Some(Duration::new(seconds, nanos))
        }),
        allowed: usage.num_requests_allowed,
        denied: usage.num_requests_denied,
    }
}

fn response(actions: Vec<BucketAction>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: actions
            .into_iter()
            .map(|action| ProtoBucketAction {
                bucket_id: Some(BucketId {
                    bucket: action.bucket.into_iter().collect(),
                }),
                bucket_action: Some(match action.action {
                    Action::Abandon => ProtoAction::AbandonAction(AbandonAction {}),
                    Action::Assign { strategy, ttl } => ProtoAction::QuotaAssignmentAction(QuotaAssignmentAction {
                        assignment_time_to_live: Some(duration(ttl)),
                        rate_limit_strategy: Some(RateLimitStrategy {
                            strategy: Some(strategy_of(strategy)),
                        }),
                    }),
                }),
            })
            .collect(),
    }
}

fn strategy_of(strategy: Strategy) -> ProtoStrategy {
    match strategy {
        Strategy::Blanket(Blanket::AllowAll) => ProtoStrategy::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::Blanket(Blanket::DenyAll) => ProtoStrategy::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
        } => ProtoStrategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(UInt32Value { value: tokens_per_fill }),
            fill_interval: Some(duration(fill_interval)),
        }),
    }
}

fn duration(value: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(value.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(value.subsec_nanos()).unwrap_or(0),
    }
}
