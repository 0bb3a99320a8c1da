//! `/json`: Envoy's `ShouldRateLimit` in its JSON form, answered as Envoy's
//! protocol does.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;

use axum::extract::State;

use axum::http::StatusCode;

use axum::response::{IntoResponse, Response};

use serde::{Deserialize, Serialize};

use crate::service::{seconds, CheckRequest, CheckResponse, Code, Descriptor, Service, ServiceError, Target};

use super::{read_json, service_error};
use crate::unit::Unit;

// --- POST /json: protobuf's JSON mapping of Envoy's messages. ---------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct JsonRequest {
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
pub(super) struct JsonEntry {
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
    pub(super) fn into_check(self) -> Result<CheckRequest, ServiceError> {
        let descriptors = self
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(index, descriptor)| {
                let limit_override = match descriptor.limit {
                    Some(limit) => {
                        let unit = Unit::parse(&limit.unit).ok_or_else(|| {
                            ServiceError::invalid(format!(
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
                    cost: descriptor.hits_addend,
                    limit_override,
                })
            })
            .collect::<Result<Vec<_>, ServiceError>>()?;
        Ok(CheckRequest {
            domain: self.domain,
            descriptors,
            // Envoy's 0 means not set.
            cost: (self.hits_addend > 0).then_some(self.hits_addend),
        })
    }
}

pub(super) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// A reset in protobuf's JSON mapping, in whole seconds rounded up
/// ([`seconds`]): `"3s"`.
fn proto_duration(duration: Duration) -> String {
    format!("{}s", seconds(duration))
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

pub(super) async fn envoy_json(State(service): State<Arc<Service>>, body: Body) -> Response {
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

pub(super) fn entries(entries: Vec<JsonEntry>) -> Vec<(String, String)> {
    entries.into_iter().map(|entry| (entry.key, entry.value)).collect()
}
