//! Helpers shared by the server's integration tests (each uses some of them).
// Each test binary uses a part of it (the kit's modules re-exported too).
#![allow(dead_code, unused_imports)]

pub use tollgate_testkit::certs;
pub mod control_plane;
pub mod rls;

use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_server::config::Domain;
use tollgate_server::Config;

/// Noon UTC, 2023-11-14, in µs since the epoch: a manual clock set there
/// decides far from the end of a day's window.
pub const NOON: u64 = 1_699_963_200_000_000;

/// The configuration of one domain written as `text`.
pub fn config(text: &str) -> Config {
    let domain = Domain::parse(text, std::path::Path::new("test.yaml")).expect("the config loads");
    Config {
        domains: [(domain.domain.clone(), domain)].into(),
    }
}

/// A server running on port 0 (both listeners), stopped when dropped.
pub struct OnPort0 {
    /// `http://host:port` of the HTTP listener.
    pub http: String,
    /// The gRPC listener's address.
    pub grpc: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

/// Runs `server` on port 0 until the answer is dropped or stopped.
pub async fn on_port_0(server: tollgate_server::Server) -> OnPort0 {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_address, grpc_address) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(http, grpc, async {
        let _ = stopped.await;
    }));
    OnPort0 {
        http: format!("http://{http_address}"),
        grpc: grpc_address,
        stop,
        task,
    }
}

impl OnPort0 {
    /// `http://host:port` of the gRPC listener, for a plain-text client.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The answer to `GET path` on the HTTP listener.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(format!("{}{path}", self.http)).await.unwrap()
    }

    /// The text `GET path` answers on the HTTP listener.
    pub async fn text(&self, path: &str) -> String {
        self.get(path).await.text().await.unwrap()
    }

    /// Stops the server, and waits until it has stopped without an error.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// `method url` with an optional bearer `token` and JSON `body`: the status
/// and the JSON answered (null when none).
pub async fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(serde_json::Value::Null))
}
