//! The HTTP front end (axum).
//!
//! - `POST /json`: Envoy's request and response in protobuf's JSON mapping,
//!   as envoyproxy/ratelimit offers it (429 when over the limit);
//! - `POST /v1/check`: Tollgate's own — descriptors, or a subject and a named
//!   rule, with a cost — answering a decision with `RateLimit` /
//!   `Retry-After` headers, 429 when denied;
//! - `POST /v1/reserve` (the body of `/v1/check`, its `cost` the estimate,
//!   and an optional `ttl`): answered as `/v1/check`, plus the
//!   `reservation` id when admitted; `POST /v1/settle` (`{"reservation":
//!   id, "actual": n}`): the limits after the unused part went back or the
//!   excess was recorded (404 for an unknown or expired id, 409 for one
//!   settled with another amount);
//! - `GET /metrics` (Prometheus), `GET /healthz`, `GET /v1/config`;
//! - `GET /healthcheck`: envoyproxy/ratelimit's (`OK`, or 500 when unhealthy);
//! - `GET /rlconfig`: envoyproxy/ratelimit's debug view of the loaded
//!   configuration, as text.
//!
//! Every route parses its body into the service's one request type and
//! calls [`Service::should_rate_limit`]. Bodies are capped at [`MAX_BODY`]
//! (413 above it); every malformed request is a 400 with `{"error": "…"}`,
//! and the server keeps serving.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tollgate::wire::DecisionJson;
use tollgate::{Decision, Restrictiveness};

use crate::service::{
    rate_limit_headers, restrictiveness, CheckRequest, CheckResponse, Code, Descriptor, DescriptorStatus, Service,
    ServiceError, Target,
};
use crate::unit::Unit;

/// The largest request body, in bytes.
pub const MAX_BODY: usize = 64 * 1024;

/// The routes, over `service`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/json", post(envoy_json))
        .route("/v1/check", post(check))
        .route("/v1/reserve", post(reserve))
        .route("/v1/settle", post(settle))
        .route("/v1/config", get(config))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/healthcheck", get(healthcheck))
        .route("/rlconfig", get(rlconfig))
        .with_state(service)
}

/// envoyproxy/ratelimit's debug listener (`DEBUG_HOST`, `DEBUG_PORT`):
/// `/rlconfig`, and the metrics at `/metrics`.
pub fn debug_router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics))
        .with_state(service)
}

/// The metrics alone, at `path`.
pub fn metrics_router(service: Arc<Service>, path: &str) -> Router {
    Router::new().route(path, get(metrics)).with_state(service)
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (status, axum::Json(json!({ "error": message.to_string() }))).into_response()
}

fn service_error(failure: &ServiceError) -> Response {
    match failure {
        ServiceError::InvalidArgument(message) => error(StatusCode::BAD_REQUEST, message),
        ServiceError::Unavailable(message) => error(StatusCode::SERVICE_UNAVAILABLE, message),
        ServiceError::NotFound(message) => error(StatusCode::NOT_FOUND, message),
        ServiceError::Conflict(message) => error(StatusCode::CONFLICT, message),
    }
}

/// Reads the body as JSON of type `T`, naming the field at fault.
async fn read_json<T: serde::de::DeserializeOwned>(body: Body) -> Result<T, Response> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body must be at most {MAX_BODY} bytes"),
        )
    })?;
    if let Ok(value) = serde_json::from_slice(&bytes) {
        return Ok(value);
    }
    // Read again, tracking the path, to name the field at fault.
    let mut reader = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize::<_, T>(&mut reader).map_err(|failure| {
        let path = failure.path().to_string();
        let message = failure.inner().to_string().replace('`', "\"");
        if path == "." {
            error(StatusCode::BAD_REQUEST, format!("invalid JSON: {message}"))
        } else {
            error(StatusCode::BAD_REQUEST, format!("invalid JSON at {path}: {message}"))
        }
    })
}

fn with_headers(mut response: Response, headers: &[(&'static str, String)]) -> Response {
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(HeaderName::from_static(name), value);
        }
    }
    response
}

// --- POST /json: protobuf's JSON mapping of Envoy's messages. ---------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", deserialize_with = "proto_u64")]
    hits_addend: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", deserialize_with = "proto_u64_option")]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonOverride {
    #[serde(alias = "requests_per_unit")]
    requests_per_unit: u64,
    unit: String,
}

/// protobuf's JSON mapping writes 64-bit integers as strings; accept both.
fn proto_u64<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Number(u64),
        Text(String),
    }
    match Number::deserialize(deserializer)? {
        Number::Number(number) => Ok(number),
        Number::Text(text) => text
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("\"{text}\" is not a non-negative integer"))),
    }
}

