//! An axum service that allows each client address 5 requests per minute on
//! every route; the sixth within a minute is answered 429 with `RateLimit`
//! and `Retry-After` headers.
//!
//! ```sh
//! cargo run -p tollgate --features tower --example axum -- 127.0.0.1:3000
//! for i in 1 2 3 4 5 6; do curl -si 127.0.0.1:3000/ | head -1; done
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use tollgate::tower::{PeerIp, RateLimitLayer};
use tollgate::{Limit, Limiter, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args()
        .nth(1)
        .ok_or("usage: axum LISTEN_ADDRESS (for example 127.0.0.1:3000)")?;
    let app = app(Limiter::in_memory(limit()?));

    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // PeerIp reads the client's address, which axum records this way.
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}

/// 5 requests per minute. A sliding log: never more than 5 in any 60
/// seconds, not even across the boundary of two clock minutes; a refused
/// client may retry when its oldest request of the last minute is a minute old.
pub fn limit() -> Result<Limit, tollgate::Error> {
    Limit::sliding_log(5, Duration::from_secs(60))
}

/// Every route, limited per client address by `limiter`.
pub fn app<S: Store>(limiter: Limiter<S>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/hello/{name}", get(hello))
        .layer(RateLimitLayer::new(limiter, PeerIp))
}

async fn hello(Path(name): Path<String>) -> String {
    format!("hello, {name}\n")
}
