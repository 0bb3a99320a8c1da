//! Rate limiting for tower and axum services (feature `tower`).
//!
//! [`RateLimitLayer`] decides each request in `call`, before the inner
//! service sees it, for the subject a [`KeyExtractor`] names: the peer's IP
//! address ([`PeerIp`]), a header ([`Header`]) or a closure ([`key_fn`]).
//!
//! - A refused request is answered `429 Too Many Requests` with the
//!   `RateLimit-Policy`, `RateLimit` and `Retry-After` headers and the
//!   decision as JSON (the same headers and body as `tollgate serve`, from
//!   [`crate::wire`]); the inner service never sees it.
//! - Shaping and borrowing limits (reservation, leaky bucket) queue instead
//!   of refusing: the request is granted a departure time and waits
//!   `Decision::wait` before it goes on (on the store's clock, so a
//!   [`ManualClock`](crate::ManualClock) makes tests instant). Only a full
//!   queue, or a wait beyond [`RateLimitLayer::max_wait`], refuses.
//! - A concurrency limit holds a lease while the inner service works on the
//!   request, given back when its response is ready (or when the request is
//!   dropped; its ttl ends it otherwise).
//! - Admitted responses carry `RateLimit-Policy` and `RateLimit` too.
//! - A request without a key is answered by the extractor's status (400
//!   for a missing header, 500 for a server that does not record peer
//!   addresses); a store fault (Redis down, a timeout) answers 503 with
//!   `{"error": …}`, or lets the request through after
//!   [`RateLimitLayer::fail_open`].
//!
//! `poll_ready` is the inner service's: the layer never holds capacity for
//! a request it has not seen.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//!
//! use axum::{routing::get, Router};
//! use tollgate::tower::{PeerIp, RateLimitLayer};
//! use tollgate::{Limit, Limiter};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::in_memory(Limit::gcra(5, Duration::from_secs(60), 5)?);
//! let app = Router::new()
//!     .route("/", get(|| async { "hello\n" }))
//!     .layer(RateLimitLayer::new(limiter, PeerIp));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // PeerIp reads the address axum records with `ConnectInfo`.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request as HttpRequest, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::decision::Outcome;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::request::{Op, Request};
use crate::store::{MemoryStore, Store};
use crate::subject::Subject;
use crate::wire::{rate_limit_headers, DecisionJson, HeaderLimit};

/// Why a request has no subject, and what to answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    status: StatusCode,
    message: String,
}

impl KeyError {
    /// Answer `status` with `{"error": message}`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// Answer `400 Bad Request` with `{"error": message}`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// The status the request is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KeyError {}

/// Names the subject a request is limited as.
///
/// It sees the request's head (method, URI, headers, extensions), not its
/// body.
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The subject of the request with head `parts`.
    ///
    /// # Errors
    ///
    /// When the request carries no key; the layer answers with the error's
    /// status and message, and the inner service never sees the request.
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyError>;
}

/// The peer's IP address (not its port: one client opens connections from
/// many ports).
///
/// Read from axum's `ConnectInfo<SocketAddr>` (serve the router with
/// `into_make_service_with_connect_info::<SocketAddr>()`), or from a plain
/// `SocketAddr` request extension that another server put there. Behind a
/// proxy this is the proxy's address: key on its forwarding header with
/// [`Header`] or [`key_fn`] instead. Each IPv6 address is its own subject;
/// to limit a client that holds a whole prefix, key on the prefix with
/// [`key_fn`].
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyError> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(address)| *address)
            .or_else(|| parts.extensions.get::<SocketAddr>().copied());
        match peer {
            Some(address) => Ok(Subject::new(address.ip())),
            None => Err(KeyError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the server does not record peer addresses (serve with into_make_service_with_connect_info::<SocketAddr>())",
            )),
        }
    }
}

/// The value of a request header (an API key, a tenant, a forwarded
/// address); a request without it is answered 400.
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl Header {
    /// Keys on header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self(name)
    }

    /// Keys on header `name`, a name known at compile time (`"x-api-key"`).
    ///
    /// # Panics
    ///
    /// When `name` is not a valid lowercase header name: a programming error.
    pub fn from_static(name: &'static str) -> Self {
        Self(HeaderName::from_static(name))
    }
}

impl KeyExtractor for Header {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyError> {
        parts
            .headers
            .get(&self.0)
            .map(|value| Subject::from_bytes(value.as_bytes()))
            .ok_or_else(|| KeyError::bad_request(format!("missing header {}", self.0)))
    }
}

/// A closure as a [`KeyExtractor`]; see [`key_fn`].
#[derive(Clone)]
pub struct KeyFn<F>(F);

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn")
    }
}

