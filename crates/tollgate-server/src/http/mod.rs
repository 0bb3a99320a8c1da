//! The HTTP front end (axum).
//!
//! - `POST /json`: Envoy's request and response in protobuf's JSON mapping,
//!   as envoyproxy/ratelimit offers it (429 when over the limit);
//! - `POST /v1/check`: Tollgate's own — descriptors, or a subject and a named
//!   rule, with a cost — answering a decision with `RateLimit` /
//!   `Retry-After` headers, 429 when denied;
//! - `POST /v1/estimate` (the body of `/v1/check`, its `cost` the estimate,
//!   and an optional `ttl`): answered as `/v1/check`, plus the
//!   `estimate` id when admitted; `POST /v1/settle` (`{"estimate":
//!   id, "actual": n}`): the limits after the unused part went back or the
//!   excess was recorded (404 for an unknown or expired id, 409 for one
//!   settled with another amount);
//! - `GET /metrics` (Prometheus), `GET /healthz`, `GET /v1/config`;
//! - `GET /healthcheck`: envoyproxy/ratelimit's (`OK`, or 500 when unhealthy);
//! - `GET /rlconfig`: envoyproxy/ratelimit's debug view of the loaded
//!   configuration, as text, with the overrides in force;
//! - `PUT`, `GET`, `DELETE /v1/overrides`: limits set per descriptor while
//!   running, behind an admin token (the `overrides` module);
//! - `POST /v1/usage`: the body of `/json`, answered with where each
//!   descriptor stands, consuming nothing (the `usage` module), behind the
//!   admin or the read-only token (the `access` module);
//! - `GET /v1/top?domain=D[&rule=R][&k=N]`: each rule's heaviest
//!   descriptors over the last minute, by hits and by refusals (the `top`
//!   module), behind the same tokens;
//! - `GET /console`: the console (the `console` module), on the APIs above,
//!   `GET /v1/overview`, the service at a glance, and `GET /v1/events`, what
//!   happened to it lately.
//!
//! Every route parses its body into the service's one request type and
//! calls [`Service::should_rate_limit`]. Bodies are capped at [`MAX_BODY`]
//! (413 above it); every malformed request is a 400 with `{"error": "…"}`,
//! and the server keeps serving.

mod access;
mod check;
mod console;
mod envoy;
mod overrides;
mod top;
mod usage;

use std::sync::Arc;

use axum::body::{Body, Bytes};

use axum::extract::{FromRef, State};

use axum::http::{header, HeaderName, HeaderValue, StatusCode};

use axum::response::{IntoResponse, Response};

use axum::routing::{get, post, put};

use axum::Router;

use serde_json::json;

pub use self::access::{Access, AdminToken};
use crate::quota::Quotas;
use crate::service::{Failure, Service, ServiceError};

/// The largest request body, in bytes.
pub const MAX_BODY: usize = 64 * 1024;

/// What the routes answer from: the service, and the quota service (RLQS)
/// whose buckets `/rlconfig` lists.
#[derive(Clone)]
struct Served {
    service: Arc<Service>,
    quotas: Arc<Quotas>,
}

impl FromRef<Served> for Arc<Service> {
    fn from_ref(served: &Served) -> Self {
        Arc::clone(&served.service)
    }
}

impl FromRef<Served> for Arc<Quotas> {
    fn from_ref(served: &Served) -> Self {
        Arc::clone(&served.quotas)
    }
}

/// The routes, over `service` (and `quotas`, for `/rlconfig`); the routes
/// behind a token open as `access` says (off without one).
pub fn router(service: Arc<Service>, quotas: Arc<Quotas>, access: Access) -> Router {
    let admin = overrides::Admin {
        service: Arc::clone(&service),
        access,
    };
    let overrides = Router::new()
        .route(
            "/v1/overrides",
            put(overrides::put).get(overrides::list).delete(overrides::delete),
        )
        .route("/v1/usage", post(usage::post).get(usage::get))
        .route("/v1/top", get(top::get))
        .route("/v1/overview", get(console::overview))
        .route("/v1/events", get(console::events))
        .route("/console", get(console::index))
        .route("/console/console.js", get(console::script))
        .route("/console/console.css", get(console::style))
        .with_state(admin);
    Router::new()
        .route("/json", post(envoy::envoy_json))
        .route("/v1/check", post(check::check))
        .route("/v1/estimate", post(check::estimate))
        .route("/v1/settle", post(check::settle))
        .route("/v1/config", get(config))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/healthcheck", get(healthcheck))
        .route("/rlconfig", get(rlconfig))
        .with_state(Served { service, quotas })
        .merge(overrides)
}

/// envoyproxy/ratelimit's debug listener (`DEBUG_HOST`, `DEBUG_PORT`):
/// `/rlconfig`, and the metrics at `/metrics`.
pub fn debug_router(service: Arc<Service>, quotas: Arc<Quotas>) -> Router {
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics))
        .with_state(Served { service, quotas })
}

/// The metrics alone, at `path`.
pub fn metrics_router(service: Arc<Service>, path: &str) -> Router {
    Router::new().route(path, get(metrics)).with_state(service)
}

pub(super) fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (status, axum::Json(json!({ "error": message.to_string() }))).into_response()
}

pub(super) fn service_error(failure: &ServiceError) -> Response {
    match failure.kind() {
        Failure::InvalidArgument => error(StatusCode::BAD_REQUEST, failure),
        Failure::Unavailable => error(StatusCode::SERVICE_UNAVAILABLE, failure),
        Failure::NotFound => error(StatusCode::NOT_FOUND, failure),
        Failure::Conflict => error(StatusCode::CONFLICT, failure),
    }
}

/// Reads the body as JSON of type `T`, naming the field at fault.
pub(super) async fn read_json<T: serde::de::DeserializeOwned>(body: Body) -> Result<T, Response> {
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

pub(super) fn with_headers(mut response: Response, headers: &[(&'static str, String)]) -> Response {
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(HeaderName::from_static(name), value);
        }
    }
    response
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

/// envoyproxy/ratelimit's `/rlconfig`: where the configuration came from
/// (a `# config:` line: the file, or the xDS server and version), every
/// loaded rule, one line each; then the quota service's buckets, each with what it matched and each
/// Envoy's share.
async fn rlconfig(State(service): State<Arc<Service>>, State(quotas): State<Arc<Quotas>>) -> Response {
    let source = service.config_source();
    let mut text = if source.is_empty() {
        String::new()
    } else {
        format!("# config: {source}\n")
    };
    if let Some(lasting) = service.lasting() {
        text.push_str(&lasting.describe());
    }
    text.push_str(&service.config().dump());
    text.push_str(&service.overrides().dump());
    text.push_str(&quotas.describe());
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn config(State(service): State<Arc<Service>>) -> Response {
    axum::Json(service.config().as_ref().clone()).into_response()
}

async fn metrics(State(service): State<Arc<Service>>) -> Response {
    // The engine may change while serving (a Redis that loses the module).
    if let Some(engine) = service.engine() {
        service.metrics().engine(engine);
    }
    if let tollgate::AnyStore::Regional(region) = service.store() {
        // The outbox's length is one call to the region's Redis; without
        // it the rest is still shown.
        let mut stats = region.stats().await;
        if let Ok(stats) = &mut stats {
            service.metrics().region().set(stats, &region.rule_stats());
        }
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
