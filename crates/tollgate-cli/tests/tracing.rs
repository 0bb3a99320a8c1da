//! `serve`'s traces as envoyproxy/ratelimit exports them: with
//! `TRACING_ENABLED`, a span per decision over OTLP/HTTP to
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, received here by an OTLP endpoint written
//! for the test that decodes what arrives.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// A span as received: its name, its attributes as text, its service's name.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    attributes: Vec<(String, String)>,
    service: String,
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::IntValue(number)) => number.to_string(),
        Some(Value::BoolValue(flag)) => flag.to_string(),
        Some(Value::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

/// An OTLP/HTTP endpoint on port 0: its address and what it received.
async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = Arc::clone(&sink);
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|resource| &resource.attributes)
                        .find(|attribute| attribute.key == "service.name")
                        .map(|attribute| text(attribute.value.as_ref()))
                        .unwrap_or_default();
                    for span in resource.scope_spans.into_iter().flat_map(|scope| scope.spans) {
                        sink.lock().unwrap().push(Received {
                            name: span.name,
                            attributes: span
                                .attributes
                                .iter()
                                .map(|attribute| (attribute.key.clone(), text(attribute.value.as_ref())))
                                .collect(),
                            service: service.clone(),
                        });
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_a_span_over_otlp() {
    let (endpoint, received) = collector().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("traced.yaml");
    std::fs::write(
        &config,
        "domain: traced\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let mut command = common::tollgate(&["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--config"]);
    command
        .arg(&config)
        .env("TRACING_ENABLED", "true")
        .env("TRACING_SERVICE_NAME", "ratelimit-under-test")
        .env("TRACING_SERVICE_NAMESPACE", "gateway-system")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "50");
    let serve = common::Serve::start_command(command);
    let client = reqwest::Client::new();
    let body = r#"{"domain":"traced","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let response = client
            .post(format!("http://{}/json", serve.http))
            .body(body)
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 429]);

    let mut spans = Vec::new();
    for _ in 0..200 {
        spans = received
            .lock()
            .unwrap()
            .iter()
            .filter(|span| span.name == "should_rate_limit")
            .cloned()
            .collect();
        if spans.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(spans.len(), 2, "{:?}", received.lock().unwrap());
    let codes: Vec<String> = spans
        .iter()
        .map(|span| {
            assert_eq!(span.service, "ratelimit-under-test");
            let attribute = |key: &str| {
                span.attributes
                    .iter()
                    .find(|(name, _)| name == key)
                    .map(|(_, value)| value.clone())
                    .unwrap_or_default()
            };
            assert_eq!(attribute("domain"), "traced", "{span:?}");
            assert_eq!(attribute("descriptors"), "1", "{span:?}");
            attribute("code")
        })
        .collect();
    assert_eq!(codes, ["Ok", "OverLimit"]);
    let (stopped, logs) = serve.terminate();
    assert!(stopped, "{logs:?}");
    assert!(
        !logs.iter().any(|line| line.contains("should_rate_limit")),
        "decision spans stay out of the logs: {logs:?}"
    );
}