/// Keys on what `f` returns for the request's head; `None` answers 400.
///
/// ```
/// use tollgate::tower::key_fn;
/// use tollgate::Subject;
///
/// // Per tenant and route.
/// let key = key_fn(|parts: &axum::http::request::Parts| {
///     let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
///     Some(Subject::new(tenant).and(parts.uri.path()))
/// });
/// # let _ = key;
/// ```
pub fn key_fn<F>(f: F) -> KeyFn<F>
where
    F: Fn(&Parts) -> Option<Subject> + Clone + Send + Sync + 'static,
{
    KeyFn(f)
}

impl<F> KeyExtractor for KeyFn<F>
where
    F: Fn(&Parts) -> Option<Subject> + Clone + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyError> {
        (self.0)(parts).ok_or_else(|| KeyError::bad_request("the request has no rate limit key"))
    }
}

/// How the layer takes a request, fixed by the policy when it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Check every limit; refuse when any refuses.
    Check,
    /// Acquire: shaping limits queue (the request waits), concurrency limits
    /// hold a lease, the others check.
    Acquire,
}

/// A [`Layer`] that rate limits every request of the inner service.
///
/// Built over a [`Limiter`] (a policy over a store) and a [`KeyExtractor`];
/// cheap to clone.
#[derive(Debug, Clone)]
pub struct RateLimitLayer<K, S: Store = MemoryStore> {
    shared: Arc<Shared<K, S>>,
}

#[derive(Debug)]
struct Shared<K, S: Store> {
    limiter: Limiter<S>,
    key: K,
    mode: Mode,
    max_wait: Option<Duration>,
    /// A store fault lets the request through.
    fail_open: bool,
    /// Each limit's name and window, for `RateLimit-Policy`.
    limits: Vec<(String, Option<Duration>)>,
}

impl<K: KeyExtractor, S: Store> RateLimitLayer<K, S> {
    /// Limits each request with `limiter`, for the subject `key` names.
    ///
    /// A policy with a shaping limit (reservation, leaky bucket) delays
    /// requests by their `wait`, unbounded unless [`Self::max_wait`] says
    /// otherwise (the leaky bucket's capacity already bounds its queue).
    pub fn new(limiter: Limiter<S>, key: K) -> Self {
        let policy: &Policy = limiter.policy();
        let mode = if policy
            .limits()
            .any(|(_, limit)| limit.is_shaping() || limit.is_concurrency())
        {
            Mode::Acquire
        } else {
            Mode::Check
        };
        let limits = policy
            .limits()
            .map(|(name, limit)| (name.to_owned(), limit.window()))
            .collect();
        Self {
            shared: Arc::new(Shared {
                limiter,
                key,
                mode,
                max_wait: None,
                fail_open: false,
                limits,
            }),
        }
    }

    /// Shaping limits refuse (429) a request that would wait longer than
    /// `max_wait`, and book nothing for it.
    #[must_use]
    pub fn max_wait(self, max_wait: Duration) -> Self {
        let shared = Arc::unwrap_or_clone(self.shared);
        Self {
            shared: Arc::new(Shared {
                max_wait: Some(max_wait),
                ..shared
            }),
        }
    }

    /// A store fault (Redis down, a timeout) lets the request through,
    /// without rate limit headers, instead of answering 503: for services
    /// that prefer serving unlimited to not serving. Invalid requests (an
    /// operation the policy cannot run) still answer 500.
    #[must_use]
    pub fn fail_open(self) -> Self {
        let shared = Arc::unwrap_or_clone(self.shared);
        Self {
            shared: Arc::new(Shared {
                fail_open: true,
                ..shared
            }),
        }
    }
}

impl<K: Clone, S: Store> Clone for Shared<K, S> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            mode: self.mode,
            max_wait: self.max_wait,
            fail_open: self.fail_open,
            limits: self.limits.clone(),
        }
    }
}

impl<I, K: KeyExtractor, S: Store> Layer<I> for RateLimitLayer<K, S> {
    type Service = RateLimit<I, K, S>;

