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
//! Every request must carry `Authorization: Bearer <token>`; without the
//! token, or with another, it is refused with 401. The token is compared
//! through SHA-256 digests in constant time, so neither its bytes nor its
//! length can be guessed from timings. Without a token configured the API is
//! off (404).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::{error, read_json, service_error};
use crate::overrides::{Entry, OverrideRequest, Stored};
use crate::service::Service;

/// The token that opens `/v1/overrides`, kept as its digest.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// The token `text` (surrounding white space dropped, as a file's
    /// trailing newline); `None` when it is empty.
    pub fn new(text: &str) -> Option<Self> {
        let text = text.trim();
        (!text.is_empty()).then(|| Self {
            digest: Sha256::digest(text.as_bytes()).into(),
        })
    }

    /// True when `headers` carry the token as `Authorization: Bearer`.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or("");
        let digest: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        bool::from(digest.ct_eq(&self.digest))
    }
}

/// What the override routes answer from.
#[derive(Clone)]
pub(super) struct Admin {
    pub(super) service: Arc<Service>,
    pub(super) token: Option<AdminToken>,
}

impl Admin {
    /// The refusal of a request the token does not open, if it is one.
    fn refuse(&self, headers: &HeaderMap) -> Option<Response> {
        match &self.token {
            None => Some(error(
                StatusCode::NOT_FOUND,
                "the overrides API is off: start serve with an admin token \
                 (--admin-token-file, or TOLLGATE_ADMIN_TOKEN)",
            )),
            Some(token) if !token.admits(headers) => {
                let mut response = error(
                    StatusCode::UNAUTHORIZED,
                    "an admin token is required: Authorization: Bearer <token>",
                );
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
                Some(response)
            }
            Some(_) => None,
        }
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
    if let Some(refused) = admin.refuse(&headers) {
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