fn proto_u64_option<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    proto_u64(deserializer).map(Some)
}

impl JsonRequest {
    fn into_check(self) -> Result<CheckRequest, ServiceError> {
        let descriptors = self
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(index, descriptor)| {
                let limit_override = match descriptor.limit {
                    Some(limit) => {
                        let unit = Unit::parse(&limit.unit).ok_or_else(|| {
                            ServiceError::InvalidArgument(format!(
                                "descriptors[{index}].limit.unit: {}",
                                Unit::unknown(&limit.unit)
                            ))
                        })?;
                        Some((limit.requests_per_unit, unit))
                    }
                    None => None,
                };
                Ok(Descriptor {
                    target: Target::Entries(entries(descriptor.entries)),
                    hits_addend: descriptor.hits_addend,
                    limit_override,
                })
            })
            .collect::<Result<Vec<_>, ServiceError>>()?;
        Ok(CheckRequest {
            domain: self.domain,
            descriptors,
            // Envoy's 0 means 1.
            hits: self.hits_addend.max(1),
            hits_addend: self.hits_addend,
        })
    }
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// A duration in protobuf's JSON mapping: `"1.500s"`.
fn proto_duration(duration: Duration) -> String {
    let nanos = duration.subsec_nanos();
    if nanos == 0 {
        format!("{}s", duration.as_secs())
    } else {
        let fraction = format!("{nanos:09}");
        format!("{}.{}s", duration.as_secs(), fraction.trim_end_matches('0'))
    }
}

/// Envoy's response in protobuf's JSON mapping (default values left out).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvoyResponseJson<'a> {
    overall_code: &'static str,
    statuses: Vec<EnvoyStatusJson<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<HeaderJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvoyStatusJson<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<CurrentLimitJson<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CurrentLimitJson<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    requests_per_unit: u64,
    unit: &'static str,
}

