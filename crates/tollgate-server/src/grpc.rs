//! Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{DescriptorStatus as ProtoStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::{Request, Response, Status};

use crate::service::seconds;
use crate::service::{CheckRequest, CheckResponse, Code, Descriptor, Failure, Service, ServiceError, Target};
use crate::unit::Unit;

/// The gRPC front end.
pub struct Grpc {
    service: Arc<Service>,
}

impl Grpc {
    /// A tonic service answering for `service`.
    pub fn server(service: Arc<Service>) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(Self { service })
    }
}

/// Reads a descriptor of the request.
///
/// # Errors
///
/// Negative hits and overrides with an unknown unit are refused.
pub(crate) fn descriptor(index: usize, descriptor: RateLimitDescriptor) -> Result<Descriptor, ServiceError> {
    if descriptor.is_negative_hits {
        return Err(ServiceError::invalid(format!(
            "descriptors[{index}].is_negative_hits is not supported"
        )));
    }
    let limit_override = match descriptor.limit {
        Some(limit) => {
            let unit = Unit::from_proto(limit.unit)
                .ok_or_else(|| ServiceError::invalid(format!("descriptors[{index}].limit.unit is unknown")))?;
            Some((u64::from(limit.requests_per_unit), unit))
        }
        None => None,
    };
    Ok(Descriptor {
        target: Target::Entries(
            descriptor
                .entries
                .into_iter()
                .map(|entry| (entry.key, entry.value))
                .collect(),
        ),
        cost: descriptor.hits_addend.map(|hits| hits.value),
        limit_override,
    })
}

/// A reset in whole seconds, rounded up ([`seconds`]).
fn duration(value: std::time::Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(seconds(value)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn code(code: Code) -> i32 {
    match code {
        Code::Ok => 1,
        Code::OverLimit => 2,
    }
}

fn response(answer: CheckResponse) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(answer.overall),
        statuses: answer
            .statuses
            .into_iter()
            .map(|status| ProtoStatus {
                code: code(status.code),
                current_limit: status.current_limit.map(|limit| RateLimit {
                    name: limit.name,
                    requests_per_unit: saturate(limit.requests_per_unit),
                    unit: limit.unit.map_or(0, Unit::proto),
                }),
                limit_remaining: saturate(status.limit_remaining),
                duration_until_reset: status.duration_until_reset.map(duration),
                ..ProtoStatus::default()
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                ..HeaderValue::default()
            })
            .collect(),
        dynamic_metadata: answer.dynamic_metadata.map(crate::protobuf_json::to_struct),
        ..RateLimitResponse::default()
    }
}

/// The gRPC status of `error`.
pub(crate) fn status(error: &ServiceError) -> Status {
    let message = error.to_string();
    match error.kind() {
        Failure::InvalidArgument => Status::invalid_argument(message),
        Failure::Unavailable => Status::unavailable(message),
        Failure::NotFound => Status::not_found(message),
        Failure::Conflict => Status::failed_precondition(message),
    }
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let descriptors = request
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(index, each)| descriptor(index, each))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| status(&error))?;
        let check = CheckRequest {
            domain: request.domain,
            descriptors,
            // Envoy's 0 means not set.
            cost: (request.hits_addend > 0).then(|| u64::from(request.hits_addend)),
        };
        let answer = self
            .service
            .should_rate_limit(&check)
            .await
            .map_err(|error| status(&error))?;
        Ok(Response::new(response(answer)))
    }
}
