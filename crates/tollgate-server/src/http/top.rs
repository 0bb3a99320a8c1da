//! `GET /v1/top?domain=D[&rule=R][&k=N]`: each rule's heaviest descriptors
//! over the last minute, by hits and by refusals, heaviest first, each with
//! bounds on its true count, merged over every replica on the store
//! (`{"domain": …, "rules": [ … ]}`). Behind the admin or the read-only
//! token.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::overrides::Admin;
use super::{error, service_error};
use crate::top::DEFAULT_K;

#[derive(Deserialize)]
pub(super) struct TopQuery {
    domain: Option<String>,
    rule: Option<String>,
    k: Option<usize>,
}

pub(super) async fn get(
    State(admin): State<Admin>,
    headers: HeaderMap,
    query: Result<Query<TopQuery>, QueryRejection>,
) -> Response {
    if let Some(refused) = admin.access.refuse_read(&headers, "the top API") {
        return refused;
    }
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return error(StatusCode::BAD_REQUEST, rejection.body_text()),
    };
    let Some(domain) = query.domain.filter(|domain| !domain.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "domain is required: ?domain=D[&rule=R][&k=N]");
    };
    match admin
        .service
        .top(&domain, query.rule.as_deref(), query.k.unwrap_or(DEFAULT_K))
        .await
    {
        Ok(rules) => axum::Json(json!({ "domain": domain, "rules": rules })).into_response(),
        Err(failure) => service_error(&failure),
    }
}
