//! The tower layer in an axum server on a real listener (127.0.0.1:0), asked
//! by a real HTTP client. Time is a manual clock: the layer waits on the
//! store's clock, so a delayed request moves the clock instead of sleeping.

#[cfg(feature = "redis")]
use tollgate_testkit::redis_server;

#[path = "../examples/axum.rs"]
#[allow(dead_code)]
mod example;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use serde_json::Value;
use tokio::net::TcpListener;
use tollgate::tower::{key_fn, Header, PeerIp, RateLimitLayer};
use tollgate::{Clock, Limit, Limiter, ManualClock, MemoryStore, Subject, Timestamp};

/// A whole minute since the epoch, plus 15 s: a minute window ends in 45 s.
const START: Timestamp = Timestamp::from_micros(1_800_000_015_000_000);

fn limiter(limit: Limit) -> (Limiter<MemoryStore>, ManualClock) {
    let clock = ManualClock::new(START);
    (Limiter::new(MemoryStore::with_clock(clock.clone()), limit), clock)
}

/// A router whose one route counts its calls.
fn app(calls: &Arc<AtomicUsize>) -> Router {
    let calls = Arc::clone(calls);
    Router::new().route(
        "/",
        get(move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "ok"
        }),
    )
}

/// Serves `app` on 127.0.0.1:0 with peer addresses recorded; its address.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    address
}

/// A client from `local` that opens a new connection (a new port) for each request.
fn client_from(local: Ipv4Addr) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(local))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|value| value.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_refused_request_is_answered_429_with_headers_and_the_decision() {
    let (limiter, _clock) = limiter(Limit::fixed_window(2, Duration::from_secs(60)).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let address = serve(app(&calls).layer(RateLimitLayer::new(limiter, PeerIp))).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    let url = format!("http://{address}/");

    let first = client.get(&url).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some("\"fixed_window\";q=2;w=60")
    );
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some("\"fixed_window\";r=1;t=45")
    );
    assert_eq!(header(&first, "retry-after"), None);
    assert_eq!(first.text().await.unwrap(), "ok");
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);

    let refused = client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("45"));
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some("\"fixed_window\";r=0;t=45")
    );
    assert_eq!(
        header(&refused, "ratelimit-policy").as_deref(),
        Some("\"fixed_window\";q=2;w=60")
    );
    assert_eq!(header(&refused, "content-type").as_deref(), Some("application/json"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["allowed"], false);
    assert_eq!(body["limit"], 2);
    assert_eq!(body["remaining"], 0);
    assert_eq!(body["retry_after_ms"], 45_000.0);
    // The inner service never saw the refused request.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_policy_reports_every_limit_and_retries_after_the_refusing_one() {
    let policy = tollgate::Policy::new([
        ("per_minute", Limit::fixed_window(10, Duration::from_secs(60)).unwrap()),
        ("per_hour", Limit::gcra(1, Duration::from_secs(3600), 1).unwrap()),
    ])
    .unwrap();
    let clock = ManualClock::new(START);
    let limiter = Limiter::new(MemoryStore::with_clock(clock), policy);
    let calls = Arc::new(AtomicUsize::new(0));
    let address = serve(app(&calls).layer(RateLimitLayer::new(limiter, PeerIp))).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    let url = format!("http://{address}/");

    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    let refused = client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(
        header(&refused, "ratelimit-policy").as_deref(),
        Some("\"per_minute\";q=10;w=60, \"per_hour\";q=1")
    );
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some("\"per_hour\";r=0;t=3600")
    );
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("3600"));
}

#[tokio::test]
async fn shaping_limits_delay_the_request_by_its_wait_instead_of_refusing() {
    // One request per second leaves; up to 3 queued.
    let (limiter, clock) = limiter(Limit::leaky_bucket(1, Duration::from_secs(1), 3).unwrap());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler_clock = clock.clone();
    let handler_seen = Arc::clone(&seen);
    let app = Router::new()
        .route(
            "/",
            get(move || async move {
                handler_seen.lock().unwrap().push(handler_clock.now());
                "ok"
            }),
        )
        .layer(RateLimitLayer::new(limiter, PeerIp));
    let address = serve(app).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    let url = format!("http://{address}/");

    for _ in 0..3 {
        assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    }
    // The first went at once; each next one waited its turn at the outlet, a
    // second after the one before (the layer waited on the manual clock).
    let second = Duration::from_secs(1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![START, START.after(second), START.after(second * 2)]
    );
    assert_eq!(clock.now(), START.after(second * 2));
}

