//! What Tollgate's tests and benchmarks share, across the crates: real
//! `redis-server` processes (one, a Cluster, a Sentinel set), each stopped
//! by its pid when dropped; test certificates; Python virtual environments
//! for third-party clients. A dev-dependency only.

pub mod certs;
pub mod python_venv;
pub mod redis_cluster;
pub mod redis_server;
