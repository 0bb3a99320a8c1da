//! The gRPC listener's TLS handshakes: how many are in progress, and how
//! many were dropped to make room (a flood of connections that never finish
//! one).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The TLS handshakes' metrics.
#[derive(Default)]
pub struct TlsMetrics {
    handshakes: Gauge,
    evicted: Counter,
}

impl TlsMetrics {
    /// Registers them in `registry` (prefixed `tollgate`).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "grpc_tls_handshakes",
            "TLS handshakes in progress on the gRPC listener",
            self.handshakes.clone(),
        );
        registry.register(
            "grpc_tls_handshakes_evicted",
            "TLS handshakes dropped unfinished to make room for a newer connection",
            self.evicted.clone(),
        );
    }

    /// Handshakes in progress now.
    pub fn in_progress(&self, handshakes: usize) {
        self.handshakes.set(i64::try_from(handshakes).unwrap_or(i64::MAX));
    }

    /// One handshake dropped unfinished.
    pub fn evicted(&self) {
        self.evicted.inc();
    }
}
