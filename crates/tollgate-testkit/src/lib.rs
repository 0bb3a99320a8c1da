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
