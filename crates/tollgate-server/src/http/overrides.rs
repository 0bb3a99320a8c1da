//! `/v1/overrides`: per-descriptor limits changed while running, behind an
//! admin token.
//!
//! - `PUT` takes an [`OverrideRequest`] and answers `{"override": …,
//!   "previous": … | null}`;
//! - `GET ?domain=…` answers `{"overrides": […]}` (every domain without
//!   `domain`);
//! - `DELETE` takes `{"domain": …, "descriptor": […]}` and answers
//!   `{"deleted": …}`, or 404 when the descriptor had no override.
//!
//! Every request must carry the admin token (`Authorization: Bearer
//! <token>`, see [`Access`]); a `GET` may carry the read-only token
//! instead.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::access::Access;
use super::{error, read_json, service_error};
use crate::overrides::{Entry, OverrideRequest, Stored};
use crate::service::Service;

/// What the override routes answer from.
#[derive(Clone)]
pub(super) struct Admin {
    pub(super) service: Arc<Service>,
    pub(super) access: Access,
}

impl Admin {
    /// The refusal of a request the admin token does not open, if it is one.
    fn refuse(&self, headers: &HeaderMap) -> Option<Response> {
        self.access.refuse_change(headers, "the overrides API")
    }
}

fn listed(stored: Option<&Stored>) -> serde_json::Value {
    stored.map_or(serde_json::Value::Null, |stored| json!(stored))
}

pub(super) async fn put(State(admin): State<Admin>, headers: HeaderMap, body: Body) -> Response {
    if let Some(refused) = admin.refuse(&headers) {
        return refused;
    }
    let request: OverrideRequest = match read_json(body).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    match admin.service.set_override(request).await {
        Ok(changed) => axum::Json(json!({
            "override": listed(changed.current.as_ref().map(|found| &found.stored)),
            "previous": listed(changed.previous.as_ref().map(|found| &found.stored)),
        }))
        .into_response(),
        Err(failure) => service_error(&failure),
    }
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    domain: Option<String>,
}

pub(super) async fn list(State(admin): State<Admin>, headers: HeaderMap, Query(query): Query<ListQuery>) -> Response {
    if let Some(refused) = admin.access.refuse_read(&headers, "the overrides API") {
        return refused;
    }
    match admin.service.list_overrides(query.domain.as_deref()) {
        Ok(overrides) => axum::Json(json!({ "overrides": overrides })).into_response(),
        Err(failure) => service_error(&failure),
    }
}

/// The body of `DELETE /v1/overrides`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteRequest {
    domain: String,
    descriptor: Vec<Entry>,
}

pub(super) async fn delete(State(admin): State<Admin>, headers: HeaderMap, body: Body) -> Response {
    if let Some(refused) = admin.refuse(&headers) {
        return refused;
    }
    let request: DeleteRequest = match read_json(body).await {
        Ok(request) => request,
        Err(response) => return response,
    };
    match admin
        .service
        .delete_override(&request.domain, &request.descriptor)
        .await
    {
        Ok(changed) => match changed.previous {
            Some(previous) => axum::Json(json!({ "deleted": previous.stored })).into_response(),
            None => error(StatusCode::NOT_FOUND, "descriptor: no override is set for it"),
        },
        Err(failure) => service_error(&failure),
    }
}