    fn layer(&self, inner: I) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an inner one.
#[derive(Debug)]
pub struct RateLimit<I, K, S: Store = MemoryStore> {
    inner: I,
    shared: Arc<Shared<K, S>>,
}

impl<I: Clone, K, S: Store> Clone for RateLimit<I, K, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The future of [`RateLimit`]'s `call`.
pub type ResponseFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'static>>;

impl<I, K, S, ReqBody, ResBody> Service<HttpRequest<ReqBody>> for RateLimit<I, K, S>
where
    I: Service<HttpRequest<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    K: KeyExtractor,
    S: Store,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = I::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest<ReqBody>) -> Self::Future {
        // The ready service takes this request; a clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let (parts, body) = request.into_parts();
        let subject = shared.key.extract(&parts);
        let request = HttpRequest::from_parts(parts, body);
        Box::pin(async move {
            let subject = match subject {
                Ok(subject) => subject,
                Err(failure) => return Ok(error_response(failure.status, &failure.message)),
            };
            let (outcome, lease) = match shared.decide(&subject).await {
                Ok(decided) => decided,
                Err(failure) if failure.is_invalid() => {
                    return Ok(error_response(StatusCode::INTERNAL_SERVER_ERROR, &failure.to_string()));
                }
                Err(_) if shared.fail_open => return inner.call(request).await,
                Err(failure) => return Ok(error_response(StatusCode::SERVICE_UNAVAILABLE, &failure.to_string())),
            };
            let headers = shared.headers(&outcome);
            if !outcome.decision.allowed {
                let body = match serde_json::to_string(&DecisionJson::from(&outcome.decision)) {
                    Ok(body) => body,
                    Err(error) => {
                        let message = format!("the decision could not be written: {error}");
                        return Ok(error_response(StatusCode::INTERNAL_SERVER_ERROR, &message));
                    }
                };
                let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, body);
                add_headers(&mut response, &headers);
                return Ok(response);
            }
            if !outcome.decision.wait.is_zero() {
                shared.limiter.store().sleep(outcome.decision.wait).await;
            }
            let response = inner.call(request).await;
            if let Some(lease) = lease {
                lease.release().await;
            }
            let mut response = response?;
            add_headers(&mut response, &headers);
            Ok(response)
        })
    }
}

impl<K, S: Store> Shared<K, S> {
    /// Decides one request of cost 1; the lease, when a concurrency limit
    /// granted one, is given back when the guard drops.
    async fn decide(&self, subject: &Subject) -> Result<(Outcome, Option<LeaseGuard<S>>), Error> {
        let op = match self.mode {
            Mode::Check => Op::Check,
            Mode::Acquire => Op::Acquire {
                lease: format!("{:016x}", fastrand::u64(..)),
                max_wait: self.max_wait,
            },
        };
        let outcome = self.limiter.decide(subject, &Request::new(op, 1)).await?;
        let lease = outcome.lease.clone().map(|lease| LeaseGuard {
            limiter: self.limiter.clone(),
            subject: subject.clone(),
            lease,
        });
        Ok((outcome, lease))
    }

    /// The RateLimit headers of `outcome`.
    fn headers(&self, outcome: &Outcome) -> Vec<(&'static str, String)> {
        let limits: Vec<HeaderLimit<'_>> = if outcome.limits.is_empty() {
            let (name, window) = &self.limits[0];
            vec![with_window(HeaderLimit::new(name, &outcome.decision), *window)]
        } else {
            outcome
                .limits
                .iter()
                .zip(&self.limits)
                .map(|((name, decision), (_, window))| with_window(HeaderLimit::new(name, decision), *window))
                .collect()
        };
        rate_limit_headers(&limits, !outcome.decision.allowed)
    }
}

fn with_window(limit: HeaderLimit<'_>, window: Option<Duration>) -> HeaderLimit<'_> {
    match window {
        Some(window) => limit.window(window),
        None => limit,
    }
}

/// A concurrency lease: given back when the response is ready, before the
/// client sees it, or in the background when the request is dropped on the
/// way.
struct LeaseGuard<S: Store> {
    limiter: Limiter<S>,
    subject: Subject,
    lease: String,
}

impl<S: Store> LeaseGuard<S> {
    /// Gives the lease back now (a store fault leaves it to its ttl).
    async fn release(mut self) {
        let lease = std::mem::take(&mut self.lease);
        let _ = self
            .limiter
            .decide(&self.subject, &Request::new(Op::Release { lease }, 0))
            .await;
    }
}

impl<S: Store> Drop for LeaseGuard<S> {
    fn drop(&mut self) {
        if self.lease.is_empty() {
            return;
        }
        // Without a runtime the lease's ttl ends it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let limiter = self.limiter.clone();
            let subject = self.subject.clone();
            let lease = std::mem::take(&mut self.lease);
            runtime.spawn(async move {
                let _ = limiter.decide(&subject, &Request::new(Op::Release { lease }, 0)).await;
            });
        }
    }
}

fn add_headers<B>(response: &mut Response<B>, headers: &[(&'static str, String)]) {
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(HeaderName::from_static(name), value);
        }
    }
}

fn json_response<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response<B: From<String>>(status: StatusCode, message: &str) -> Response<B> {
    json_response(status, serde_json::json!({ "error": message }).to_string())
}
