//! `/v1/check`, `/v1/estimate` and `/v1/settle`: Tollgate's own JSON API.

use std::sync::Arc;

use axum::body::Body;

use axum::extract::State;

use axum::http::StatusCode;

use axum::response::{IntoResponse, Response};

use serde::{Deserialize, Serialize};

use tollgate::wire::DecisionJson;

use crate::service::{rate_limit_headers, CheckRequest, CheckResponse, Descriptor, Service, ServiceError, Target};

use super::envoy::{code_name, entries, JsonEntry};
use super::{error, read_json, service_error, with_headers};

// --- POST /v1/check: Tollgate's own. ----------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    domain: String,
    #[serde(default)]
    descriptors: Option<Vec<CheckDescriptor>>,
    /// A subject and the `name` of a rule of the domain, instead of descriptors.
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    limit: Option<String>,
    #[serde(default)]
    cost: Option<u64>,
    /// `/v1/estimate` only: how long the estimate waits for its
    /// settlement (`"10m"`).
    #[serde(default)]
    ttl: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckDescriptor {
    entries: Vec<JsonEntry>,
    #[serde(default)]
    cost: Option<u64>,
}

pub(super) async fn check(State(service): State<Arc<Service>>, body: Body) -> Response {
    let body: CheckBody = match read_json(body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let (request, named) = match body.into_check() {
        Ok(parsed) => parsed,
        Err(failure) => return service_error(&failure),
    };
    match service.should_rate_limit(&request).await {
        Ok(answer) => check_answer(&answer, named, None, false),
        Err(failure) => service_error(&failure),
    }
}

pub(super) async fn estimate(State(service): State<Arc<Service>>, body: Body) -> Response {
    let mut body: CheckBody = match read_json(body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let ttl = match body
        .ttl
        .take()
        .as_deref()
        .map(tollgate::duration::parse_duration)
        .transpose()
    {
        Ok(ttl) => ttl,
        Err(failure) => return error(StatusCode::BAD_REQUEST, format!("ttl: {failure}")),
    };
    let (request, named) = match body.into_check() {
        Ok(parsed) => parsed,
        Err(failure) => return service_error(&failure),
    };
    match service.estimate(&request, ttl).await {
        Ok(estimated) => {
            let estimate = estimated.id.map(|id| EstimateJson {
                id,
                ttl_ms: estimated.ttl.as_millis(),
            });
            check_answer(&estimated.response, named, estimate, false)
        }
        Err(failure) => service_error(&failure),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    estimate: String,
    actual: u64,
}

pub(super) async fn settle(State(service): State<Arc<Service>>, body: Body) -> Response {
    let body: SettleBody = match read_json(body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    match service.settle(&body.estimate, body.actual).await {
        // Settled (200): the request went through; the decision says
        // whether the limits admit more now.
        Ok(answer) => check_answer(&answer, false, None, true),
        Err(failure) => service_error(&failure),
    }
}

/// `/v1/check`'s answer (and `/v1/estimate`'s, with its `estimate`);
/// 429 when refused, unless `settled` (always 200).
fn check_answer(answer: &CheckResponse, named: bool, estimate: Option<EstimateJson>, settled: bool) -> Response {
    let overall = answer.overall;
    let decision = answer.decision();
    let headers = rate_limit_headers(&answer.statuses, overall);
    let status = if decision.allowed || settled {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let descriptors = (!named).then(|| {
        answer
            .statuses
            .iter()
            .map(|status| DescriptorJson {
                code: code_name(status.code),
                rule: status.rule.clone(),
                decision: status.decision.as_ref().map(DecisionJson::from),
            })
            .collect()
    });
    let json = CheckJson {
        decision: DecisionJson::from(&decision),
        descriptors,
        estimate,
    };
    with_headers((status, axum::Json(json)).into_response(), &headers)
}

impl CheckBody {
    /// The service's request, and whether it is the named form (answered
    /// without the per-descriptor list).
    fn into_check(self) -> Result<(CheckRequest, bool), ServiceError> {
        if self.ttl.is_some() {
            return Err(ServiceError::invalid(
                "ttl: only an estimate (/v1/estimate) has one".to_owned(),
            ));
        }
        let (descriptors, named) = match (self.descriptors, self.subject, self.limit) {
            (Some(descriptors), None, None) => {
                let descriptors = descriptors
                    .into_iter()
                    .map(|descriptor| Descriptor {
                        target: Target::Entries(entries(descriptor.entries)),
                        cost: descriptor.cost,
                        limit_override: None,
                    })
                    .collect();
                (descriptors, false)
            }
            (None, Some(subject), Some(limit)) => {
                let descriptor = Descriptor {
                    target: Target::Named { subject, rule: limit },
                    ..Descriptor::default()
                };
                (vec![descriptor], true)
            }
            _ => {
                return Err(ServiceError::invalid(
                    "give either descriptors, or a subject and the name of a limit".to_owned(),
                ))
            }
        };
        let request = CheckRequest {
            domain: self.domain,
            descriptors,
            // Here, unlike Envoy's hits_addend, a cost of 0 is a peek.
            cost: self.cost,
        };
        Ok((request, named))
    }
}

/// `/v1/check`'s answer: the request's decision, and each descriptor's.
#[derive(Serialize)]
struct CheckJson {
    #[serde(flatten)]
    decision: DecisionJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    descriptors: Option<Vec<DescriptorJson>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    estimate: Option<EstimateJson>,
}

/// An admitted estimate: its id, and how long it waits to be settled.
#[derive(Serialize)]
struct EstimateJson {
    id: String,
    ttl_ms: u128,
}

#[derive(Serialize)]
struct DescriptorJson {
    code: &'static str,
    rule: Option<String>,
    #[serde(flatten)]
    decision: Option<DecisionJson>,
}
