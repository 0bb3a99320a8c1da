//! `serve`'s logs and traces: logs to stderr (text or JSON), and with
//! `TRACING_ENABLED` a span per decision over OTLP/HTTP
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, as envoyproxy/ratelimit exports them).
//! The decision spans go to the exporter only, never to the logs, and cost
//! nothing without one.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tollgate_server::service::DECISION_SPANS;
use tollgate_server::settings::{Settings, TracingSettings};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

/// Flushes and stops the trace exporter when dropped (at the end of `serve`).
pub struct Telemetry(Option<SdkTracerProvider>);

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            if let Err(error) = provider.shutdown() {
                tracing::warn!(%error, "traces: the exporter did not stop cleanly");
            }
        }
    }
}

/// Starts the logs (`RUST_LOG`, else `LOG_LEVEL`, else info; JSON with
/// `json`) and, when `settings` ask, the trace exporter.
///
/// # Errors
///
/// An exporter that cannot be built (a malformed OTLP endpoint).
pub fn init(settings: &Settings, json: bool) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env()
        .ok()
        .or_else(|| {
            settings
                .log_level
                .as_deref()
                .and_then(|level| EnvFilter::try_new(level).ok())
        })
        .unwrap_or_else(|| "info".into())
        .add_directive(format!("{DECISION_SPANS}=off").parse()?);
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = if json { logs.json().boxed() } else { logs.boxed() };
    let (traces, provider) = match &settings.tracing {
        Some(tracing) => {
            let provider = provider(tracing)?;
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("tollgate"))
                .with_filter(Targets::new().with_target(DECISION_SPANS, tracing::Level::INFO));
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .init();
    if let Some(tracing) = &settings.tracing {
        tracing::info!(
            service = %tracing.service_name,
            sampling_rate = tracing.sampling_rate,
            "traces: a span per decision over OTLP/HTTP"
        );
    }
    Ok(Telemetry(provider))
}

/// The OTLP/HTTP exporter, batched, sampling `sampling_rate` of the
/// traces that do not follow a sampled parent.
fn provider(tracing: &TracingSettings) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build()?;
    let mut attributes = Vec::new();
    if let Some(namespace) = &tracing.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    if let Some(instance) = &tracing.service_instance_id {
        attributes.push(KeyValue::new("service.instance.id", instance.clone()));
    }
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(tracing.service_name.clone())
        .with_attributes(attributes)
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            tracing.sampling_rate,
        ))))
        .with_resource(resource)
        .build())
}
