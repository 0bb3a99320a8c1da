//! What Tollgate's tests and benchmarks share, across the crates: real
//! `redis-server` processes (one, a Cluster, a Sentinel set), each stopped
//! by its pid when dropped; test certificates; Python virtual environments
//! for third-party clients; a real Envoy; a TCP proxy that can cut a
//! replication stream; a slow link (a one-way delay, and a cut) between
//! places far apart. A dev-dependency only.

pub mod certs;
pub mod envoy;
pub mod python_venv;
pub mod redis_cluster;
pub mod redis_server;
pub mod slow_link;
pub mod tcp_proxy;

/// The target directory's `tmp` (what Cargo names `CARGO_TARGET_TMPDIR` to
/// an integration test), found from the running test's executable
/// (`<target>/<profile>/deps/<test>`).
pub fn target_tmp() -> String {
    let exe = std::env::current_exe().expect("the test's executable");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test runs from <target>/<profile>/deps");
    target.join("tmp").to_string_lossy().into_owned()
}

/// A runtime of two worker threads, for a test that drives several
/// clients (replicas, processes) from its own thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a test's runtime")
}

/// A listener on a free port of 127.0.0.1 served by a runtime of its own
/// (one worker thread), so that it outlives any test's runtime; the
/// runtime, and every task on it, ends when this is dropped.
pub struct Listening {
    port: u16,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Listening {
    /// Binds a free port and spawns `serve(listener)` on the runtime.
    pub fn start<F>(serve: impl FnOnce(tokio::net::TcpListener) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a listener's runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a free port of 127.0.0.1");
        let port = listener.local_addr().expect("local address").port();
        runtime.spawn(serve(listener));
        Self {
            port,
            runtime: Some(runtime),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