#[tokio::test]
async fn a_wait_beyond_max_wait_is_refused_and_books_nothing() {
    let (limiter, clock) = limiter(Limit::leaky_bucket(1, Duration::from_secs(1), 3).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter, PeerIp).max_wait(Duration::from_millis(500));
    let address = serve(app(&calls).layer(layer)).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    let url = format!("http://{address}/");

    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    let refused = client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("1"));
    assert_eq!(clock.now(), START, "a refused request does not wait");
    clock.advance(Duration::from_secs(1));
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_peer_key_is_the_client_ip_whatever_its_port() {
    let (limiter, _clock) = limiter(Limit::fixed_window(1, Duration::from_secs(60)).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let address = serve(app(&calls).layer(RateLimitLayer::new(limiter, PeerIp))).await;
    let url = format!("http://{address}/");
    let first = client_from(Ipv4Addr::LOCALHOST);
    let second = client_from(Ipv4Addr::new(127, 0, 0, 2));

    // Each request is a new connection from a new port: one key all the same.
    assert_eq!(first.get(&url).send().await.unwrap().status(), 200);
    assert_eq!(first.get(&url).send().await.unwrap().status(), 429);
    // Another address has its own limit.
    assert_eq!(second.get(&url).send().await.unwrap().status(), 200);
    assert_eq!(second.get(&url).send().await.unwrap().status(), 429);
}

#[tokio::test]
async fn without_connect_info_the_peer_key_answers_500() {
    let (limiter, _clock) = limiter(Limit::fixed_window(1, Duration::from_secs(60)).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(&calls).layer(RateLimitLayer::new(limiter, PeerIp));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let response = reqwest::get(format!("http://{address}/")).await.unwrap();
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("into_make_service_with_connect_info"),
        "{body}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_header_key_limits_each_value_and_refuses_requests_without_it() {
    let (limiter, _clock) = limiter(Limit::fixed_window(1, Duration::from_secs(60)).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(limiter, Header::from_static("x-api-key"));
    let address = serve(app(&calls).layer(layer)).await;
    let client = client_from(Ipv4Addr::LOCALHOST);
    let url = format!("http://{address}/");
    let ask = |key: &'static str| client.get(&url).header("x-api-key", key).send();

    assert_eq!(ask("alice").await.unwrap().status(), 200);
    assert_eq!(ask("alice").await.unwrap().status(), 429);
    assert_eq!(ask("bob").await.unwrap().status(), 200);
    let missing = client.get(&url).send().await.unwrap();
    assert_eq!(missing.status(), 400);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"], "missing header x-api-key");
}

#[tokio::test]
async fn a_closure_key_can_limit_each_route_apart() {
    let (limiter, _clock) = limiter(Limit::fixed_window(1, Duration::from_secs(60)).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let key = key_fn(|parts: &axum::http::request::Parts| Some(Subject::new(parts.uri.path())));
    let app = app(&calls)
        .route("/other", get(|| async { "other" }))
        .layer(RateLimitLayer::new(limiter, key));
    let address = serve(app).await;
    let client = client_from(Ipv4Addr::LOCALHOST);

    assert_eq!(
        client.get(format!("http://{address}/")).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        client.get(format!("http://{address}/")).send().await.unwrap().status(),
        429
    );
    assert_eq!(
        client
            .get(format!("http://{address}/other"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn a_concurrency_limit_holds_its_lease_while_the_inner_service_works() {
    let (limiter, _clock) = limiter(Limit::concurrency(1, Duration::from_secs(60)).unwrap());
    let (entered_tx, mut entered_rx) = tokio::sync::mpsc::channel::<()>(1);
    let gate = Arc::new(tokio::sync::Notify::new());
    let handler_gate = Arc::clone(&gate);
    let app = Router::new()
        .route(
            "/slow",
            get(move || async move {
                entered_tx.send(()).await.unwrap();
                handler_gate.notified().await;
                "slow"
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter, PeerIp));
    let address = serve(app).await;
    let client = client_from(Ipv4Addr::LOCALHOST);

    let slow = tokio::spawn(client.get(format!("http://{address}/slow")).send());
    entered_rx.recv().await.unwrap();
    // The slow request holds the only lease.
    assert_eq!(
        client.get(format!("http://{address}/")).send().await.unwrap().status(),
        429
    );
    gate.notify_one();
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);
    // Given back before the slow response left.
    assert_eq!(
        client.get(format!("http://{address}/")).send().await.unwrap().status(),
        200
    );
}

#[tokio::test]
async fn the_example_allows_5_requests_per_minute_per_client_address_on_every_route() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::with_clock(clock.clone());
    let address = serve(example::app(Limiter::new(store, example::limit().unwrap()))).await;
    let first = client_from(Ipv4Addr::LOCALHOST);
    let second = client_from(Ipv4Addr::new(127, 0, 0, 2));
    let ask = |client: &reqwest::Client, path: &str| client.get(format!("http://{address}{path}")).send();

    for path in ["/", "/hello/a", "/", "/hello/b", "/"] {
        assert_eq!(ask(&first, path).await.unwrap().status(), 200, "{path}");
    }
    let refused = ask(&first, "/hello/c").await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("60"));
    assert_eq!(ask(&second, "/").await.unwrap().status(), 200);
    // A minute later the five have left the window, and five more fit.
    clock.advance(Duration::from_secs(60));
    for _ in 0..5 {
        assert_eq!(ask(&first, "/").await.unwrap().status(), 200);
    }
    assert_eq!(ask(&first, "/").await.unwrap().status(), 429);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_store_fault_answers_503_or_lets_the_request_through_when_failing_open() {
    let mut redis = redis_server::RedisServer::start();
    let store = tollgate::RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    // A sliding log: no window boundary for the test to fall on.
    let limiter = Limiter::new(store, Limit::sliding_log(1, Duration::from_secs(3600)).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let closed = serve(app(&calls).layer(RateLimitLayer::new(limiter.clone(), PeerIp))).await;
    let open = serve(app(&calls).layer(RateLimitLayer::new(limiter, PeerIp).fail_open())).await;
    let client = client_from(Ipv4Addr::LOCALHOST);

    // With Redis up, both decide in Redis.
    assert_eq!(
        client.get(format!("http://{closed}/")).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        client.get(format!("http://{open}/")).send().await.unwrap().status(),
        429
    );
    redis.stop();
    let refused = client.get(format!("http://{closed}/")).send().await.unwrap();
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"].is_string(), "{body}");
    let through = client.get(format!("http://{open}/")).send().await.unwrap();
    assert_eq!(through.status(), 200);
    assert_eq!(header(&through, "ratelimit"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
