//! Helpers shared by the server's integration tests (each uses some of them).
#![allow(dead_code)]

pub mod certs;
pub mod control_plane;

/// A server running on port 0 (both listeners), stopped when dropped.
pub struct OnPort0 {
    /// `http://host:port` of the HTTP listener.
    pub http: String,
    /// The gRPC listener's address.
    pub grpc: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Runs `server` on port 0 until the answer is dropped.
pub async fn on_port_0(server: tollgate_server::Server) -> OnPort0 {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_address, grpc_address) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(http, grpc, async {
        let _ = stopped.await;
    }));
    OnPort0 {
        http: format!("http://{http_address}"),
        grpc: grpc_address,
        _stop: stop,
    }
}
