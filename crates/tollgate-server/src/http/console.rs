//! The console: `/console`, pages an operator keeps open, built on the APIs
//! behind a token (`/v1/overview`, `/v1/usage`, `/v1/top`,
//! `/v1/overrides`). Its three files are compiled in (no network access,
//! nothing fetched by the page but this server's APIs), served with a
//! strict Content-Security-Policy (no inline script or style, no frames),
//! and the page sets every value from a request as text. Off (404) unless a
//! token is configured; the page asks for it and keeps it for the tab.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::access::Grant;
use super::error;
use super::overrides::Admin;

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// The policy every console file is served with.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                      img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn file(admin: &Admin, content_type: &'static str, body: &'static str) -> Response {
    if !admin.access.is_on() {
        return error(
            StatusCode::NOT_FOUND,
            "the console is off: start serve with an admin token (--admin-token-file) or a read-only \
             token (--read-token-file)",
        );
    }
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    let mut response = (StatusCode::OK, body).into_response();
    for (name, value) in headers {
        response.headers_mut().insert(name, HeaderValue::from_static(value));
    }
    response.headers_mut().insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

pub(super) async fn index(State(admin): State<Admin>) -> Response {
    file(&admin, "text/html; charset=utf-8", INDEX)
}

pub(super) async fn script(State(admin): State<Admin>) -> Response {
    file(&admin, "text/javascript; charset=utf-8", SCRIPT)
}

pub(super) async fn style(State(admin): State<Admin>) -> Response {
    file(&admin, "text/css; charset=utf-8", STYLE)
}

#[derive(serde::Deserialize)]
pub(super) struct EventsQuery {
    #[serde(default)]
    after: u64,
}

/// `GET /v1/events[?after=ID]`: the last events (configurations applied and
/// refused, overrides changed) after `ID`, newest first.
pub(super) async fn events(
    State(admin): State<Admin>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(refused) = admin.access.refuse_read(&headers, "the events") {
        return refused;
    }
    match query {
        Ok(axum::extract::Query(query)) => {
            axum::Json(json!({ "events": admin.service.events_after(query.after) })).into_response()
        }
        Err(rejection) => error(StatusCode::BAD_REQUEST, rejection.body_text()),
    }
}

/// `GET /v1/overview`: the service at a glance, and what the token opens
/// (`"access": "admin" | "read"`).
pub(super) async fn overview(State(admin): State<Admin>, headers: HeaderMap) -> Response {
    if let Some(refused) = admin.access.refuse_read(&headers, "the overview") {
        return refused;
    }
    let access = if admin.access.grant(&headers) == Grant::Admin {
        "admin"
    } else {
        "read"
    };
    let mut overview = json!(admin.service.overview());
    overview["access"] = json!(access);
    // Replicas that published their summaries lately (with the sketches on).
    overview["replicas"] = match admin.service.replicas_seen().await {
        Ok(seen) => json!(seen),
        Err(_) => serde_json::Value::Null,
    };
    axum::Json(overview).into_response()
}
