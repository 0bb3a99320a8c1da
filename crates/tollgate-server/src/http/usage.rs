//! `/v1/usage`, consuming nothing, behind the admin or the read-only token:
//!
//! - `POST`: the body of `/json` (a domain and its descriptors), answered
//!   with where each descriptor stands — the rule or override that applies,
//!   its limit, what is used and remaining, when it resets — as
//!   `{"domain": …, "usage": [ … ]}`;
//! - `GET ?domain=D&k=v…[&limit=N][&cursor=C]`: every limit that applies
//!   below the prefix `k=v…` (query entries other than `domain`, `limit`
//!   and `cursor`, in their order), a page at a time (`limit`, default
//!   100), with the `cursor` of the next page and the rules whose
//!   descriptors vary below it (`varying`).

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::envoy::JsonRequest;
use super::overrides::Admin;
use super::{error, read_json, service_error};

/// A page's length unless `limit=` says otherwise.
const DEFAULT_PAGE: usize = 100;

pub(super) async fn post(State(admin): State<Admin>, headers: HeaderMap, body: Body) -> Response {
    if let Some(refused) = admin.access.refuse_read(&headers, "the usage API") {
        return refused;
    }
    let request: JsonRequest = match read_json(body).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    let answer = match request.into_check() {
        Ok(check) => admin.service.usage(&check).await.map(|usage| (check.domain, usage)),
        Err(failure) => Err(failure),
    };
    match answer {
        Ok((domain, usage)) => axum::Json(json!({ "domain": domain, "usage": usage })).into_response(),
        Err(failure) => service_error(&failure),
    }
}

pub(super) async fn get(State(admin): State<Admin>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    if let Some(refused) = admin.access.refuse_read(&headers, "the usage API") {
        return refused;
    }
    let (mut domain, mut limit, mut cursor, mut prefix) = (None, DEFAULT_PAGE, None, Vec::new());
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match name.as_ref() {
            "domain" => domain = Some(value.into_owned()),
            "limit" => match value.parse() {
                Ok(number) => limit = number,
                Err(_) => return error(StatusCode::BAD_REQUEST, format!("limit: \"{value}\" is not a number")),
            },
            "cursor" => cursor = Some(value.into_owned()),
            _ => prefix.push((name.into_owned(), value.into_owned())),
        }
    }
    let Some(domain) = domain.filter(|domain| !domain.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "domain is required: ?domain=D&key=value…");
    };
    match admin
        .service
        .usage_below(&domain, &prefix, cursor.as_deref(), limit)
        .await
    {
        Ok(page) => axum::Json(page).into_response(),
        Err(failure) => service_error(&failure),
    }
}