#[derive(Serialize)]
struct HeaderJson<'a> {
    key: &'a str,
    value: &'a str,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn envoy_response_json(answer: &CheckResponse) -> EnvoyResponseJson<'_> {
    let max = u64::from(u32::MAX);
    EnvoyResponseJson {
        overall_code: code_name(answer.overall),
        statuses: answer
            .statuses
            .iter()
            .map(|status| EnvoyStatusJson {
                code: code_name(status.code),
                current_limit: status.current_limit.as_ref().map(|limit| CurrentLimitJson {
                    name: &limit.name,
                    requests_per_unit: limit.requests_per_unit.min(max),
                    unit: limit.unit.map_or("UNKNOWN", Unit::name),
                }),
                limit_remaining: status.limit_remaining.min(max),
                duration_until_reset: status.duration_until_reset.map(proto_duration),
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .iter()
            .map(|(key, value)| HeaderJson { key, value })
            .collect(),
        dynamic_metadata: answer.dynamic_metadata.as_ref(),
    }
}

async fn envoy_json(State(service): State<Arc<Service>>, body: Body) -> Response {
    let request: JsonRequest = match read_json(body).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    let answer = match request.into_check() {
        Ok(check) => service.should_rate_limit(&check).await,
        Err(failure) => Err(failure),
    };
    match answer {
        Ok(answer) => {
            let status = if answer.overall == Code::OverLimit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(envoy_response_json(&answer))).into_response()
        }
        Err(failure) => service_error(&failure),
    }
}

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
    /// `/v1/reserve` only: how long the reservation waits for its
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

async fn check(State(service): State<Arc<Service>>, body: Body) -> Response {
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

async fn reserve(State(service): State<Arc<Service>>, body: Body) -> Response {
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
    match service.reserve(&request, ttl).await {
        Ok(reserved) => {
            let reservation = reserved.id.map(|id| ReservationJson {
                id,
                ttl_ms: reserved.ttl.as_millis(),
            });
            check_answer(&reserved.response, named, reservation, false)
        }
        Err(failure) => service_error(&failure),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    reservation: String,
    actual: u64,
}

async fn settle(State(service): State<Arc<Service>>, body: Body) -> Response {
    let body: SettleBody = match read_json(body).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    match service.settle(&body.reservation, body.actual).await {
        // Settled (200): the request went through; the decision says
        // whether the limits admit more now.
        Ok(answer) => check_answer(&answer, false, None, true),
        Err(failure) => service_error(&failure),
    }
}

/// `/v1/check`'s answer (and `/v1/reserve`'s, with its `reservation`);
/// 429 when refused, unless `settled` (always 200).
fn check_answer(answer: &CheckResponse, named: bool, reservation: Option<ReservationJson>, settled: bool) -> Response {
    // The request's decision: the most restrictive descriptor's (the
    // denying one with the longest retry_after, else the one with the
    // fewest remaining).
    let limited: Vec<&DescriptorStatus> = answer
        .statuses
        .iter()
        .filter(|status| status.decision.is_some())
        .collect();
    let chosen =
        Restrictiveness::most(limited.iter().map(|status| restrictiveness(status))).map(|index| limited[index]);
    let overall = answer.overall;
    let mut decision = match chosen {
        // Refused, but not by a limit with a decision: by a blocking rule,
        // never admissible.
        Some(status) if overall == Code::OverLimit && status.code != Code::OverLimit => blocked(),
        Some(status) => status.decision.clone().unwrap_or_else(Decision::unlimited),
        None if overall == Code::OverLimit => blocked(),
        None => Decision::unlimited(),
    };
    decision.allowed = overall == Code::Ok;
    if decision.allowed {
        // Admitted past a limit that does not refuse (shadow or quota mode).
        decision.retry_after = Some(std::time::Duration::ZERO);
    }
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
        reservation,
    };
    with_headers((status, axum::Json(json)).into_response(), &headers)
}

impl CheckBody {
    /// The service's request, and whether it is the named form (answered
    /// without the per-descriptor list).
    fn into_check(self) -> Result<(CheckRequest, bool), ServiceError> {
        if self.ttl.is_some() {
            return Err(ServiceError::InvalidArgument(
                "ttl: only a reservation (/v1/reserve) has one".to_owned(),
            ));
        }
        // Here, unlike Envoy's hits_addend, a cost of 0 is a peek.
        let hits = self.cost.unwrap_or(1);
        let (descriptors, named) = match (self.descriptors, self.subject, self.limit) {
            (Some(descriptors), None, None) => {
                let descriptors = descriptors
                    .into_iter()
                    .map(|descriptor| Descriptor {
                        target: Target::Entries(entries(descriptor.entries)),
                        hits_addend: descriptor.cost,
                        limit_override: None,
                    })
                    .collect();
                (descriptors, false)
            }
            (None, Some(subject), Some(limit)) => {
                let descriptor = Descriptor {
                    target: Target::Named { subject, limit },
                    ..Descriptor::default()
                };
                (vec![descriptor], true)
            }
            _ => {
                return Err(ServiceError::InvalidArgument(
                    "give either descriptors, or a subject and the name of a limit".to_owned(),
                ))
            }
        };
        let request = CheckRequest {
            domain: self.domain,
            descriptors,
            hits,
            hits_addend: 0,
        };
        Ok((request, named))
    }
}

/// The decision of a request a blocking rule refuses: never admissible.
fn blocked() -> Decision {
    let mut decision = Decision::unlimited();
    decision.allowed = false;
    decision.limit = 0;
    decision.remaining = 0;
    decision.retry_after = None;
    decision
}

/// `/v1/check`'s answer: the request's decision, and each descriptor's.
#[derive(Serialize)]
struct CheckJson {
    #[serde(flatten)]
    decision: DecisionJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    descriptors: Option<Vec<DescriptorJson>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<ReservationJson>,
}

/// An admitted reservation: its id, and how long it waits to be settled.
#[derive(Serialize)]
struct ReservationJson {
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

fn entries(entries: Vec<JsonEntry>) -> Vec<(String, String)> {
    entries.into_iter().map(|entry| (entry.key, entry.value)).collect()
}

// --- The rest. ----------------------------------------------------------------

/// envoyproxy/ratelimit's health check: `OK` while healthy, 500 otherwise
/// (shutting down, or no configuration with
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
async fn healthcheck(State(service): State<Arc<Service>>) -> Response {
    if *service.health().borrow() {
        (StatusCode::OK, "OK").into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

/// `/healthz`: `ok`, or 503 while unhealthy: shutting down, no domain
/// loaded with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, or the store not
/// answering with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`.
async fn healthz(State(service): State<Arc<Service>>) -> Response {
    if *service.health().borrow() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy\n").into_response()
    }
}

/// envoyproxy/ratelimit's `/rlconfig`: every loaded rule, one line each.
async fn rlconfig(State(service): State<Arc<Service>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        service.config().dump(),
    )
        .into_response()
}

async fn config(State(service): State<Arc<Service>>) -> Response {
    axum::Json(service.config().as_ref().clone()).into_response()
}

async fn metrics(State(service): State<Arc<Service>>) -> Response {
    // The engine may change while serving (a Redis that loses the module).
    if let Some(engine) = service.engine() {
        service.metrics().engine(engine);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        service.metrics().encode(),
    )
        .into_response()
}
